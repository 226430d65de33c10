"""The ingest stage: raw changelogs of one or more epochs → canonical records in the warehouse.

What it does, for a source and epochs ``first..last``:

1. Lists every configured server's changelog files under ``<changelogs.uri>/<server>/``
   (any names, read in name order; hidden files, starting with ``.``, are skipped so a
   writer can stage a file before renaming it). The caller lists (a local directory, or an
   ``s3://bucket/prefix/`` with boto3); the executors read.
2. Parses them on the executors (one Spark job, ``mapInArrow`` over a few task ids; Spark
   Connect and classic sessions alike): no per-record Python UDF. Canonical JSON Lines take
   a fast path (pyarrow's strict JSON reader and vectorised checks, equivalent to the
   importer's checks); any chunk the fast path has a doubt about, and every other format,
   goes through the importers' ``parse_stream`` — the reference, which names ``FILE:LINE``.
3. The executors write ``records/source=S/epoch=E/server=X/`` Parquet with pyarrow into a
   staging directory of the warehouse (``file://``: local, or a file system shared by the
   executors and the caller) and return one report row per file. The caller then checks
   them: bad records (the epoch fails, or with ``on_bad_record: quarantine`` they go to
   ``quarantine/source=S/epoch=E/`` and the run goes on), per-server index continuity
   against the consumer cursor, and that every server has closed ``last``. Only then are
   the epochs' directories swapped in, one commit at a time per source (a lock file), so
   a failed run leaves the warehouse as it was and a re-run overwrites its own output. An
   epoch whose committed files already hold exactly the staged bytes (a retry, a second
   target's ingest, two runs at once) is left in place: its readers are never disturbed.

Epoch closure (:func:`epoch_closure`, :func:`missing_epoch_servers`) is here too: the
Airflow sensor calls it before ingest. Nothing heavy is imported at module level.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, cast

from epochsync.core.errors import EpochError, EpochsyncError, ParseError, StoreError
from epochsync.core.schema import FIELD_NAMES, INT32_MAX, NAMING_TYPES, RECORD_TYPES, UNNAMING_TYPES, Record
from epochsync.warehouse.paths import Warehouse, local_path

#: Bytes a fast-path chunk holds (cut at a line end); bounds an executor's memory per file.
CHUNK_BYTES = 32 * 1024 * 1024
#: Records per Arrow batch handed to Spark from the reference path.
BATCH_RECORDS = 32768
#: JSON Lines tasks per core: files are packed into this many tasks per core at most.
TASKS_PER_CORE = 4
#: changelog bytes one ingest task is worth (about 40,000 JSON Lines records)
BYTES_PER_TASK = 16 * 1024 * 1024
#: Bad records kept per file for the error message and the quarantine (the rest are counted).
MAX_ERRORS_PER_FILE = 10000

#: what base64.b64decode(validate=True) accepts
_BASE64 = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"


# =========================================================================== epoch closure


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
        return not self.waiting

    def describe(self) -> str:
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
    """Read the raw changelogs of ``source`` (driver side, no Spark) and say whether ``epoch`` is closed.

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


# =========================================================================== cursors


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


# =========================================================================== index continuity


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


# =========================================================================== listing and reading


@dataclass(frozen=True)
class ChangelogFile:
    """One changelog file of a server: where it is and how errors name it."""

    server: str
    ordinal: int
    #: ``/abs/path`` or ``s3://bucket/key``
    uri: str
    size: int = 0


def _is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


def _split_s3(uri: str) -> tuple[str, str]:
    rest = uri[len("s3://") :]
    bucket, _, prefix = rest.partition("/")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    return bucket, prefix


def _changelog_s3(src):
    """S3 settings for an ``s3://`` changelog URI (``changelogs.conn_id``, else the store's)."""
    if not _is_s3(src.changelogs.uri):
        return None
    from epochsync.stores.connections import resolve_s3

    return resolve_s3(src.changelogs.conn_id or src.store.conn_id)


def _list_local(base: str, server: str) -> list[ChangelogFile]:
    directory = os.path.join(base, server)
    if not os.path.isdir(directory):
        return []
    names = sorted(n for n in os.listdir(directory) if not n.startswith("."))
    out: list[ChangelogFile] = []
    for n in names:
        path = os.path.join(directory, n)
        if os.path.isfile(path):
            out.append(ChangelogFile(server, len(out), path, os.path.getsize(path)))
    return out


def _list_s3(s3, bucket: str, prefix: str, server: str) -> list[ChangelogFile]:
    client = s3.client()
    keys = []
    try:
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=f"{prefix}{server}/", Delimiter="/"
        ):
            for obj in page.get("Contents", []):
                name = obj["Key"].rsplit("/", 1)[-1]
                if name and not name.startswith("."):
                    keys.append((obj["Key"], obj["Size"]))
    except Exception as exc:  # botocore raises many types; the message names them
        raise StoreError(f"cannot list s3://{bucket}/{prefix}{server}/ via {s3.describe()}: {exc}") from None
    keys.sort()
    return [ChangelogFile(server, i, f"s3://{bucket}/{k}", size) for i, (k, size) in enumerate(keys)]


#: bytes read from the end of a JSON Lines file to find its last record
TAIL_BYTES = 64 * 1024


def file_tail(f: ChangelogFile, s3=None) -> tuple[int, int, str | None] | None:
    """(index, epoch, type) of the last line of a JSON Lines file, or None if it cannot tell."""
    if f.size <= 0:
        return None
    try:
        if _is_s3(f.uri):
            bucket, _, key = f.uri[len("s3://") :].partition("/")
            data = s3.client().get_object(Bucket=bucket, Key=key, Range=f"bytes=-{TAIL_BYTES}")["Body"].read()
        else:
            with open(f.uri, "rb") as fh:
                fh.seek(max(0, f.size - TAIL_BYTES))
                data = fh.read()
    except Exception as exc:  # the file's own run reports unreadable files; here: no shortcut
        del exc
        return None
    data = data.rstrip(b"\n")
    cut = data.rfind(b"\n")
    if cut < 0 and f.size > len(data) + 1:
        return None  # the last line is longer than the tail read
    try:
        last = json.loads(data[cut + 1 :])
    except ValueError:
        return None
    if not isinstance(last, dict):
        return None
    index, epoch = last.get("index"), last.get("epoch")
    if not isinstance(index, int) or not isinstance(epoch, int) or isinstance(index, bool) or isinstance(epoch, bool):
        return None
    kind = last.get("type")
    return index, epoch, kind if isinstance(kind, str) else None


def settled_files(
    files: dict[str, list[ChangelogFile]],
    tails: dict[str, tuple | None],
    first: int,
    after_index: Mapping[str, int] | None,
) -> dict[str, list[ChangelogFile]]:
    """Drop the leading files of each server that cannot hold anything this run judges.

    JSON Lines epochs never go down along a server's files (a late record is an error)
    and indexes only go up, so a file whose last record is of an epoch before ``first``
    and, when the server has a cursor, at or below it holds only what earlier runs
    ingested and checked. Only a leading run of such files is dropped.
    """
    out = {}
    for server, fl in files.items():
        cursor = (after_index or {}).get(server)
        keep_from = 0
        for i, f in enumerate(fl):
            tail = tails.get(f.uri)
            if tail is None or tail[1] >= first or (cursor is not None and tail[0] > cursor):
                break
            keep_from = i + 1
        out[server] = fl[keep_from:]
    return out


def list_changelog_files(src) -> dict[str, list[ChangelogFile]]:
    """Per configured server, its changelog files in name order (listed by the caller: a
    few LISTs per server, no Spark job)."""
    uri = src.changelogs.uri
    if not _is_s3(uri):
        base = local_path(uri)
        return {s: _list_local(base, s) for s in src.servers}
    s3 = _changelog_s3(src)
    bucket, prefix = _split_s3(uri)
    return {s: _list_s3(s3, bucket, prefix, s) for s in src.servers}


