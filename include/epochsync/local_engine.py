"""The local engine: merge and translate of a small epoch in the driver's Python, no Spark job.

A Spark job costs tens to hundreds of milliseconds however little it reads, and the merge
stage runs dozens of them: an epoch of a hundred changed files took 4 s in a warm Spark
session. :func:`merge_rows` is the same transform as :func:`epochsync.merge.merge_epoch`,
written row by row over plain Python values, and :func:`run_merge_local` reads and writes
the same warehouse tables with pyarrow. The two engines are interchangeable epoch by
epoch; ``tests/unit/test_local_engine.py`` checks that they produce equal snapshots and
change sets on random simulated histories and on every rule case of the merge's tests.

Which engine merges an epoch is :func:`choose_engine`: ``spark`` or ``local`` when the
target's ``engine`` says so, otherwise (``auto``) local when the warehouse is on the local
file system, the epoch holds at most ``local_max_records`` ingested records and the
previous snapshot at most ``LOCAL_MAX_SNAPSHOT_ROWS`` fids. Memory then follows the
epoch, not the namespace, except for the snapshot itself, which the merge holds as Arrow
(the rows the records touch become Python values, the others are copied as they are)
and translate reads down to the directories and the rows it needs (:func:`plan_rows`).

Values follow pyarrow's ``to_pylist``: structs are dicts, arrays lists. Internally a link
is a ``(pfid, name)`` tuple, an xattr ``(name, value)``, an object ``(ost, oid, version)``.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from epochsync.errors import EpochError
from epochsync.formats.common import FLAG_OPEN_EXEC, FLAG_OPEN_READ, FLAG_OPEN_WRITE
from epochsync.merge import (
    ATTR_COLUMNS,
    CHANGE_FIELDS,
    CREATORS,
    LINK_ADDERS,
    LINK_REMOVERS,
    MERGED_TYPES,
    S_IFMT,
    SIZE_SETTERS,
    TIME_SETTERS,
    TIME_TYPES,
)
from epochsync.model import DIR, FILE, OTHER, SNAPSHOT_FIELDS, SYMLINK

_CREATORS = frozenset(CREATORS)
_MERGED = frozenset(MERGED_TYPES)
_TIME_SETTERS = frozenset(TIME_SETTERS)
_SIZE_SETTERS = frozenset(SIZE_SETTERS)
_OPEN_ANY = FLAG_OPEN_READ | FLAG_OPEN_WRITE | FLAG_OPEN_EXEC


class MergeInputError(EpochError):
    """The snapshot and the changelog disagree, or a record lacks what the merge needs."""


def _node_type(r: Mapping[str, Any]) -> str:
    t = r["type"]
    if t == "CREAT":
        return FILE
    if t == "MKDIR":
        return DIR
    if t == "SLINK":
        return SYMLINK
    bits = (r.get("mode") or 0) & S_IFMT
    return {0o100000: FILE, 0o040000: DIR, 0o120000: SYMLINK}.get(bits, OTHER)


def _close_for_write(r: Mapping[str, Any]) -> bool:
    flags = r.get("flags")
    if r["type"] != "CLOSE" or flags is None:
        return False
    if flags & _OPEN_ANY:
        return bool(flags & FLAG_OPEN_WRITE)
    return flags & 3 in (1, 2)


def _later(cur, ord_, value):
    """``max(named_struct('o', ord, 'v', value))``: keep the (ord, value) with the larger ord."""
    return (ord_, value) if cur is None or ord_ > cur[0] else cur


def _tdiv(a: int, b: int) -> int:
    """SQL ``div``: integral division truncating toward zero."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _key_none_last(v):
    return (v is None, v if v is not None else 0)


def _link(d) -> tuple:
    return (d["pfid"], d["name"]) if isinstance(d, Mapping) else tuple(d)


def _xattr(d) -> tuple:
    return (d["name"], d["value"]) if isinstance(d, Mapping) else tuple(d)


def _obj(d) -> tuple:
    return (d["ost"], d["oid"], d["version"]) if isinstance(d, Mapping) else tuple(d)


def _layout_objects(layout) -> list[tuple]:
    if layout is None:
        return []
    objs = layout["objects"] if isinstance(layout, Mapping) else layout[2]
    return [(o["ost"], o["oid"]) if isinstance(o, Mapping) else (o[0], o[1]) for o in objs or []]


def _layout_field(layout, name: str):
    if layout is None:
        return None
    if isinstance(layout, Mapping):
        return layout.get(name)
    return {"stripe_size": layout[0], "stripe_count": layout[1]}[name]


def _sort_structs(items: Iterable[tuple]) -> list[tuple]:
    """``array_sort`` of structs: field by field, a null field before a value."""
    return sorted(items, key=lambda t: tuple((x is not None, x if x is not None else 0) for x in t))


def _distinct(items: Iterable) -> list:
    seen, out = set(), []
    for x in items:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


