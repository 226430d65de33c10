"""The merge of a small window in this process: pyarrow and plain Python, no Spark job.

:func:`local_outcome` returns exactly the table the Spark small path collects in
:func:`epochsync.stages.merge._merge_small` (``collect_arrow`` of :func:`~epochsync.stages.merge.state_outcome`
united with :func:`~epochsync.stages.merge.cookie_groups`): the same columns, types and
values, rows in another order. :func:`epochsync.stages.merge.run_merge` hands it to the same
``_publish_small``. It mirrors the Spark transform step by step, each function here named
after the one it mirrors, and keeps SQL's null rules where they decide a value (``greatest``
and ``max`` skip nulls, a null condition selects nothing), so the rules live in
:mod:`epochsync.stages.merge`'s docstring and ``docs/INTERNALS.md`` ("Merge: the replay
order"), not here. ``tests/support/merge_paths.py`` holds the two equal, table for table and
error for error, in the rule, oracle-property and stage tests.

Why another path: a small epoch's Spark merge is one operation of analysis and planning of
some 300 expressions, 3.5-5 s on two cores for a 1,700-record epoch whatever its data; this
takes 0.25-0.45 s for it (``docs/INTERNALS.md``, "Merge: small windows in this process",
which also says why the threshold is 250,000).
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from epochsync.core.errors import EpochError
from epochsync.core.model import CHANGE_FIELDS, DIR, FILE, OTHER, SNAPSHOT_FIELDS, SYMLINK
from epochsync.formats.common import FLAG_OPEN_EXEC, FLAG_OPEN_READ, FLAG_OPEN_WRITE
from epochsync.stages.merge_common import (
    ATTR_COLUMNS,
    CREATORS,
    LINK_ADDERS,
    LINK_REMOVERS,
    MERGED_TYPES,
    S_IFMT,
    SIZE_SETTERS,
    TIME_SETTERS,
    TIME_TYPES,
)

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

#: merge inputs (records + snapshot rows named) below which the merge runs in this process.
#: Measured on a Gluster epoch of 50,000 new files (150,173 records + 50,075 fids, load 3, one
#: warm local[2] server): 12.1-13.5 s here (about 60 µs of CPU per row, peak RSS about 1 GB)
#: against 23.1 s on the Spark small path and 32.5-55.5 s on the large one. Memory is the
#: bound: about 4.5 KB per row, so 1.1 GB at this default
LOCAL_MAX_ROWS = 250_000

Row = dict[str, Any]


def local_max_rows() -> int:
    """Input rows below which the merge runs here (``EPOCHSYNC_MERGE_LOCAL_MAX_ROWS``; 0: never)."""
    return int(os.environ.get("EPOCHSYNC_MERGE_LOCAL_MAX_ROWS", LOCAL_MAX_ROWS))


# --------------------------------------------------------------------------- inputs


def record_arrow_schema() -> pa.Schema:
    """The Arrow schema of canonical records as :func:`epochsync.stages.ingest.read_records` types them."""
    from epochsync.core.schema import record_arrow_schema as schema

    return schema()


def read_window_records(records_uri: str, first: int, last: int) -> pa.Table:
    """The records of epochs ``first..last`` (``records_uri`` = ``Warehouse.records(source)``), every
    column of the canonical schema: ``epoch`` and ``server`` come from the partition
    directories, as Spark's read derives them (:func:`epochsync.stages.ingest.read_records`)."""
    import pyarrow as pa

    from epochsync.core.arrow import array, dataset_module
    from epochsync.warehouse import fs as warehouse_fs
    from epochsync.warehouse.paths import local_path

    ds = dataset_module()

    schema = record_arrow_schema()
    in_files = pa.schema([f for f in schema if f.name not in ("epoch", "server")])
    server = ds.partitioning(pa.schema([("server", pa.string())]), flavor="hive")
    tables = []
    for e in range(first, last + 1):
        uri = f"{records_uri}/epoch={e}"
        if not warehouse_fs.exists(uri):
            raise EpochError(f"not ingested yet: {uri}")
        t = ds.dataset(local_path(uri), format="parquet", partitioning=server, schema=in_files.append(server.schema[0]))
        t = t.to_table()
        t = t.append_column("epoch", array([e] * t.num_rows, pa.int64()))
        tables.append(t.select(schema.names).cast(schema))
    return pa.concat_tables(tables) if tables else schema.empty_table()