def _open(f: ChangelogFile, s3) -> IO[bytes]:
    """A binary stream of the file (a local file, or the body of an S3 GET)."""
    if not _is_s3(f.uri):
        try:
            return open(f.uri, "rb")
        except OSError as exc:  # e.g. purged or renamed since it was listed
            raise StoreError(f"cannot read {f.uri}: {exc.strerror or exc}") from None
    bucket, _, key = f.uri[len("s3://") :].partition("/")
    try:
        body = s3.client().get_object(Bucket=bucket, Key=key)["Body"]
    except Exception as exc:
        raise StoreError(f"cannot read {f.uri} via {s3.describe()}: {exc}") from None
    return cast("IO[bytes]", _ClosingBody(body))


class _ClosingBody(io.RawIOBase):
    """A botocore StreamingBody as a context-managed raw stream."""

    def __init__(self, body):
        self.body = body

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        return self.body.read(None if size is None or size < 0 else size)

    def readinto(self, b) -> int:
        data = self.body.read(len(b))
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self.body.close()
        super().close()


class _Chain(io.RawIOBase):
    """``head`` bytes, then the rest of ``tail``: resumes a stream at a chunk already read."""

    def __init__(self, head: bytes, tail: IO[bytes]):
        self.head = memoryview(head)
        self.tail = tail

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        if self.head.nbytes:
            n = min(len(b), self.head.nbytes)
            b[:n] = self.head[:n]
            self.head = self.head[n:]
            return n
        data = self.tail.read(len(b))
        b[: len(data)] = data
        return len(data)


# =========================================================================== executor side


@dataclass(frozen=True)
class IngestJob:
    """What every executor task needs to know (picklable)."""

    source: str
    fmt: str
    epochs_from: str
    first: int
    last: int
    continuity: bool
    after_index: dict[str, int] | None
    s3: Any = None
    #: the epoch grid for time-window epochs
    start_ns: int = 0
    interval_ns: int = 1
    #: local staging directory the executors write Parquet into (a local or
    #: shared-file-system warehouse)
    staging_dir: str | None = None


@dataclass
class FileReport:
    """What one file yielded: counts, the index span, EPOCH progress and bad records."""

    server: str
    ordinal: int
    file: str
    records: dict[int, int] = field(default_factory=dict)
    span_first: int | None = None
    span_last: int | None = None
    bad_before: int = 0
    bad_after: int = 0
    last_is_mark: bool = False
    first_is_epoch: bool = False
    closed_through: int | None = None
    #: (epoch the bad line belongs to, or None if unknown; ParseError.to_dict())
    errors: list[tuple[int | None, dict]] = field(default_factory=list)
    errors_dropped: int = 0
    gaps: list[str] = field(default_factory=list)
    fast_lines: int = 0
    slow_lines: int = 0
    bytes: int = 0
    #: executor time reading, parsing and checking; and writing Parquet (executor writer)
    seconds: float = 0.0
    write_seconds: float = 0.0

    def span(self) -> IndexSpan:
        return IndexSpan(
            self.server,
            self.file,
            self.span_first,
            self.span_last,
            self.bad_before,
            self.bad_after,
            self.last_is_mark,
            self.first_is_epoch,
        )


def _epoch_of_time(start_ns: int, interval_ns: int):
    from functools import partial

    from epochsync.core.epochs import epoch_of_ns

    return partial(epoch_of_ns, start_ns, interval_ns)


def _parse_options(src_or_job, server: str, *, on_error=None, context=None, after_index=None):
    """ParseOptions for one server's files, from the source config or an IngestJob."""
    from epochsync.formats import ParseOptions

    if isinstance(src_or_job, IngestJob):
        fmt, mode = src_or_job.fmt, src_or_job.epochs_from
        start_ns, interval_ns = src_or_job.start_ns, src_or_job.interval_ns
    else:
        fmt, mode = src_or_job.changelogs.format, src_or_job.changelogs.epochs_from
        start_ns, interval_ns = _epoch_grid(src_or_job)
    return ParseOptions(
        server=server,
        epoch_of_time=_epoch_of_time(start_ns, interval_ns) if mode == "time" and fmt != "jsonl" else None,
        epochs_from_marks=mode == "mark" and fmt == "lustre",
        after_index=after_index,
        on_error=on_error,
        context=context,
    )


def _epoch_grid(src) -> tuple[int, int]:
    from epochsync.core.epochs import grid

    return grid(src.epoch.start, src.epoch.interval_s)


def _arrow_schemas():
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    from epochsync.core.schema import record_struct_type

    out = to_arrow_schema(record_struct_type())
    # Reading: a missing server is filled from the directory; base64 is decoded after.
    read = out.set(out.get_field_index("server"), pa.field("server", pa.string(), nullable=True))
    read = read.set(read.get_field_index("xattr_value"), pa.field("xattr_value", pa.string()))
    return out, read


class _Sink:
    """Collects one file's outcome while its records stream out as Arrow batches."""

    def __init__(self, job: IngestJob, f: ChangelogFile, out_schema):
        self.job = job
        self.f = f
        self.schema = out_schema
        self.report = FileReport(f.server, f.ordinal, f.uri, bytes=f.size)
        self.last_scoped: int | None = None
        self.last_scoped_type: str | None = None
        self.bad_since_scoped = 0
        self.prev_epoch_after: int | None = None  # epoch a line after the last record belongs to
        self.pending_bad: list[ParseError] = []
        self.last_index_any: int | None = None  # last index the fast path accepted
        self.closed_so_far: int | None = None  # highest EPOCH seen so far in this file

    # --- bad lines
    def bad(self, err: ParseError, epoch: int | None) -> None:
        rep = self.report
        if epoch is not None and not (self.job.first <= epoch <= self.job.last):
            return  # another epoch's problem: that epoch's ingest judges it
        self.bad_since_scoped += 1
        if rep.span_first is None:
            rep.bad_before += 1
        if len(rep.errors) < MAX_ERRORS_PER_FILE:
            entry = err.to_dict()
            if entry["server"] is None:  # a line too broken to say: its directory says
                entry["server"] = self.f.server
            rep.errors.append((epoch, entry))
        else:
            rep.errors_dropped += 1

    def flush_pending(self, epoch: int | None) -> None:
        for err in self.pending_bad:
            self.bad(err, epoch)
        self.pending_bad = []

    # --- good records, in file order
    def scoped(self, index: int, epoch: int, rtype: str) -> None:
        """Continuity bookkeeping for a record with index above the cursor and epoch ≤ last."""
        rep = self.report
        last = self.last_scoped
        if last is not None and self.job.continuity:
            if index == last and rtype == "EPOCH" and self.last_scoped_type == "MARK":
                pass
            elif index > last + 1 + self.bad_since_scoped:
                rep.gaps.append(
                    f"server {self.f.server}: records {last + 1}..{index - 1} are missing "
                    f"({self.f.uri} has index {index} after index {last})"
                )
        if rep.span_first is None:
            rep.span_first = index
            rep.first_is_epoch = rtype == "EPOCH"
        rep.span_last = index
        rep.last_is_mark = rtype == "MARK"
        self.last_scoped = index
        self.last_scoped_type = rtype
        self.bad_since_scoped = 0

    def finish(self) -> FileReport:
        self.flush_pending(self.prev_epoch_after)
        self.report.bad_after = self.bad_since_scoped if self.report.span_first is not None else 0
        return self.report


def _record_columns(records: list[Record]) -> list[list]:
    rows = [r.to_row() for r in records]
    return [list(c) for c in zip(*rows)] if rows else [[] for _ in FIELD_NAMES]


def _records_to_batch(records: list[Record], schema):
    """Arrow batch of canonical records (flags kept as their 32 bits)."""
    import pyarrow as pa

    cols = _record_columns(records)
    flags = FIELD_NAMES.index("flags")
    cols[flags] = [None if v is None else (v - (1 << 32) if v > INT32_MAX else v) for v in cols[flags]]
    arrays = [pa.array(c, type=schema.field(i).type) for i, c in enumerate(cols)]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _unencodable(r: Record) -> str | None:
    for name in FIELD_NAMES:
        v = getattr(r, name)
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return name
    return None


