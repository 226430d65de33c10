"""The net-change rules in DuckDB SQL over Arrow tables: one fid range, in the calling process.

:func:`merge_outcome` takes snapshot E-1's rows of the fids the records name and the window's
records (Arrow tables) and returns the per-fid outcome table that
:func:`epochsync.stages.merge._publish_small` splits into the snapshot delta, the change set and
the cookie groups (:func:`outcome_arrow_schema`). The rules are the ones stated in
:mod:`epochsync.stages.merge`'s docstring and DESIGN section 5; the SQL follows the Spark
transforms of that module expression by expression (the same window functions, the same
``max(struct) FILTER`` for "last value wins", the same null rules), so that both give the same
table on every input the tests hold them to (``tests/support/merge_paths.py``).

Why DuckDB: measured on the bench's 1 M-record epoch (``docs/INTERNALS.md``, "Merge"), the
causal-time windows and the rank took 1.3 s of CPU in DuckDB against 2.9 s in polars, with
the last-value aggregates 0.8 s against 0.5 s; and the Spark SQL ports to it almost one to one.

Everything is computed per fid: a caller may split the records by fid (with the snapshot rows
of those fids) and call this on each part; only the cookie groups span fids.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

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


def _in(values) -> str:
    return "(" + ", ".join(f"'{v}'" for v in values) + ")"


_LINK = "STRUCT(pfid VARCHAR, name VARCHAR)"
_XATTR = "STRUCT(name VARCHAR, value BLOB)"
_OBJECT = "STRUCT(ost VARCHAR, oid VARCHAR, version VARCHAR, size BIGINT)"
_EXTENT = 'STRUCT("offset" BIGINT, length BIGINT)'


def _empty(element_type: str) -> str:
    return f"CAST([] AS {element_type}[])"


def _last(value: str, cond: str, alias: str) -> str:
    """The ``{o, v}`` struct of the last record (by ``o``) matching ``cond``; null if none."""
    return f"max({{'o': o, 'v': {value}}}) FILTER (WHERE {cond}) AS {alias}"


#: "this CLOSE follows an open for write" (formats.common.opened_for_write)
_CLOSE_FOR_WRITE = (
    f"(type = 'CLOSE' AND flags IS NOT NULL AND CASE WHEN flags & {FLAG_OPEN_READ | FLAG_OPEN_WRITE | FLAG_OPEN_EXEC} != 0"
    f" THEN flags & {FLAG_OPEN_WRITE} != 0 ELSE flags & 3 IN (1, 2) END)"
)
_NODE_TYPE = (
    f"CASE type WHEN 'CREAT' THEN '{FILE}' WHEN 'MKDIR' THEN '{DIR}' WHEN 'SLINK' THEN '{SYMLINK}' ELSE "
    f"CASE coalesce(mode, 0) & {S_IFMT} WHEN {0o100000} THEN '{FILE}' WHEN {0o040000} THEN '{DIR}'"
    f" WHEN {0o120000} THEN '{SYMLINK}' ELSE '{OTHER}' END END"
)

# ------------------------------------------------------------------ the replay order
# (merge.causal_time and merge.prepare_records): computed on narrow columns with the fid as an
# integer key (``fk``); ``o`` is the record's position in the order (fid, creator first,
# ctime, server, index), so comparing ``o`` within a fid compares the Spark path's ``ord``.
_RANK = f"""
WITH ops AS (
  SELECT fk, cookie, max(coalesce(time_ns, 0)) AS op_t FROM narrow
  WHERE cookie IS NOT NULL GROUP BY fk, cookie HAVING min(server) != max(server)),
opd AS (
  SELECT n.rid, n.fk, n.type, n.server, n."index", coalesce(n.time_ns, 0) AS t, ops.op_t
  FROM narrow n LEFT JOIN ops ON n.fk = ops.fk AND n.cookie = ops.cookie),
ct AS (
  SELECT *, greatest(max(greatest(t, op_t)) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW),
                     max(op_t + 1) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)) AS ctime
  FROM opd WINDOW w AS (PARTITION BY fk, server ORDER BY "index"))