class _Fid:
    """What the records of one fid say (the per-fid aggregates of the Spark merge)."""

    __slots__ = (
        "l_type", "l_mode", "l_type_bits", "l_uid", "l_gid", "l_atime_ns", "l_mtime_ns", "l_ctime_ns",
        "l_symlink", "l_layout", "l_size", "min_set_size", "relayout", "blind_data", "attr_touch",
        "xattr_touch", "meta", "link_last", "x_last", "lf_layout", "set_ord", "writes",
    )  # fmt: skip

    def __init__(self):
        for s in self.__slots__:
            setattr(self, s, None)
        self.relayout = self.blind_data = self.attr_touch = self.xattr_touch = self.meta = False
        self.link_last = {}
        self.x_last = {}
        self.writes = []


def merge_rows(
    prev_rows: Iterable[Mapping[str, Any]],
    records: Iterable[Mapping[str, Any]],
    root_fid: str | Iterable[str],
    extents_known: bool = True,
) -> tuple[list[dict], list[dict]]:
    """Snapshot E-1 rows and the records of E (or a window) → (snapshot E rows, change rows).

    The row-by-row twin of :func:`epochsync.merge.merge_epoch` (same rules, same columns,
    same errors); rows are sorted by fid.
    """
    roots = {root_fid} if isinstance(root_fid, str) else set(root_fid)
    prev: dict[str, dict] = {r["fid"]: dict(r) for r in prev_rows}
    per: dict[str, _Fid] = {}

    def fid_state(fid: str) -> _Fid:
        st = per.get(fid)
        if st is None:
            st = per[fid] = _Fid()
        return st

    for r in records:
        t = r["type"]
        if t not in _MERGED:
            continue
        o = (r.get("time_ns") if r.get("time_ns") is not None else 0, r["server"], r["index"])
        fid = r.get("sfid") if t == "RENME" else r.get("tfid")
        if t in LINK_ADDERS or t in LINK_REMOVERS or t == "RENME":
            _link_events(r, o, t, fid_state)
        if fid is None:
            continue
        st = fid_state(fid)
        if t == "WRITE":
            st.writes.append((o, r))
            continue
        st.meta = True
        creator = t in _CREATORS
        if creator:
            st.l_type = _later(st.l_type, o, _node_type(r))
        mode = r.get("mode")
        if creator or (t == "SATTR" and mode is not None):
            st.l_mode = _later(st.l_mode, o, mode)
        if (t == "SATTR" or creator) and mode is not None and mode & S_IFMT:
            st.l_type_bits = _later(st.l_type_bits, o, mode)
        for col in ("uid", "gid"):
            v = r.get(col)
            if creator or (t == "SATTR" and v is not None):
                setattr(st, "l_" + col, _later(getattr(st, "l_" + col), o, v))
        for col, rtype in TIME_TYPES.items():
            v = r.get(col)
            if (t in _TIME_SETTERS and v is not None) or t == rtype:
                if t == rtype and v is None:
                    v = r.get("time_ns")
                setattr(st, "l_" + col, _later(getattr(st, "l_" + col), o, v))
        if creator:
            st.l_symlink = _later(st.l_symlink, o, r.get("symlink") if _node_type(r) == SYMLINK else None)
        if creator or t == "LYOUT":
            st.l_layout = _later(st.l_layout, o, r.get("layout"))
        size = r.get("size")
        if t in _SIZE_SETTERS and size is not None:
            st.l_size = _later(st.l_size, o, size)
            st.min_set_size = size if st.min_set_size is None else min(st.min_set_size, size)
            st.set_ord = o if st.set_ord is None or o > st.set_ord else st.set_ord
        if t == "LYOUT":
            st.relayout = True
        if t in ("MTIME", "TRUNC", "LYOUT") or _close_for_write(r):
            st.blind_data = True
        if t in ("SATTR", "MTIME", "CTIME", "ATIME"):
            st.attr_touch = True
        if t == "XATTR":
            st.xattr_touch = True
            if r.get("xattr_name") is not None:
                name = r["xattr_name"]
                cur = st.x_last.get(name)
                if cur is None or o > cur[0]:
                    st.x_last[name] = (o, r.get("xattr_value"))

    snapshot: dict[str, dict] = {fid: row for fid, row in prev.items() if fid not in per}
    changes: list[dict] = []
    for fid in sorted(per):
        new_row, change = _merge_fid(fid, per[fid], prev.get(fid), fid in roots, extents_known)
        if new_row is not None:
            snapshot[fid] = new_row
        if change is not None:
            changes.append(change)
    return [snapshot[f] for f in sorted(snapshot)], changes