# --------------------------------------------------------------------------- the outcome


def outcome_arrow_schema() -> pa.Schema:
    """The columns of the Spark small path's collect: ``exists_after``, ``s_*``, ``c_*``, ``c__changed``, ``g_*``."""
    import pyarrow as pa

    from epochsync.core.model import change_arrow_schema
    from epochsync.stages.merge_common import cookie_arrow_schema
    from epochsync.warehouse.snapshot_files import snapshot_arrow_schema

    snap = snapshot_arrow_schema()
    change = change_arrow_schema()
    fields = [pa.field("exists_after", pa.bool_())]
    fields += [pa.field("s_" + f.name, f.type) for f in snap]
    fields += [pa.field("c_" + f.name, f.type) for f in change]
    fields.append(pa.field("c__changed", pa.bool_()))
    for f in cookie_arrow_schema():  # collect_set's arrays hold no null
        t = pa.list_(pa.field("element", f.type.value_type, nullable=False)) if pa.types.is_list(f.type) else f.type
        fields.append(pa.field("g_" + f.name, t))
    return pa.schema(fields)


def local_outcome(
    prev_rows: pa.Table, records: pa.Table, root_fid: str | Iterable[str], extents_known: bool = True
) -> pa.Table:
    """The Spark small path's collected table (:func:`~epochsync.stages.merge.state_outcome` rows,
    then :func:`~epochsync.stages.merge.cookie_groups` rows) for snapshot E-1's rows of the fids
    the records name (``prev_rows``, snapshot columns) and the window's records (canonical
    columns, :func:`read_window_records`).

    Raises :class:`EpochError` with the sentence the Spark merge's ``raise_error`` carries
    (``record ... has no fid, parent fid or name``, ``fid F gains a name ...``, ``fid F: name
    n in P is added and removed in no order that applies (...)``): ``merge._clean_error``
    turns either into the same message.
    """
    from epochsync.core.arrow import table_from_pylist

    roots = {root_fid} if isinstance(root_fid, str) else set(root_fid)
    raw = records.to_pylist()
    prev = {r["fid"]: r for r in prev_rows.select(list(SNAPSHOT_FIELDS)).to_pylist()}
    recs = prepare_records(raw)
    meta = attribute_changes(recs)
    links = link_changes(recs)
    xattrs = xattr_changes(recs)
    data = write_data(recs, meta, prev, extents_known)
    fids = sorted(set(meta) | set(links) | set(xattrs) | set(data))
    rows = []
    for fid in fids:
        row = _state_row(fid, prev.get(fid), meta.get(fid), links.get(fid), xattrs.get(fid), data.get(fid))
        row = _merge_state_row(row, fid in roots, extents_known)
        if row["existed_before"] or row["exists_after"]:
            rows.append(_outcome_row(row, extents_known))
    rows += [{"g_" + k: v for k, v in g.items()} for g in cookie_groups(raw)]
    # built from buffers: pa.Table.from_pylist imports pandas (0.3-0.4 s of a small epoch)
    return table_from_pylist(rows, outcome_arrow_schema())


# --------------------------------------------------------------------------- the steps


def _node_type(r: Row) -> str:
    t = r["type"]
    if t == "CREAT":
        return FILE
    if t == "MKDIR":
        return DIR
    if t == "SLINK":
        return SYMLINK
    bits = (r["mode"] or 0) & S_IFMT
    return {0o100000: FILE, 0o040000: DIR, 0o120000: SYMLINK}.get(bits, OTHER)