def _emit(records: list[Record], sink: _Sink):
    """Batches of ``records``; a record Arrow cannot hold (not UTF-8) becomes a bad record."""
    try:
        return [_records_to_batch(records, sink.schema)] if records else []
    except (UnicodeEncodeError, OverflowError, ValueError, TypeError) as exc:
        first_error = exc
    good = []
    for r in records:
        name = _unencodable(r)
        if name is None:
            try:
                _records_to_batch([r], sink.schema)
            except Exception as exc:  # pyarrow's conversion errors have several types
                name = f"a value ({exc})"
        if name is None:
            good.append(r)
        else:
            reason = f"record index {r.index}: field {name} is not valid UTF-8 text"
            sink.bad(ParseError(sink.f.uri, None, reason, server=r.server, index=r.index), r.epoch)
    if len(good) == len(records):  # pragma: no cover - the batch failed for a reason we did not find
        raise first_error
    return [_records_to_batch(good, sink.schema)] if good else []


def _reference_path(stream: IO[bytes], sink: _Sink, *, line_base=0, offset_base=0, context=None, after=None):
    """Parse with the importer (``parse_stream``): exact ``FILE:LINE`` errors, any format."""
    from epochsync.formats import parse_stream

    job, f = sink.job, sink.f
    errors: list[ParseError] = []
    opts = _parse_options(job, f.server, on_error=errors.append, context=context, after_index=after)
    cursor = (job.after_index or {}).get(f.server)
    out: list[Record] = []
    for r in parse_stream(job.fmt, stream, f.uri, opts):
        if errors:
            moved = [_shift(e, line_base, offset_base) for e in errors]
            errors.clear()
            sink.pending_bad.extend(moved)
        if r.server != f.server:
            reason = (
                f"record index {r.index} names server {r.server!r} but lies in the changelog directory "
                f"of server {f.server!r}"
            )
            sink.pending_bad.append(ParseError(f.uri, None, reason, server=r.server, index=r.index))
            continue
        closed = sink.closed_so_far
        if r.type == "EPOCH":
            sink.closed_so_far = r.epoch if closed is None else max(closed, r.epoch)
        elif closed is not None and r.epoch <= closed and job.epochs_from != "time":
            # a late record: its epoch may be replicated already, so it would be lost
            reason = f"record index {r.index} of epoch {r.epoch} comes after the server closed epoch {closed}"
            sink.pending_bad.append(ParseError(f.uri, None, reason, server=r.server, index=r.index))
            continue
        # bad lines before this record belong to the epoch the stream was in
        sink.flush_pending(sink.prev_epoch_after if sink.prev_epoch_after is not None else r.epoch)
        sink.prev_epoch_after = r.epoch + 1 if r.type == "EPOCH" and job.epochs_from != "time" else r.epoch
        sink.report.slow_lines += 1
        if r.type == "EPOCH" or job.epochs_from == "time":
            reached = r.epoch if r.type == "EPOCH" else r.epoch - 1
            if sink.report.closed_through is None or reached > sink.report.closed_through:
                sink.report.closed_through = reached
        if r.epoch <= job.last and (cursor is None or r.index > cursor):
            sink.scoped(r.index, r.epoch, r.type)
        if job.first <= r.epoch <= job.last:
            out.append(r)
            if len(out) >= BATCH_RECORDS:
                yield from _emit(out, sink)
                out = []
    if errors:
        sink.pending_bad.extend(_shift(e, line_base, offset_base) for e in errors)
    yield from _emit(out, sink)


def _shift(e: ParseError, lines: int, offset: int) -> ParseError:
    if not lines and not offset:
        return e
    return ParseError(
        e.file,
        None if e.line is None else e.line + lines,
        e.reason,
        offset=None if e.offset is None else e.offset + offset,
        text=e.text,
        server=e.server,
        index=e.index,
    )


#: bytes at the start of a chunk whose keys make the JSON reader's schema (see _read_json)
JSON_SAMPLE_BYTES = 64 * 1024


def _read_json(chunk: bytes, read_schema):
    """The chunk through pyarrow's JSON reader as a table in ``read_schema``, or None.

    Arrow's reader costs about a third more per record when the explicit schema names all
    28 fields while a record holds 5-12 of them. So the schema given is only the fields whose
    key appears in the first :data:`JSON_SAMPLE_BYTES`; any other key is inferred, and kept
    only if its inferred type is the schema's (or null, or an integer that fits). Anything
    else reads the chunk again with the full schema, and unknown keys are an error there.
    """
    import pyarrow as pa
    import pyarrow.json as pj

    read_opts = pj.ReadOptions(use_threads=False, block_size=max(len(chunk), 1 << 20) + 1)
    errors = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, UnicodeDecodeError)
    sample = chunk[:JSON_SAMPLE_BYTES]
    hint = pa.schema([f for f in read_schema if b'"' + f.name.encode() + b'"' in sample])
    if len(hint) < len(read_schema):
        try:
            table = pj.read_json(
                io.BytesIO(chunk),
                read_options=read_opts,
                parse_options=pj.ParseOptions(explicit_schema=hint, unexpected_field_behavior="infer"),
            )
            arrays = []
            for f in read_schema:
                i = table.schema.get_field_index(f.name)
                if i < 0:
                    arrays.append(pa.nulls(table.num_rows, f.type))
                    continue
                col = table.column(i)
                if col.type != f.type:
                    if not (
                        pa.types.is_null(col.type) or (pa.types.is_integer(col.type) and pa.types.is_integer(f.type))
                    ):
                        raise pa.ArrowInvalid(f"field {f.name} inferred as {col.type}")
                    col = col.cast(f.type)  # safe: an integer that does not fit raises
                arrays.append(col)
            if table.num_columns == sum(1 for f in read_schema if table.schema.get_field_index(f.name) >= 0):
                return pa.Table.from_arrays(arrays, schema=read_schema)
        except errors:
            pass
    try:
        return pj.read_json(
            io.BytesIO(chunk),
            read_options=read_opts,
            parse_options=pj.ParseOptions(explicit_schema=read_schema, unexpected_field_behavior="error"),
        )
    except errors:
        return None