def _link_events(r: Mapping[str, Any], o: tuple, t: str, fid_state) -> None:
    events = []
    if t in LINK_ADDERS:
        events.append((r.get("tfid"), r.get("pfid"), r.get("name"), True, 0))
    elif t in LINK_REMOVERS:
        events.append((r.get("tfid"), r.get("pfid"), r.get("name"), False, 0))
    elif not (r.get("tfid") is not None and r.get("tfid") == r.get("sfid")):
        events.append((r.get("sfid"), r.get("spfid"), r.get("sname"), False, 0))
        events.append((r.get("sfid"), r.get("pfid"), r.get("name"), True, 1))
        if r.get("tfid") is not None:
            events.append((r.get("tfid"), r.get("pfid"), r.get("name"), False, 0))
    for fid, pfid, name, add, sub in events:
        if fid is None or pfid is None or name is None:
            raise MergeInputError(
                f"record {r['server']}:{r['index']} ({t}) has no fid, parent fid or name;"
                " fix the importer or quarantine the record"
            )
        st = fid_state(fid)
        at = (o, sub)
        cur = st.link_last.get((pfid, name))
        if cur is None or at > cur[0]:
            st.link_last[(pfid, name)] = (at, add)


def _write_facts(st: _Fid, layout, extents_known: bool):
    """(write_whole, ranges_raw, wmax, last write times, new_objects) of a fid's writes."""
    ss = _layout_field(layout, "stripe_size")
    cnt = _layout_field(layout, "stripe_count")
    objects = _layout_objects(layout)
    whole = False
    chunks: list[tuple[int, int, bool]] = []
    times: dict[str, tuple | None] = {c: None for c in TIME_TYPES}
    objs: dict[tuple, tuple] = {}
    for o, r in st.writes:
        extents, obj = r.get("extents"), r.get("object")
        after_set = st.set_ord is None or o > st.set_ord
        for c in TIME_TYPES:
            if r.get(c) is not None:
                times[c] = _later(times[c], o, r[c])
        if obj is not None:
            key = (obj["ost"], obj["oid"])
            cur = objs.get(key)
            if cur is None or o > cur[0]:
                objs[key] = (o, obj["version"])
        if not extents_known:
            whole = True
            continue
        if extents is None:
            whole = whole or obj is None
            continue
        if obj is None or layout is None or cnt == 1:
            kind = "identity"
        else:
            k = objects.index((obj["ost"], obj["oid"])) if (obj["ost"], obj["oid"]) in objects else -1
            if k < 0 or (ss is not None and ss <= 0) or (cnt is not None and cnt < 1):
                whole = True
                continue
            kind = "striped"
        for x in extents:
            if x is None or x["length"] is None or not x["length"] > 0:
                continue
            off, end = x["offset"], x["offset"] + x["length"]
            if kind == "identity":
                chunks.append((off, end, after_set))
                continue
            for j in range(_tdiv(off, ss), _tdiv(end - 1, ss) + 1):
                base = (j * cnt + k) * ss - j * ss
                chunks.append((base + max(off, j * ss), base + min(end, (j + 1) * ss), after_set))
    ranges: list[list[int]] = []
    for s, e, _ in sorted(chunks):
        if ranges and s <= ranges[-1][1]:
            ranges[-1][1] = max(ranges[-1][1], e)
        else:
            ranges.append([s, e])
    after = [e for _, e, a in chunks if a]
    wmax = max(after) if after else None
    new_objects = [(k[0], k[1], v[1]) for k, v in sorted(objs.items(), key=lambda kv: _sort_key2(kv[0]))] or None
    return whole, (ranges if chunks else None), wmax, times, new_objects


def _sort_key2(t):
    return tuple((x is not None, x if x is not None else "") for x in t)