def causal_time(about: list[Row]) -> None:
    """Sets ``ctime`` on each record (records with their ``fid``): :func:`epochsync.stages.merge.causal_time`."""
    by_fid: dict[Any, list[Row]] = defaultdict(list)
    for r in about:
        by_fid[r["fid"]].append(r)
    for rs in by_fid.values():
        ops: dict[str, list[Row]] = defaultdict(list)
        for r in rs:
            r["_t"] = r["time_ns"] or 0
            r["_op"] = None
            if r["cookie"] is not None:
                ops[r["cookie"]].append(r)
        for op in ops.values():
            if len({r["server"] for r in op}) > 1:
                t = max(r["_t"] for r in op)
                for r in op:
                    r["_op"] = t
        by_server: dict[str, list[Row]] = defaultdict(list)
        for r in rs:
            by_server[r["server"]].append(r)
        for srs in by_server.values():
            srs.sort(key=lambda r: r["index"])
            upto: int | None = None
            before: int | None = None  # the highest operation time + 1 of the records before
            for r in srs:
                own = r["_t"] if r["_op"] is None else max(r["_t"], r["_op"])
                upto = own if upto is None else max(upto, own)
                r["ctime"] = upto if before is None else max(upto, before)
                if r["_op"] is not None:
                    before = r["_op"] + 1 if before is None else max(before, r["_op"] + 1)


def prepare_records(raw: list[Row]) -> list[Row]:
    """The records the merge reads, with ``fid`` and ``ord``: :func:`epochsync.stages.merge.prepare_records`."""
    about = [{**r, "fid": r["sfid"] if r["type"] == "RENME" else r["tfid"]} for r in raw]
    causal_time(about)
    merged = set(MERGED_TYPES)
    out = []
    for r in about:
        if r["type"] in merged:
            r["ord"] = (0 if r["type"] in CREATORS else 1, r["ctime"], r["server"], r["index"])
            out.append(r)
    return out


def _last(rs: Iterable[Row], value, cond) -> tuple | None:
    """``max(named_struct('o', ord, 'v', value)) FILTER (WHERE cond)``: ``(ord, value)`` of the last match."""
    best = None
    for r in rs:
        if cond(r) and (best is None or r["ord"] > best[0]):
            best = (r["ord"], value(r))
    return best


def _close_for_write(r: Row) -> bool:
    f = r["flags"]
    if r["type"] != "CLOSE" or f is None:
        return False
    if f & (FLAG_OPEN_READ | FLAG_OPEN_WRITE | FLAG_OPEN_EXEC):
        return bool(f & FLAG_OPEN_WRITE)
    return f & 3 in (1, 2)


def _creator(r: Row) -> bool:
    return r["type"] in CREATORS


def _set_by_creator_or_sattr(col: str):
    """The records that set ``col``: creates (even to null) and ``SATTR`` records carrying it."""
    return lambda r: _creator(r) or (r["type"] == "SATTR" and r[col] is not None)


def _time_value(col: str, rtype: str):
    """``col`` of a record; a record of type ``rtype`` (``MTIME``...) without it: its own ``time_ns``."""
    return lambda r: (r[col] if r[col] is not None else r["time_ns"]) if r["type"] == rtype else r[col]


def _time_set(col: str, rtype: str):
    return lambda r: (r["type"] in TIME_SETTERS and r[col] is not None) or r["type"] == rtype


def _has_type_bits(r: Row) -> bool:
    return (r["type"] == "SATTR" or _creator(r)) and r["mode"] is not None and r["mode"] & S_IFMT != 0


