"""Canonical JSON Lines, the native format (the only one that carries extents).

One JSON object per line with the fields of :class:`epochsync.core.schema.Record` (null
fields may be left out, ``xattr_value`` is base64). Blank lines are skipped.
``ParseOptions.epoch`` overrides every record's epoch; ``ParseOptions.server`` fills in a
missing ``server`` only. Records go through the same checks as every importer's (known
type, safe names, strictly increasing index per server).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import IO

from epochsync.core.errors import ParseError, RecordError
from epochsync.core.schema import Record
from epochsync.formats.common import ParseOptions, RecordChecker, iter_lines, report


def parse_jsonl(stream: IO[bytes], file: str, opts: ParseOptions) -> Iterator[Record]:
    """Yields the records of canonical JSON Lines; a bad line raises ParseError or is quarantined."""
    checker = RecordChecker(opts)
    offset = 0
    for lineno, raw in enumerate(iter_lines(stream), 1):
        line_offset = offset
        offset += len(raw)
        if not raw.strip():
            continue
        text = raw.decode("utf-8", "backslashreplace").rstrip("\r\n")
        data = None
        try:
            try:
                decoded = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise RecordError(f"line is not valid UTF-8 (byte {exc.start} of the line)") from None
            data = json.loads(decoded)
            if isinstance(data, dict):
                if opts.epoch is not None:
                    data["epoch"] = opts.epoch
                if opts.server is not None and data.get("server") is None:
                    data["server"] = opts.server
            rec = checker.check(Record.from_dict(data))
        except json.JSONDecodeError as exc:
            _report(opts, file, lineno, f"not valid JSON: {exc.msg} (column {exc.colno})", line_offset, text, None)
            continue
        except RecursionError:
            _report(opts, file, lineno, "not valid JSON: nested too deeply", line_offset, text, None)
            continue
        except (RecordError, ValueError) as exc:
            _report(opts, file, lineno, str(exc), line_offset, text, data)
            continue
        yield rec


def _report(opts: ParseOptions, file: str, lineno: int, reason: str, offset: int, text: str, data) -> None:
    server = data.get("server") if isinstance(data, dict) and isinstance(data.get("server"), str) else None
    index = data.get("index") if isinstance(data, dict) and type(data.get("index")) is int else None
    report(opts, ParseError(file, lineno, reason, offset=offset, text=text, server=server, index=index))
