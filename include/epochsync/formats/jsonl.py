"""Canonical JSON Lines, the native format (the only one that carries extents)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import IO

from epochsync.errors import ParseError, RecordError
from epochsync.formats.common import ParseOptions, RecordChecker, report
from epochsync.schema import Record


def parse_jsonl(stream: IO[bytes], file: str, opts: ParseOptions) -> Iterator[Record]:
    checker = RecordChecker(opts)
    offset = 0
    for lineno, raw in enumerate(stream, 1):
        line_offset = offset
        offset += len(raw)
        text = raw.decode("utf-8", "replace")
        if not text.strip():
            continue
        data = None
        try:
            data = json.loads(text)
            if isinstance(data, dict):
                if opts.epoch is not None:
                    data["epoch"] = opts.epoch
                if opts.server is not None and data.get("server") is None:
                    data["server"] = opts.server
            rec = checker.check(Record.from_dict(data))
        except (RecordError, ValueError) as exc:
            reason = f"not valid JSON: {exc.msg}" if isinstance(exc, json.JSONDecodeError) else str(exc)
            srv = data.get("server") if isinstance(data, dict) else None
            report(opts, ParseError(file, lineno, reason, offset=line_offset, text=text.rstrip("\n"), server=srv))
            continue
        yield rec
