"""Vectorized Lustre text parse: a chunk of whole lines → one Arrow table, or None.

The reference is :func:`epochsync.formats.lustre.parse_lustre` (one line at a time, exact
``FILE:LINE: reason`` errors). This module parses a chunk of lines with numpy over the
bytes and Arrow kernels over the columns, and is conservative: it returns None for the
whole chunk as soon as any line is not one it is sure the importer accepts unchanged, and
the caller then hands the chunk to the importer, which names the bad line. What it accepts:

- ``INDEX NNTYPE HH:MM:SS.NNNNNNNNN YYYY.MM.DD 0xFLAGS t=[FID]`` (runs of spaces between
  these, as the importer allows), then ``j= ef= u= nid= m= x=`` in that order (each at
  most once, one space before each), then ``p=[FID]``, then the name and, for ``RENME``,
  ``s=[FID] sp=[FID] SNAME`` (the split is the importer's own regular expression);
- FIDs already in Lustre's ``DFID`` spelling (``[0x200000402:0x1:0x0]``, ``[0:0x50:0xb]``;
  ``[0:0x0:0x0]`` is null), as ``lfs changelog`` prints them;
- blank (empty) lines, CRLF line ends, a last line without a newline.

Everything else (a line without an index, the old raw time, another FID spelling, fields
in another order, bad UTF-8, a NUL byte, any error at all) goes to the importer. The
records are exactly the importer's (tests/unit/test_lustre_fast.py compares both on
generated and edge-case input), and the index order, MARK epochs and cursor state carry
from chunk to chunk and file to file through the same :class:`ParseContext`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from epochsync.core.errors import RecordError
from epochsync.core.names import NAME_MAX_BYTES
from epochsync.core.schema import INT64_MAX, NAMING_TYPES, UNNAMING_TYPES
from epochsync.formats.common import (
    FLAG_OPEN_EXEC,
    FLAG_OPEN_READ,
    FLAG_OPEN_WRITE,
    LUSTRE_FLAG_MASK,
    ParseOptions,
    RecordChecker,
)
from epochsync.formats.lustre import (
    _ENTRY_TYPES,
    _FULL_PATH_TYPES,
    _OPEN_MODE,
    _UIDGID,
    DEFAULT_SERVER,
    _day_start,
    _record_type,
)

#: FIDs the importer keeps as they are: the DFID spelling (non-zero sequence) or ``[0:0x..:0x..]``
_CANON_FID = r"^\[(?:0x[1-9a-f][0-9a-f]{0,15}|0):0x(?:0|[1-9a-f][0-9a-f]{0,7}):0x(?:0|[1-9a-f][0-9a-f]{0,7})\]$"
_ZERO_FID = "[0:0x0:0x0]"
#: the fields the importer reads after ``t=``, in the order the fast path accepts them
_FIELD_KEYS = (b"j=", b"ef=", b"u=", b"nid=", b"m=", b"x=")
_EF = re.compile(r"0x[0-9a-fA-F]{1,16}")
_TYPE_TOKEN = re.compile(r"([0-9]{2})([A-Z]+)")
_DATE = re.compile(r"[0-9]{4}\.[0-9]{2}\.[0-9]{2}")
_FLAGS = re.compile(r"0x[0-9a-fA-F]+")
#: the time of day must leave room for the nanoseconds in int64
_LAST_DAY_START = (INT64_MAX // 1_000_000_000) - 86_401


@dataclass
class ChunkState:
    """What the importer's :class:`ParseContext` holds after a chunk (applied once accepted)."""

    server: str
    last_index: int | None
    last_type: str | None
    mark_epoch: int | None

    def apply(self, opts: ParseOptions) -> None:
        """Carry this chunk's state into ``opts.context`` (a no-op without one)."""
        ctx = opts.context
        if ctx is None:
            return
        if self.last_index is not None:
            ctx.last_index[self.server] = self.last_index
            ctx.last_type[self.server] = self.last_type
        if self.mark_epoch is not None:
            ctx.mark_epoch[self.server] = self.mark_epoch


class _Doubt(Exception):
    """A line the fast path is not sure about: the importer takes the chunk."""