SELECT rid, row_number() OVER (ORDER BY fk, CASE WHEN type IN {_in(CREATORS)} THEN 0 ELSE 1 END, ctime, server, "index") AS o
FROM ct WHERE type IN {_in(MERGED_TYPES)}
"""

# ------------------------------------------------------------------ attributes (merge.attribute_changes)
_CRE = f"type IN {_in(CREATORS)}"
_SIZE_SET = f"type IN {_in(SIZE_SETTERS)} AND size IS NOT NULL"
_ATTRS = f"""
SELECT fid,
  max({{'o': o, 'v': {_NODE_TYPE}}}) FILTER (WHERE {_CRE}) AS l_type,
  {_last("mode", f"{_CRE} OR (type = 'SATTR' AND mode IS NOT NULL)", "l_mode")},
  {_last("mode", f"(type = 'SATTR' OR {_CRE}) AND mode & {S_IFMT} != 0", "l_type_bits")},
  {_last("uid", f"{_CRE} OR (type = 'SATTR' AND uid IS NOT NULL)", "l_uid")},
  {_last("gid", f"{_CRE} OR (type = 'SATTR' AND gid IS NOT NULL)", "l_gid")},
  {
    ", ".join(
        _last(
            f"CASE WHEN type = '{rtype}' THEN coalesce({col}, time_ns) ELSE {col} END",
            f"(type IN {_in(TIME_SETTERS)} AND {col} IS NOT NULL) OR type = '{rtype}'",
            "l_" + col,
        )
        for col, rtype in TIME_TYPES.items()
    )
}, {_last(f"CASE WHEN {_NODE_TYPE} = '{SYMLINK}' THEN symlink END", _CRE, "l_symlink")},
  {_last("layout", f"{_CRE} OR type = 'LYOUT'", "l_layout")},
  {_last("size", _SIZE_SET, "l_size")},
  min(size) FILTER (WHERE {_SIZE_SET}) AS min_set_size,
  bool_or(type = 'LYOUT') AS relayout,
  bool_or(type IN ('MTIME', 'TRUNC', 'LYOUT') OR {_CLOSE_FOR_WRITE}) AS blind_data,
  bool_or(type IN ('SATTR', 'MTIME', 'CTIME', 'ATIME')) AS attr_touch,
  bool_or(type = 'XATTR') AS xattr_touch
FROM ranked WHERE type != 'WRITE' AND fid IS NOT NULL GROUP BY fid
"""

# ------------------------------------------------------------------ links (merge.link_changes)
_REN = "type = 'RENME' AND NOT (tfid IS NOT NULL AND tfid = sfid)"
_EVENTS = f"""
SELECT rid, server, "index", type, tfid AS fid, pfid, name, 1 AS d, 0 AS sub FROM ranked WHERE type IN {_in(LINK_ADDERS)}
UNION ALL SELECT rid, server, "index", type, tfid, pfid, name, -1, 0 FROM ranked WHERE type IN {_in(LINK_REMOVERS)}
UNION ALL SELECT rid, server, "index", type, sfid, spfid, sname, -1, 0 FROM ranked WHERE {_REN}
UNION ALL SELECT rid, server, "index", type, tfid, pfid, name, -1, 0 FROM ranked WHERE {_REN} AND tfid IS NOT NULL
UNION ALL SELECT rid, server, "index", type, sfid, pfid, name, 1, 1 FROM ranked WHERE {_REN}
"""


def _consistent(b: int) -> str:
    needed = f"h_adds_in_a_row + {'CASE WHEN h_first = 1 THEN 1 ELSE 0 END' if b else '0'}"
    return f"""({b} + d BETWEEN 0 AND 1 AND {b} + lo >= 0 AND {b} + hi <= 1 AND CASE
        WHEN adders = 0 THEN foreign_removes <= {b}
        WHEN adders = 1 THEN h_removes_in_a_row = 0 AND {"true" if b else "h_first = 1"}
            AND (foreign_removes = {needed} OR (foreign_removes = {needed} + 1 AND h_last = 1))
        ELSE true END)"""


_PAIR = "{'pfid': pfid, 'name': name}"
_LINKS = f"""
WITH marked AS (
  SELECT *, lag(d) OVER w AS prev_d, sum(d) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS run
  FROM events WINDOW w AS (PARTITION BY fid, pfid, name, server ORDER BY "index", sub)),
per_server AS (
  SELECT fid, pfid, name, server,
    count_if(d = 1) AS n_add, count_if(d = -1) AS n_rem,
    arg_min(d, {{'i': "index", 's': sub}}) AS first_d, arg_max(d, {{'i': "index", 's': sub}}) AS last_d,
    count_if(d = 1 AND prev_d = 1) AS adds_in_a_row, count_if(d = -1 AND prev_d = -1) AS removes_in_a_row,
    min(run) AS low, max(run) AS high
  FROM marked GROUP BY fid, pfid, name, server),
per_link AS (
  SELECT fid, pfid, name,
    sum(n_add) - sum(n_rem) AS d,
    sum(n_add) + min(low - n_add) AS lo,
    max(high + n_rem) - sum(n_rem) AS hi,
    count_if(n_add > 0) AS adders,
    max(first_d) FILTER (WHERE n_add > 0) AS h_first,
    max(last_d) FILTER (WHERE n_add > 0) AS h_last,
    max(adds_in_a_row) FILTER (WHERE n_add > 0) AS h_adds_in_a_row,
    max(removes_in_a_row) FILTER (WHERE n_add > 0) AS h_removes_in_a_row,
    coalesce(sum(n_rem) FILTER (WHERE n_add = 0), 0) AS foreign_removes
  FROM per_server GROUP BY fid, pfid, name)