def _merge_fid(fid: str, st: _Fid, p: dict | None, is_root: bool, extents_known: bool):
    existed = p is not None
    p = p or {}
    p_links = [_link(x) for x in p["links"]] if existed and p.get("links") is not None else None
    if is_root:
        links: list[tuple] = []
    else:
        removed = {k for k, (_, add) in st.link_last.items() if not add}
        added = [k for k, (_, add) in st.link_last.items() if add]
        kept = [x for x in _distinct(p_links or []) if x not in removed]
        links = _sort_structs(_distinct(kept + added))
    exists_after = is_root or len(links) > 0
    if existed:
        ntype = p.get("type")
    elif exists_after and st.l_type is None:
        raise MergeInputError(
            f"fid {fid} gains a name in this window but is neither in snapshot E-1 nor created by a"
            " CREAT/MKDIR/MKNOD/SLINK record: the snapshot and the changelog disagree (hydrate the target)"
        )
    else:
        ntype = st.l_type[1] if st.l_type is not None else None

    # the final layout (for the writes) and the write facts
    w_layout = st.l_layout[1] if st.l_layout is not None else p.get("layout")
    if st.writes:
        write_whole, ranges_raw, wmax, wtimes, new_objects = _write_facts(st, w_layout, extents_known)
    else:
        write_whole, ranges_raw, wmax, wtimes, new_objects = None, None, None, {c: None for c in TIME_TYPES}, None

    def last_or_prev(col):
        cur = getattr(st, "l_" + col)
        return p.get(col) if cur is None else cur[1]

    if st.l_mode is None:
        n_mode = p.get("mode")
    elif st.l_mode[1] is None or st.l_mode[1] & S_IFMT:
        n_mode = st.l_mode[1]
    else:
        bits = st.l_type_bits[1] if st.l_type_bits is not None else p.get("mode")
        n_mode = st.l_mode[1] | ((bits or 0) & S_IFMT)
    n_uid, n_gid, n_symlink, n_layout = (last_or_prev(c) for c in ("uid", "gid", "symlink", "layout"))
    p_xattrs = [_xattr(x) for x in p["xattrs"]] if existed and p.get("xattrs") is not None else None
    if extents_known:
        touched = set(st.x_last)
        x_set = [(n, v) for n, (_, v) in st.x_last.items() if v is not None]
        n_xattrs = _sort_structs([x for x in (p_xattrs or []) if x[0] not in touched] + x_set)
    else:
        n_xattrs = list(p_xattrs or [])
    old0 = p.get("size") if p.get("size") is not None else 0
    set_size = st.l_size[1] if st.l_size is not None else None
    n_times = {}
    for col in TIME_TYPES:
        cands = [x for x in (getattr(st, "l_" + col), wtimes[col]) if x is not None]
        n_times[col] = max(cands, key=lambda x: x[0])[1] if cands else p.get(col)

    def greatest(*xs):
        vals = [x for x in xs if x is not None]
        return max(vals) if vals else None

    def least(*xs):
        vals = [x for x in xs if x is not None]
        return min(vals) if vals else None

    if ntype == FILE:
        if set_size is not None:
            n_size = greatest(set_size, wmax)
        elif wmax is not None:
            n_size = greatest(old0, wmax)
        else:
            n_size = p.get("size") if existed else 0
    else:
        n_size = set_size if set_size is not None else (p.get("size") if existed else 0)
    is_file = exists_after and ntype == FILE
    whole = bool(write_whole) or st.relayout or (not extents_known and st.blind_data)
    whole_file = is_file and whole
    low = least(old0, st.min_set_size)
    trunc_from = low if existed and low < old0 else None
    rc = [(s, least(e, n_size)) for s, e in (ranges_raw or [])]
    rc = [(s, e) for s, e in rc if e > s]
    if is_file and not whole_file:
        if trunc_from is not None and trunc_from < n_size:
            tail = [s for s, e in rc if e >= trunc_from]
            rc = [(s, e) for s, e in rc if e < trunc_from] + [(least(trunc_from, min(tail) if tail else trunc_from), n_size)]
        ranges = [{"offset": s, "length": e - s} for s, e in rc]
    else:
        ranges = []
    p_objects = [_obj(x) for x in p["objects"]] if existed and p.get("objects") is not None else None
    merged = None
    if new_objects is not None or st.relayout:
        news = new_objects or []
        keys = {(n[0], n[1]) for n in news}
        merged = _sort_structs([x for x in (p_objects or []) if (x[0], x[1]) not in keys] + news)
    if st.relayout:
        in_layout = set(_layout_objects(n_layout)) if n_layout is not None else set()
        n_objects = [x for x in merged if n_layout is not None and (x[0], x[1]) in in_layout]
    elif new_objects is None:
        n_objects = list(p_objects or [])
    else:
        n_objects = merged

    new_row = None
    if exists_after:
        new_row = {
            "fid": fid, "type": ntype, "links": [{"pfid": a, "name": b} for a, b in links],
            "mode": n_mode, "uid": n_uid, "gid": n_gid, "size": n_size, **n_times,
            "xattrs": [{"name": a, "value": b} for a, b in n_xattrs], "symlink": n_symlink, "layout": n_layout,
            "objects": [{"ost": a, "oid": b, "version": c} for a, b, c in n_objects],
        }  # fmt: skip
        new_row = {f: new_row[f] for f in SNAPSHOT_FIELDS}
    if not (existed or exists_after):
        return new_row, None
    n_attrs = {"mode": n_mode, "uid": n_uid, "gid": n_gid, **n_times}
    attrs_differ = any(n_attrs[c] != p.get(c) for c in ATTR_COLUMNS)
    if extents_known:
        xattrs_differ = (not existed and len(n_xattrs) > 0) or (existed and n_xattrs != p_xattrs)
    else:
        attrs_differ = attrs_differ or st.attr_touch
        xattrs_differ = st.xattr_touch
    change = {
        "fid": fid,
        "type": ntype,
        "created": not existed and exists_after,
        "deleted": existed and not exists_after,
        "links_changed": existed != exists_after or links != p_links,
        "attrs_changed": exists_after and (not existed or attrs_differ),
        "xattrs_changed": exists_after and bool(xattrs_differ),
        "data_changed": is_file and (whole_file or len(ranges) > 0 or n_size != old0),
        "whole_file": whole_file,
        "ranges": ranges,
        "old_size": p.get("size") if existed else None,
        "new_size": n_size if exists_after else None,
    }
    if not any(change[k] for k in ("created", "deleted", "links_changed", "attrs_changed", "xattrs_changed", "data_changed")):
        return new_row, None
    return new_row, {f: change[f] for f in CHANGE_FIELDS}