def _fast_chunk(chunk: bytes, server: str, read_schema):
    """Canonical JSON Lines chunk → validated Arrow table, or None if any line needs the importer.

    Conservative: it accepts a chunk only if every line is one JSON object that the
    importer would accept unchanged (keep in step with ``Record.from_dict`` and
    ``formats.common.RecordChecker``). Anything else — blank lines, unknown keys, a
    number where a string belongs, an unsafe name — returns None.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    body = chunk[:-1] if chunk.endswith(b"\n") else chunk
    # Every line must start with "{" and end with "}": no blank lines (the importer skips
    # them), no object spread over lines; with one row per line below, each line is then
    # exactly one object. Counting bytes is far cheaper than a regular expression.
    if body[:1] != b"{" or body[-1:] != b"}":
        return None
    at = np.flatnonzero(np.frombuffer(body, np.uint8) == 10)
    newlines = len(at)
    if newlines:
        raw = np.frombuffer(body, np.uint8)
        if not ((raw[at - 1] == 125).all() and (raw[at + 1] == 123).all()):  # "}\n{"
            return None
    lines = newlines + 1
    table = _read_json(chunk, read_schema)
    if table is None:
        return None
    if table.num_rows != lines:
        return None  # two objects on a line, or one object over several
    table = table.combine_chunks()
    t = {name: table.column(name) for name in table.column_names}

    def any_(mask) -> bool:
        return bool(pc.any(pc.fill_null(mask, False)).as_py())

    def null_or_empty(col):
        return pc.or_(pc.is_null(col), pc.equal(pc.fill_null(col, "x"), ""))

    srv = t["server"]
    if srv.null_count:
        srv = pc.fill_null(srv, server)
    if not pc.all(pc.equal(srv, server)).as_py():
        return None
    typ = t["type"]
    if not pc.all(pc.is_in(typ, value_set=pa.array(sorted(RECORD_TYPES)))).as_py():
        return None
    if any_(pc.less(t["index"], 0)) or any_(pc.less(t["epoch"], 0)):
        return None
    for name in ("mode", "uid", "gid"):
        col = t[name]
        if col.null_count < len(col) and (any_(pc.less(col, 0)) or any_(pc.greater(col, 2**32 - 1))):
            return None

    def unsafe(names, present_only: bool):
        bad = pc.or_(
            pc.is_in(names, value_set=pa.array(["", ".", ".."])),
            pc.or_(pc.match_substring(names, "/"), pc.match_substring(names, "\x00")),
        )
        bad = pc.or_(bad, pc.greater(pc.binary_length(names), 255))
        return pc.fill_null(bad, not present_only)

    naming = pc.is_in(typ, value_set=pa.array(sorted(NAMING_TYPES)))
    unnaming = pc.is_in(typ, value_set=pa.array(sorted(UNNAMING_TYPES)))
    if any_(pc.and_(naming, unsafe(t["name"], False))) or any_(pc.and_(unnaming, unsafe(t["name"], True))):
        return None
    renme = pc.equal(typ, "RENME")
    if any_(renme):
        if any_(pc.and_(renme, pc.or_(unsafe(t["sname"], False), null_or_empty(t["sfid"])))):
            return None
        if any_(pc.and_(renme, null_or_empty(t["spfid"]))):
            return None
    if any_(pc.and_(pc.or_(naming, unnaming), null_or_empty(t["pfid"]))):
        return None
    if any_(pc.and_(pc.equal(typ, "SLINK"), pc.match_substring(t["symlink"], "\x00"))):
        return None

    # nested values the importer checks one by one
    layout = t["layout"]
    if layout.null_count < len(layout):
        ss, sc = pc.struct_field(layout, "stripe_size"), pc.struct_field(layout, "stripe_count")
        present = pc.is_valid(layout)
        if any_(pc.and_(present, pc.or_(pc.is_null(ss), pc.less(pc.fill_null(ss, 1), 1)))):
            return None
        if any_(pc.and_(present, pc.or_(pc.is_null(sc), pc.invert(pc.fill_null(pc.less_equal(sc, 65535), False))))):
            return None
        if any_(pc.and_(present, pc.less(pc.fill_null(sc, 0), 0))):
            return None
        objs = pc.struct_field(layout, "objects")
        flat = pc.list_flatten(objs)
        if flat.null_count or (
            len(flat) and (pc.struct_field(flat, "ost").null_count or pc.struct_field(flat, "oid").null_count)
        ):
            return None
    obj = t["object"]
    if obj.null_count < len(obj):
        present = pc.is_valid(obj)
        if any_(
            pc.and_(present, pc.or_(pc.is_null(pc.struct_field(obj, "ost")), pc.is_null(pc.struct_field(obj, "oid"))))
        ):
            return None
    ext = t["extents"]
    if ext.null_count < len(ext):
        flat = pc.list_flatten(ext)
        if flat.null_count:
            return None
        if len(flat):
            off, length = pc.struct_field(flat, "offset"), pc.struct_field(flat, "length")
            if off.null_count or length.null_count or any_(pc.less(off, 0)) or any_(pc.less(length, 0)):
                return None
    xv = t["xattr_value"]
    if xv.null_count < len(xv) and not pc.all(pc.match_substring_regex(pc.drop_null(xv), _BASE64)).as_py():
        return None
    idx = t["index"]
    if len(idx) > 1 and not pc.all(pc.greater(idx.slice(1), idx.slice(0, len(idx) - 1))).as_py():
        return None  # not strictly increasing: the importer names the line
    if srv is not t["server"]:
        table = table.set_column(table.column_names.index("server"), "server", srv)
    return table


def _finish_fast(table, sink: _Sink):
    """Continuity, closure and output for a validated fast-path table; False if the importer must judge."""
    import pyarrow as pa
    import pyarrow.compute as pc

    job = sink.job
    idx = table.column("index")
    epoch = table.column("epoch")
    typ = table.column("type")
    prev = sink.report.span_last
    last_any = sink.last_index_any
    if last_any is not None and len(idx) and idx[0].as_py() <= last_any:
        return None
    is_epoch = pc.equal(typ, "EPOCH")
    closing = pc.cumulative_max(pc.if_else(is_epoch, epoch, -1))
    first = pa.array([-1 if sink.closed_so_far is None else sink.closed_so_far], pa.int64())
    before = pa.chunked_array([first, *closing.slice(0, len(closing) - 1).chunks], type=pa.int64())
    late = pc.and_(pc.invert(is_epoch), pc.less_equal(epoch, before))
    if job.epochs_from != "time" and pc.any(late).as_py():
        return None  # a record after its epoch was closed: the importer path names it
    cursor = (job.after_index or {}).get(sink.f.server)
    mask = pc.less_equal(epoch, job.last)
    if cursor is not None:
        mask = pc.and_(mask, pc.greater(idx, cursor))
    scoped = pc.filter(idx, mask)
    if len(scoped):
        if job.continuity:
            if len(scoped) > 1:
                step = pc.subtract(scoped.slice(1), scoped.slice(0, len(scoped) - 1))
                if not pc.all(pc.equal(step, 1)).as_py():
                    # the one repeat allowed: a MARK's EPOCH record (Lustre MARK epochs)
                    styp = pc.filter(typ, mask)
                    repeat = pc.and_(
                        pc.equal(step, 0),
                        pc.and_(pc.equal(styp.slice(1), "EPOCH"), pc.equal(styp.slice(0, len(styp) - 1), "MARK")),
                    )
                    if not pc.all(pc.or_(pc.equal(step, 1), repeat)).as_py():
                        return None
            if prev is not None and scoped[0].as_py() != prev + 1:
                return None
        if sink.report.span_first is None:
            sink.report.span_first = scoped[0].as_py()
            sink.report.first_is_epoch = pc.filter(typ, mask)[0].as_py() == "EPOCH"
        sink.report.span_last = scoped[-1].as_py()
        sink.report.last_is_mark = pc.filter(typ, mask)[-1].as_py() == "MARK"
        sink.last_scoped = sink.report.span_last
        sink.last_scoped_type = pc.filter(typ, mask)[-1].as_py()
    if len(idx):
        sink.last_index_any = idx[-1].as_py()
        last_type = typ[-1].as_py()
        last_epoch = epoch[-1].as_py()
        sink.prev_epoch_after = last_epoch + 1 if last_type == "EPOCH" else last_epoch
    reached = pc.max(pc.filter(epoch, is_epoch)).as_py() if pc.any(is_epoch).as_py() else None
    if reached is not None:
        sink.closed_so_far = reached if sink.closed_so_far is None else max(sink.closed_so_far, reached)
    if job.epochs_from == "time" and len(epoch):
        later = pc.max(epoch).as_py() - 1
        reached = later if reached is None else max(reached, later)
    if reached is not None and (sink.report.closed_through is None or reached > sink.report.closed_through):
        sink.report.closed_through = reached
    keep = pc.and_(pc.greater_equal(epoch, job.first), pc.less_equal(epoch, job.last))
    out = pc.filter(table, keep) if not pc.all(keep).as_py() else table
    counts = pc.value_counts(out.column("epoch"))
    for item in counts.to_pylist():
        sink.report.records[item["values"]] = sink.report.records.get(item["values"], 0) + item["counts"]
    sink.report.fast_lines += table.num_rows
    if out.num_rows == 0:
        return []
    # base64 → bytes for the few xattr values; a layout without "objects" has none (as the importer)
    cols = {n: out.column(n) for n in out.column_names}
    xv = cols["xattr_value"]
    if xv.null_count < len(xv):
        cols["xattr_value"] = b64decode_column(xv)
    else:
        cols["xattr_value"] = pa.nulls(len(xv), type=pa.binary())
    lay = cols["layout"]
    if lay.null_count < len(lay):
        lay = lay.combine_chunks()
        objs = pc.struct_field(lay, "objects")
        if objs.null_count > lay.null_count:
            empty = pa.scalar([], type=objs.type)
            objs = pc.if_else(pc.is_null(objs), empty, objs)
            cols["layout"] = pa.StructArray.from_arrays(
                [pc.struct_field(lay, "stripe_size"), pc.struct_field(lay, "stripe_count"), objs],
                fields=list(lay.type),
                mask=pc.is_null(lay),
            )
    batches = pa.Table.from_arrays([cols[f.name] for f in sink.schema], schema=sink.schema).to_batches(
        max_chunksize=65536
    )
    return batches


_B64_LOOKUP = None


def b64decode_column(col):
    """Base64 strings (already checked against ``_BASE64``: padded, length a multiple of 4)
    → binary, null stays null; numpy over the concatenated characters, no per-value Python."""
    import numpy as np
    import pyarrow as pa

    global _B64_LOOKUP
    if _B64_LOOKUP is None:
        table = np.zeros(256, np.uint8)
        alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
        table[np.frombuffer(alphabet, np.uint8)] = np.arange(64, dtype=np.uint8)
        _B64_LOOKUP = table
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    arr = arr.cast(pa.large_string())
    n = len(arr)
    offsets = np.frombuffer(arr.buffers()[1], np.int64)[arr.offset : arr.offset + n + 1]
    data = arr.buffers()[2]
    chars = np.frombuffer(data, np.uint8)[offsets[0] : offsets[-1]] if data is not None else np.zeros(0, np.uint8)
    lengths = np.diff(offsets)
    if (lengths % 4).any():  # pragma: no cover - _fast_chunk checked the spelling
        raise ValueError("base64 value whose length is not a multiple of 4")
    v = _B64_LOOKUP[chars].reshape(-1, 4).astype(np.uint8)
    out = np.empty((len(v), 3), np.uint8)
    out[:, 0] = (v[:, 0] << 2) | (v[:, 1] >> 4)
    out[:, 1] = ((v[:, 1] & 15) << 4) | (v[:, 2] >> 2)
    out[:, 2] = ((v[:, 2] & 3) << 6) | v[:, 3]
    out = out.reshape(-1)
    # padding: each "=" at a value's end drops one decoded byte
    ends = offsets[1:] - offsets[0]
    pad = np.zeros(n, np.int64)
    has = lengths > 0
    pad[has] = (chars[ends[has] - 1] == 61).astype(np.int64) + (chars[ends[has] - 2] == 61)
    out_len = lengths // 4 * 3 - pad
    keep = np.ones(len(out), bool)
    out_end = np.cumsum(lengths // 4 * 3)
    keep[(out_end - 1)[pad >= 1]] = False
    keep[(out_end - 2)[pad >= 2]] = False
    decoded = out[keep]
    new_offsets = np.zeros(n + 1, np.int64)
    np.cumsum(out_len, out=new_offsets[1:])
    validity = arr.buffers()[0]
    if validity is not None and arr.offset:
        validity = pa.array(arr.is_valid()).buffers()[1]
    result = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(),
        n,
        [validity, pa.py_buffer(new_offsets), pa.py_buffer(decoded.tobytes())],
        null_count=arr.null_count,
    )
    return result.cast(pa.binary())


def _count_epochs(records_counts: dict[int, int], batch) -> None:
    import pyarrow.compute as pc

    for item in pc.value_counts(batch.column("epoch")).to_pylist():
        records_counts[item["values"]] = records_counts.get(item["values"], 0) + item["counts"]


def _timed(batches: Iterable, rep: FileReport) -> Iterator:
    """Pass ``batches`` through, adding the time spent producing them (not consuming) to ``rep``."""
    it = iter(batches)
    while True:
        started = time.perf_counter()
        try:
            item = next(it)
        except StopIteration:
            rep.seconds += time.perf_counter() - started
            return
        rep.seconds += time.perf_counter() - started
        yield item


def _ingest_jsonl_file(sink: _Sink, read_schema) -> Iterator:
    """One JSON Lines file: fast path chunk by chunk, the importer from the first doubtful chunk on."""

    def fast(chunk: bytes):
        table = _fast_chunk(chunk, sink.f.server, read_schema)
        return None if table is None else _finish_fast(table, sink)

    def importer(stream, lines_before: int, bytes_before: int):
        after = sink.last_index_any
        return _reference_path(
            stream,
            sink,
            line_base=lines_before,
            offset_base=bytes_before,
            after={sink.f.server: after} if after is not None else None,
        )

    return _chunked(sink, fast, importer)


def _ingest_lustre_file(sink: _Sink, context) -> Iterator:
    """One Lustre text file: the vectorized parse chunk by chunk (``formats.lustre_fast``), the
    importer from the first doubtful chunk on; ``context`` carries index order and MARK epochs."""
    from epochsync.formats.lustre_fast import parse_lustre_chunk

    job = sink.job
    opts = _parse_options(job, sink.f.server, context=context)
    grid = (job.start_ns, job.interval_ns)

    def fast(chunk: bytes):
        parsed = parse_lustre_chunk(chunk, opts, sink.schema, time_grid=grid)
        if parsed is None:
            return None
        table, state = parsed
        if table.num_rows == 0:  # blank lines only
            return []
        out = _finish_fast(table, sink)
        if out is not None:
            state.apply(opts)
        return out

    def importer(stream, lines_before: int, bytes_before: int):
        return _reference_path(stream, sink, line_base=lines_before, offset_base=bytes_before, context=context)

    return _chunked(sink, fast, importer)


def _chunked(sink: _Sink, fast, importer) -> Iterator:
    """A file in chunks of whole lines: ``fast(chunk)`` (batches, or None when in doubt) until
    it doubts, then ``importer(stream, lines_before, bytes_before)`` for the rest of the file."""
    f, job = sink.f, sink.job
    with _open(f, job.s3) as raw:
        carry = b""
        lines_before = 0
        bytes_before = 0
        while True:
            data = raw.read(CHUNK_BYTES)
            chunk = carry + data
            if not chunk:
                break
            if data:
                cut = chunk.rfind(b"\n") + 1
                if cut == 0:
                    carry = chunk
                    continue
                chunk, carry = chunk[:cut], chunk[cut:]
            else:
                carry = b""
            out = fast(chunk)
            if out is None:
                # the importer takes over from this chunk to the end of the file
                stream = io.BufferedReader(_Chain(chunk + carry, raw), buffer_size=1 << 20)
                for b in importer(stream, lines_before, bytes_before):
                    _count_epochs(sink.report.records, b)
                    yield b
                return
            yield from out
            lines_before += chunk.count(b"\n")
            bytes_before += len(chunk)
            if not data:
                break


def _ingest_server_file(sink: _Sink, context) -> Iterator:
    """One file through the importer; ``context`` carries index order and MARK epochs between files."""
    with _open(sink.f, sink.job.s3) as raw:
        for b in _reference_path(raw, sink, context=context):
            _count_epochs(sink.report.records, b)
            yield b


def _task_runner(tasks: list[list[ChangelogFile]], job: IngestJob):
    """The ``mapInArrow`` function: each input row names a task (a file, or a server's files).

    JSON Lines files stand alone; other formats carry MARK epochs and index order from
    file to file of a server, so a task is all of that server's files, in order. The task
    writes each file's Parquet into ``job.staging_dir`` itself and yields one report row
    (JSON) per file: the reports come back as rows of the job's output (as under Spark Connect they must).
    """

    def run(batches):
        import pyarrow as pa

        from epochsync.formats.common import ParseContext

        out_schema, read_schema = _arrow_schemas()
        for b in batches:
            for task_id in b.column(0).to_pylist():
                context = ParseContext()
                for f in tasks[task_id]:
                    sink = _Sink(job, f, out_schema)
                    if job.fmt == "jsonl":
                        produced = _ingest_jsonl_file(sink, read_schema)
                    elif job.fmt == "lustre":
                        produced = _ingest_lustre_file(sink, context)
                    else:
                        produced = _ingest_server_file(sink, context)
                    started = time.perf_counter()
                    _write_parquet(_timed(produced, sink.report), job.staging_dir, f, out_schema)
                    sink.report.write_seconds = time.perf_counter() - started - sink.report.seconds
                    report = json.dumps(_report_to_dict(sink.finish()))
                    yield pa.RecordBatch.from_arrays([pa.array([report])], names=["report"])

    return run


#: rows per Parquet row group of an ingested file: fixed, so that the same records give
#: the same bytes whatever the window or the batches they came in (a re-ingest is compared
#: byte for byte with what is committed)
ROW_GROUP_ROWS = 65536


def part_file_name(f: ChangelogFile) -> str:
    """The Parquet file a changelog file's records of one epoch go to: a function of the
    changelog file's URI alone (not of its place in a listing that purge shortens)."""
    import hashlib

    digest = hashlib.sha1(f.uri.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return f"part-{f.server}-{digest}.snappy.parquet"


class _EpochPart:
    """One epoch's Parquet file of one changelog file, written in fixed-size row groups."""

    def __init__(self, directory: str, name: str, schema):
        import pyarrow.parquet as pq

        os.makedirs(directory, exist_ok=True)
        self.final = os.path.join(directory, name)
        self.tmp = os.path.join(directory, f".{name}.tmp-{uuid.uuid4().hex[:8]}")
        self.schema = schema
        self.writer = pq.ParquetWriter(self.tmp, schema, compression="snappy")
        self.pending: list = []
        self.rows = 0

    def add(self, batch) -> None:
        self.pending.append(batch)
        self.rows += batch.num_rows
        while self.rows >= ROW_GROUP_ROWS:
            self._flush(ROW_GROUP_ROWS)

    def _flush(self, n: int) -> None:
        import pyarrow as pa

        table = pa.Table.from_batches(self.pending, schema=self.schema)
        # one contiguous chunk per column: the writer's pages then do not depend on how
        # the rows were batched
        self.writer.write_table(table.slice(0, n).combine_chunks(), row_group_size=n)
        rest = table.slice(n)
        self.pending = rest.to_batches()
        self.rows = rest.num_rows

    def close(self) -> None:
        """Write the last row group and put the file in place under its final name."""
        if self.rows:
            self._flush(self.rows)
        self.writer.close()
        os.replace(self.tmp, self.final)

    def abort(self) -> None:
        if self.writer.is_open:
            self.writer.close()
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.tmp)


def _write_parquet(batches: Iterable, staging_dir: str, f: ChangelogFile, schema) -> None:
    """Write ``batches`` as ``epoch=E/server=X/part-*.parquet`` under ``staging_dir`` (Spark's layout).

    Partition columns live in the path only, as Spark writes them. File names are a
    function of the file (a retried task overwrites its own output) and appear only
    when complete (written under a hidden name, then renamed).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    data_fields = [fld for fld in schema if fld.name not in ("epoch", "server")]
    data_schema = pa.schema(data_fields)
    parts: dict[int, _EpochPart] = {}
    try:
        for batch in batches:
            epochs = batch.column("epoch")
            for e in pc.unique(epochs).to_pylist():
                part = batch if pc.all(pc.equal(epochs, e)).as_py() else batch.filter(pc.equal(epochs, e))
                if e not in parts:
                    d = os.path.join(staging_dir, f"epoch={e}", f"server={f.server}")
                    parts[e] = _EpochPart(d, part_file_name(f), data_schema)
                cols = [part.column(fld.name) for fld in data_fields]
                parts[e].add(pa.RecordBatch.from_arrays(cols, schema=data_schema))
        for p in parts.values():
            p.close()
    except BaseException:
        for p in parts.values():
            p.abort()
        raise


def _report_to_dict(rep: FileReport) -> dict:
    d = dict(rep.__dict__)
    d["records"] = dict(rep.records)
    return d


# =========================================================================== driver side


class IngestError(EpochError):
    """The epoch cannot be ingested: bad records, an index gap, or an open epoch."""

    def __init__(self, problems: list[str], total: int | None = None, hint: str = ""):
        self.problems = problems
        total = len(problems) if total is None else total
        more = f" (and {total - 1} more)" if total > 1 else ""
        super().__init__(problems[0] + more + (f"; {hint}" if hint else ""))


#: cores assumed when the session says neither spark.default.parallelism nor a local[N] master
DEFAULT_CORES = 2


def task_slots(spark) -> int:
    """How many tasks an ingest job may have: :data:`TASKS_PER_CORE` per core of the session.

    Cores: ``spark.default.parallelism`` when set, else ``spark.cores.max``, else the N of
    a ``local[N]`` master, else :data:`DEFAULT_CORES`. Read through ``spark.conf``, which
    Spark Connect serves too.
    """

    def conf(key: str) -> str | None:
        try:
            return spark.conf.get(key, None)
        except Exception:  # a key the server refuses to show: not set, as far as we know
            return None

    cores = None
    for key in ("spark.default.parallelism", "spark.cores.max"):
        value = conf(key)
        if value and value.strip().isdigit() and int(value) > 0:
            cores = int(value)
            break
    if cores is None:
        m = re.fullmatch(r"local(?:\[(\d+|\*)(?:,\s*\d+)?\])?", (conf("spark.master") or "").strip())
        if m:
            n = m.group(1)
            cores = 1 if n is None else (os.cpu_count() or DEFAULT_CORES) if n == "*" else int(n)
    return max(1, cores or DEFAULT_CORES) * TASKS_PER_CORE


def run_ingest(
    cfg,
    source: str,
    first_epoch: int,
    last_epoch: int | None = None,
    spark=None,
    *,
    consumer: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Ingest epochs ``first_epoch..last_epoch`` of ``source`` into the warehouse; returns figures.

    Raises :class:`IngestError` (nothing written) when a server has not closed
    ``last_epoch``, an index is missing, or a record is bad and the source does not say
    ``on_bad_record: quarantine``. ``consumer`` picks the cursor continuity starts from
    (default: the minimum over the source's consumers). The parse is one Spark job
    (``spark``, a classic or a Spark Connect session; one is started if None and there
    is a file to read); its executors write the Parquet into the warehouse, which must be
    ``file://`` on a file system they share with this process. Two ingests of the same
    epochs may run at once (two targets, a retry): their commits take turns, and an epoch
    whose committed files hold the same bytes is left in place (``unchanged_epochs``).
    """
    from epochsync.warehouse import fs as warehouse_fs

    last_epoch = first_epoch if last_epoch is None else last_epoch
    if first_epoch < 1 or last_epoch < first_epoch:
        raise EpochError(f"epochs to ingest must satisfy 1 ≤ first ≤ last, got {first_epoch}..{last_epoch}")
    if not warehouse_fs.is_local(cfg.warehouse):
        raise EpochError(
            f"ingest needs a file:// warehouse (local, or a file system shared by the Spark executors "
            f"at the same path), not {cfg.warehouse}"
        )
    say = progress or (lambda line: None)
    started = time.perf_counter()
    src = cfg.source(source)
    _require_epochs(src)
    wh = Warehouse(cfg.warehouse)
    fmt = src.changelogs.format
    after = read_cursor_indexes(cfg.warehouse, source, consumer)
    start_ns, interval_ns = _epoch_grid(src)
    job = IngestJob(
        source=source,
        fmt=fmt,
        epochs_from=src.changelogs.epochs_from,
        first=first_epoch,
        last=last_epoch,
        continuity=fmt != "gluster",  # Gluster has no native index (INTERNALS "Epochs")
        after_index=after,
        s3=_changelog_s3(src),
        start_ns=start_ns,
        interval_ns=interval_ns,
    )
    phases: dict[str, float] = {}
    try:
        files = list_changelog_files(src)  # on the caller: a few LISTs per server
    except StoreError as exc:
        raise StoreError(f"ingest of source {source!r}: {exc}") from None
    phases["list"] = time.perf_counter() - started
    for server in src.servers:
        fl = files.get(server, [])
        say(f"{server}: {len(fl)} changelog file(s), {sum(f.size for f in fl)} bytes")

    listed = files
    skipped_closed: dict[str, int] = {}
    if fmt == "jsonl" and job.epochs_from == "records" and first_epoch > 1:
        # skip what earlier epochs' runs already read: the last line of each file says
        every = [f for fl in files.values() for f in fl]
        if job.s3 is None:
            tails = {f.uri: file_tail(f) for f in every}
        else:
            from concurrent.futures import ThreadPoolExecutor

            s3 = job.s3
            try:
                with ThreadPoolExecutor(8) as pool:
                    tails = dict(zip((f.uri for f in every), pool.map(lambda f: file_tail(f, s3), every)))
            except StoreError as exc:
                raise StoreError(f"ingest of source {source!r}: {exc}") from None
        files = settled_files(files, tails, first_epoch, after)
        for server, fl in listed.items():
            # a skipped file's closing EPOCH still counts for the closure
            for f in fl[: len(fl) - len(files[server])]:
                tail = tails[f.uri]
                if tail is not None and tail[2] == "EPOCH" and tail[1] > skipped_closed.get(server, -1):
                    skipped_closed[server] = tail[1]
    tasks: list[list[ChangelogFile]] = []
    if any(files.values()):
        if spark is None:
            from epochsync.spark import spark_session

            spark = spark_session("epochsync-ingest")
        # jsonl files stand alone: packed into a few balanced tasks per core; other formats
        # carry MARK epochs and index order from file to file: one task per server.
        if fmt == "jsonl":
            every = [f for fl in files.values() for f in fl]
            # a task costs a Python worker's start on a fresh session: small epochs take few
            by_size = max(1, -(-sum(f.size for f in every) // BYTES_PER_TASK))
            tasks = pack_files(every, min(task_slots(spark), by_size))
        else:
            tasks = [fl for fl in files.values() if fl]
    staging = f"{wh.records(source)}/_ingest-{uuid.uuid4().hex[:12]}"
    # executors write Parquet with pyarrow straight into the (local or shared) staging
    # directory: no Arrow → row conversion and no sort in the JVM
    job = dataclasses.replace(job, staging_dir=local_path(staging))
    try:
        reports: list[dict] = []
        if tasks:
            ids = spark.range(0, len(tasks), 1, numPartitions=len(tasks))
            try:
                rows = ids.mapInArrow(_task_runner(tasks, job), "report string").collect()
            except Exception as exc:  # Py4J, PySpark and Spark Connect wrap what the executor raised
                raise _executor_failure(exc, source) from None
            reports = _dedupe([json.loads(r["report"]) for r in rows])
        phases["spark_job"] = time.perf_counter() - started - phases["list"]
        result = _judge(src, job, reports, skipped_closed)
        unchanged = _commit(wh, src, job, staging, files, result)
    finally:
        warehouse_fs.delete(staging)
    phases["check_and_commit"] = time.perf_counter() - started - phases["list"] - phases["spark_job"]

    stats = _stats(src, job, files, reports, result, time.perf_counter() - started)
    stats["unchanged_epochs"] = unchanged
    for server, s in stats["servers"].items():
        # files before the run's epochs (and below the cursor) are listed but not read
        s["files_skipped"] = len(listed.get(server, [])) - len(files.get(server, []))
        if server in skipped_closed and (s["closed_through"] or -1) < skipped_closed[server]:
            s["closed_through"] = skipped_closed[server]
    stats["phase_seconds"] = {k: round(v, 3) for k, v in phases.items()}
    for server, s in stats["servers"].items():
        say(
            f"{server}: {s['records']} records of epochs {first_epoch}..{last_epoch}, "
            f"closed through epoch {s['closed_through']}, {s['bad_records']} bad"
        )
    if unchanged:
        say(f"epoch(s) {', '.join(map(str, unchanged))}: already ingested with the same bytes, left in place")
    return stats


_EXECUTOR_ERROR = re.compile(r"epochsync\.core\.errors\.(\w+): (.+)")


def _executor_failure(exc: Exception, source: str) -> EpochsyncError:
    """One line for a failed Spark job: the executor's own epochsync error if it raised one."""
    text = str(exc)
    found = _EXECUTOR_ERROR.findall(text)
    if found:
        kind, message = found[-1]
        cls = StoreError if kind == "StoreError" else EpochError
        return cls(f"ingest of source {source!r}: {message.strip()}")
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), repr(exc))
    return EpochError(f"ingest of source {source!r} failed on an executor: {first[:500]}")


def pack_files(files: list[ChangelogFile], slots: int) -> list[list[ChangelogFile]]:
    """At most ``slots`` tasks of similar total size (largest file first into the lightest task).

    One task per file would cost more in scheduling than in work when a source has many
    small files (one per server per epoch); a few tasks per core keep both cores busy.
    """
    import heapq

    bins: list[tuple[int, int, list[ChangelogFile]]] = [(0, i, []) for i in range(min(slots, len(files)))]
    for f in sorted(files, key=lambda f: (-f.size, f.uri)):
        size, i, members = heapq.heappop(bins)
        members.append(f)
        heapq.heappush(bins, (size + max(f.size, 1), i, members))
    return [members for _, _, members in sorted(bins, key=lambda b: -b[0])]


def _dedupe(reports: list[dict]) -> list[dict]:
    """One report per file (a retried task reports twice), in server, file order."""
    by_file = {(r["server"], r["ordinal"]): r for r in reports}
    return [by_file[k] for k in sorted(by_file)]


@dataclass
class _Judgement:
    bad: list[tuple[int | None, dict]]
    bad_total: int
    records: dict[int, int]


def _judge(src, job: IngestJob, reports: list[dict], skipped_closed: Mapping[str, int]) -> _Judgement:
    """Closure, bad records and continuity; raises IngestError when the run must not commit."""
    closed: dict[str, int | None] = {s: skipped_closed.get(s) for s in src.servers}
    for r in reports:
        c = r["closed_through"]
        if c is not None and (closed[r["server"]] is None or c > closed[r["server"]]):
            closed[r["server"]] = c
    closure = Closure(job.last, closed, src.name)
    if not closure.closed:
        raise IngestError([closure.describe()], hint="ingest runs only on closed epochs (the sensor waits for them)")

    bad = [(e, d) for r in reports for e, d in r["errors"]]
    bad_total = len(bad) + sum(r["errors_dropped"] for r in reports)
    if bad and src.on_bad_record != "quarantine":
        d = bad[0][1]
        first = ParseError(d["file"], d["line"], d["reason"], offset=d["offset"])
        raise IngestError(
            [f"bad record of server {d['server']}: {first}"],
            total=bad_total,
            hint="fix the changelog, or set on_bad_record: quarantine for the source to set bad records aside",
        )
    gaps = [g for r in reports for g in r["gaps"]]
    if job.continuity:
        spans = [
            IndexSpan(
                r["server"],
                r["file"],
                r["span_first"],
                r["span_last"],
                r["bad_before"],
                r["bad_after"],
                r["last_is_mark"],
                r["first_is_epoch"],
            )
            for r in reports
        ]
        gaps += find_index_gaps(spans, job.after_index)
    if gaps:
        raise IngestError(gaps, hint="records were lost: the epoch cannot be replicated exactly")
    records: dict[int, int] = {}
    for r in reports:
        for e, n in r["records"].items():
            records[int(e)] = records.get(int(e), 0) + n
    return _Judgement(bad, bad_total, records)


#: in ``records/source=S/``: ingests of the source commit one at a time while they hold it
COMMIT_LOCK = "_ingest.lock"


def _commit(wh: Warehouse, src, job: IngestJob, staging: str, files, result: _Judgement) -> list[int]:
    """Quarantine first, then each epoch's directory swapped in; returns the epochs left in place.

    Under the source's commit lock, so two ingests of one epoch (two targets, a retry)
    never interleave their swaps. An epoch whose committed data files are byte for byte the
    staged ones is not swapped: only its marker is replaced (one rename), so a reader of
    those files (another target's merge) is not disturbed. Otherwise the staged directory,
    marker included, replaces the committed one in one atomic exchange where the file
    system can (Linux ``renameat2``), else by two renames.
    """
    from epochsync.warehouse import fs as warehouse_fs

    by_epoch: dict[int, list[dict]] = {}
    for epoch, d in result.bad:
        by_epoch.setdefault(job.first if epoch is None else epoch, []).append(d)
    markers = _markers(src, job, files, result)
    unchanged = []
    base = local_path(wh.records(src.name))
    with warehouse_fs.lock_file(os.path.join(base, COMMIT_LOCK)):
        for epoch in range(job.first, job.last + 1):
            qfile = os.path.join(local_path(wh.quarantine(src.name, epoch)), "part-00000.jsonl")
            entries = by_epoch.get(epoch)
            if entries:
                text = "".join(json.dumps(d, ensure_ascii=False, separators=(",", ":")) + "\n" for d in entries)
                warehouse_fs.write_text_atomic(qfile, text)
            else:
                warehouse_fs.delete(os.path.dirname(qfile))
        for epoch in range(job.first, job.last + 1):
            staged = os.path.join(local_path(staging), f"epoch={epoch}")
            final = local_path(wh.records(src.name, epoch))
            os.makedirs(staged, exist_ok=True)  # an epoch with no records is still ingested
            if same_data_files(staged, final):
                warehouse_fs.write_text_atomic(os.path.join(final, INGEST_MARKER), markers[epoch])
                unchanged.append(epoch)
            else:
                warehouse_fs.write_text_atomic(os.path.join(staged, INGEST_MARKER), markers[epoch])
                warehouse_fs.move_replacing(staged, final)
    return unchanged


def _data_files(root: str) -> dict[str, int]:
    """Relative path → size of the files readers read under ``root`` (names starting with
    ``_`` or ``.`` aside, as Spark and pyarrow skip them)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(("_", "."))]
        for name in filenames:
            if not name.startswith(("_", ".")):
                path = os.path.join(dirpath, name)
                out[os.path.relpath(path, root)] = os.path.getsize(path)
    return out


def same_data_files(a: str, b: str) -> bool:
    """True if directories ``a`` and ``b`` both exist and hold the same data files, byte for byte."""
    if not (os.path.isdir(a) and os.path.isdir(b)):
        return False
    fa, fb = _data_files(a), _data_files(b)
    if fa != fb:
        return False
    for rel in fa:
        with open(os.path.join(a, rel), "rb") as x, open(os.path.join(b, rel), "rb") as y:
            while True:
                bx, by = x.read(1 << 20), y.read(1 << 20)
                if bx != by:
                    return False
                if not bx:
                    break
    return True


#: in each ingested epoch's records directory (Spark's readers skip ``_`` files): what was read
INGEST_MARKER = "_epochsync_ingest.json"


def _markers(src, job: IngestJob, files, result: _Judgement) -> dict[int, str]:
    """Per epoch: the window, the consumer cursor it started from and the changelog files
    read (with sizes): the inputs that decide the result, so :func:`ingest_is_current`
    can tell a second target's ingest of the same closed epoch that there is nothing to redo."""
    out = {}
    for epoch in range(job.first, job.last + 1):
        marker = {
            "source": src.name,
            "epoch": epoch,
            "window": [job.first, job.last],
            "records": result.records.get(epoch, 0),
            "quarantined": sum(1 for e, _ in result.bad if (job.first if e is None else e) == epoch),
            "after_index": dict(job.after_index) if job.after_index is not None else None,
            "files": {f.uri: f.size for fl in files.values() for f in fl},
            "ingested_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        out[epoch] = json.dumps(marker, sort_keys=True)
    return out


def ingest_is_current(cfg, source: str, first_epoch: int, last_epoch: int, consumer: str | None = None) -> str | None:
    """Why epochs ``first..last`` need no new ingest, or None (then run it).

    Current means: a ``file://`` warehouse holds a marker for every epoch of the window
    written by an ingest of exactly that window; every changelog file it read is still
    there with the same size; and ``consumer``'s cursor (what the ingest keeps records
    above and checks continuity from) is the one that ingest started from. Then a new
    ingest would write the same records. Pure Python, no
    Spark: the Airflow task asks before it pays for a spark-submit. Anything unusual
    (another warehouse scheme, a changed or missing file, a different window) says None.
    """
    if not str(cfg.warehouse).startswith("file://"):
        return None
    src = cfg.source(source)
    wh = Warehouse(cfg.warehouse)
    markers = []
    for epoch in range(first_epoch, last_epoch + 1):
        path = os.path.join(local_path(wh.records(source, epoch)), INGEST_MARKER)
        try:
            with open(path, encoding="utf-8") as fh:
                marker = json.load(fh)
        except (OSError, ValueError):
            return None
        if marker.get("window") != [first_epoch, last_epoch] or marker.get("source") != source:
            return None
        markers.append(marker)
    try:
        listed = {f.uri: f.size for fl in list_changelog_files(src).values() for f in fl}
    except EpochsyncError:
        return None
    if any(listed.get(uri) != size for uri, size in markers[0]["files"].items()):
        return None
    if read_cursor_indexes(cfg.warehouse, source, consumer) != markers[0]["after_index"]:
        return None
    records = sum(m["records"] for m in markers)
    window = f"epoch {first_epoch}" if first_epoch == last_epoch else f"epochs {first_epoch}..{last_epoch}"
    return (
        f"{window} of source {source!r} already ingested at {markers[0]['ingested_at']} ({records} records; "
        f"its {len(markers[0]['files'])} changelog file(s) unchanged): nothing to redo"
    )


def _stats(src, job: IngestJob, files, reports: list[dict], result: _Judgement, seconds: float) -> dict:
    servers = {}
    for s in src.servers:
        rs = [r for r in reports if r["server"] == s]
        closed = [r["closed_through"] for r in rs if r["closed_through"] is not None]
        servers[s] = {
            "files": len(files.get(s, [])),
            "bytes": sum(f.size for f in files.get(s, [])),
            "records": sum(sum(r["records"].values()) for r in rs),
            "bad_records": sum(len(r["errors"]) + r["errors_dropped"] for r in rs),
            "closed_through": max(closed) if closed else None,
            "fast_path_records": sum(r["fast_lines"] for r in rs),
            "reference_path_records": sum(r["slow_lines"] for r in rs),
        }
    return {
        "source": src.name,
        "first_epoch": job.first,
        "last_epoch": job.last,
        "records": sum(result.records.values()),
        "records_per_epoch": {e: result.records.get(e, 0) for e in range(job.first, job.last + 1)},
        "quarantined": result.bad_total,
        #: time the executors spent reading, parsing and checking (summed over tasks)
        "parse_seconds": round(sum(r["seconds"] for r in reports), 3),
        "write_seconds": round(sum(r.get("write_seconds", 0.0) for r in reports), 3),
        "servers": servers,
        "seconds": round(seconds, 3),
    }


def read_records(spark, warehouse: str, source: str, first_epoch: int, last_epoch: int | None = None):
    """Ingested records of epochs ``first..last`` as a DataFrame in the canonical schema."""
    from pyspark.sql import functions as F

    from epochsync.core.schema import record_struct_type

    last_epoch = first_epoch if last_epoch is None else last_epoch
    wh = Warehouse(warehouse)
    schema = record_struct_type()
    paths = [wh.records(source, e) for e in range(first_epoch, last_epoch + 1)]
    from epochsync.warehouse import fs as warehouse_fs

    missing = [p for p in paths if not warehouse_fs.exists(p)]
    if missing:
        raise EpochError(f"not ingested yet: {', '.join(missing)}")
    df = spark.read.schema(schema).option("basePath", wh.records(source)).parquet(*paths)
    return df.filter(F.col("epoch").between(first_epoch, last_epoch)).select(*schema.fieldNames())
