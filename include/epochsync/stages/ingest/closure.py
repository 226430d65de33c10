"""Epoch closure: which servers have closed an epoch (the Airflow sensor asks before ingest)."""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from epochsync.core.errors import EpochError
from epochsync.core.schema import Record
from epochsync.stages.ingest.executor import _parse_options

#: Bytes a fast-path chunk holds (cut at a line end); bounds an executor's memory per file.
from epochsync.stages.ingest.files import ChangelogFile, _changelog_s3, _open, list_changelog_files


@dataclass(frozen=True)
class Closure:
    """Whether epoch ``epoch`` of a source is closed, and which servers it still waits for."""

    epoch: int
    #: server -> the highest epoch it has closed (None: no EPOCH record yet)
    closed_through: dict[str, int | None]
    source: str | None = None

    @property
    def waiting(self) -> tuple[str, ...]:
        """Servers that have not written an EPOCH record for ``epoch`` or later, by name."""
        return tuple(s for s, e in self.closed_through.items() if e is None or e < self.epoch)

    @property
    def closed(self) -> bool:
        """Returns whether every server has closed ``epoch``."""
        return not self.waiting

    def describe(self) -> str:
        """Returns one sentence: the epoch is closed, or which servers it waits for and how far each got."""
        what = f"epoch {self.epoch}" + (f" of source {self.source!r}" if self.source else "")
        if self.closed:
            return f"{what} is closed"
        parts = []
        for s in self.waiting:
            e = self.closed_through[s]
            parts.append(f"{s} (no EPOCH record yet)" if e is None else f"{s} (closed through {e})")
        return f"{what} is not closed: waiting for {', '.join(parts)}"


def closed_through_of(records: Iterable[Record], epochs_from: str = "records") -> dict[str, int]:
    """Per server, the highest epoch its records close.

    A server closes E with an ``EPOCH`` record of epoch E. With time-window epochs
    (``epochs_from: time``) a record of a later window closes the earlier ones too, since
    a server's records come in time order.
    """
    out: dict[str, int] = {}
    for r in records:
        if r.type == "EPOCH":
            reached = r.epoch
        elif epochs_from == "time":
            reached = r.epoch - 1
        else:
            continue
        if reached > out.get(r.server, -1):
            out[r.server] = reached
    return out


def epoch_closure(
    servers: Sequence[str], closed_through: Mapping[str, int | None], epoch: int, source: str | None = None
) -> Closure:
    """Epoch ``epoch`` is closed when every server in ``servers`` has closed it or a later one."""
    return Closure(epoch, {s: closed_through.get(s) for s in servers}, source)


def closure_of_records(
    servers: Sequence[str], records: Iterable[Record], epoch: int, epochs_from: str = "records"
) -> Closure:
    """:func:`epoch_closure` from the servers' records (any order, any epochs)."""
    return epoch_closure(servers, closed_through_of(records, epochs_from), epoch)


def closure_of_dataframe(df, servers: Sequence[str], epoch: int, epochs_from: str = "records") -> Closure:
    """:func:`epoch_closure` from a DataFrame of canonical records (e.g. the warehouse's)."""
    from pyspark.sql import functions as F

    reached = F.when(F.col("type") == "EPOCH", F.col("epoch"))
    if epochs_from == "time":
        reached = F.when(F.col("type") == "EPOCH", F.col("epoch")).otherwise(F.col("epoch") - 1)
    rows = df.groupBy("server").agg(F.max(reached).alias("reached")).collect()
    return epoch_closure(servers, {r["server"]: r["reached"] for r in rows}, epoch)


def _require_epochs(src) -> None:
    """Lustre and Gluster records carry no epoch: they must come from MARKs or time windows."""
    if src.changelogs.format != "jsonl" and src.changelogs.epochs_from == "records":
        raise EpochError(
            f"source {src.name!r}: {src.changelogs.format} changelogs carry no epochs; set "
            "changelogs.epochs_from to mark (Lustre MARK records) or time (the epoch windows)"
        )


def check_epoch_closed(cfg, source: str, epoch: int) -> Closure:
    """Returns the :class:`Closure` of ``epoch``, from the raw changelogs of ``source`` (driver side, no Spark).

    This is what the Airflow sensor asks. Bad lines are skipped here (ingest reports
    them); only EPOCH records (and, for time-window epochs, record times) count.
    """
    src = cfg.source(source)
    _require_epochs(src)
    files = list_changelog_files(src)
    s3 = _changelog_s3(src)
    reached: dict[str, int | None] = {}
    for server in src.servers:
        reached[server] = _server_closed_through(src, server, files.get(server, []), s3)
    return Closure(epoch, reached, source)


def missing_epoch_servers(cfg, source: str, epoch: int) -> list[str]:
    """Servers of ``source`` that have not yet written an ``EPOCH`` record for ``epoch`` or later."""
    return list(check_epoch_closed(cfg, source, epoch).waiting)


def latest_closed_epoch(cfg, source: str) -> int | None:
    """The highest epoch every server of ``source`` has closed (None if some server closed none)."""
    closure = check_epoch_closed(cfg, source, 0)
    values = list(closure.closed_through.values())
    if not values or any(v is None for v in values):
        return None
    return min(v for v in values if v is not None)


def _server_closed_through(src, server: str, files: list[ChangelogFile], s3) -> int | None:
    from epochsync.formats import ParseOptions, parse_stream
    from epochsync.formats.common import ParseContext

    fmt, mode = src.changelogs.format, src.changelogs.epochs_from
    if fmt == "jsonl" and mode == "records":
        # Epochs only grow along a server's files: the last file with an EPOCH record has
        # the answer, and only its EPOCH lines need parsing.
        for f in reversed(files):
            with _open(f, s3) as stream:
                data = stream.read()
            lines = b"".join(line + b"\n" for line in data.split(b"\n") if b'"EPOCH"' in line)
            if not lines:
                continue
            opts = ParseOptions(server=server, on_error=lambda e: None)
            found = closed_through_of(parse_stream(fmt, io.BytesIO(lines), f.uri, opts), mode).get(server)
            if found is not None:
                return found
        return None
    best: int | None = None
    ctx = ParseContext()
    for f in files:
        opts = _parse_options(src, server, on_error=lambda e: None, context=ctx)
        with _open(f, s3) as stream:
            got = closed_through_of(parse_stream(fmt, stream, f.uri, opts), mode).get(server)
        if got is not None and (best is None or got > best):
            best = got
    return best