def cookie_group_rows(records: Iterable[Mapping[str, Any]]) -> list[dict]:
    """The rows of :func:`epochsync.merge.cookie_groups`, sorted by cookie."""
    groups: dict[str, dict] = {}
    for r in records:
        c = r.get("cookie")
        if c is None:
            continue
        g = groups.get(c)
        if g is None:
            g = groups[c] = {"servers": set(), "fids": set(), "types": set(), "records": 0, "epochs": [], "times": []}
        g["servers"].add(r["server"])
        for f in (r.get("tfid"), r.get("sfid")):
            if f is not None:
                g["fids"].add(f)
        g["types"].add(r["type"])
        g["records"] += 1
        g["epochs"].append(r["epoch"])
        if r.get("time_ns") is not None:
            g["times"].append(r["time_ns"])
    out = []
    for c in sorted(groups):
        g = groups[c]
        if len(g["servers"]) < 2:
            continue
        out.append({
            "cookie": c, "servers": sorted(g["servers"]), "fids": sorted(g["fids"]), "types": sorted(g["types"]),
            "records": g["records"], "first_epoch": min(g["epochs"]), "last_epoch": max(g["epochs"]),
            "first_time_ns": min(g["times"]) if g["times"] else None,
            "last_time_ns": max(g["times"]) if g["times"] else None,
        })  # fmt: skip
    return out


# --------------------------------------------------------------------------- warehouse I/O


def arrow_schema(struct_type):
    """The pyarrow schema of a Spark ``StructType`` (the same Parquet types Spark writes)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(struct_type)


def _parquet_files(path: str) -> list[str]:
    """Data files under a table directory (Spark's and our writers' layout), sorted; ``_``/``.`` skipped."""
    out = []
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(("_", ".")))
        out += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".parquet") and not f.startswith(("_", "."))]
    return out


def read_arrow_table(uri: str, struct_type):
    """A local Parquet table as one pyarrow Table with the schema of ``struct_type`` (None: no data file)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from epochsync.paths import local_path

    schema = arrow_schema(struct_type)
    parts = [pq.read_table(f).select(schema.names) for f in _parquet_files(local_path(uri))]
    if not parts:
        return None
    return pa.concat_tables([t.cast(schema) for t in parts])


def touched_fids(records: Iterable[Mapping[str, Any]]) -> set[str]:
    """The fids :func:`merge_rows` recomputes: every other snapshot row is copied as it is."""
    out: set[str] = set()
    for r in records:
        t = r["type"]
        if t not in _MERGED:
            continue
        for f in (r.get("sfid") if t == "RENME" else r.get("tfid"),) + ((r.get("tfid"),) if t == "RENME" else ()):
            if f is not None:
                out.add(f)
    return out


def read_table_rows(uri: str, struct_type=None) -> list[dict]:
    """Every row of a local Parquet table as plain Python values (``[]`` for no data file)."""
    import pyarrow.parquet as pq

    from epochsync.paths import local_path

    rows: list[dict] = []
    schema = arrow_schema(struct_type) if struct_type is not None else None
    for f in _parquet_files(local_path(uri)):
        t = pq.read_table(f)
        if schema is not None:
            t = t.select([n for n in schema.names if n in t.column_names])
        rows += t.to_pylist()
    return rows