SELECT fid,
  list({_PAIR}) FILTER (WHERE d = 1) AS added,
  list({_PAIR}) FILTER (WHERE d = -1) AS removed,
  list({_PAIR}) FILTER (WHERE NOT {_consistent(0)}) AS bad_absent,
  list({_PAIR}) FILTER (WHERE NOT {_consistent(1)}) AS bad_present
FROM per_link GROUP BY fid
"""

# ------------------------------------------------------------------ xattrs (merge.xattr_changes)
_XATTRS = """
WITH last AS (
  SELECT fid, xattr_name, struct_extract(max({'o': o, 'v': xattr_value}), 'v') AS value FROM ranked
  WHERE type = 'XATTR' AND xattr_name IS NOT NULL AND fid IS NOT NULL GROUP BY fid, xattr_name)
SELECT fid, list(xattr_name) AS x_touched,
  list({'name': xattr_name, 'value': value}) FILTER (WHERE value IS NOT NULL) AS x_set
FROM last GROUP BY fid
"""


# ------------------------------------------------------------------ data (merge.write_chunks, write_data)
def _kind(extents_known: bool) -> str:
    if not extents_known:
        return "'whole'"
    return """CASE
        WHEN extents IS NULL AND object IS NULL THEN 'whole'
        WHEN extents IS NULL THEN 'nothing'
        WHEN object IS NULL OR layout IS NULL OR cnt = 1 THEN 'identity'
        WHEN coalesce(k, -1) < 0 OR ss <= 0 OR cnt < 1 THEN 'whole'
        ELSE 'striped' END"""


_PER_WRITE = """
WITH w AS (
  SELECT r.fid, r.o, r.object, r.extents, r.atime_ns, r.mtime_ns, r.ctime_ns,
    CASE WHEN a.l_layout IS NULL THEN p.layout ELSE a.l_layout.v END AS layout,
    a.l_size.o AS set_ord
  FROM ranked r LEFT JOIN attrs a ON r.fid = a.fid LEFT JOIN prev p ON r.fid = p.fid
  WHERE r.type = 'WRITE' AND r.fid IS NOT NULL),
k AS (
  SELECT *, set_ord IS NULL OR o > set_ord AS after_set, layout.stripe_size AS ss,
    CAST(layout.stripe_count AS BIGINT) AS cnt,
    -- RAID-0: object k of the layout holds file stripes j*count + k (DESIGN section 4);
    -- Spark's array_position is 0 when absent, null when the array is
    CASE WHEN layout.objects IS NOT NULL THEN
      coalesce(list_position(layout.objects, {'ost': object.ost, 'oid': object.oid}), 0) - 1 END AS k
  FROM w)
SELECT *, {kind} AS kind FROM k
"""

_CHUNKS = """
WITH x AS (
  SELECT fid, after_set, kind, ss, cnt, k, unnest(extents) AS x FROM per_write WHERE kind IN ('identity', 'striped')),
e AS (
  SELECT fid, after_set, kind, ss, cnt, k, x."offset" AS xo, x."offset" + x.length AS xe FROM x
  WHERE x.length > 0 AND x."offset" IS NOT NULL),
