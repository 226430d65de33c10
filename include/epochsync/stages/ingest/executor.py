"""The executor side of ingest: parse a task's changelog files (fast Arrow path, or the importers) into Parquet parts."""

from __future__ import annotations

import contextlib
import io
import json
import os
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from epochsync.core.arrow import array, scalar
from epochsync.core.errors import ParseError
from epochsync.core.schema import FIELD_NAMES, INT32_MAX, NAMING_TYPES, RECORD_TYPES, UNNAMING_TYPES, Record
from epochsync.stages.ingest.cursors import IndexSpan

#: Bytes a fast-path chunk holds (cut at a line end); bounds an executor's memory per file.
from epochsync.stages.ingest.files import ChangelogFile, _Chain, _open

#: Bytes a fast-path chunk holds (cut at a line end); bounds an executor's memory per file.
CHUNK_BYTES = 32 * 1024 * 1024


#: Records per Arrow batch handed to Spark from the reference path.
BATCH_RECORDS = 32768


#: Bad records kept per file for the error message and the quarantine (the rest are counted).
MAX_ERRORS_PER_FILE = 10000


#: what base64.b64decode(validate=True) accepts
_BASE64 = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"


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
        """Returns the file's in-scope index span, for the continuity checks."""
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

    from epochsync.core.schema import record_arrow_schema

    out = record_arrow_schema()
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

    # every Python value below goes through epochsync.core.arrow (pa.scalar would import pandas)
    no, zero = scalar(False), scalar(0)

    def any_(mask) -> bool:
        return bool(pc.any(pc.fill_null(mask, no)).as_py())

    def null_or_empty(col):
        return pc.or_(pc.is_null(col), pc.equal(pc.fill_null(col, scalar("x")), scalar("")))

    srv = t["server"]
    if srv.null_count:
        srv = pc.fill_null(srv, scalar(server))
    if not pc.all(pc.equal(srv, scalar(server))).as_py():
        return None
    typ = t["type"]
    if not pc.all(pc.is_in(typ, value_set=array(sorted(RECORD_TYPES), pa.string()))).as_py():
        return None
    if any_(pc.less(t["index"], zero)) or any_(pc.less(t["epoch"], zero)):
        return None
    for name in ("mode", "uid", "gid"):
        col = t[name]
        if col.null_count < len(col) and (any_(pc.less(col, zero)) or any_(pc.greater(col, scalar(2**32 - 1)))):
            return None

    def unsafe(names, present_only: bool):
        bad = pc.or_(
            pc.is_in(names, value_set=array(["", ".", ".."], pa.string())),
            pc.or_(pc.match_substring(names, "/"), pc.match_substring(names, "\x00")),
        )
        bad = pc.or_(bad, pc.greater(pc.binary_length(names), scalar(255)))
        return pc.fill_null(bad, scalar(not present_only))

    naming = pc.is_in(typ, value_set=array(sorted(NAMING_TYPES), pa.string()))
    unnaming = pc.is_in(typ, value_set=array(sorted(UNNAMING_TYPES), pa.string()))
    if any_(pc.and_(naming, unsafe(t["name"], False))) or any_(pc.and_(unnaming, unsafe(t["name"], True))):
        return None
    renme = pc.equal(typ, scalar("RENME"))
    if any_(renme):
        if any_(pc.and_(renme, pc.or_(unsafe(t["sname"], False), null_or_empty(t["sfid"])))):
            return None
        if any_(pc.and_(renme, null_or_empty(t["spfid"]))):
            return None
    if any_(pc.and_(pc.or_(naming, unnaming), null_or_empty(t["pfid"]))):
        return None
    if any_(pc.and_(pc.equal(typ, scalar("SLINK")), pc.match_substring(t["symlink"], "\x00"))):
        return None

    # nested values the importer checks one by one
    layout = t["layout"]
    if layout.null_count < len(layout):
        ss, sc = pc.struct_field(layout, "stripe_size"), pc.struct_field(layout, "stripe_count")
        present = pc.is_valid(layout)
        one = scalar(1)
        if any_(pc.and_(present, pc.or_(pc.is_null(ss), pc.less(pc.fill_null(ss, scalar(1, ss.type)), one)))):
            return None
        if any_(
            pc.and_(present, pc.or_(pc.is_null(sc), pc.invert(pc.fill_null(pc.less_equal(sc, scalar(65535)), no))))
        ):
            return None
        if any_(pc.and_(present, pc.less(pc.fill_null(sc, scalar(0, sc.type)), zero))):
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
        length = pc.struct_field(obj, "size")
        if length.null_count < len(length) and any_(pc.and_(present, pc.less(length, zero))):
            return None
    ext = t["extents"]
    if ext.null_count < len(ext):
        flat = pc.list_flatten(ext)
        if flat.null_count:
            return None
        if len(flat):
            off, length = pc.struct_field(flat, "offset"), pc.struct_field(flat, "length")
            if off.null_count or length.null_count or any_(pc.less(off, zero)) or any_(pc.less(length, zero)):
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
    is_epoch = pc.equal(typ, scalar("EPOCH"))
    closing = pc.cumulative_max(pc.if_else(is_epoch, epoch, scalar(-1)))
    first = array([-1 if sink.closed_so_far is None else sink.closed_so_far], pa.int64())
    before = pa.chunked_array([first, *closing.slice(0, len(closing) - 1).chunks], type=pa.int64())
    late = pc.and_(pc.invert(is_epoch), pc.less_equal(epoch, before))
    if job.epochs_from != "time" and pc.any(late).as_py():
        return None  # a record after its epoch was closed: the importer path names it
    cursor = (job.after_index or {}).get(sink.f.server)
    mask = pc.less_equal(epoch, scalar(job.last))
    if cursor is not None:
        mask = pc.and_(mask, pc.greater(idx, scalar(cursor)))
    scoped = pc.filter(idx, mask)
    if len(scoped):
        if job.continuity:
            if len(scoped) > 1:
                step = pc.subtract(scoped.slice(1), scoped.slice(0, len(scoped) - 1))
                if not pc.all(pc.equal(step, scalar(1))).as_py():
                    # the one repeat allowed: a MARK's EPOCH record (Lustre MARK epochs)
                    styp = pc.filter(typ, mask)
                    repeat = pc.and_(
                        pc.equal(step, scalar(0)),
                        pc.and_(
                            pc.equal(styp.slice(1), scalar("EPOCH")),
                            pc.equal(styp.slice(0, len(styp) - 1), scalar("MARK")),
                        ),
                    )
                    if not pc.all(pc.or_(pc.equal(step, scalar(1)), repeat)).as_py():
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
    keep = pc.and_(pc.greater_equal(epoch, scalar(job.first)), pc.less_equal(epoch, scalar(job.last)))
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
                    yield pa.RecordBatch.from_arrays([array([report], pa.string())], names=["report"])

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
                same = pc.equal(epochs, scalar(e))
                part = batch if pc.all(same).as_py() else batch.filter(same)
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