def write_table_rows(rows, struct_type, uri: str) -> None:
    """Write ``rows`` (dicts, or a pyarrow Table of that schema) as one Parquet file at ``uri``, replacing what was there, all or nothing.

    Written into ``<uri>.tmp-<random>`` and renamed onto ``uri``, as
    :func:`epochsync.snapshot.write_table` does with Spark's writer.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from epochsync.paths import local_path

    dst = local_path(uri).rstrip("/")
    tmp = f"{dst}.tmp-{uuid.uuid4().hex[:12]}"
    schema = arrow_schema(struct_type)
    try:
        os.makedirs(tmp)
        table = rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(rows, schema=schema)
        pq.write_table(table, os.path.join(tmp, "part-00000.snappy.parquet"), compression="snappy")
        open(os.path.join(tmp, "_SUCCESS"), "wb").close()
        if os.path.exists(dst):
            shutil.rmtree(dst)
        os.replace(tmp, dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_record_rows(warehouse: str, source: str, first: int, last: int) -> list[dict]:
    """The ingested records of epochs ``first..last`` (``epoch`` and ``server`` from the paths)."""
    from epochsync.paths import Warehouse, local_path
    from epochsync.schema import record_struct_type

    wh = Warehouse(warehouse)
    names = record_struct_type().fieldNames()
    rows: list[dict] = []
    for e in range(first, last + 1):
        base = local_path(wh.records(source, e))
        if not os.path.isdir(base):
            raise EpochError(f"not ingested yet: {wh.records(source, e)}")
        for d in sorted(os.listdir(base)):
            if not d.startswith("server="):
                continue
            server = d[len("server=") :]
            for r in read_table_rows(os.path.join(base, d)):
                r["epoch"], r["server"] = e, server
                rows.append({n: r.get(n) for n in names})
    return rows


def count_records(warehouse: str, source: str, first: int, last: int) -> int | None:
    """Ingested records of epochs ``first..last`` from the Parquet footers; None if one is missing."""
    import pyarrow.parquet as pq

    from epochsync.paths import Warehouse, local_path

    wh = Warehouse(warehouse)
    total = 0
    for e in range(first, last + 1):
        base = local_path(wh.records(source, e))
        if not os.path.isdir(base):
            return None
        total += sum(pq.ParquetFile(f).metadata.num_rows for f in _parquet_files(base))
    return total


def is_local_warehouse(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def choose_engine(cfg, target, first: int, last: int) -> str:
    """``spark`` or ``local`` for merging ``first..last`` of ``target`` (see the module docstring)."""
    mode = target.engine
    if mode != "auto":
        if mode == "local" and not is_local_warehouse(cfg.warehouse):
            raise EpochError(
                f"target {target.name}: engine local needs a local warehouse, not {cfg.warehouse}; use auto or spark"
            )
        return mode
    if not is_local_warehouse(cfg.warehouse):
        return "spark"
    n = count_records(cfg.warehouse, cfg.source_of(target).name, first, last)
    if n is None or n > target.local_max_records:
        return "spark"
    return "local" if snapshot_rows(cfg, target, first - 1) <= LOCAL_MAX_SNAPSHOT_ROWS else "spark"


#: auto keeps epochs whose previous snapshot has more fids than this on Spark: the local
#: merge holds the whole snapshot in memory (as Arrow, about 150 bytes a fid)
LOCAL_MAX_SNAPSHOT_ROWS = 5_000_000


def snapshot_rows(cfg, target, epoch: int) -> int:
    """Rows of snapshot ``epoch`` of ``target`` from the Parquet footers (0 when there is none)."""
    import pyarrow.parquet as pq

    from epochsync.paths import Warehouse, local_path

    base = local_path(Warehouse(cfg.warehouse).snapshot(target.name, epoch))
    return sum(pq.ParquetFile(f).metadata.num_rows for f in _parquet_files(base)) if os.path.isdir(base) else 0


#: changelog bytes per record assumed when the ingest decides before it has read anything
INGEST_BYTES_PER_RECORD = 256


def ingest_in_process(cfg, target) -> bool | int:
    """What :func:`epochsync.ingest.run_ingest` gets as ``in_process`` for ``target``'s epochs:
    True (engine local), False (engine spark, or a warehouse that is not local) or, for
    auto, a budget of changelog bytes: about ``local_max_records`` records' worth."""
    if target.engine == "spark" or not is_local_warehouse(cfg.warehouse):
        return False
    if target.engine == "local":
        return True
    return target.local_max_records * INGEST_BYTES_PER_RECORD


def _snapshot_epochs(wh, target: str) -> list[int]:
    import re

    from epochsync.paths import local_path

    base = local_path(wh.snapshots(target))
    if not os.path.isdir(base):
        return []
    return sorted(
        int(m.group(1))
        for d in os.listdir(base)
        if (m := re.fullmatch(r"epoch=(\d+)", d)) and os.path.isdir(os.path.join(base, d))
    )


