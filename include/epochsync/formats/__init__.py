"""Changelog importers: every supported format → canonical :class:`Record` values.

One entry point, :func:`parse_stream` / :func:`parse_file`, for the CLI, the Spark
ingest stage and tests. Bad input raises :class:`ParseError` (``FILE:LINE: reason``)
or, when ``ParseOptions.on_error`` is set (quarantine), is handed to it and parsing
goes on. Nothing is dropped silently.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO

from epochsync.core.schema import Record
from epochsync.formats.common import ParseOptions, RecordChecker

FORMATS = ("lustre", "gluster", "jsonl")

__all__ = ["FORMATS", "ParseOptions", "RecordChecker", "parse_file", "parse_stream"]


def parse_stream(fmt: str, stream: IO[bytes], file: str, opts: ParseOptions | None = None) -> Iterator[Record]:
    """Returns an iterator over the records of a binary stream of format ``fmt``; ``file`` names it in errors."""
    opts = opts or ParseOptions()
    if fmt == "jsonl":
        from epochsync.formats.jsonl import parse_jsonl

        return parse_jsonl(stream, file, opts)
    if fmt == "lustre":
        from epochsync.formats.lustre import parse_lustre

        return parse_lustre(stream, file, opts)
    if fmt == "gluster":
        from epochsync.formats.gluster import parse_gluster

        return parse_gluster(stream, file, opts)
    raise ValueError(f"unknown changelog format {fmt!r} (expected one of {', '.join(FORMATS)})")


def parse_file(fmt: str, path: str, opts: ParseOptions | None = None) -> Iterator[Record]:
    """Yields the records of a local file; the file is closed when the iterator is exhausted or closed."""
    with open(path, "rb") as fh:
        yield from parse_stream(fmt, fh, path, opts)