def attribute_changes(recs: list[Row]) -> dict[str, Row]:
    """Per fid (non-``WRITE`` records): :func:`epochsync.stages.merge.attribute_changes`."""
    by_fid: dict[str, list[Row]] = defaultdict(list)
    for rec in recs:
        if rec["type"] != "WRITE" and rec["fid"] is not None:
            by_fid[rec["fid"]].append(rec)
    out = {}
    for fid, rs in by_fid.items():
        m: Row = {
            "l_type": _last(rs, _node_type, _creator),
            "l_mode": _last(rs, lambda r: r["mode"], _set_by_creator_or_sattr("mode")),
            "l_type_bits": _last(rs, lambda r: r["mode"], _has_type_bits),
            "l_uid": _last(rs, lambda r: r["uid"], _set_by_creator_or_sattr("uid")),
            "l_gid": _last(rs, lambda r: r["gid"], _set_by_creator_or_sattr("gid")),
            "l_symlink": _last(rs, lambda r: r["symlink"] if _node_type(r) == SYMLINK else None, _creator),
            "l_layout": _last(rs, lambda r: r["layout"], lambda r: _creator(r) or r["type"] == "LYOUT"),
        }
        for col, rtype in TIME_TYPES.items():
            m["l_" + col] = _last(rs, _time_value(col, rtype), _time_set(col, rtype))
        sizes = [r for r in rs if r["type"] in SIZE_SETTERS and r["size"] is not None]
        m["l_size"] = _last(sizes, lambda r: r["size"], lambda r: True)
        m["min_set_size"] = min((r["size"] for r in sizes), default=None)
        types = {r["type"] for r in rs}
        m["relayout"] = "LYOUT" in types
        m["blind_data"] = bool(types & {"MTIME", "TRUNC", "LYOUT"}) or any(_close_for_write(r) for r in rs)
        m["attr_touch"] = bool(types & {"SATTR", "MTIME", "CTIME", "ATIME"})
        m["xattr_touch"] = "XATTR" in types
        out[fid] = m
    return out


def _link_error(r: Row) -> EpochError:
    return EpochError(
        f"record {r['server']}:{r['index']} ({r['type']}) has no fid, parent fid or name;"
        " fix the importer or quarantine the record"
    )


def _link_events(r: Row) -> list[tuple]:
    """``(fid, pfid, name, d, sub)`` of one namespace record (the ``events`` array of :func:`link_changes`)."""
    t, tfid, sfid = r["type"], r["tfid"], r["sfid"]
    evs = []
    if t in LINK_ADDERS:
        evs.append((tfid, r["pfid"], r["name"], 1, 0))
    if t in LINK_REMOVERS:
        evs.append((tfid, r["pfid"], r["name"], -1, 0))
    # SQL: NOT (tfid IS NOT NULL AND tfid = sfid) is null, so false, when sfid alone is null
    if t == "RENME" and not (tfid is not None and (sfid is None or tfid == sfid)):
        evs.append((sfid, r["spfid"], r["sname"], -1, 0))
        if tfid is not None:
            evs.append((tfid, r["pfid"], r["name"], -1, 0))
        evs.append((sfid, r["pfid"], r["name"], 1, 1))
    for fid, pfid, name, _, _ in evs:
        if fid is None or pfid is None or name is None:
            raise _link_error(r)
    return evs


def _consistent(lk: Row, b: int) -> bool:
    """Whether some order applies a name's events, given it was held (``b`` = 1) at E-1."""
    if not (0 <= b + lk["d"] <= 1 and b + lk["lo"] >= 0 and b + lk["hi"] <= 1):
        return False
    if lk["adders"] == 0:
        return lk["foreign_removes"] <= b
    if lk["adders"] == 1:
        needed = lk["h_adds_in_a_row"] + ((1 if lk["h_first"] == 1 else 0) if b else 0)
        return (
            lk["h_removes_in_a_row"] == 0
            and (bool(b) or lk["h_first"] == 1)
            and (lk["foreign_removes"] == needed or (lk["foreign_removes"] == needed + 1 and lk["h_last"] == 1))
        )
    return True