def run_merge_local(cfg, target_name: str, first_epoch: int, last_epoch: int) -> dict:
    """:func:`epochsync.merge.run_merge` on the local engine: same tables, same stats."""
    from epochsync.merge import MergeOutputs, extents_known_for
    from epochsync.model import change_struct_type, snapshot_struct_type
    from epochsync.paths import Warehouse, local_path

    if first_epoch < 1 or last_epoch < first_epoch:
        raise EpochError(f"bad epoch window {first_epoch}..{last_epoch}: need 1 <= first <= last")
    t0 = time.monotonic()
    target = cfg.target(target_name)
    source = cfg.source_of(target)
    wh = Warehouse(cfg.warehouse)
    import pyarrow as pa
    import pyarrow.compute as pc

    snap_schema = arrow_schema(snapshot_struct_type())
    prev_table = read_snapshot_table(cfg, target, first_epoch - 1)
    records = read_record_rows(cfg.warehouse, source.name, first_epoch, last_epoch)
    # only the rows the records touch become Python values; the others stay Arrow
    touched = pa.array(sorted(touched_fids(records)), pa.string())
    hit = pc.is_in(prev_table.column("fid"), value_set=touched)
    prev = prev_table.filter(hit).to_pylist()
    untouched = prev_table.filter(pc.invert(hit))
    try:
        new_rows, changes = merge_rows(prev, records, source.root_fid, extents_known_for(source.changelogs.format))
    except MergeInputError as exc:
        raise EpochError(f"merge of target {target.name!r} epochs {first_epoch}..{last_epoch}: {exc}") from None
    snapshot = pa.concat_tables([untouched, pa.Table.from_pylist(new_rows, schema=snap_schema)]).sort_by("fid")
    groups = cookie_group_rows(records)
    out = MergeOutputs(
        wh.snapshot(target.name, last_epoch), wh.changes(target.name, last_epoch), wh.cookie_groups(target.name, last_epoch)
    )
    # the snapshot last: its presence says the merge of this epoch is complete
    write_table_rows(changes, change_struct_type(), out.changes)
    write_table_rows(groups, cookie_groups_struct_type(), out.cookie_groups)
    write_table_rows(snapshot, snapshot_struct_type(), out.snapshot)  # an Arrow table
    merged = sum(1 for r in records if r["type"] in _MERGED)
    flags = ("created", "deleted", "links_changed", "attrs_changed", "xattrs_changed", "data_changed", "whole_file")
    stats = {
        "target": target.name,
        "source": source.name,
        "first_epoch": first_epoch,
        "epoch": last_epoch,
        "records": len(records),
        "merged_records": merged,
        "changes": len(changes),
        **{c: sum(1 for ch in changes if ch[c]) for c in flags},
        "range_bytes": sum(r["length"] for ch in changes for r in ch["ranges"]),
        "snapshot_fids": len(snapshot),
        "cookie_groups": len(groups),
        "net_to_raw_ratio": len(changes) / merged if merged else 0.0,
        "snapshot": out.snapshot,
        "changes_uri": out.changes,
        "engine": "local",
        "seconds": round(time.monotonic() - t0, 3),
    }
    keep = target.snapshot_retention
    epochs = [e for e in _snapshot_epochs(wh, target.name) if e <= first_epoch - 1]
    doomed = epochs[:-keep] if len(epochs) > keep else []
    for e in doomed:
        shutil.rmtree(local_path(wh.snapshot(target.name, e)), ignore_errors=True)
    stats["snapshots_pruned"] = doomed
    return stats


def cookie_groups_struct_type():
    from pyspark.sql.types import ArrayType, LongType, StringType, StructField, StructType

    strings = ArrayType(StringType(), False)
    return StructType(
        [StructField("cookie", StringType()), StructField("servers", strings, False),
         StructField("fids", strings, False), StructField("types", strings, False),
         StructField("records", LongType(), False), StructField("first_epoch", LongType()),
         StructField("last_epoch", LongType()), StructField("first_time_ns", LongType()),
         StructField("last_time_ns", LongType())]
    )  # fmt: skip


# --------------------------------------------------------------------------- translate


def resolve_link_rows(snapshot: Iterable[Mapping[str, Any]], root_fid: str, *, max_depth: int = 4096) -> list[tuple]:
    """:func:`epochsync.translate.resolve_links` over rows: every reachable link as (fid, pfid, name, path)."""
    from epochsync.translate import directory_paths

    links = [(r["fid"], r["type"], lk["pfid"], lk["name"]) for r in snapshot for lk in r["links"] or []]
    paths = directory_paths(((f, p, n) for f, t, p, n in links if t == DIR), root_fid, max_depth=max_depth)
    out = []
    for fid, _, pfid, name in links:
        pp = paths.get(pfid)
        if pp is not None:
            out.append((fid, pfid, name, name if pp == "" else f"{pp}/{name}"))
    return out


def _visible(path: str, fileset) -> bool:
    return not fileset or any(path == s.strip("/") or path.startswith(s.strip("/") + "/") for s in fileset)


def plan_entry_rows(old_rows, new_rows, change_rows, *, root_fid: str, fileset=()) -> list[dict]:
    """:func:`epochsync.translate.plan_entries` over rows: one dict per fid the target must act on."""
    from epochsync.translate import finish_entry

    def side(rows) -> dict[str, list[dict]]:
        out: dict[str, list[tuple]] = {}
        for fid, pfid, name, path in resolve_link_rows(rows, root_fid):
            if _visible(path, fileset):
                out.setdefault(fid, []).append((path, pfid, name))
        return {f: [{"path": a, "pfid": b, "name": c} for a, b, c in sorted(v)] for f, v in out.items()}

    old_by = {r["fid"]: r for r in old_rows}
    new_by = {r["fid"]: r for r in new_rows}
    old_l, new_l = side(old_by.values()), side(new_by.values())
    changes = {c["fid"]: c for c in change_rows}
    entries = []
    for fid in sorted(set(old_l) | set(new_l)):
        ol, nl = old_l.get(fid), new_l.get(fid)
        change = changes.get(fid)
        if change is None and ol is not None and nl is not None and ol == nl:
            continue
        new = new_by.get(fid)
        d = {"fid": fid, "old_links": ol or [], "new_links": (nl or []) if new is not None else [],
             "change": change, "old": old_by.get(fid), "new": new}  # fmt: skip
        if finish_entry(d):
            entries.append(d)
    return entries