def parse_lustre_chunk(data: bytes, opts: ParseOptions, schema, *, time_grid: tuple[int, int] | None = None):
    """Whole lines of ``lfs changelog`` text → ``(table, ChunkState)`` in ``schema``, or None.

    ``schema`` is the canonical record schema in Arrow (``xattr_value`` binary). ``opts``
    as for :func:`parse_lustre`, with ``opts.context`` carrying state between chunks (the
    caller applies the returned state once it accepts the table). Time-window epochs need
    ``time_grid`` = (start_ns, interval_ns), the grid ``opts.epoch_of_time`` stands for.
    """
    import pyarrow as pa

    try:
        return _parse(data, opts, schema, time_grid)
    except (_Doubt, IndexError, ValueError, OverflowError, pa.ArrowException):
        # a doubt, or input shaped in a way this parse did not foresee: the importer decides
        return None


def _parse(data: bytes, opts: ParseOptions, schema, time_grid):  # noqa: C901 - one pass, in the importer's order
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    server = opts.server or DEFAULT_SERVER
    if opts.epoch is None and not opts.epochs_from_marks and opts.epoch_of_time is not None and time_grid is None:
        raise _Doubt
    if b"\x00" in data:
        raise _Doubt
    try:
        pa.array([data], pa.binary()).cast(pa.string())  # UTF-8 (a sequence never spans a newline)
    except (pa.ArrowInvalid, UnicodeDecodeError):
        raise _Doubt from None
    checker = RecordChecker(opts)  # raises the context to the cursor, as the importer does
    ctx = checker.context

    N = len(data)
    # padded with newlines: a read past a line's end sees "\n" (or "\r"), never a key's letter
    A = np.frombuffer(data + b"\n" * 8, np.uint8)
    #: the 4 bytes from each position, little-endian (unaligned view, no copy)
    U4 = np.ndarray((N + 4,), dtype="<u4", buffer=A, strides=(1,))
    nl = np.flatnonzero(A[:N] == 10)
    n_lines = len(nl) + (1 if N and (not len(nl) or nl[-1] != N - 1) else 0)
    starts = np.zeros(n_lines, np.int64)
    ends = np.full(n_lines, N, np.int64)
    if len(nl):
        starts[1:] = (nl + 1)[: n_lines - 1]
        ends[: len(nl)] = nl
    while True:  # the importer strips every \r before the \n
        cr = (ends > starts) & (A[np.maximum(ends - 1, 0)] == 13)
        if not cr.any():
            break
        ends = ends - cr
    keep = ends > starts  # empty lines are skipped
    if not keep.all():
        starts, ends = starts[keep], ends[keep]
    n = len(starts)
    if n == 0:
        return pa.Table.from_batches([], schema=schema), ChunkState(server, None, None, None)

    # runs of spaces (never across a line end): start, end, length, and the first 4 bytes of
    # the token after each; two sentinel runs at the end of the chunk
    edge = np.zeros(N + 2, bool)
    edge[1:-1] = A[:N] == 32
    change = np.flatnonzero(edge[1:] != edge[:-1])
    R = np.append(change[0::2], [N, N])
    RE = np.append(change[1::2], [N, N])
    del edge, change
    RL = RE - R
    TOK = U4[RE]
    lo = np.searchsorted(R[:-2], starts)
    hi = np.searchsorted(R[:-2], ends)
    if not (hi - lo >= 5).all():
        raise _Doubt

    def key_is(tok, key: bytes):
        return (tok & ((1 << (8 * len(key))) - 1)) == int.from_bytes(key, "little")

    def token_end(k):
        """End of the token after run k: the next run of the line, or the line end."""
        return np.where(k + 1 < hi, R[k + 1], ends)

    evens = pa.array(np.arange(0, 2 * n, 2, dtype=np.int32))

    def column(s, e, present=None):
        """The bytes [s, e) of every line (null where not ``present``) as a string array: one take."""
        s = np.clip(s, starts, ends)
        e = np.clip(e, s, ends)
        if present is not None:
            s = np.where(present, s, starts)
            e = np.where(present, e, starts)
        offs = np.empty(2 * n + 1, np.int32 if N < 2**31 else np.int64)
        offs[0 : 2 * n : 2] = s
        offs[1 : 2 * n : 2] = e
        offs[2 * n] = e[-1]
        kind = pa.StringArray if offs.dtype == np.int32 else pa.LargeStringArray
        arr = kind.from_buffers(2 * n, pa.py_buffer(offs), pa.py_buffer(data)).take(evens)
        if present is not None and not present.all():
            arr = pc.if_else(pa.array(present), arr, pa.nulls(n, arr.type))
        return arr if arr.type == pa.string() else arr.cast(pa.string())

    def lookup(col, fn):
        """``fn`` on each distinct value (few: types, dates, flags, uid:gid); raises _Doubt."""
        enc = pc.dictionary_encode(col)
        values = [fn(v) for v in enc.dictionary.to_pylist()]
        return values, np.asarray(enc.indices)

    # ---- the head: INDEX NNTYPE CLOCK DATE 0xFLAGS t=[FID], runs of spaces between
    t0s, t0e = starts, R[lo]
    t1s, t1e = RE[lo], R[lo + 1]
    t2s, t2e = RE[lo + 1], R[lo + 2]
    t3s, t3e = RE[lo + 2], R[lo + 3]
    t4s, t4e = RE[lo + 3], R[lo + 4]
    t5s, t5e = RE[lo + 4], token_end(lo + 4)

    index_col = column(t0s, t0e)
    if not ((t0e - t0s) <= 18).all() or not pc.all(pc.ascii_is_decimal(index_col)).as_py():
        raise _Doubt
    index = np.asarray(pc.cast(index_col, pa.int64()))

    def type_of(token: str) -> str:
        m = _TYPE_TOKEN.fullmatch(token)
        if m is None:
            raise _Doubt
        try:
            return _record_type(m.group(1), m.group(2))
        except RecordError:
            raise _Doubt from None

    type_names, type_ids = lookup(column(t1s, t1e), type_of)
    rtype = pc.take(pa.array(type_names, pa.string()), pa.array(type_ids))

    def of_type(kinds):
        return np.isin(type_ids, [k for k, name in enumerate(type_names) if name in kinds])

    # clock HH:MM:SS.F{1,9}
    clen = t2e - t2s
    if not ((clen >= 10) & (clen <= 18)).all():
        raise _Doubt
    c = A[t2s[:, None] + np.arange(9)].astype(np.int16) - 48  # HH:MM:SS.
    if not ((c[:, [2, 5]] == 58 - 48).all() and (c[:, 8] == 46 - 48).all()):
        raise _Doubt
    d = c[:, [0, 1, 3, 4, 6, 7]]
    if not ((d >= 0) & (d <= 9)).all():
        raise _Doubt
    d = d.astype(np.int64)
    hh, mi, ss = d[:, 0] * 10 + d[:, 1], d[:, 2] * 10 + d[:, 3], d[:, 4] * 10 + d[:, 5]
    if (hh > 23).any() or (mi > 59).any() or (ss > 60).any():
        raise _Doubt
    frac = column(t2s + 9, t2e)
    if not pc.all(pc.ascii_is_decimal(frac)).as_py():
        raise _Doubt
    nanos = np.asarray(pc.cast(pc.utf8_rpad(frac, 9, "0"), pa.int64()))

    def day_of(token: str) -> int:
        if _DATE.fullmatch(token) is None:
            raise _Doubt
        try:
            seconds = _day_start(token)
        except RecordError:
            raise _Doubt from None
        if seconds > _LAST_DAY_START:
            raise _Doubt
        return seconds

    days, ids = lookup(column(t3s, t3e), day_of)
    time_ns = (np.asarray(days, np.int64)[ids] + hh * 3600 + mi * 60 + ss) * 1_000_000_000 + nanos

    def flags_of(token: str) -> int:
        if _FLAGS.fullmatch(token) is None or len(token) > 18:
            raise _Doubt
        value = int(token, 16)
        if value > LUSTRE_FLAG_MASK:
            raise _Doubt
        return value

    fl, ids = lookup(column(t4s, t4e), flags_of)
    flags = np.asarray(fl, np.int64)[ids]

    if not key_is(TOK[lo + 4], b"t=").all():
        raise _Doubt

    def fid_column(s, e, present=None):
        """Canonical FIDs (null where absent or the zero fid); raises _Doubt on another spelling."""
        col = _canonical(column(s, e, present))
        if col is None:
            raise _Doubt
        return col

    tfid = fid_column(t5s + 2, t5e)

    # ---- fields: one space, key=value, in the accepted order; then p=[FID]
    r = lo + 5  # the run before the next token
    values = {}
    for key in _FIELD_KEYS:
        here = (r < hi) & (RL[r] == 1) & key_is(TOK[r], key)
        if here.any():
            values[key] = (here, RE[r] + len(key), token_end(r))
            r = r + here
    parent = (r < hi) & (RL[r] == 1) & key_is(TOK[r], b"p=")
    pfid = fid_column(RE[r] + 2, token_end(r), parent) if parent.any() else pa.nulls(n, pa.string())
    r = r + parent
    # what follows must not look like a field the importer would have read
    has_rest = r < hi
    tok = TOK[r]
    looks = np.zeros(n, bool)
    for key in (*_FIELD_KEYS, b"p="):
        looks |= key_is(tok, key)
    if (has_rest & (RL[r] == 1) & looks).any():
        raise _Doubt

    def optional(key):
        if key not in values:
            return None, None
        here, s, e = values[key]
        return column(s, e, here), here

    jobid, _ = optional(b"j=")
    ef, _ = optional(b"ef=")
    if ef is not None:
        lookup(pc.drop_null(ef), lambda v: None if _EF.fullmatch(v) else _raise())
    ug, here_u = optional(b"u=")
    uid = gid = None
    if ug is not None:

        def uid_gid(v):
            m = _UIDGID.fullmatch(v)
            if m is None or int(m.group(1)) > 2**32 - 1 or int(m.group(2)) > 2**32 - 1:
                raise _Doubt
            return int(m.group(1)), int(m.group(2))

        pairs, ids = lookup(pc.fill_null(ug, "0:0"), uid_gid)
        uid = pa.array(np.asarray([p[0] for p in pairs], np.int64)[ids], mask=~here_u)
        gid = pa.array(np.asarray([p[1] for p in pairs], np.int64)[ids], mask=~here_u)
    nid, _ = optional(b"nid=")
    if nid is not None and not pc.all(pc.greater(pc.binary_length(pc.drop_null(nid)), 0)).as_py():
        raise _Doubt
    mode, here_m = optional(b"m=")
    if mode is not None:

        def open_bits(v):
            if _OPEN_MODE.fullmatch(v) is None:
                raise _Doubt
            return sum(
                bit for letter, bit in zip(v, (FLAG_OPEN_READ, FLAG_OPEN_WRITE, FLAG_OPEN_EXEC)) if letter != "-"
            )

        bits, ids = lookup(pc.fill_null(mode, "---"), open_bits)
        flags = flags | np.where(here_m, np.asarray(bits, np.int64)[ids], 0)
    xname, _ = optional(b"x=")
    if xname is not None and not pc.all(pc.greater(pc.binary_length(pc.drop_null(xname)), 0)).as_py():
        raise _Doubt

    # ---- the name (after exactly one space), and RENME's "NAME s=[SFID] sp=[SPFID] SNAME":
    # the importer splits at the last " s=[FID] sp=[FID]"; here a line may hold at most one
    # token pair "s=[..." + " sp=[..." (more: the importer decides)
    rest_s = R[r] + 1
    renme = of_type({"RENME"})
    cand = key_is(TOK, b"s=[") & np.append(RL[1:] == 1, False) & np.append(key_is(TOK[1:], b"sp=["), False)
    cand[np.maximum(hi - 1, 0)[hi > lo]] = False  # the pair must lie in one line
    cand[-2:] = False
    at = np.flatnonzero(cand)
    n_pairs = np.searchsorted(at, np.maximum(hi - 1, r)) - np.searchsorted(at, r)  # pairs in runs r..hi-2
    if (n_pairs[~renme] > 0).any() or (n_pairs[renme] != 1).any():
        raise _Doubt  # s=/sp= on another type, or a RENME without (or with two): the importer says
    name = column(rest_s, ends, has_rest)
    null_str = pa.nulls(n, pa.string())
    sname = sfid = spfid = null_str
    if renme.any():
        k = at[np.minimum(np.searchsorted(at, r), len(at) - 1)]
        name = pc.if_else(pa.array(renme), column(rest_s, RE[k] - 1, renme), name)
        sfid = _canonical(column(RE[k] + 2, R[k + 1], renme))
        spfid = _canonical(column(RE[k + 1] + 3, token_end(k + 1), renme))
        if sfid is None or spfid is None:
            raise _Doubt
        has_sname = renme & (k + 2 < hi)
        sname = column(R[k + 2] + 1, ends, has_sname)
        if not (
            pc.all(pc.filter(pc.is_valid(sfid), pa.array(renme))).as_py()
            and pc.all(pc.filter(pc.is_valid(spfid), pa.array(renme))).as_py()
        ):
            raise _Doubt  # a zero renamed fid or old parent

    # full paths of UNLNK/RMDIR names and RENME old names: the basename (the parent fid is given)
    def basename_of_full_path(col, rows):
        if not rows.any():
            return col
        sel = pc.and_(pc.fill_null(pc.starts_with(col, "/"), False), pa.array(rows))
        if not pc.any(sel).as_py():
            return col
        return pc.if_else(sel, pc.replace_substring_regex(col, "^.*/", ""), col)

    name = basename_of_full_path(name, of_type(_FULL_PATH_TYPES))
    sname = basename_of_full_path(sname, renme)

    def safe(col, rows):
        """check_basename on ``rows``: present, not empty, . or .., no /, at most NAME_MAX bytes."""
        if not rows.any():
            return
        sub = pc.filter(col, pa.array(rows))
        if sub.null_count:
            raise _Doubt
        bad = pc.or_(
            pc.is_in(sub, value_set=pa.array(["", ".", ".."])),
            pc.or_(pc.match_substring(sub, "/"), pc.greater(pc.binary_length(sub), NAME_MAX_BYTES)),
        )
        if pc.any(bad).as_py():
            raise _Doubt

    entry = of_type(_ENTRY_TYPES)
    safe(name, entry)
    safe(sname, renme)
    if not entry.all():  # other types: an empty name is no name
        empty = pc.fill_null(pc.equal(name, ""), False)
        if pc.any(empty).as_py():
            name = pc.if_else(empty, null_str, name)
    named = of_type(NAMING_TYPES | UNNAMING_TYPES)
    if named.any() and not pc.all(pc.filter(pc.is_valid(pfid), pa.array(named))).as_py():
        raise _Doubt

    # ---- index order (the importer's RecordChecker), then epochs
    last = ctx.last_index.get(server)
    if last is not None and index[0] <= last:
        raise _Doubt
    if n > 1 and not (index[1:] > index[:-1]).all():
        raise _Doubt
    is_mark = of_type({"MARK"})
    synth = False
    mark_epoch = None
    if opts.epoch is not None:
        epoch = np.full(n, opts.epoch, np.int64)
    elif opts.epochs_from_marks:
        base = ctx.mark_epoch.get(server, opts.first_epoch)
        epoch = base + np.cumsum(is_mark) - is_mark
        synth = bool(is_mark.any())
        mark_epoch = int(base + is_mark.sum()) if synth else None
    elif opts.epoch_of_time is not None:
        start_ns, interval_ns = time_grid
        epoch = (time_ns - start_ns) // interval_ns + 1
    else:
        epoch = np.zeros(n, np.int64)
    if (epoch < 0).any():
        raise _Doubt

    cols = {
        "server": pa.repeat(pa.scalar(server, pa.string()), n),
        "index": pa.array(index, pa.int64()),
        "epoch": pa.array(epoch, pa.int64()),
        "type": rtype,
        "time_ns": pa.array(time_ns, pa.int64()),
        "flags": pa.array(flags.astype(np.int32), pa.int32()),  # at most 0x7ffff
        "tfid": tfid,
        "pfid": pfid,
        "name": name,
        "sfid": sfid,
        "spfid": spfid,
        "sname": sname,
        "uid": uid,
        "gid": gid,
        "xattr_name": xname,
        "jobid": jobid,
        "nid": nid,
    }
    arrays = []
    for f in schema:
        col = cols.get(f.name)
        arrays.append(pa.nulls(n, f.type) if col is None else col if col.type == f.type else col.cast(f.type))
    table = pa.Table.from_arrays(arrays, schema=schema)
    last_type = type_names[type_ids[-1]]
    if synth:
        # each MARK is followed by the EPOCH record of the epoch it closes (same server, index,
        # time, epoch): slices of the table around one-row EPOCH tables (no copy)
        pieces, prev = [], 0
        for i in np.flatnonzero(is_mark):
            pieces.append(table.slice(prev, i + 1 - prev))
            row = table.slice(i, 1)
            pieces.append(
                pa.Table.from_arrays(
                    [
                        row.column(f.name)
                        if f.name in ("server", "index", "epoch", "time_ns")
                        else pa.array(["EPOCH"], pa.string())
                        if f.name == "type"
                        else pa.nulls(1, f.type)
                        for f in schema
                    ],
                    schema=schema,
                )
            )
            prev = i + 1
        if prev < n:
            pieces.append(table.slice(prev))
        table = pa.concat_tables(pieces)
        if is_mark[-1]:
            last_type = "EPOCH"
    return table, ChunkState(server, int(index[-1]), last_type, mark_epoch)


def _canonical(col):
    """Canonical FIDs with the zero fid as null, or None if one is spelled otherwise."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not pc.all(pc.fill_null(pc.match_substring_regex(col, _CANON_FID), True)).as_py():
        return None
    zero = pc.fill_null(pc.equal(col, _ZERO_FID), False)
    return pc.if_else(zero, pa.nulls(len(col), pa.string()), col) if pc.any(zero).as_py() else col


def _raise():
    raise _Doubt