def link_changes(recs: list[Row]) -> dict[str, Row]:
    """Per fid: ``added``, ``removed``, ``bad_absent``, ``bad_present``, ``bad_records``
    (:func:`epochsync.stages.merge.link_changes`, whose docstring says why the check is exact)."""
    kinds = {*LINK_ADDERS, *LINK_REMOVERS, "RENME"}
    per_server: dict[tuple, list[tuple]] = defaultdict(list)
    for r in recs:
        if r["type"] in kinds:
            for fid, pfid, name, d, sub in _link_events(r):
                per_server[(fid, pfid, name, r["server"])].append((r["index"], sub, d, r["type"]))
    per_link: dict[tuple, list[Row]] = defaultdict(list)
    for (fid, pfid, name, server), evs in per_server.items():
        evs.sort()
        run, low, high, prev_d = 0, None, None, None
        s: Row = {"n_add": 0, "n_rem": 0, "adds_in_a_row": 0, "removes_in_a_row": 0}
        for _, _, d, _ in evs:
            s["n_add" if d == 1 else "n_rem"] += 1
            if prev_d == d:
                s["adds_in_a_row" if d == 1 else "removes_in_a_row"] += 1
            run += d
            low = run if low is None else min(low, run)
            high = run if high is None else max(high, run)
            prev_d = d
        s.update(first_d=evs[0][2], last_d=evs[-1][2], low=low, high=high)
        s["evs"] = [(server, index, t) for index, _, _, t in evs]
        per_link[(fid, pfid, name)].append(s)
    out: dict[str, Row] = {}
    for (fid, pfid, name), servers in per_link.items():
        adders = [s for s in servers if s["n_add"] > 0]
        n_add = sum(s["n_add"] for s in servers)
        n_rem = sum(s["n_rem"] for s in servers)
        lk = {
            "d": n_add - n_rem,
            "lo": n_add + min(s["low"] - s["n_add"] for s in servers),
            "hi": max(s["high"] + s["n_rem"] for s in servers) - n_rem,
            "adders": len(adders),
            "h_first": max((s["first_d"] for s in adders), default=None),
            "h_last": max((s["last_d"] for s in adders), default=None),
            "h_adds_in_a_row": max((s["adds_in_a_row"] for s in adders), default=None),
            "h_removes_in_a_row": max((s["removes_in_a_row"] for s in adders), default=None),
            "foreign_removes": sum(s["n_rem"] for s in servers if s["n_add"] == 0),
        }
        f = out.setdefault(fid, {"added": [], "removed": [], "bad_absent": [], "bad_present": [], "bad_records": {}})
        pair = (pfid, name)
        if lk["d"] == 1:
            f["added"].append(pair)
        elif lk["d"] == -1:
            f["removed"].append(pair)
        ok_absent, ok_present = _consistent(lk, 0), _consistent(lk, 1)
        if not ok_absent:
            f["bad_absent"].append(pair)
        if not ok_present:
            f["bad_present"].append(pair)
        if not (ok_absent and ok_present):
            f["bad_records"][pair] = [e for s in servers for e in s["evs"]]
    return out


def xattr_changes(recs: list[Row]) -> dict[str, Row]:
    """Per fid: ``x_touched`` names and ``x_set`` {name: value}: :func:`epochsync.stages.merge.xattr_changes`."""
    last: dict[str, dict[str, tuple]] = defaultdict(dict)
    for r in recs:
        if r["type"] == "XATTR" and r["xattr_name"] is not None and r["fid"] is not None:
            seen = last[r["fid"]].get(r["xattr_name"])
            if seen is None or r["ord"] > seen[0]:
                last[r["fid"]][r["xattr_name"]] = (r["ord"], r["xattr_value"])
    return {
        fid: {
            "x_touched": set(names),
            "x_set": [{"name": n, "value": v} for n, (_, v) in names.items() if v is not None],
        }
        for fid, names in last.items()
    }


def _write_kind(w: Row, layout: Row | None, extents_known: bool) -> tuple[str, int | None]:
    """A write's ``kind`` (:func:`epochsync.stages.merge.write_chunks`) and its object's stripe ``k``."""
    if not extents_known:
        return "whole", None
    obj, extents = w["object"], w["extents"]
    if extents is None:
        return ("whole" if obj is None else "nothing"), None
    cnt = layout["stripe_count"] if layout is not None else None
    if obj is None or layout is None or cnt == 1:
        return "identity", None
    objects = layout["objects"]
    k = None
    if objects is not None:
        want = {"ost": obj["ost"], "oid": obj["oid"]}
        k = next((i for i, o in enumerate(objects) if o is not None and o == want), -1)
    ss = layout["stripe_size"]
    if (k if k is not None else -1) < 0 or (ss is not None and ss <= 0) or (cnt is not None and cnt < 1):
        return "whole", k
    return "striped", k