def read_snapshot_table(cfg, target, epoch: int):
    """Snapshot ``epoch`` of ``target`` as a pyarrow Table (epoch 0 without a written one: the root alone)."""
    import pyarrow as pa

    from epochsync.model import snapshot_struct_type
    from epochsync.oracle import ROOT_MODE
    from epochsync.paths import Warehouse, local_path

    schema = arrow_schema(snapshot_struct_type())
    uri = Warehouse(cfg.warehouse).snapshot(target.name, epoch)
    if os.path.isdir(local_path(uri)):
        table = read_arrow_table(uri, snapshot_struct_type())
        return schema.empty_table() if table is None else table
    if epoch == 0:
        root = {f: None for f in SNAPSHOT_FIELDS}
        root.update(fid=cfg.source_of(target).root_fid, type=DIR, links=[], mode=ROOT_MODE, uid=0, gid=0, size=0,
                    xattrs=[], objects=[])  # fmt: skip
        return pa.Table.from_pylist([root], schema=schema)
    raise EpochError(
        f"no snapshot of target {target.name!r} at epoch {epoch} ({uri}): merge epoch {epoch} first "
        f"(epochsync replicate --target {target.name} --epoch {epoch}) or hydrate the target"
    )


def moved_dirs(changes: list[dict]) -> set[str]:
    """Directories that moved (``links_changed``, neither created nor deleted)."""
    return {c["fid"] for c in changes if c["type"] == DIR and c["links_changed"] and not c["created"] and not c["deleted"]}


def plan_rows(tables: list, changes: list[dict]) -> list[list[dict]]:
    """The rows of each snapshot table a plan needs: directories, changed fids, and
    everything directly inside a directory below a moved one.

    A fid's paths change only through its own links (then it has a change row) or through
    a directory above it moving, so the rest of the namespace can stay on disk: a small
    epoch costs what it touches, whatever the size of the namespace.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    dirs = [t.filter(pc.equal(t.column("type"), DIR)).to_pylist() for t in tables]
    moved = moved_dirs(changes)
    below: set[str] = set()
    if moved:
        children: dict[str, set[str]] = {}
        for rows in dirs:
            for r in rows:
                for lk in r["links"] or []:
                    children.setdefault(lk["pfid"], set()).add(r["fid"])
        todo = list(moved)
        while todo:
            d = todo.pop()
            if d not in below:
                below.add(d)
                todo.extend(children.get(d, ()))
    changed = pa.array(sorted({c["fid"] for c in changes}), pa.string())
    under = pa.array(sorted(below), pa.string())
    out = []
    for t, drows in zip(tables, dirs):
        keep = pc.is_in(t.column("fid"), value_set=changed)
        if len(under):
            links = t.column("links").combine_chunks()
            parents = pc.struct_field(pc.list_flatten(links), "pfid")
            inside = pc.list_parent_indices(links).filter(pc.is_in(parents, value_set=under))
            mask = pc.is_in(pa.array(range(len(t)), pa.int64()), value_set=pc.unique(inside).cast(pa.int64()))
            keep = pc.or_(keep, mask)
        keep = pc.and_(keep, pc.not_equal(t.column("type"), DIR))
        out.append(drows + t.filter(keep).to_pylist())
    return out


def translate_entries(cfg, target, first: int, epoch: int, whole_file: bool = False) -> tuple[list[dict], int]:
    """The plan entries of ``first..epoch`` for ``target`` and the records in (EPOCH records aside)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from epochsync.model import change_struct_type
    from epochsync.paths import Warehouse, local_path

    wh = Warehouse(cfg.warehouse)
    src = cfg.source_of(target)
    if not os.path.isdir(local_path(wh.changes(target.name, epoch))):
        raise EpochError(f"no change set for target {target.name} epoch {epoch}: run the merge stage first")
    changes = read_table_rows(wh.changes(target.name, epoch), change_struct_type())
    old, new = plan_rows([read_snapshot_table(cfg, target, first - 1), read_snapshot_table(cfg, target, epoch)], changes)
    if whole_file:
        for c in changes:
            c["whole_file"] = c["data_changed"]
    entries = plan_entry_rows(old, new, changes, root_fid=src.root_fid, fileset=target.fileset)
    records_in = 0
    dirs = [local_path(wh.records(src.name, e)) for e in range(first, epoch + 1)]
    if all(os.path.isdir(d) for d in dirs):
        for d in dirs:
            for f in _parquet_files(d):
                types = pq.read_table(f, columns=["type"]).column("type")
                records_in += len(types) - (pc.sum(pc.cast(pc.equal(types, "EPOCH"), "int64")).as_py() or 0)
    return entries, records_in
