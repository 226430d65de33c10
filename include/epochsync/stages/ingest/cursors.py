"""Index continuity: the consumer cursors, and gaps between a server's files."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from epochsync.core.errors import EpochError
from epochsync.warehouse.paths import Warehouse, local_path

#: Bytes a fast-path chunk holds (cut at a line end); bounds an executor's memory per file.


def parse_cursor(text: str, file: str) -> dict[str, int]:
    """The per-server last indexes of a cursor file ``{"epoch": E, "servers": {server: index}}``."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise EpochError(f"{file}: consumer cursor is not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("servers", {}), dict):
        raise EpochError(f'{file}: consumer cursor must be {{"epoch": E, "servers": {{SERVER: INDEX}}}}')
    out = {}
    for server, index in (doc.get("servers") or {}).items():
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise EpochError(f"{file}: consumer cursor: server {server!r} has index {index!r}, expected an integer ≥ 0")
        out[str(server)] = index
    return out


def read_cursor_indexes(warehouse: str, source: str, consumer: str | None = None) -> dict[str, int] | None:
    """The last applied index per server that ingest checks continuity from.

    ``consumer`` given: that consumer's cursor (None if it has none yet). Otherwise the
    minimum over every consumer of the source, because records are kept only above the
    minimum cursor; a server some consumer has no index for is left unchecked.
    """
    wh = Warehouse(warehouse)
    if consumer is not None:
        path = local_path(wh.cursor(source, consumer))
        if not os.path.exists(path):
            return None
        with open(path, encoding="utf-8") as fh:
            return parse_cursor(fh.read(), path)
    directory = local_path(wh.cursors(source))
    if not os.path.isdir(directory):
        return None
    cursors = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".json") and not name.startswith("."):
            path = os.path.join(directory, name)
            with open(path, encoding="utf-8") as fh:
                cursors.append(parse_cursor(fh.read(), path))
    if not cursors:
        return None
    common = set.intersection(*(set(c) for c in cursors))
    return {s: min(c[s] for c in cursors) for s in sorted(common)}


@dataclass(frozen=True)
class IndexSpan:
    """The in-scope records of one changelog file of a server, in file order.

    ``first_index``/``last_index`` bound them; ``bad_before``/``bad_after`` count the
    quarantined lines before the first and after the last one (a quarantined line may be
    a lost index, so it may explain a gap).
    """

    server: str
    file: str
    first_index: int | None
    last_index: int | None
    bad_before: int = 0
    bad_after: int = 0
    #: the file's last in-scope record is a MARK (its EPOCH may repeat the index)
    last_is_mark: bool = False
    first_is_epoch: bool = False


def find_index_gaps(spans: Sequence[IndexSpan], after_index: Mapping[str, int] | None = None) -> list[str]:
    """Continuity problems across the files of each server (spans in server, file order).

    ``after_index`` is the consumer cursor per server: the first record must be the
    next index (a server the cursor does not name is not checked at its start). Each
    problem is one sentence naming the server and the missing index range.
    """
    problems: list[str] = []
    prev: dict[str, IndexSpan] = {}
    for span in spans:
        if span.first_index is None:
            # a file with no in-scope record: its bad lines still count between neighbours
            p = prev.get(span.server)
            if p is not None:
                prev[span.server] = IndexSpan(
                    p.server,
                    p.file,
                    p.first_index,
                    p.last_index,
                    p.bad_before,
                    p.bad_after + span.bad_before + span.bad_after,
                    p.last_is_mark,
                )
            continue
        p = prev.get(span.server)
        if p is None:
            start = (after_index or {}).get(span.server)
            if start is not None and span.first_index > start + 1 + span.bad_before:
                problems.append(
                    f"server {span.server}: records {start + 1}..{span.first_index - 1} are missing "
                    f"(the consumer cursor is at index {start}; {span.file} starts at index {span.first_index})"
                )
        else:
            assert p.last_index is not None  # a span seen before has its last index
            expected = p.last_index + 1
            tolerance = p.bad_after + span.bad_before
            if span.first_index < expected and not (
                span.first_index == p.last_index and p.last_is_mark and span.first_is_epoch
            ):
                problems.append(
                    f"server {span.server}: index goes backwards: {span.file} starts at index {span.first_index} "
                    f"after index {p.last_index} in {p.file}"
                )
            elif span.first_index > expected + tolerance:
                problems.append(
                    f"server {span.server}: records {expected}..{span.first_index - 1} are missing "
                    f"({p.file} ends at index {p.last_index}; {span.file} starts at index {span.first_index})"
                )
        prev[span.server] = span
    return problems