def _chunks(x: Row, kind: str, layout: Row | None, k: int | None) -> Iterable[tuple[int, int]]:
    """File-offset intervals of one object extent (RAID-0, DESIGN section 4)."""
    off, end = x["offset"], x["offset"] + x["length"]
    if kind == "identity":
        yield off, end
        return
    assert layout is not None and k is not None
    ss, cnt = layout["stripe_size"], layout["stripe_count"]
    if ss is None or cnt is None:  # SQL: sequence() of a null is null, exploded to nothing
        return
    for j in range(off // ss, (end - 1) // ss + 1):
        base = (j * cnt + k) * ss - j * ss
        yield base + max(off, j * ss), base + min(end, (j + 1) * ss)


def _union(chunks: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted disjoint non-adjacent intervals covering ``chunks`` (adjacent ones join)."""
    out: list[list[int]] = []
    for s, e in sorted(chunks):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def write_data(recs: list[Row], meta: dict[str, Row], prev: dict[str, Row], extents_known: bool) -> dict[str, Row]:
    """Per written fid: ``ranges_raw``, ``wmax``, ``write_whole``, ``w_<time>`` and ``new_objects``
    (:func:`epochsync.stages.merge.layout_facts`, ``write_chunks`` and ``write_data``)."""
    writes: dict[str, list[Row]] = defaultdict(list)
    for r in recs:
        if r["type"] == "WRITE" and r["fid"] is not None:
            writes[r["fid"]].append(r)
    out = {}
    for fid, ws in writes.items():
        m = meta.get(fid)
        l_layout = m["l_layout"] if m else None
        p = prev.get(fid)
        layout = (p["layout"] if p else None) if l_layout is None else l_layout[1]
        set_ord = m["l_size"][0] if m and m["l_size"] else None
        chunks: list[tuple[int, int, bool]] = []
        whole = False
        for w in ws:
            kind, k = _write_kind(w, layout, extents_known)
            whole = whole or kind == "whole"
            if kind not in ("identity", "striped"):
                continue
            after_set = set_ord is None or w["ord"] > set_ord
            for x in w["extents"]:
                if x is None or x["offset"] is None or x["length"] is None or not x["length"] > 0:
                    continue
                chunks.extend((s, e, after_set) for s, e in _chunks(x, kind, layout, k))
        d: Row = {"write_whole": whole, "has_write": True}
        if chunks:
            d["ranges_raw"] = _union([(s, e) for s, e, _ in chunks])
            d["wmax"] = max((e for _, e, after in chunks if after), default=None)
        else:
            d["ranges_raw"] = d["wmax"] = None
        for col in TIME_TYPES:
            d["w_" + col] = _last(ws, lambda r, col=col: r[col], lambda r, col=col: r[col] is not None)
        latest: dict[tuple, tuple] = {}
        for w in ws:
            o = w["object"]
            if o is not None:
                key = (o["ost"], o["oid"])
                if key not in latest or w["ord"] > latest[key][0]:
                    latest[key] = (w["ord"], o["version"], o.get("size"))
        d["new_objects"] = (
            [{"ost": ost, "oid": oid, "version": v, "size": n} for (ost, oid), (_, v, n) in sorted(latest.items())]
            if latest
            else None
        )
        out[fid] = d
    return out


def _state_row(fid, p, m, lk, x, w) -> Row:
    row: Row = {"fid": fid}
    for c in SNAPSHOT_FIELDS[1:]:
        row["p_" + c] = p[c] if p else None
    row.update(m or {})
    row.update(lk or {})
    row.update(x or {})
    row.update(w or {})
    return row


def _gt(a, b):
    """SQL ``greatest`` of two ``(o, v)`` structs (nulls skipped)."""
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b, key=lambda t: t[0])


def _link_sentence(fid: str, first_bad: tuple, held: list, records: list[tuple]) -> str:
    pfid, name = first_bad
    recs = ", ".join(f"{s} index {i} ({t})" for s, i, t in sorted(records)[:8])
    state = "held" if first_bad in held else "not held"
    return (
        f"fid {fid}: name {name} in {pfid} is added and removed in no order that applies ({state} at E-1;"
        f" records {recs}): the snapshot and the changelog disagree (missing or reordered records?)"
    )


def _merge_state_row(st: Row, is_root: bool, extents_known: bool) -> Row:
    """The per-fid state at E: :func:`epochsync.stages.merge.merge_state` for one fid."""
    g = st.get
    fid = st["fid"]
    p_links = g("p_links")
    held = [(lk["pfid"], lk["name"]) for lk in p_links or []]
    st["existed_before"] = g("p_type") is not None
    if is_root:
        links: list[tuple] = []
    else:
        absent = [b for b in dict.fromkeys(g("bad_absent") or []) if b not in held]
        present = [b for b in dict.fromkeys(g("bad_present") or []) if b in held]
        bad = sorted(absent) + sorted(present)
        if bad:
            raise EpochError(_link_sentence(fid, bad[0], held, st["bad_records"][bad[0]]))
        removed = set(g("removed") or [])
        links = sorted({*(h for h in held if h not in removed), *(g("added") or [])})
    st["links"] = [{"pfid": pf, "name": n} for pf, n in links]
    st["exists_after"] = is_root or len(links) > 0
    if g("p_type") is not None:
        st["type"] = st["p_type"]
    elif st["exists_after"] and g("l_type") is None:
        raise EpochError(
            f"fid {fid} gains a name in this window but is neither in snapshot E-1 nor created"
            " by a CREAT/MKDIR/MKNOD/SLINK record: the snapshot and the changelog disagree (hydrate the target)"
        )
    else:
        st["type"] = st["l_type"][1] if g("l_type") is not None else None

    def last_or_prev(col):
        return st["p_" + col] if g("l_" + col) is None else st["l_" + col][1]

    l_mode = g("l_mode")
    if l_mode is None:
        st["n_mode"] = g("p_mode")
    elif l_mode[1] is None or l_mode[1] & S_IFMT != 0:
        st["n_mode"] = l_mode[1]
    else:
        bits = g("l_type_bits")
        src = bits[1] if bits is not None and bits[1] is not None else g("p_mode")
        st["n_mode"] = l_mode[1] | ((src or 0) & S_IFMT)
    for c in ("uid", "gid", "symlink", "layout"):
        st["n_" + c] = last_or_prev(c)
    p_xattrs = g("p_xattrs")
    if extents_known:
        touched = g("x_touched") or set()
        kept = [x for x in p_xattrs or [] if x["name"] not in touched]
        st["n_xattrs"] = sorted(
            [*kept, *(g("x_set") or [])], key=lambda x: (x["name"], x["value"] is not None, x["value"] or b"")
        )
    else:
        st["n_xattrs"] = list(p_xattrs) if p_xattrs is not None else []
    p_size = g("p_size")
    old0: int = p_size if p_size is not None else 0
    st["old0"] = old0
    l_size = g("l_size")
    set_size = l_size[1] if l_size is not None else None
    for col in TIME_TYPES:
        best = _gt(g("l_" + col), g("w_" + col))
        st["n_" + col] = g("p_" + col) if best is None else best[1]

    wmax = g("wmax")
    existed = st["existed_before"]
    n_size: int | None
    if st["type"] == FILE:
        if set_size is not None:
            n_size = set_size if wmax is None else max(set_size, wmax)
        elif wmax is not None:
            n_size = max(old0, wmax)
        else:
            n_size = g("p_size") if existed else 0
    else:
        n_size = set_size if set_size is not None else (g("p_size") if existed else 0)
    st["n_size"] = n_size
    is_file = st["exists_after"] and st["type"] == FILE
    whole = bool(g("write_whole")) or bool(g("relayout"))
    if not extents_known:
        whole = whole or bool(g("blind_data"))
    st["whole_file"] = is_file and whole
    min_set = g("min_set_size")
    low: int = old0 if min_set is None else min(old0, min_set)
    trunc_from = low if existed and low < old0 else None
    rc: list[tuple[int, int]] = [(s, e if n_size is None else min(e, n_size)) for s, e in g("ranges_raw") or []]
    rc = [(s, e) for s, e in rc if e > s]
    if is_file and not st["whole_file"]:
        if trunc_from is not None and n_size is not None and trunc_from < n_size:
            tail = [s for s, e in rc if e >= trunc_from]
            rc = [(s, e) for s, e in rc if e < trunc_from] + [(min(trunc_from, min(tail, default=trunc_from)), n_size)]
        st["ranges"] = [{"offset": s, "length": e - s} for s, e in rc]
    else:
        st["ranges"] = []
    p_objects = g("p_objects")
    new_objects = g("new_objects")
    new_keys = {(o["ost"], o["oid"]) for o in new_objects or []}
    merged = sorted(
        [*(o for o in p_objects or [] if (o["ost"], o["oid"]) not in new_keys), *(new_objects or [])],
        key=lambda o: (o["ost"], o["oid"], o["version"] is not None, o["version"] or ""),
    )
    if g("relayout"):
        layout = st["n_layout"]
        in_layout = {(lo["ost"], lo["oid"]) for lo in (layout["objects"] or [])} if layout is not None else set()
        st["n_objects"] = [o for o in merged if (o["ost"], o["oid"]) in in_layout]
    elif new_objects is None:
        st["n_objects"] = list(p_objects) if p_objects is not None else []
    else:
        st["n_objects"] = merged
    return st


def _outcome_row(st: Row, extents_known: bool) -> Row:
    """One :func:`epochsync.stages.merge.state_outcome` row (``_change_columns``)."""
    existed, after = st["existed_before"], st["exists_after"]
    attrs_differ = any(st["n_" + c] != st["p_" + c] for c in ATTR_COLUMNS)
    if extents_known:
        xattrs_differ = (not existed and len(st["n_xattrs"]) > 0) or (existed and st["n_xattrs"] != st["p_xattrs"])
    else:
        attrs_differ = attrs_differ or bool(st.get("attr_touch"))
        xattrs_differ = bool(st.get("xattr_touch"))
    flags = {
        "created": not existed and after,
        "deleted": existed and not after,
        "links_changed": existed != after or st["links"] != st["p_links"],
        "attrs_changed": after and (not existed or attrs_differ),
        "xattrs_changed": after and xattrs_differ,
        "data_changed": after
        and st["type"] == FILE
        and (st["whole_file"] or len(st["ranges"]) > 0 or st["n_size"] != st["old0"]),
    }
    change = {
        **flags,
        "fid": st["fid"],
        "type": st["type"],
        "whole_file": st["whole_file"],
        "ranges": st["ranges"],
        "old_size": st["p_size"],
        "new_size": st["n_size"] if after else None,
    }
    out: Row = {"exists_after": after}
    for c in SNAPSHOT_FIELDS:
        out["s_" + c] = st[c] if c in ("fid", "type", "links") else st["n_" + c]
    for c in CHANGE_FIELDS:
        out["c_" + c] = change[c]
    out["c__changed"] = any(flags.values())
    return out


def cookie_groups(raw: list[Row]) -> list[Row]:
    """Records sharing a ``cookie`` across servers: :func:`epochsync.stages.merge.cookie_groups`."""
    groups: dict[str, list[Row]] = defaultdict(list)
    for r in raw:
        if r["cookie"] is not None:
            groups[r["cookie"]].append(r)
    out = []
    for cookie, rs in groups.items():
        servers = sorted({r["server"] for r in rs if r["server"] is not None})
        if len(servers) < 2:
            continue
        times = [r["time_ns"] for r in rs if r["time_ns"] is not None]
        epochs = [r["epoch"] for r in rs if r["epoch"] is not None]
        out.append(
            {
                "cookie": cookie,
                "servers": servers,
                "fids": sorted({r[c] for r in rs for c in ("tfid", "sfid") if r[c] is not None}),
                "types": sorted({r["type"] for r in rs if r["type"] is not None}),
                "records": len(rs),
                "first_epoch": min(epochs, default=None),
                "last_epoch": max(epochs, default=None),
                "first_time_ns": min(times, default=None),
                "last_time_ns": max(times, default=None),
            }
        )
    return out