j AS (
  SELECT *, unnest(CASE WHEN kind = 'striped' THEN generate_series(xo // ss, (xe - 1) // ss) ELSE [0::BIGINT] END) AS j
  FROM e)
SELECT fid, after_set,
  CASE WHEN kind = 'striped' THEN (j * cnt + k) * ss + greatest(xo, j * ss) - j * ss ELSE xo END AS s,
  CASE WHEN kind = 'striped' THEN (j * cnt + k) * ss + least(xe, (j + 1) * ss) - j * ss ELSE xe END AS e
FROM j
"""

# the union of a fid's intervals: a chunk starts a merged interval when it begins after
# every end before it (adjacent intervals join)
_INTERVALS = """
WITH m AS (
  SELECT fid, s, e, max(e) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
  FROM chunks WINDOW w AS (PARTITION BY fid ORDER BY s, e)),
g AS (
  SELECT fid, s, e, sum(CASE WHEN prev_end IS NULL OR s > prev_end THEN 1 ELSE 0 END)
    OVER (PARTITION BY fid ORDER BY s, e ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS grp FROM m)
SELECT fid, min(s) AS s, max(e) AS e FROM g GROUP BY fid, grp
"""

_WRITE_DATA = f"""
WITH objs AS (
  SELECT fid, object.ost AS ost, object.oid AS oid, max({{'o': o, 'version': object.version, 'size': object.size}}) AS m
  FROM per_write WHERE object IS NOT NULL GROUP BY fid, object.ost, object.oid),
new_objects AS (
  SELECT fid, list(CAST({{'ost': ost, 'oid': oid, 'version': m.version, 'size': m.size}} AS {_OBJECT})
    ORDER BY ost, oid) AS new_objects FROM objs GROUP BY fid),
facts AS (
  SELECT fid, bool_or(kind = 'whole') AS write_whole,
    {", ".join(_last(c, f"{c} IS NOT NULL", "w_" + c) for c in TIME_TYPES)}
  FROM per_write GROUP BY fid),
wmax AS (SELECT fid, max(e) FILTER (WHERE after_set) AS wmax, true AS has_chunks FROM chunks GROUP BY fid)
SELECT f.*, wmax.wmax, wmax.has_chunks, n.new_objects, true AS has_write
FROM facts f LEFT JOIN wmax USING (fid) LEFT JOIN new_objects n USING (fid)
"""

# ------------------------------------------------------------------ the per-fid state (merge.merge_state)
_HELD = f"coalesce(p_links, {_empty(_LINK)})"


def _state(roots: list[str], extents_known: bool) -> str:
    is_root = f"fid IN ({', '.join(_quote(r) for r in roots)})" if roots else "false"
    links = (
        f"list_sort(list_distinct(list_concat(list_filter({_HELD}, lambda h: NOT list_contains("
        f"coalesce(removed, {_empty(_LINK)}), h)), coalesce(added, {_empty(_LINK)}))))"
    )
    bad = (
        f"list_concat(list_filter(coalesce(bad_absent, {_empty(_LINK)}), lambda b: NOT list_contains({_HELD}, b)),"
        f" list_filter(coalesce(bad_present, {_empty(_LINK)}), lambda b: list_contains({_HELD}, b)))"
    )
    xattrs = (
        f"list_sort(list_concat(list_filter(coalesce(p_xattrs, {_empty(_XATTR)}),"
        f" lambda x: NOT list_contains(coalesce(x_touched, CAST([] AS VARCHAR[])), x.name)),"
        f" coalesce(x_set, {_empty(_XATTR)})), 'ASC', 'NULLS FIRST')"
    )
    if not extents_known:  # values are not in the changelog: the snapshot keeps what it had
        xattrs = f"coalesce(p_xattrs, {_empty(_XATTR)})"
    old = ", ".join(f"p.{c} AS p_{c}" for c in SNAPSHOT_FIELDS if c != "fid")
    times = ",\n  ".join(
        f"CASE WHEN coalesce(l_{c}, w_{c}) IS NULL THEN p_{c} ELSE greatest(l_{c}, w_{c}).v END AS n_{c}"
        for c in TIME_TYPES
    )
    whole = "coalesce(write_whole, false) OR coalesce(relayout, false)"
    if not extents_known:
        whole += " OR coalesce(blind_data, false)"
    merged_objects = (
        f"list_sort(list_concat(list_filter(coalesce(p_objects, {_empty(_OBJECT)}), lambda o: NOT list_contains("
        f"list_transform(coalesce(new_objects, {_empty(_OBJECT)}), lambda n: {{'ost': n.ost, 'oid': n.oid}}),"
        f" {{'ost': o.ost, 'oid': o.oid}})), coalesce(new_objects, {_empty(_OBJECT)})), 'ASC', 'NULLS FIRST')"
    )
    in_layout = (
        f"list_filter({merged_objects}, lambda o: n_layout IS NOT NULL"
        " AND list_contains(n_layout.objects, {'ost': o.ost, 'oid': o.oid}))"
    )
    return f"""
WITH touched AS (
  SELECT coalesce(a.fid, l.fid, x.fid, d.fid) AS fid, a.* EXCLUDE (fid), l.* EXCLUDE (fid), x.* EXCLUDE (fid),
    d.* EXCLUDE (fid)
  FROM attrs a FULL JOIN links l ON a.fid = l.fid
  FULL JOIN xattrs x ON coalesce(a.fid, l.fid) = x.fid
  FULL JOIN data d ON coalesce(a.fid, l.fid, x.fid) = d.fid),
s1 AS (
  SELECT t.*, {old}, p_type IS NOT NULL AS existed_before, {is_root} AS is_root FROM touched t LEFT JOIN prev p USING (fid)),
s2 AS (
  SELECT *, CASE WHEN is_root THEN {_empty(_LINK)} ELSE {links} END AS links,
    CASE WHEN is_root THEN 0 ELSE len({bad}) END AS n_bad FROM s1),
s3 AS (
  SELECT *, is_root OR len(links) > 0 AS exists_after FROM s2),
s4 AS (
  SELECT *,
    CASE WHEN p_type IS NOT NULL THEN p_type ELSE l_type.v END AS type,
    p_type IS NULL AND exists_after AND l_type IS NULL AS unknown,
    CASE WHEN l_mode IS NULL THEN p_mode WHEN l_mode.v IS NULL OR l_mode.v & {S_IFMT} != 0 THEN l_mode.v
      ELSE l_mode.v | (coalesce(l_type_bits.v, p_mode, 0) & {S_IFMT}) END AS n_mode,
    {", ".join(f"CASE WHEN l_{c} IS NULL THEN p_{c} ELSE l_{c}.v END AS n_{c}" for c in ("uid", "gid", "symlink", "layout"))},
    {xattrs} AS n_xattrs,
    coalesce(p_size, 0) AS old0, l_size.o AS set_ord, l_size.v AS set_size,
    {times}
  FROM s3),
s5 AS (
  SELECT *, CASE WHEN type = '{FILE}' THEN
      CASE WHEN set_size IS NOT NULL THEN greatest(set_size, wmax)
           WHEN wmax IS NOT NULL THEN greatest(old0, wmax)
           WHEN existed_before THEN p_size ELSE 0 END
    ELSE CASE WHEN set_size IS NOT NULL THEN set_size WHEN existed_before THEN p_size ELSE 0 END END AS n_size,
    coalesce(exists_after AND type = '{FILE}', false) AS is_file
  FROM s4)
SELECT *, is_file AND ({whole}) AS whole_file,
  -- the replica holds stale bytes from the lowest size reached up to the old size
  CASE WHEN existed_before AND least(old0, min_set_size) < old0 THEN least(old0, min_set_size) END AS trunc_from,
  CASE WHEN coalesce(relayout, false) THEN {in_layout} WHEN new_objects IS NULL
    THEN coalesce(p_objects, {_empty(_OBJECT)}) ELSE {merged_objects} END AS n_objects
FROM s5
"""


# the ranges: the intervals clipped to the final size; every clipped range ending at or after
# trunc_from touches [trunc_from, n_size): one range
_RANGES = """
WITH c AS (
  SELECT i.fid, i.s, least(i.e, st.n_size) AS e, st.trunc_from, st.n_size,
    coalesce(st.trunc_from IS NOT NULL AND st.trunc_from < st.n_size, false) AS trunc
  FROM intervals i JOIN state st USING (fid) WHERE st.is_file AND NOT st.whole_file)
SELECT fid,
  list({'offset': s, 'length': e - s} ORDER BY s) FILTER (WHERE e > s AND (NOT trunc OR e < trunc_from)) AS kept,
  min(s) FILTER (WHERE e > s AND trunc AND e >= trunc_from) AS tail
FROM c GROUP BY fid
"""


def _outcome(extents_known: bool) -> str:
    attrs_differ = " OR ".join(f"n_{c} IS DISTINCT FROM p_{c}" for c in ATTR_COLUMNS)
    xattrs_differ = (
        "(NOT existed_before AND len(n_xattrs) > 0) OR (existed_before AND n_xattrs IS DISTINCT FROM p_xattrs)"
    )
    if not extents_known:
        attrs_differ += " OR coalesce(attr_touch, false)"
        xattrs_differ = "coalesce(xattr_touch, false)"
    flags = {
        "created": "NOT existed_before AND exists_after",
        "deleted": "existed_before AND NOT exists_after",
        "links_changed": "existed_before <> exists_after OR links IS DISTINCT FROM p_links",
        "attrs_changed": f"exists_after AND (NOT existed_before OR {attrs_differ})",
        "xattrs_changed": f"exists_after AND ({xattrs_differ})",
        "data_changed": f"exists_after AND type = '{FILE}' AND (whole_file OR len(ranges) > 0 OR n_size IS DISTINCT FROM old0)",
    }
    cols = {c: f"({e}) AS c_{c}" for c, e in flags.items()}
    cols.update(
        fid="fid AS c_fid",
        type="type AS c_type",
        whole_file="whole_file AS c_whole_file",
        ranges="ranges AS c_ranges",
        old_size="p_size AS c_old_size",
        new_size="CASE WHEN exists_after THEN n_size END AS c_new_size",
    )
    snap = [f"{c if c in ('fid', 'type', 'links') else 'n_' + c} AS s_{c}" for c in SNAPSHOT_FIELDS]
    changed = " OR ".join(f"({e})" for e in flags.values())
    trunc = (
        "CASE WHEN trunc_from IS NOT NULL AND trunc_from < n_size THEN list_concat(coalesce(r.kept, "
        f"{_empty(_EXTENT)}), [{{'offset': least(trunc_from, coalesce(r.tail, trunc_from)),"
        " 'length': n_size - least(trunc_from, coalesce(r.tail, trunc_from))}])"
        f" ELSE coalesce(r.kept, {_empty(_EXTENT)}) END"
    )
    return f"""
WITH o AS (
  SELECT st.*, CASE WHEN is_file AND NOT whole_file THEN {trunc} ELSE {_empty(_EXTENT)} END AS ranges
  FROM state st LEFT JOIN ranges r USING (fid) WHERE existed_before OR exists_after)
SELECT exists_after, {", ".join(snap)}, {", ".join(cols[c] for c in CHANGE_FIELDS)}, ({changed}) AS c__changed FROM o
"""


_COOKIES = """
SELECT cookie AS g_cookie,
  list_sort(list_distinct(list(server))) AS g_servers,
  list_sort(list_distinct(list_concat(list(tfid), list(sfid)))) AS g_fids,
  list_sort(list_distinct(list(type))) AS g_types,
  count(*) AS g_records, min(epoch) AS g_first_epoch, max(epoch) AS g_last_epoch,
  min(time_ns) AS g_first_time_ns, max(time_ns) AS g_last_time_ns
FROM recs WHERE cookie IS NOT NULL GROUP BY cookie HAVING count(DISTINCT server) > 1
"""


def _quote(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


# ------------------------------------------------------------------ the outcome


def outcome_arrow_schema() -> pa.Schema:
    """The outcome's columns: ``exists_after``, ``s_*`` (snapshot E), ``c_*`` (change set),
    ``c__changed``, ``g_*`` (cookie groups; a row is either a fid's or a cookie group's)."""
    import pyarrow as pa

    from epochsync.core.model import change_arrow_schema
    from epochsync.stages.merge_common import cookie_arrow_schema
    from epochsync.warehouse.snapshot_files import snapshot_arrow_schema

    fields = [pa.field("exists_after", pa.bool_())]
    fields += [pa.field("s_" + f.name, f.type) for f in snapshot_arrow_schema()]
    fields += [pa.field("c_" + f.name, f.type) for f in change_arrow_schema()]
    fields.append(pa.field("c__changed", pa.bool_()))
    for f in cookie_arrow_schema():  # collect_set's arrays hold no null
        t = pa.list_(pa.field("element", f.type.value_type, nullable=False)) if pa.types.is_list(f.type) else f.type
        fields.append(pa.field("g_" + f.name, t))
    return pa.schema(fields)


def _threads(rows: int) -> int:
    """DuckDB's threads: one for a small window (a second costs more than it brings there)."""
    return int(os.environ.get("EPOCHSYNC_MERGE_THREADS", "1" if rows < 50_000 else "2"))


def merge_outcome(
    prev_rows: pa.Table,
    records: pa.Table,
    root_fid: str | Iterable[str],
    extents_known: bool = True,
    *,
    cookies: bool = True,
    fids: pa.Array | None = None,
    threads: int | None = None,
) -> pa.Table:
    """The outcome (:func:`outcome_arrow_schema`) of merging ``records`` (canonical record
    columns) onto ``prev_rows`` (snapshot E-1's rows of the fids the records name, snapshot
    columns): one row per fid a merged record is about that existed before or exists after,
    and one per cookie group; rows in no particular order.

    Raises :class:`EpochError` with the sentence the Spark merge's ``raise_error`` carries
    (``record ... has no fid, parent fid or name``, ``fid F gains a name ...``, ``fid F: name
    n in P is added and removed in no order that applies (...)``): a record's first, then the
    first fid's in fid order. ``cookies=False``: no cookie group rows (a caller that merges
    a part of the window computes them over the whole window). ``fids``: the outcome and the
    errors of these fids only (the others' records in ``records`` are incomplete).
    ``threads``: DuckDB's (default: one below 50,000 records, else ``EPOCHSYNC_MERGE_THREADS`` or 2).
    """
    roots = [root_fid] if isinstance(root_fid, str) else sorted(root_fid)
    con = _ranked(prev_rows, records, threads)
    try:
        con.execute(f"CREATE TEMP TABLE attrs AS {_ATTRS}")
        con.execute(f"CREATE TEMP TABLE events AS {_EVENTS}")
        _check_events(con)
        con.execute(f"CREATE TEMP TABLE links AS {_LINKS}")
        con.execute(f"CREATE TEMP TABLE xattrs AS {_XATTRS}")
        con.execute(f"CREATE TEMP TABLE per_write AS {_PER_WRITE.replace('{kind}', _kind(extents_known))}")
        con.execute(f"CREATE TEMP TABLE chunks AS {_CHUNKS}")
        con.execute(f"CREATE TEMP TABLE intervals AS {_INTERVALS}")
        con.execute(f"CREATE TEMP TABLE data AS {_WRITE_DATA}")
        con.execute(f"CREATE TEMP TABLE state AS {_state(roots, extents_known)}")
        if fids is not None:
            import pyarrow as pa

            con.register("owned", pa.table({"fid": fids}))
            con.execute("DELETE FROM state WHERE fid NOT IN (SELECT fid FROM owned WHERE fid IS NOT NULL)")
        _check_state(con)
        con.execute(f"CREATE TEMP TABLE ranges AS {_RANGES}")
        fids = con.sql(_outcome(extents_known)).to_arrow_table()
        groups = con.sql(_COOKIES if cookies else f"{_COOKIES} LIMIT 0").to_arrow_table()
    finally:
        con.close()
    return _conform(fids, groups)


def fid_outcome_schema() -> pa.Schema:
    """:func:`outcome_arrow_schema` without the cookie group columns: what :func:`partition_merger` yields."""
    import pyarrow as pa

    return pa.schema([f for f in outcome_arrow_schema() if not f.name.startswith("g_")])


def partition_merger(root_fid: str | Iterable[str], extents_known: bool):
    """A ``mapInArrow`` function that merges one fid partition.

    Its input rows are ``home`` (the fid whose partition the row is in), ``dup``, ``rec``
    (a record, or null) and ``snap`` (a snapshot E-1 row, or null): every record with home its
    fid (``sfid`` for a rename, ``tfid`` otherwise), a rename that overwrites another fid once
    more with home that ``tfid`` and ``dup`` true (the overwritten fid loses its name there),
    and the snapshot rows of the named fids with home their fid. It yields the outcome rows
    (:func:`fid_outcome_schema`) of the fids that are the home of a row here: what a copy of
    a rename would make of its ``sfid`` in ``tfid``'s partition is dropped (rows and errors),
    and a copy that lands in its own ``sfid``'s partition is dropped before the merge.
    """
    roots = [root_fid] if isinstance(root_fid, str) else sorted(root_fid)

    def merge_partition(batches):
        import pyarrow as pa
        import pyarrow.compute as pc

        from epochsync.core.schema import record_arrow_schema
        from epochsync.warehouse.snapshot_files import snapshot_arrow_schema

        batches = list(batches)
        if not batches:
            return
        t = pa.Table.from_batches(batches)
        is_rec = pc.is_valid(t["rec"])
        recs = pa.Table.from_struct_array(pc.filter(t["rec"], is_rec).combine_chunks())
        dup = pc.filter(t["dup"], is_rec)
        key = pc.binary_join_element_wise(recs["server"], pc.cast(recs["index"], pa.string()), ":")
        once = pc.invert(pc.and_(dup, pc.is_in(key, value_set=pc.filter(key, pc.invert(dup)))))
        recs = recs.filter(once).cast(record_arrow_schema())
        snap = pa.Table.from_struct_array(pc.filter(t["snap"], pc.invert(is_rec)).combine_chunks())
        snap = snap.cast(snapshot_arrow_schema())
        homes = pc.unique(t["home"].combine_chunks())
        # one thread: Spark runs a task per core beside this one
        out = merge_outcome(snap, recs, roots, extents_known, cookies=False, fids=homes, threads=1)
        yield from out.select(fid_outcome_schema().names).cast(fid_outcome_schema()).to_batches()

    return merge_partition


def link_changes(records: pa.Table) -> pa.Table:
    """Per fid a namespace record names: the names it gains (``added``) and loses
    (``removed``), and those whose adds and removes apply in no order when it did not hold
    them at E-1 (``bad_absent``) or did (``bad_present``); lists of ``{pfid, name}``
    (:func:`epochsync.stages.merge.link_changes` says why the check is exact)."""
    from epochsync.warehouse.snapshot_files import snapshot_arrow_schema

    con = _ranked(snapshot_arrow_schema().empty_table(), records)
    try:
        con.execute(f"CREATE TEMP TABLE events AS {_EVENTS}")
        _check_events(con)
        return con.sql(_LINKS).to_arrow_table()
    finally:
        con.close()


def _ranked(prev_rows: pa.Table, records: pa.Table, threads: int | None = None):
    """A DuckDB connection holding ``prev`` (the snapshot rows), ``recs`` (the records) and
    ``ranked`` (the merged records with their ``fid``, ``rid`` and rank ``o``)."""
    import duckdb
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from epochsync.core.arrow import array

    recs = records.drop_columns([c for c in ("jobid", "nid") if c in records.column_names])
    fid = pc.if_else(pc.equal(recs["type"], "RENME"), recs["sfid"], recs["tfid"])
    fid = fid.combine_chunks() if isinstance(fid, pa.ChunkedArray) else fid
    rid = array(range(recs.num_rows), pa.int64())
    narrow = pa.table(
        {
            "rid": rid,
            "fk": pc.dictionary_encode(fid).indices,
            "type": recs["type"],
            "server": recs["server"],
            "index": recs["index"],
            "cookie": recs["cookie"],
            "time_ns": recs["time_ns"],
        }
    )
    con = duckdb.connect(config={"threads": threads or _threads(recs.num_rows)})
    try:
        con.register("narrow", narrow)
        order = con.sql(_RANK).to_arrow_table()
        # each record's rank in input order (null: a type the merge does not read), scattered
        # here rather than joined or taken: the records' nested columns are never copied
        o = np.zeros(recs.num_rows, np.int64)
        valid = np.zeros(recs.num_rows, np.bool_)
        at = order["rid"].to_numpy()
        o[at] = order["o"].to_numpy()
        valid[at] = True
        with_o = recs.append_column("rid", rid).append_column("fid", fid)
        with_o = with_o.append_column("o", pa.array(o, pa.int64(), mask=~valid))
        con.register("recs", recs)
        con.register("recs_o", with_o)
        con.execute("CREATE VIEW ranked AS SELECT * EXCLUDE (cookie) FROM recs_o WHERE o IS NOT NULL")
        con.register("prev", prev_rows.select(list(SNAPSHOT_FIELDS)))
    except BaseException:
        con.close()
        raise
    return con


def _conform(fids: pa.Table, cookies: pa.Table) -> pa.Table:
    """Both parts as one table of :func:`outcome_arrow_schema` (columns a part lacks: null)."""
    import pyarrow as pa

    schema = outcome_arrow_schema()
    parts = []
    for part in (fids, cookies):
        cols = []
        for f in schema:
            if f.name in part.column_names:
                cols.append(_cast(part[f.name], f.type))
            else:
                cols.append(pa.nulls(part.num_rows, f.type))
        parts.append(pa.Table.from_arrays(cols, schema=schema))
    return pa.concat_tables(parts).combine_chunks()


def _cast(col, typ):
    """``col`` as ``typ``: field names come from ``typ`` (DuckDB names list items otherwise)."""
    import pyarrow as pa

    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_list(typ) and not typ.value_field.nullable:
        values = _cast(col.values, typ.value_type)
        return pa.ListArray.from_arrays(col.offsets, values, type=typ, mask=col.is_null())
    return col.cast(typ)


def _check_events(con) -> None:
    """A name-less link event would silently lose an unlink: fail naming the record instead."""
    row = con.execute(
        'SELECT server, "index", type FROM events WHERE fid IS NULL OR pfid IS NULL OR name IS NULL ORDER BY rid LIMIT 1'
    ).fetchone()
    if row is not None:
        server, index, rtype = row
        raise EpochError(
            f"record {server}:{index} ({rtype}) has no fid, parent fid or name; fix the importer or quarantine the record"
        )


def _check_state(con) -> None:
    """The first fid (in fid order) whose names apply in no order, or that gains a name
    though it is neither in snapshot E-1 nor created: the snapshot and the changelog disagree."""
    row = con.execute(
        "SELECT fid, n_bad > 0, p_links, bad_absent, bad_present FROM state WHERE n_bad > 0 OR unknown ORDER BY fid LIMIT 1"
    ).fetchone()
    if row is None:
        return
    fid, inconsistent, p_links, bad_absent, bad_present = row
    if not inconsistent:
        raise EpochError(
            f"fid {fid} gains a name in this window but is neither in snapshot E-1 nor created"
            " by a CREAT/MKDIR/MKNOD/SLINK record: the snapshot and the changelog disagree (hydrate the target)"
        )
    held = [(lk["pfid"], lk["name"]) for lk in p_links or []]
    pairs = lambda links: [(lk["pfid"], lk["name"]) for lk in links or []]  # noqa: E731
    absent = sorted(b for b in dict.fromkeys(pairs(bad_absent)) if b not in held)
    present = sorted(b for b in dict.fromkeys(pairs(bad_present)) if b in held)
    pfid, name = (absent + present)[0]
    events = con.execute(
        'SELECT server, "index", type FROM events WHERE fid = ? AND pfid = ? AND name = ? ORDER BY server, "index", type LIMIT 8',
        [fid, pfid, name],
    ).fetchall()
    recs = ", ".join(f"{s} index {i} ({t})" for s, i, t in events)
    state = "held" if (pfid, name) in held else "not held"
    raise EpochError(
        f"fid {fid}: name {name} in {pfid} is added and removed in no order that applies ({state} at E-1;"
        f" records {recs}): the snapshot and the changelog disagree (missing or reordered records?)"
    )
