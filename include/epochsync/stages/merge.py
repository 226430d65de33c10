"""The merge stage: snapshot E-1 + records of E (or a window E1..E2) → snapshot E + net change set.

:func:`merge_epoch` is a pure ``DataFrame -> DataFrame`` transform (no I/O); :func:`run_merge`
reads the warehouse, calls it and writes the results. The rules are DESIGN section 5
"Net-change rules"; the sequential replayer :func:`epochsync_dev.oracle.replay` is the reference
and the property tests compare the two on random simulated histories.

How it is computed (Spark SQL functions, window functions and aggregates only; no Python
UDF, no ``applyInPandas``):

- The replay order (``docs/INTERNALS.md``, "Merge: the replay order"; MDT and OST clocks are
  independent): :func:`causal_time` gives every record about a fid ``ctime``, its server's
  clock for that fid so far (a running maximum in index order, so the index orders within
  a server) raised by the operations on the fid spanning servers (records sharing a
  ``cookie``) it took part in: an operation's time is its records' highest ``time_ns``, and
  the records its servers log about the fid after it rank after it. Records of a fid are
  ordered by ``ord = (creator ? 0 : 1, ctime, server, index)``: its creator first, then by
  causal rank. "Last value wins" is
  ``max(named_struct('o', ord, 'v', value))`` with a ``FILTER`` on the records that set the
  value (struct comparison orders by ``ord`` first).
- Links: every namespace record becomes add (+1) / remove (-1) events per ``(fid, pfid,
  name)`` (a ``RENME`` removes the old name of ``sfid``, removes the new name from the
  overwritten ``tfid``, then adds the new name to ``sfid``; a rename onto another name of the
  same fid does nothing). No order is needed: in every order in which each record applies,
  a name's count goes 0, 1, 0, ... alternately, so a fid holds a name at E iff its E-1 state
  plus the events' sum is 1 (a create on one MDT and the rename that moves it on another
  end the same whatever their clocks). :func:`link_changes` also checks that such an order
  exists (exactly when one server logs the name's adds, as Lustre and Gluster do; by the
  running counts otherwise) and the merge fails naming the records when none does. The
  final links are the links of E-1 minus the names whose sum is -1 plus those whose sum is
  +1. A fid exists at E iff it has a link or is the root. A rename back to the original
  name sums to 0: links unchanged, no change row.
- Attributes and xattrs: last value wins (creates set mode/uid/gid/layout even when null;
  ``SATTR`` sets what it carries, a mode without file-type bits keeps the node's;
  ``MTIME``/``CTIME``/``ATIME`` without a value use ``time_ns``; creates, ``SATTR``,
  ``TRUNC``, the time records and ``WRITE`` set the times they carry). An xattr whose last
  event is a remove is removed, which is no change if it was absent at E-1.
- Data (files existing at E only: writes to a fid that does not exist at E are dropped):
  ``WRITE`` extents in object offsets are mapped to file offsets through the file's final
  layout (RAID-0, DESIGN section 4; no layout = one object, the identity) by exploding each
  extent into its stripe chunks with ``sequence``; the intervals are united with a window
  (sort by start, running max of the ends before), clipped to the final size, and the
  truncate rule adds ``[min size, final size)`` when the size went below its E-1 value.
  Sizes: a ``WRITE`` extends the size to its highest byte, ``TRUNC``/``SATTR`` with a size
  set it, so the final size is the last set size raised by the writes after it, and the
  lowest size reached is ``min(old size, set sizes)``.
- Whole file (``ranges`` empty): with ``extents_known=False`` (Lustre text and Gluster
  sources, whose records carry no byte ranges and no attribute or xattr values) any
  ``CLOSE`` after an open for write, ``MTIME``, ``TRUNC``, ``LYOUT`` or ``WRITE``; with
  extents known, a ``WRITE`` with neither extents nor object, a ``WRITE`` to an object that
  is not in the file's layout, or a ``LYOUT``. An OST ``WRITE`` with an object and no
  extents only reports the object's new version (the oracle's rule): no bytes.
- ``extents_known=False`` also means values are unknown: ``SATTR``/time records mark
  ``attrs_changed`` and ``XATTR`` records mark ``xattrs_changed`` (translate reads the
  values from the source); the snapshot keeps the xattrs it had.

Only fids a record touches are recomputed; every other row of snapshot E-1 is copied.

Three ways to run it (:func:`run_merge`, ``merge_path`` in its stats): a window below
``EPOCHSYNC_MERGE_LOCAL_MAX_ROWS`` records plus named fids (250,000) is merged in this
process by :func:`epochsync.stages.merge_rules.merge_outcome`, the same rules in DuckDB SQL
over Arrow tables, which the tests hold equal to these transforms (no Spark job: up to there
Spark's fixed costs and shuffles cost more than the rows); a larger one below
``EPOCHSYNC_MERGE_CACHE_MIN_ROWS`` in one Spark collect; the largest on Spark end to end.
Each variable sets one boundary: ``EPOCHSYNC_MERGE_LOCAL_MAX_ROWS=0`` sends every window to
Spark, ``EPOCHSYNC_MERGE_CACHE_MIN_ROWS=0`` every window that reaches Spark to the large path.
``EPOCHSYNC_MERGE_LARGE_ENGINE=rules`` (opt-in, not yet faster: ``docs/INTERNALS.md``) runs the
large path's merge as :func:`partitioned_outcome`: ``merge_rules`` on fid partitions through
``mapInArrow``, the step of issue 52 that will leave these transforms unused.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from epochsync.core.arrow import array, combine, dataset_module, empty_table, scalar
from epochsync.core.errors import EpochError, EpochsyncError
from epochsync.core.model import CHANGE_FIELDS, DIR, FILE, OTHER, SNAPSHOT_FIELDS, SYMLINK
from epochsync.formats.common import FLAG_OPEN_EXEC, FLAG_OPEN_READ, FLAG_OPEN_WRITE
from epochsync.journal.lease import holds_target_lease
from epochsync.stages.merge_common import (  # noqa: F401 (the rules' names, read from here too)
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
from epochsync.warehouse.tables import conform

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

    from epochsync.core.config import Config


_LINK = "struct<pfid:string,name:string>"
_XATTR = "struct<name:string,value:binary>"
_OBJECT = "struct<ost:string,oid:string,version:string,size:bigint>"
_EXTENT = "struct<offset:bigint,length:bigint>"


def _in(values) -> str:
    return "(" + ", ".join(f"'{v}'" for v in values) + ")"


def _empty(element_type: str) -> str:
    return f"CAST(array() AS array<{element_type}>)"


def _last(value: str, cond: str, alias: str):
    """The ``(o, v)`` struct of the last record (by ``ord``) matching ``cond``; null if none."""
    from pyspark.sql import functions as F

    return F.expr(f"max(named_struct('o', ord, 'v', {value})) FILTER (WHERE {cond})").alias(alias)


#: SQL for "this CLOSE follows an open for write" (formats.common.opened_for_write)
_CLOSE_FOR_WRITE = (
    f"(type = 'CLOSE' AND flags IS NOT NULL AND CASE WHEN flags & {FLAG_OPEN_READ | FLAG_OPEN_WRITE | FLAG_OPEN_EXEC} != 0"
    f" THEN flags & {FLAG_OPEN_WRITE} != 0 ELSE flags & 3 IN (1, 2) END)"
)
_NODE_TYPE = (
    f"CASE type WHEN 'CREAT' THEN '{FILE}' WHEN 'MKDIR' THEN '{DIR}' WHEN 'SLINK' THEN '{SYMLINK}' ELSE "
    f"CASE coalesce(mode, 0) & {S_IFMT} WHEN {0o100000} THEN '{FILE}' WHEN {0o040000} THEN '{DIR}'"
    f" WHEN {0o120000} THEN '{SYMLINK}' ELSE '{OTHER}' END END"
)


def causal_time(recs: DataFrame) -> DataFrame:
    """``recs`` (records with their ``fid``) plus ``ctime``, the causal time of each record
    (the oracle's :func:`epochsync_dev.oracle.causal_times`; ``docs/INTERNALS.md``, "Merge: the
    replay order").

    Per fid: ``ctime`` of a record about fid X logged by server S is the highest of: the
    ``time_ns`` (null = 0) of every record about X that S logged up to it in index order; for
    every operation on X spanning servers (a ``cookie`` on records about X of two or more
    servers) with a record on S at or before it, the operation's time (the highest
    ``time_ns`` of its records), plus 1 ns for the records after it. Two windows, both within
    a fid: ``recs`` partitioned by ``fid`` needs no shuffle for them, nor for the per-fid
    aggregations after them.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    op = Window.partitionBy("fid", "cookie")
    spans = F.col("cookie").isNotNull() & (F.min("server").over(op) != F.max("server").over(op))
    w = Window.partitionBy("fid", "server").orderBy("index")
    upto = w.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    before = w.rowsBetween(Window.unboundedPreceding, -1)
    return (
        recs.withColumn("_t", F.coalesce(F.col("time_ns"), F.lit(0)))
        .withColumn("_op", F.when(spans, F.max("_t").over(op)))
        .withColumn(
            "ctime",
            F.greatest(F.max(F.greatest("_t", "_op")).over(upto), F.max(F.col("_op") + 1).over(before)),
        )
        .drop("_t", "_op")
    )


def prepare_records(records: DataFrame) -> DataFrame:
    """Returns the records the merge reads, with ``fid`` and ``ord`` added; partitioned by ``fid``.

    ``fid`` is the fid a record is about: ``sfid`` for a rename, ``tfid`` otherwise.
    ``ord = (creator ? 0 : 1, ctime, server, index)``: the replay rank, a fid's creator first
    (a fid's values start from its creator's whatever the clocks say).
    """
    from pyspark.sql import functions as F

    about = records.drop(*_UNREAD).withColumn(
        "fid", F.when(F.col("type") == "RENME", F.col("sfid")).otherwise(F.col("tfid"))
    )
    ranked = causal_time(about.repartition("fid")).filter(F.col("type").isin(*MERGED_TYPES))
    creator_first = F.when(F.col("type").isin(*CREATORS), 0).otherwise(1).alias("c")
    return ranked.withColumn("ord", F.struct(creator_first, "ctime", "server", "index")).drop("cookie", "ctime")


#: record columns no step of the merge reads (dropped before the records are shuffled)
_UNREAD = ("epoch", "jobid", "nid")


def attribute_changes(recs: DataFrame) -> DataFrame:
    """Per fid (non-``WRITE`` records): last-value structs of the attributes and the facts
    the size and whole-file rules need."""
    from pyspark.sql import functions as F

    creators = f"type IN {_in(CREATORS)}"
    size_set = f"type IN {_in(SIZE_SETTERS)} AND size IS NOT NULL"
    times = [
        _last(
            f"CASE WHEN type = '{rtype}' THEN coalesce({col}, time_ns) ELSE {col} END",
            f"(type IN {_in(TIME_SETTERS)} AND {col} IS NOT NULL) OR type = '{rtype}'",
            "l_" + col,
        )
        for col, rtype in TIME_TYPES.items()
    ]
    return (
        recs.filter((F.col("type") != "WRITE") & F.col("fid").isNotNull())
        .groupBy("fid")
        .agg(
            F.expr(f"max(named_struct('o', ord, 'v', {_NODE_TYPE})) FILTER (WHERE {creators})").alias("l_type"),
            _last("mode", f"{creators} OR (type = 'SATTR' AND mode IS NOT NULL)", "l_mode"),
            _last("mode", f"(type = 'SATTR' OR {creators}) AND mode & {S_IFMT} != 0", "l_type_bits"),
            _last("uid", f"{creators} OR (type = 'SATTR' AND uid IS NOT NULL)", "l_uid"),
            _last("gid", f"{creators} OR (type = 'SATTR' AND gid IS NOT NULL)", "l_gid"),
            *times,
            _last(f"CASE WHEN {_NODE_TYPE} = '{SYMLINK}' THEN symlink END", creators, "l_symlink"),
            _last("layout", f"{creators} OR type = 'LYOUT'", "l_layout"),
            _last("size", size_set, "l_size"),
            F.expr(f"min(size) FILTER (WHERE {size_set})").alias("min_set_size"),
            F.expr("bool_or(type = 'LYOUT')").alias("relayout"),
            F.expr(f"bool_or(type IN ('MTIME', 'TRUNC', 'LYOUT') OR {_CLOSE_FOR_WRITE})").alias("blind_data"),
            F.expr("bool_or(type IN ('SATTR', 'MTIME', 'CTIME', 'ATIME'))").alias("attr_touch"),
            F.expr("bool_or(type = 'XATTR')").alias("xattr_touch"),
        )
    )


def layout_facts(recs: DataFrame) -> DataFrame:
    """Per fid: the last layout set in the window (``l_layout``) and the order of the last
    size set (``set_ord``): what mapping and sizing the writes need, from few records."""
    from pyspark.sql import functions as F

    types = (*CREATORS, "LYOUT", *SIZE_SETTERS)
    return (
        recs.filter(F.col("type").isin(*types) & F.col("fid").isNotNull())
        .groupBy("fid")
        .agg(
            _last("layout", f"type IN {_in((*CREATORS, 'LYOUT'))}", "l_layout"),
            F.expr(f"max(ord) FILTER (WHERE type IN {_in(SIZE_SETTERS)} AND size IS NOT NULL)").alias("set_ord"),
        )
    )


def link_changes(recs: DataFrame) -> DataFrame:
    """Per fid: the names it gains (``added``) and loses (``removed``) in the window, and the
    names whose adds and removes apply in no order (``bad_absent`` if the fid did not hold
    the name at E-1, ``bad_present`` if it did; ``bad_records`` maps each to its events).

    Order-free: a fid holds ``(pfid, name)`` at E iff its E-1 state plus the adds minus the
    removes of that name is 1. In any order in which every record applies, the count goes
    0, 1, 0, ... alternately, so any such order ends there; the clocks of the servers do not
    matter. Whether such an order exists (each server's events in index order, then the
    events of one record in the order it applies them):

    - always checked: the final count is 0 or 1, and no server's running count leaves 0..1
      by more than the other servers' adds or removes could make up;
    - exact when at most one server logs adds of the name (Lustre and Gluster log the
      entries of a directory on the server holding it; only a rename's removal of its old
      name is logged elsewhere, with the new name): that server's events must not remove
      twice in a row, nor first when the name was absent; each two adds in a row need one
      removal from another server between them (and one before the first add when the name
      was held), and one more may come after a last add.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    def ev(fid: str, pfid: str, name: str, add: bool, sub: int) -> str:
        return f"named_struct('fid', {fid}, 'pfid', {pfid}, 'name', {name}, 'add', {str(add).lower()}, 'sub', {sub})"

    # A name-less event would silently lose an unlink: fail naming the record instead.
    bad = (
        "raise_error(concat('record ', server, ':', index, ' (', type, ') has no fid, parent fid or name;"
        " fix the importer or quarantine the record'))"
    )
    # RENME onto another name of the same fid (sfid = tfid) changes nothing (POSIX).
    ren = "type = 'RENME' AND NOT (tfid IS NOT NULL AND tfid = sfid)"
    events = f"""array(
        CASE WHEN type IN {_in(LINK_ADDERS)} THEN {ev("tfid", "pfid", "name", True, 0)} END,
        CASE WHEN type IN {_in(LINK_REMOVERS)} THEN {ev("tfid", "pfid", "name", False, 0)} END,
        CASE WHEN {ren} THEN {ev("sfid", "spfid", "sname", False, 0)} END,
        CASE WHEN {ren} AND tfid IS NOT NULL THEN {ev("tfid", "pfid", "name", False, 0)} END,
        CASE WHEN {ren} THEN {ev("sfid", "pfid", "name", True, 1)} END
    )"""
    exploded = (
        recs.filter(F.col("type").isin(*LINK_ADDERS, *LINK_REMOVERS, "RENME"))
        .select("server", "index", "type", F.explode(F.expr(events)).alias("ev"))
        .filter(F.col("ev").isNotNull())  # explode + filter: no lambda per record
        .select(
            F.col("ev.fid").alias("fid"),
            F.expr(f"CASE WHEN ev.fid IS NULL OR ev.pfid IS NULL OR ev.name IS NULL THEN {bad} ELSE ev.pfid END").alias(
                "pfid"
            ),
            F.col("ev.name").alias("name"),
            F.when(F.col("ev.add"), 1).otherwise(-1).alias("d"),
            "server",
            "index",
            F.col("ev.sub").alias("sub"),
            "type",
        )
    )
    link = ["fid", "pfid", "name"]
    w = Window.partitionBy(*link, "server").orderBy("index", "sub")
    per_server = (
        exploded.select(
            "*",
            F.lag("d").over(w).alias("prev_d"),
            F.sum("d").over(w.rowsBetween(Window.unboundedPreceding, Window.currentRow)).alias("run"),
        )
        .groupBy(*link, "server")
        .agg(
            F.expr("count_if(d = 1)").alias("n_add"),
            F.expr("count_if(d = -1)").alias("n_rem"),
            F.expr("min_by(d, struct(index, sub))").alias("first_d"),
            F.expr("max_by(d, struct(index, sub))").alias("last_d"),
            F.expr("count_if(d = 1 AND prev_d = 1)").alias("adds_in_a_row"),
            F.expr("count_if(d = -1 AND prev_d = -1)").alias("removes_in_a_row"),
            F.min("run").alias("low"),
            F.max("run").alias("high"),
            F.expr("collect_list(named_struct('server', server, 'index', index, 'type', type))").alias("evs"),
        )
    )
    adder = "FILTER (WHERE n_add > 0)"
    per_link = per_server.groupBy(*link).agg(
        F.expr("sum(n_add) - sum(n_rem)").alias("d"),
        # the lowest and highest count a server can reach with the others' events at their extremes
        F.expr("sum(n_add) + min(low - n_add)").alias("lo"),
        F.expr("max(high + n_rem) - sum(n_rem)").alias("hi"),
        F.expr("count_if(n_add > 0)").alias("adders"),
        F.expr(f"max(first_d) {adder}").alias("h_first"),
        F.expr(f"max(last_d) {adder}").alias("h_last"),
        F.expr(f"max(adds_in_a_row) {adder}").alias("h_adds_in_a_row"),
        F.expr(f"max(removes_in_a_row) {adder}").alias("h_removes_in_a_row"),
        F.expr("coalesce(sum(n_rem) FILTER (WHERE n_add = 0), 0)").alias("foreign_removes"),
        F.flatten(F.collect_list("evs")).alias("evs"),
    )

    def consistent(b: int) -> str:
        needed = f"h_adds_in_a_row + {'CASE WHEN h_first = 1 THEN 1 ELSE 0 END' if b else '0'}"
        return f"""({b} + d BETWEEN 0 AND 1 AND {b} + lo >= 0 AND {b} + hi <= 1 AND CASE
            WHEN adders = 0 THEN foreign_removes <= {b}
            WHEN adders = 1 THEN h_removes_in_a_row = 0 AND {"true" if b else "h_first = 1"}
                AND (foreign_removes = {needed} OR (foreign_removes = {needed} + 1 AND h_last = 1))
            ELSE true END)"""

    pair = "named_struct('pfid', pfid, 'name', name)"
    return per_link.groupBy("fid").agg(
        F.expr(f"collect_list({pair}) FILTER (WHERE d = 1)").alias("added"),
        F.expr(f"collect_list({pair}) FILTER (WHERE d = -1)").alias("removed"),
        F.expr(f"collect_list({pair}) FILTER (WHERE NOT {consistent(0)})").alias("bad_absent"),
        F.expr(f"collect_list({pair}) FILTER (WHERE NOT {consistent(1)})").alias("bad_present"),
        F.expr(
            f"map_from_entries(collect_list(struct({pair}, evs)) FILTER (WHERE NOT {consistent(0)} OR NOT {consistent(1)}))"
        ).alias("bad_records"),
    )


def xattr_changes(recs: DataFrame) -> DataFrame:
    """Per fid: the xattr names touched and the (name, value) pairs whose last event is a set."""
    from pyspark.sql import functions as F

    last = (
        recs.filter((F.col("type") == "XATTR") & F.col("xattr_name").isNotNull() & F.col("fid").isNotNull())
        .groupBy("fid", "xattr_name")
        .agg(F.expr("max_by(named_struct('value', xattr_value), ord)").alias("last"))
    )
    return last.groupBy("fid").agg(
        F.collect_list("xattr_name").alias("x_touched"),
        F.expr(
            "collect_list(named_struct('name', xattr_name, 'value', last.value)) FILTER (WHERE last.value IS NOT NULL)"
        ).alias("x_set"),
    )


def write_chunks(
    writes: DataFrame, extents_known: bool, *, shared: Callable[[DataFrame], DataFrame] | None = None
) -> tuple[DataFrame, DataFrame]:
    """The writes with their fid's final layout → (per-write rows, file-offset chunk rows).

    Each write carries its fid's final ``layout`` and ``set_ord`` (the order of its last size
    set); a write after it has ``after_set``. Per-write rows carry ``kind``: ``whole`` (the
    whole file changed), ``nothing`` (the write only reports an object version),
    ``identity`` (extents are file offsets: no layout, one object) or ``striped``. Chunk
    rows ``(fid, after_set, s, e)`` are the extents of ``identity`` and ``striped`` writes
    in file offsets, one per extent and stripe row, exploded with generators and plain
    arithmetic: no lambda runs per record (Spark interprets higher-order functions row by
    row; they were most of the merge's time). ``shared`` receives the per-write rows (both
    outputs read them) before the chunks are derived from them.
    """
    from pyspark.sql import functions as F

    if extents_known:
        kind = """CASE
            WHEN extents IS NULL AND object IS NULL THEN 'whole'
            WHEN extents IS NULL THEN 'nothing'
            WHEN object IS NULL OR layout IS NULL OR cnt = 1 THEN 'identity'
            WHEN coalesce(k, -1) < 0 OR ss <= 0 OR cnt < 1 THEN 'whole'
            ELSE 'striped' END"""
    else:
        kind = "'whole'"
    per_write = writes.select(
        "fid",
        "ord",
        "object",
        "extents",
        *TIME_TYPES,
        "layout",
        F.expr("set_ord IS NULL OR ord > set_ord").alias("after_set"),
        F.col("layout.stripe_size").alias("ss"),
        F.col("layout.stripe_count").cast("bigint").alias("cnt"),
        # RAID-0: object k of the layout holds file stripes j*count + k (DESIGN section 4)
        F.expr("array_position(layout.objects, named_struct('ost', object.ost, 'oid', object.oid)) - 1").alias("k"),
    ).withColumn("kind", F.expr(kind))
    if shared is not None:
        per_write = shared(per_write)
    extents = (
        per_write.filter(F.col("kind").isin("identity", "striped"))
        .select("fid", "after_set", "kind", "ss", "cnt", "k", F.explode("extents").alias("x"))
        .filter("x.length > 0")
        .select(
            "fid",
            "after_set",
            "kind",
            "ss",
            "cnt",
            "k",
            F.col("x.offset").alias("off"),
            F.expr("x.offset + x.length").alias("end"),
        )
    )
    # an object extent crossing stripe rows is cut into one file interval per row j
    rows = extents.select(
        "fid",
        "after_set",
        "kind",
        "ss",
        "cnt",
        "k",
        "off",
        "end",
        F.explode(
            F.expr("CASE WHEN kind = 'striped' THEN sequence(off div ss, (end - 1) div ss) ELSE array(0L) END")
        ).alias("j"),
    )
    chunks = rows.select(
        "fid",
        "after_set",
        F.expr(
            "CASE WHEN kind = 'striped' THEN (j * cnt + k) * ss + greatest(off, j * ss) - j * ss ELSE off END"
        ).alias("s"),
        F.expr(
            "CASE WHEN kind = 'striped' THEN (j * cnt + k) * ss + least(end, (j + 1) * ss) - j * ss ELSE end END"
        ).alias("e"),
    )
    return per_write, chunks


def write_data(per_write: DataFrame, chunks: DataFrame) -> DataFrame:
    """Per written fid: sorted disjoint non-adjacent ``ranges_raw`` [(s, e)], ``wmax`` (the
    highest end written after the last size set), ``write_whole``, the writes' last times
    (``w_atime_ns``...) and the latest reported version of each stripe object (``new_objects``).

    Interval union in one window pass over the chunks sorted by (s, e): a chunk starts a
    merged interval when it begins after every end before it (adjacent intervals join),
    and ends one when the next chunk starts after every end up to it; the k-th start and
    the k-th end of a fid are its k-th merged interval.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    w = Window.partitionBy("fid").orderBy("s", "e")
    marked = chunks.select(
        "fid",
        "s",
        "e",
        "after_set",
        F.max("e").over(w.rowsBetween(Window.unboundedPreceding, -1)).alias("prev_end"),
        F.max("e").over(w.rowsBetween(Window.unboundedPreceding, Window.currentRow)).alias("run_end"),
        F.lead("s").over(w).alias("next_s"),
    )
    ranges = marked.groupBy("fid").agg(
        F.expr("array_sort(collect_list(s) FILTER (WHERE prev_end IS NULL OR s > prev_end))").alias("starts"),
        F.expr("array_sort(collect_list(run_end) FILTER (WHERE next_s IS NULL OR next_s > run_end))").alias("ends"),
        F.expr("max(e) FILTER (WHERE after_set)").alias("wmax"),
    )
    ranges = ranges.select(
        "fid",
        "wmax",
        F.expr("arrays_zip(starts, ends)").cast("array<struct<s:bigint,e:bigint>>").alias("ranges_raw"),
    )
    obj = "named_struct('ost', object.ost, 'oid', object.oid, 'o', ord, 'version', object.version, 'size', object.size)"
    facts = per_write.groupBy("fid").agg(
        F.expr("bool_or(kind = 'whole')").alias("write_whole"),
        *(_last(c, f"{c} IS NOT NULL", "w_" + c) for c in TIME_TYPES),
        F.expr(f"array_sort(collect_list({obj}) FILTER (WHERE object IS NOT NULL))").alias("objs"),
    )
    # sorted by (ost, oid, ord): the last element of each object is its latest version
    latest = (
        "transform(filter(objs, (x, i) -> coalesce(NOT (try_element_at(objs, i + 2).ost = x.ost"
        " AND try_element_at(objs, i + 2).oid = x.oid), true)),"
        f" x -> CAST(named_struct('ost', x.ost, 'oid', x.oid, 'version', x.version, 'size', x.size) AS {_OBJECT}))"
    )
    per_fid = facts.join(ranges, "fid", "left")
    return per_fid.withColumn("new_objects", F.expr(f"CASE WHEN size(objs) > 0 THEN {latest} END")).drop("objs")


def merge_state(
    prev_snapshot: DataFrame,
    records: DataFrame,
    root_fid: str | Iterable[str],
    extents_known: bool = True,
    *,
    cache: bool | list = False,
    ranked: Callable[[DataFrame], DataFrame] | None = None,
    shared: Callable[[DataFrame], DataFrame] | None = None,
) -> DataFrame:
    """The per-fid state of the merge: one row per fid a record of the window is about.

    Columns: ``fid``, ``type``, ``links`` (at E), ``existed_before``, ``exists_after``, the
    E-1 values ``p_<column>`` and the E values ``n_<column>`` of the snapshot columns,
    ``whole_file``, ``ranges``, ``old0`` (the E-1 size, 0 if none) and the facts the change
    rules read (:func:`state_changes`). Only the rows of ``prev_snapshot`` whose fid a record
    names are read: the caller may pass those alone (:func:`run_merge` does).

    A record that gives a name to a fid that neither exists at E-1 nor is created in the
    window fails the job with a message naming the fid (the snapshot and the changelog
    disagree), and so does a name whose adds and removes apply in no order (a name removed
    that the fid never held, added twice with no removal between...), naming its records
    (``server index N (TYPE)``); :func:`run_merge` turns either into one-line ``EpochError``.
    Records about such fids that give no name (a late ``CLOSE`` or ``WRITE`` of a file
    deleted before) change nothing, as in the oracle.

    ``root_fid`` may be several fids: independent namespaces merged in one job (the tests
    batch many small histories this way); each root exists without links.

    ``cache`` (True, or a list that receives the persisted DataFrames so the caller can
    ``unpersist()`` them) persists the ranked records (every aggregation reads them).
    ``ranked``, if given, receives the ranked records (:func:`prepare_records`: partitioned
    by fid, with the causal order) and returns them computed once, keeping that
    partitioning: the five aggregations then start from their rows. ``shared``, if given,
    receives the per-write rows too, the other sub-plan read twice (:func:`run_merge`
    analyzes both once into the session's plan cache).
    """
    from pyspark.sql import functions as F

    recs = prepare_records(records)
    if ranked is not None:
        recs = ranked(recs)
    if cache is not False:
        # Five aggregations read the ranked records: shuffle and sort them once. The token
        # makes this plan (and the per-fid state built on it) this call's own: Spark matches
        # cached data by plan, across sessions, and a run killed before its unpersist()
        # would otherwise serve its records to the next merge of the same files.

        from pyspark import StorageLevel

        recs = recs.withColumn("_cached_by", F.lit(uuid.uuid4().hex)).persist(StorageLevel.MEMORY_AND_DISK)
        if isinstance(cache, list):
            cache.append(recs)
    writes = recs.filter((F.col("type") == "WRITE") & F.col("fid").isNotNull()).select(
        "fid", "ord", "object", "extents", *TIME_TYPES
    )
    meta = attribute_changes(recs).join(link_changes(recs), "fid", "full").join(xattr_changes(recs), "fid", "full")
    prev = prev_snapshot.select(*SNAPSHOT_FIELDS)
    old = prev.select("fid", *(F.col(c).alias("p_" + c) for c in SNAPSHOT_FIELDS if c != "fid"))
    roots = [root_fid] if isinstance(root_fid, str) else list(root_fid)
    unknown = (
        "raise_error(concat('fid ', fid, ' gains a name in this window but is neither in snapshot E-1 nor created"
        " by a CREAT/MKDIR/MKNOD/SLINK record: the snapshot and the changelog disagree (hydrate the target)'))"
    )
    links = (
        f"array_sort(array_union(array_except(coalesce(p_links, {_empty(_LINK)}), coalesce(removed, {_empty(_LINK)})),"
        f" coalesce(added, {_empty(_LINK)})))"
    )
    # names whose adds and removes apply in no order, given whether the fid held them at E-1
    held = f"coalesce(p_links, {_empty(_LINK)})"
    bad = (
        f"concat(array_except(coalesce(bad_absent, {_empty(_LINK)}), {held}),"
        f" array_intersect(coalesce(bad_present, {_empty(_LINK)}), {held}))"
    )
    first_bad = f"element_at({bad}, 1)"
    inconsistent = f"""raise_error(concat('fid ', fid, ': name ', {first_bad}.name, ' in ', {first_bad}.pfid,
        ' is added and removed in no order that applies (', CASE WHEN array_contains({held}, {first_bad})
        THEN 'held' ELSE 'not held' END, ' at E-1; records ', concat_ws(', ', transform(
        slice(array_sort(element_at(bad_records, {first_bad})), 1, 8),
        e -> concat(e.server, ' index ', e.index, ' (', e.type, ')'))),
        '): the snapshot and the changelog disagree (missing or reordered records?)'))"""
    links = f"CASE WHEN size({bad}) > 0 THEN {inconsistent} ELSE {links} END"
    # data: every write with its fid's final layout (the layout may come from this window)
    # Left joins onto the writes, which stay where prepare_records put them (partitioned by
    # fid): only the snapshot's (fid, layout) is shuffled to meet them, never the writes.
    with_layout = (
        writes.join(layout_facts(recs), "fid", "left")
        .join(old.select("fid", "p_layout"), "fid", "left")
        .withColumn("layout", F.expr("CASE WHEN l_layout IS NULL THEN p_layout ELSE l_layout.v END"))
        .drop("l_layout", "p_layout")
    )
    per_write, chunks = write_chunks(with_layout, extents_known, shared=shared)
    data = write_data(per_write, chunks).withColumn("has_write", F.lit(True))
    touched = meta.join(data, "fid", "full")
    st = (
        touched.join(old, "fid", "left")
        .withColumn("existed_before", F.col("p_type").isNotNull())
        .withColumn("links", F.when(F.col("fid").isin(*roots), F.expr(_empty(_LINK))).otherwise(F.expr(links)))
        .withColumn("exists_after", F.col("fid").isin(*roots) | (F.size("links") > 0))
        .withColumn(
            "type",
            F.expr(
                f"CASE WHEN p_type IS NOT NULL THEN p_type WHEN exists_after AND l_type IS NULL THEN {unknown} ELSE l_type.v END"
            ),
        )
    )

    def last_or_prev(col: str):
        return F.when(F.col("l_" + col).isNull(), F.col("p_" + col)).otherwise(F.col("l_" + col + ".v"))

    # a mode without file-type bits keeps the node's (the last mode that had them)
    mode = F.expr(
        f"CASE WHEN l_mode IS NULL THEN p_mode WHEN l_mode.v IS NULL OR l_mode.v & {S_IFMT} != 0 THEN l_mode.v"
        f" ELSE l_mode.v | (coalesce(l_type_bits.v, p_mode, 0) & {S_IFMT}) END"
    )
    xattrs = (
        f"array_sort(concat(filter(coalesce(p_xattrs, {_empty(_XATTR)}),"
        f" x -> NOT array_contains(coalesce(x_touched, CAST(array() AS array<string>)), x.name)),"
        f" coalesce(x_set, {_empty(_XATTR)})))"
    )
    if not extents_known:  # values are not in the changelog: the snapshot keeps what it had
        xattrs = f"coalesce(p_xattrs, {_empty(_XATTR)})"
    st = st.select(
        "*",
        mode.alias("n_mode"),
        *(last_or_prev(c).alias("n_" + c) for c in ("uid", "gid", "symlink", "layout")),
        F.expr(xattrs).alias("n_xattrs"),
        F.coalesce("p_size", F.lit(0)).alias("old0"),
        F.col("l_size.o").alias("set_ord"),
        F.col("l_size.v").alias("set_size"),
    )

    for col in TIME_TYPES:  # the last of the non-write and the write records that set it
        st = st.withColumn(
            "n_" + col,
            F.expr(f"CASE WHEN coalesce(l_{col}, w_{col}) IS NULL THEN p_{col} ELSE greatest(l_{col}, w_{col}).v END"),
        )

    is_file = F.col("exists_after") & (F.col("type") == FILE)
    st = st.withColumn(
        "n_size",
        F.expr(
            f"""CASE WHEN type = '{FILE}' THEN
                  CASE WHEN set_size IS NOT NULL THEN greatest(set_size, wmax)
                       WHEN wmax IS NOT NULL THEN greatest(old0, wmax)
                       WHEN existed_before THEN p_size ELSE 0 END
                ELSE CASE WHEN set_size IS NOT NULL THEN set_size WHEN existed_before THEN p_size ELSE 0 END END"""
        ),
    )
    whole = F.coalesce("write_whole", F.lit(False)) | F.coalesce("relayout", F.lit(False))
    if not extents_known:
        whole = whole | F.coalesce("blind_data", F.lit(False))
    st = st.withColumn("whole_file", is_file & whole)
    # The replica holds stale bytes from the lowest size reached up to the old size.
    st = st.withColumn(
        "trunc_from",
        F.expr("CASE WHEN existed_before AND least(old0, min_set_size) < old0 THEN least(old0, min_set_size) END"),
    )
    clipped = (
        "filter(transform(coalesce(ranges_raw, CAST(array() AS array<struct<s:bigint,e:bigint>>)),"
        " r -> named_struct('s', r.s, 'e', least(r.e, n_size))), r -> r.e > r.s)"
    )
    # Every clipped range ending at or after trunc_from touches [trunc_from, n_size): one range.
    with_trunc = """CASE WHEN trunc_from IS NOT NULL AND trunc_from < n_size THEN concat(
            filter(rc, r -> r.e < trunc_from),
            array(named_struct(
                's', least(trunc_from, coalesce(array_min(transform(filter(rc, r -> r.e >= trunc_from), r -> r.s)), trunc_from)),
                'e', n_size)))
        ELSE rc END"""
    st = st.withColumn("rc", F.expr(clipped)).withColumn(
        "ranges",
        F.when(
            is_file & ~F.col("whole_file"),
            F.expr(f"transform({with_trunc}, r -> named_struct('offset', r.s, 'length', r.e - r.s))"),
        ).otherwise(F.expr(_empty(_EXTENT))),
    )
    # objects: the latest version per written object; a LYOUT forgets objects not in the new layout
    merged_objects = (
        f"array_sort(concat(filter(coalesce(p_objects, {_empty(_OBJECT)}),"
        f" o -> NOT exists(coalesce(new_objects, {_empty(_OBJECT)}), n -> n.ost = o.ost AND n.oid = o.oid)),"
        f" coalesce(new_objects, {_empty(_OBJECT)})))"
    )
    in_layout = (
        f"filter({merged_objects}, o -> n_layout IS NOT NULL"
        " AND exists(n_layout.objects, l -> l.ost = o.ost AND l.oid = o.oid))"
    )
    st = st.withColumn(
        "n_objects",
        F.expr(
            f"CASE WHEN coalesce(relayout, false) THEN {in_layout} WHEN new_objects IS NULL"
            f" THEN coalesce(p_objects, {_empty(_OBJECT)}) ELSE {merged_objects} END"
        ),
    )
    return st


def _change_columns(extents_known: bool) -> list:
    """The change-set columns (:data:`CHANGE_FIELDS`) of a per-fid state row, and ``_changed``."""
    from pyspark.sql import functions as F

    attrs_differ = " OR ".join(f"NOT (n_{c} <=> p_{c})" for c in ATTR_COLUMNS)
    xattrs_differ = "(NOT existed_before AND size(n_xattrs) > 0) OR (existed_before AND NOT (n_xattrs <=> p_xattrs))"
    if not extents_known:
        attrs_differ += " OR coalesce(attr_touch, false)"
        xattrs_differ = "coalesce(xattr_touch, false)"
    flags = {
        "created": "NOT existed_before AND exists_after",
        "deleted": "existed_before AND NOT exists_after",
        "links_changed": "existed_before <> exists_after OR NOT (links <=> p_links)",
        "attrs_changed": f"exists_after AND (NOT existed_before OR {attrs_differ})",
        "xattrs_changed": f"exists_after AND ({xattrs_differ})",
        "data_changed": f"exists_after AND type = '{FILE}' AND (whole_file OR size(ranges) > 0 OR NOT (n_size <=> old0))",
    }
    cols = {c: F.expr(e).alias(c) for c, e in flags.items()}
    cols.update(
        fid=F.col("fid"),
        type=F.col("type"),
        whole_file=F.col("whole_file"),
        ranges=F.col("ranges"),
        old_size=F.col("p_size").alias("old_size"),
        new_size=F.when(F.col("exists_after"), F.col("n_size")).alias("new_size"),
    )
    changed = F.expr(" OR ".join(f"({e})" for e in flags.values())).alias("_changed")
    return [cols[c] for c in CHANGE_FIELDS] + [changed]


def state_snapshot_rows(st: DataFrame) -> DataFrame:
    """The snapshot rows at E of the state's fids that exist after the window."""
    from pyspark.sql import functions as F

    return st.filter("exists_after").select(
        *(F.col(c if c in ("fid", "type", "links") else "n_" + c).alias(c) for c in SNAPSHOT_FIELDS)
    )


def state_changes(st: DataFrame, extents_known: bool) -> DataFrame:
    """The change set (:data:`CHANGE_FIELDS`) of a per-fid state (:func:`merge_state`)."""
    return conform(
        st.filter("existed_before OR exists_after").select(*_change_columns(extents_known)).filter("_changed"),
        _change_type(),
    )


def state_outcome(st: DataFrame, extents_known: bool) -> DataFrame:
    """Both outputs of a per-fid state in one table, for one collect: per fid that existed
    before or exists after, ``exists_after``, the snapshot columns at E (``s_<column>``;
    null when it does not exist after), the change columns (``c_<column>``) and
    ``changed`` (whether it is a row of the change set)."""
    from pyspark.sql import functions as F

    snap = [F.col(c if c in ("fid", "type", "links") else "n_" + c).alias("s_" + c) for c in SNAPSHOT_FIELDS]
    change = [c.alias("c_" + n) for c, n in zip(_change_columns(extents_known), (*CHANGE_FIELDS, "_changed"))]
    return st.filter("existed_before OR exists_after").select("exists_after", *snap, *change)


def merge_epoch(
    prev_snapshot: DataFrame,
    records: DataFrame,
    root_fid: str | Iterable[str],
    extents_known: bool = True,
    *,
    cache: bool | list | Callable[[DataFrame], DataFrame] = False,
    ranked: Callable[[DataFrame], DataFrame] | None = None,
) -> tuple[DataFrame, DataFrame]:
    """Snapshot E-1 and the records of E (or of a window) → (snapshot E, net change set).

    Pure transform: ``prev_snapshot`` has the snapshot columns (:data:`epochsync.core.model.SNAPSHOT_FIELDS`),
    ``records`` the canonical record columns. Returns DataFrames with the columns and types
    of ``snapshot_struct_type()`` and ``change_struct_type()``, in order (see
    :mod:`epochsync.core.model` for their meaning). ``extents_known`` is False for sources whose
    changelogs carry no byte ranges and no attribute values (Lustre text, Gluster). The
    per-fid state and its errors: :func:`merge_state`; rows of fids no record names are
    copied from ``prev_snapshot``.

    ``cache`` (True, or a list receiving the persisted DataFrames) also persists the
    per-fid state both outputs derive from; a callable ``cache`` receives the state and
    returns it materialized.
    """

    st = merge_state(
        prev_snapshot,
        records,
        root_fid,
        extents_known,
        cache=cache if not callable(cache) else False,
        ranked=ranked,
    )
    if callable(cache):
        st = cache(st)
    elif cache is not False:
        from pyspark import StorageLevel

        st = st.persist(StorageLevel.MEMORY_AND_DISK)
        if isinstance(cache, list):
            cache.append(st)
    untouched = prev_snapshot.select(*SNAPSHOT_FIELDS).join(st.select("fid"), "fid", "left_anti")
    snapshot = conform(untouched.unionByName(state_snapshot_rows(st)), _snapshot_type())
    return snapshot, state_changes(st, extents_known)


def partitioned_outcome(
    prev_snapshot: DataFrame, records: DataFrame, root_fid: str | Iterable[str], extents_known: bool, partitions: int
) -> DataFrame:
    """The outcome of :func:`epochsync.stages.merge_rules.merge_outcome` without cookie groups,
    computed by the same definition on ``partitions`` fid partitions that Spark distributes
    (``mapInArrow``; :func:`~epochsync.stages.merge_rules.partition_merger` says what each
    partition holds). ``prev_snapshot``: snapshot E-1's rows of the named fids (or more)."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    from epochsync.core.schema import record_struct_type
    from epochsync.stages.merge_rules import fid_outcome_schema, partition_merger

    rec = F.struct(*(F.col(c) for c in record_struct_type().fieldNames())).alias("rec")
    snap = F.struct(*(F.col(c) for c in SNAPSHOT_FIELDS)).alias("snap")
    about = F.when(F.col("type") == "RENME", F.col("sfid")).otherwise(F.col("tfid"))
    overwritten = "type = 'RENME' AND tfid IS NOT NULL AND sfid IS NOT NULL AND tfid != sfid"
    rows = (
        records.select(about.alias("home"), F.lit(False).alias("dup"), rec)
        .unionByName(records.filter(overwritten).select(F.col("tfid").alias("home"), F.lit(True).alias("dup"), rec))
        .withColumn("snap", F.lit(None).cast(_snapshot_type()))
    )
    prev_rows = prev_snapshot.select(
        F.col("fid").alias("home"),
        F.lit(False).alias("dup"),
        F.lit(None).cast(rows.schema["rec"].dataType).alias("rec"),
        snap,
    )
    return (
        rows.unionByName(prev_rows)
        .repartition(partitions, "home")
        .mapInArrow(partition_merger(root_fid, extents_known), from_arrow_schema(fid_outcome_schema()))
    )


def cookie_groups(records: DataFrame) -> DataFrame:
    """Distributed operations: records that share a ``cookie`` across two or more servers.

    One row per such cookie: ``cookie, servers, fids, types, records, first_epoch,
    last_epoch, first_time_ns, last_time_ns``. A group whose ``first_epoch`` and
    ``last_epoch`` differ was torn across an epoch boundary (one server closed the epoch
    before the other logged its part).
    """
    from pyspark.sql import functions as F

    return (
        records.filter(F.col("cookie").isNotNull())
        .groupBy("cookie")
        .agg(
            F.array_sort(F.collect_set("server")).alias("servers"),
            # collect_set skips nulls: no lambda per record
            F.array_sort(F.array_union(F.collect_set("tfid"), F.collect_set("sfid"))).alias("fids"),
            F.array_sort(F.collect_set("type")).alias("types"),
            F.count(F.lit(1)).alias("records"),
            F.min("epoch").alias("first_epoch"),
            F.max("epoch").alias("last_epoch"),
            F.min("time_ns").alias("first_time_ns"),
            F.max("time_ns").alias("last_time_ns"),
        )
        .filter(F.size("servers") > 1)
    )


def _snapshot_type():
    from epochsync.core.model import snapshot_struct_type

    return snapshot_struct_type()


def _change_type():
    from epochsync.core.model import change_struct_type

    return change_struct_type()


# --------------------------------------------------------------------------- the stage


@dataclass(frozen=True)
class MergeOutputs:
    """Where one merge wrote its three tables: snapshot, change set and cookie groups (warehouse URIs)."""

    snapshot: str
    changes: str
    cookie_groups: str


def extents_known_for(fmt: str) -> bool:
    """Only canonical JSON Lines carries byte ranges; Lustre text and Gluster do not."""
    return fmt == "jsonl"


@holds_target_lease
def run_merge(
    cfg: Config, target_name: str, first_epoch: int, last_epoch: int, spark: SparkSession | None = None
) -> dict:
    """Merge epochs ``first_epoch..last_epoch`` of ``target_name``'s source onto snapshot ``first_epoch - 1``.

    Writes snapshot ``last_epoch``, the change set of ``last_epoch`` and the cookie groups
    (each overwritten as a whole, so a retry is idempotent) and returns stats:
    ``records`` (records in the window), ``merged_records`` (those the merge reads),
    ``changes`` and per-kind counts, ``range_bytes``, ``snapshot_fids``,
    ``net_to_raw_ratio`` (change rows / merged records), ``cookie_groups``, ``seconds``,
    ``merge_path``: ``empty``, ``local`` (below :func:`local_max_rows`
    records plus named fids: computed in this process, no Spark job), ``small`` (one Spark
    collect, written here) or ``large`` (from :func:`cache_min_rows`: written on Spark).
    ``spark`` default: :func:`epochsync.spark.spark_session` (opened before the path is
    chosen, also when the local path then runs no Spark job).
    """
    if spark is None:
        from epochsync.spark import spark_session

        spark = spark_session(f"epochsync-merge-{target_name}", cfg=cfg)
    return _run_merge_spark(cfg, target_name, first_epoch, last_epoch, spark)


def _run_merge_spark(cfg: Config, target_name: str, first_epoch: int, last_epoch: int, spark: SparkSession) -> dict:
    from epochsync.stages.ingest import read_records
    from epochsync.warehouse.paths import Warehouse
    from epochsync.warehouse.snapshots import snapshot_files

    if first_epoch < 1 or last_epoch < first_epoch:
        raise EpochError(f"bad epoch window {first_epoch}..{last_epoch}: need 1 <= first <= last")
    t0 = time.monotonic()
    target = cfg.target(target_name)
    source = cfg.source_of(target)
    wh = Warehouse(cfg.warehouse)
    prev = snapshot_files(wh, target.name, first_epoch - 1, source.root_fid)
    window = _window_facts(wh.records(source.name), first_epoch, last_epoch)
    out = MergeOutputs(
        wh.snapshot(target.name, last_epoch),
        wh.changes(target.name, last_epoch),
        wh.cookie_groups(target.name, last_epoch),
    )
    extents_known = extents_known_for(source.changelogs.format)
    if window.merged == 0 and not window.cookies:
        # nothing to merge (an empty epoch): no Spark job, snapshot E is E-1's files
        path = "empty"
        _publish_small(out, last_epoch, prev, None, extents_known)
    elif window.records + len(window.fids) < local_max_rows():
        path = "local"
        _merge_local(cfg, out, last_epoch, prev, window, source, first_epoch, extents_known, target.name)
    elif window.records + len(window.fids) < cache_min_rows():
        path = "small"

        def records_of(token: str):
            return read_records(spark, cfg.warehouse, source.name, first_epoch, last_epoch, read_token=token)

        _merge_small(spark, out, last_epoch, prev, records_of, window, source.root_fid, extents_known, target.name)
    else:
        path = "large"
        records = read_records(spark, cfg.warehouse, source.name, first_epoch, last_epoch)
        _merge_large(spark, out, last_epoch, prev, records, window, source.root_fid, extents_known, target.name)

    # the figures come from the files just written, read here with pyarrow: no Spark job
    # re-reads a table only to count it (each would cost a round trip and a job)
    counts = _table_counts(out)
    snapshot_fids, groups = counts.pop("_snapshot_fids"), counts.pop("_cookie_groups")
    stats = {
        "target": target.name,
        "source": source.name,
        "first_epoch": first_epoch,
        "epoch": last_epoch,
        "records": window.records,
        "merged_records": window.merged,
        **counts,
        "snapshot_fids": snapshot_fids,
        "cookie_groups": groups,
        "net_to_raw_ratio": counts["changes"] / window.merged if window.merged else 0.0,
        "snapshot": out.snapshot,
        "changes_uri": out.changes,
        "merge_path": path,
        "seconds": round(time.monotonic() - t0, 3),
    }
    # snapshot retention: the committed epoch's snapshot (first - 1, what a rollback checks
    # against) and everything newer are always kept
    from epochsync.warehouse.snapshots import prune_snapshots

    stats["snapshots_pruned"] = prune_snapshots(
        spark, wh, target.name, target.snapshot_retention, committed_epoch=first_epoch - 1
    )
    return stats


@dataclass(frozen=True)
class WindowFacts:
    """What the merge needs to know of a window's records before Spark reads them (pyarrow, footers and two columns)."""

    records: int
    merged: int
    cookies: bool
    fids: list[str]


def _window_facts(records_uri: str, first: int, last: int) -> WindowFacts:
    """Counts and the fids the window's records name (``tfid``, ``sfid``): the snapshot rows the merge reads."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from epochsync.warehouse import fs as warehouse_fs
    from epochsync.warehouse.paths import local_path

    ds = dataset_module()

    records = merged = 0
    cookies = False
    fids: set[str] = set()
    merged_types = array(list(MERGED_TYPES), pa.string())
    for e in range(first, last + 1):
        uri = f"{records_uri}/epoch={e}"
        if not warehouse_fs.exists(uri):
            raise EpochError(f"not ingested yet: {uri}")
        t = ds.dataset(local_path(uri), format="parquet", partitioning="hive").to_table(
            columns=["type", "tfid", "sfid", "cookie"]
        )
        records += t.num_rows
        kept = pc.is_in(t["type"].cast(pa.string()), value_set=merged_types)
        merged += int(pc.sum(pc.cast(kept, "int64")).as_py() or 0)
        cookies = cookies or t["cookie"].null_count < t.num_rows
        for col in ("tfid", "sfid"):
            fids.update(pc.unique(combine(pc.filter(t[col], kept)).drop_null()).to_pylist())
    return WindowFacts(records, merged, cookies, sorted(fids))


def _merge_local(cfg, out, epoch, prev, window, source, first_epoch, extents_known, target_name) -> None:
    """A window below :func:`local_max_rows`: the outcome :func:`_merge_small` would collect,
    computed in this process by :func:`epochsync.stages.merge_rules.merge_outcome` (no Spark
    job), written the same way."""
    from epochsync.stages.merge_rules import merge_outcome
    from epochsync.warehouse.paths import Warehouse

    records = read_window_records(Warehouse(cfg.warehouse).records(source.name), first_epoch, epoch)
    try:
        table = merge_outcome(prev.rows(window.fids), records, source.root_fid, extents_known)
    except EpochError as exc:
        raise _clean_error(exc, target_name, epoch, epoch) from None
    _publish_small(out, epoch, prev, table, extents_known)


#: merge inputs (records + snapshot rows named) below which the merge runs in this process.
#: Set with the Python mirror merge_rules replaced (12.1-13.5 s and 1 GB for a Gluster epoch of
#: 150,173 records + 50,075 fids, against 23.1 s on the Spark small path); merge_rules takes
#: 3.4-3.6 CPU-s and 0.7 GB for 150,173 bench records (docs/INTERNALS.md, "Merge: small
#: windows in this process")
LOCAL_MAX_ROWS = 250_000


def local_max_rows() -> int:
    """Input rows below which the merge runs here (``EPOCHSYNC_MERGE_LOCAL_MAX_ROWS``; 0: never)."""
    return int(os.environ.get("EPOCHSYNC_MERGE_LOCAL_MAX_ROWS", LOCAL_MAX_ROWS))


def read_window_records(records_uri: str, first: int, last: int):
    """The records of epochs ``first..last`` (``records_uri`` = ``Warehouse.records(source)``) as
    an Arrow table, every column of the canonical schema: ``epoch`` and ``server`` come from the
    partition directories, as Spark's read derives them (:func:`epochsync.stages.ingest.read_records`)."""
    import pyarrow as pa

    from epochsync.core.schema import record_arrow_schema
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


def _merge_small(spark, out, epoch, prev, records_of, window, root_fid, extents_known, target_name) -> None:
    """A small window: the snapshot rows of the fids the records name go to Spark from here,
    and both outputs and the cookie groups come back in one collect (one Spark job: planning
    a wide plan costs more than its data here), then are written from this process.

    The plan reads the ranked records five times and the per-write rows twice; a Connect
    plan is a tree, so the server would analyze each copy. With the session's plan cache on
    for the merge's requests, each of the two is analyzed once (its schema asked first) and
    the copies in the collect's plan are taken from the cache: the collect's analysis went
    from about 0.6-1.7 s to 0.05-0.1 s (docs/INTERNALS.md, "Merge"). The records' read
    carries a token of this call, so the cache never serves a listing of files since
    rewritten; the cache is turned off again afterwards.
    """
    from pyspark.sql import functions as F

    from epochsync.spark import collect_arrow, size_partitions
    from epochsync.warehouse.snapshot_files import snapshot_arrow_schema

    prev_rows = prev.rows(window.fids)
    size_partitions(spark, window.records + prev_rows.num_rows, extra={PLAN_CACHE_CONF: "true"})
    try:
        records = records_of(uuid.uuid4().hex)
        prev_df = spark.createDataFrame(prev_rows.cast(snapshot_arrow_schema()), schema=_snapshot_type())
        st = merge_state(prev_df, records, root_fid, extents_known, ranked=_analyzed_once, shared=_analyzed_once)
        both = state_outcome(st, extents_known).unionByName(
            cookie_groups(records).select(*(F.col(c).alias("g_" + c) for c in COOKIE_FIELDS)),
            allowMissingColumns=True,
        )
        table = collect_arrow(both)
    except Exception as exc:  # Spark errors: surface raise_error messages as one line
        raise _clean_error(exc, target_name, epoch, epoch) from None
    finally:
        spark.conf.set(PLAN_CACHE_CONF, "false")
    _publish_small(out, epoch, prev, table, extents_known)


#: the Connect session's cache of analyzed plans (off in every epochsync session: epochsync.spark)
PLAN_CACHE_CONF = "spark.connect.session.planCache.enabled"


def _analyzed_once(df: DataFrame) -> DataFrame:
    """``df`` after the server has analyzed it (its schema asked): with the plan cache on, the
    copies of its plan inside a larger one are taken from the cache, not analyzed again."""
    if os.environ.get("EPOCHSYNC_MERGE_PLAN_CACHE", "1") != "0":
        df.schema  # noqa: B018 (the request is the point)
    return df


#: columns of the cookie groups table, in order (:func:`cookie_groups`)
COOKIE_FIELDS = (
    "cookie",
    "servers",
    "fids",
    "types",
    "records",
    "first_epoch",
    "last_epoch",
    "first_time_ns",
    "last_time_ns",
)


def _publish_small(out: MergeOutputs, epoch: int, prev, table, extents_known: bool) -> None:
    """Split the collected outcome (:func:`state_outcome` rows and ``g_`` cookie rows) into the
    three tables and publish them: change set, cookie groups, then the snapshot (its presence
    says the merge of this epoch is complete)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from epochsync.core.model import change_arrow_schema
    from epochsync.warehouse.snapshot_files import DELETED, GEN, stage_delta, storage_arrow_schema
    from epochsync.warehouse.tables import discard_staged, publish_staged, stage_arrow_table

    change_schema = change_arrow_schema()
    storage = storage_arrow_schema()
    if table is None:
        changes = empty_table(change_schema)
        cookies = empty_table(_cookie_arrow_schema())
        delta = empty_table(storage)
    else:
        is_fid = pc.is_valid(table["exists_after"])
        fid_rows, cookie_rows = table.filter(is_fid), table.filter(pc.invert(is_fid))
        changed = fid_rows.filter(pc.fill_null(fid_rows["c__changed"], scalar(False)))
        changes = pa.table({c: changed["c_" + c] for c in CHANGE_FIELDS}).cast(change_schema)
        cookies = pa.table({c: cookie_rows["g_" + c] for c in COOKIE_FIELDS}).cast(_cookie_arrow_schema())
        alive = pc.fill_null(fid_rows["exists_after"], scalar(False))
        cols = {
            c: pc.if_else(alive, fid_rows["s_" + c], pa.nulls(fid_rows.num_rows, fid_rows["s_" + c].type))
            for c in SNAPSHOT_FIELDS
        }
        cols["fid"] = fid_rows["s_fid"]
        cols[GEN] = array([epoch] * fid_rows.num_rows, pa.int64())
        cols[DELETED] = pc.invert(alive)
        delta = pa.table(cols).cast(storage)
    staged = [(stage_arrow_table(changes, out.changes), out.changes)]
    staged.append((stage_arrow_table(cookies, out.cookie_groups), out.cookie_groups))
    snapshot = None
    try:
        snapshot = stage_delta(out.snapshot, epoch, prev, delta)
        publish_staged(staged)
        snapshot.publish()
    finally:
        discard_staged(staged)
        if snapshot is not None:
            snapshot.discard()


def _cookie_arrow_schema():
    from epochsync.stages.merge_common import cookie_arrow_schema

    return cookie_arrow_schema()


def _merge_large(spark, out, epoch, prev, records, window, root_fid, extents_known, target_name) -> None:
    """A large window: Spark reads snapshot E-1's rows of the named fids, persists the per-fid
    state and writes the three tables; snapshot E is E-1's files plus a delta, or a new base
    when :func:`~epochsync.warehouse.snapshot_files.compaction_due`."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from epochsync.spark import size_partitions
    from epochsync.warehouse.snapshot_files import DELETED, GEN, compaction_due
    from epochsync.warehouse.snapshots import read_snapshot_files, stage_snapshot_files
    from epochsync.warehouse.tables import discard_staged, publish_staged, stage_tables

    partitions = size_partitions(spark, window.records + prev.rows_count)
    named = records.select(F.explode(F.array("tfid", "sfid")).alias("fid")).filter("fid IS NOT NULL").distinct()
    prev_all = read_snapshot_files(spark, prev)
    prev_df = prev_all.join(named, "fid", "left_semi")
    persisted: list = []
    staged: list[tuple[str, str]] = []
    snapshot = None
    try:
        if large_engine() == "rules":
            st = _outcome_as_state(partitioned_outcome(prev_df, records, root_fid, extents_known, partitions))
            st = st.persist(StorageLevel.MEMORY_AND_DISK)
            persisted.append(st)
            changes = conform(
                st.filter("_changed").select(*(F.col("c_" + c).alias(c) for c in CHANGE_FIELDS)), _change_type()
            )
        else:
            st = merge_state(prev_df, records, root_fid, extents_known, cache=persisted)
            st = st.persist(StorageLevel.MEMORY_AND_DISK)
            persisted.append(st)
            changes = state_changes(st, extents_known)
        staged = stage_tables([(changes, out.changes), (cookie_groups(records), out.cookie_groups)])
        counts = _table_counts(MergeOutputs("", staged[0][0], ""), snapshot=False)
        live_rows = prev.rows_count + counts["created"] - counts["deleted"]
        if compaction_due(prev, len(window.fids), live_rows):
            rows = prev_all.join(st.select("fid"), "fid", "left_anti").unionByName(state_snapshot_rows(st))
            rows = rows.select("*", F.lit(epoch).cast("bigint").alias(GEN), F.lit(False).alias(DELETED))
            snapshot = stage_snapshot_files(out.snapshot, epoch, rows, live_rows=live_rows)
        else:
            kept = {"fid", "type", "links"}
            rows = st.filter("existed_before OR exists_after").select(
                "fid",
                *(
                    F.when(F.col("exists_after"), F.col(c if c in kept else "n_" + c)).alias(c)
                    for c in SNAPSHOT_FIELDS
                    if c != "fid"
                ),
                F.lit(epoch).cast("bigint").alias(GEN),
                (~F.col("exists_after")).alias(DELETED),
            )
            snapshot = stage_snapshot_files(out.snapshot, epoch, rows, live_rows=live_rows, prev=prev)
        # published in this order, the snapshot last (its presence says the merge is complete)
        publish_staged(staged)
        snapshot.publish()
    except Exception as exc:  # Spark errors: surface raise_error messages as one line
        raise _clean_error(exc, target_name, epoch, epoch) from None
    finally:
        for df in persisted:
            df.unpersist()
        discard_staged(staged)
        if snapshot is not None:
            snapshot.discard()


def large_engine() -> str:
    """What merges a large window (``EPOCHSYNC_MERGE_LARGE_ENGINE``): ``spark`` (the Spark SQL
    transforms of this module, the default) or ``rules`` (:func:`partitioned_outcome`:
    :mod:`epochsync.stages.merge_rules` on fid partitions)."""
    engine = os.environ.get("EPOCHSYNC_MERGE_LARGE_ENGINE", "spark")
    if engine not in ("spark", "rules"):
        raise EpochError(f"EPOCHSYNC_MERGE_LARGE_ENGINE={engine!r}: use 'spark' or 'rules'")
    return engine


def _outcome_as_state(outcome: DataFrame) -> DataFrame:
    """Outcome rows (``s_``/``c_`` columns) with the per-fid state columns :func:`_merge_large`
    writes the snapshot from: ``fid``, ``type``, ``links``, ``n_<column>``, ``existed_before``,
    ``exists_after``, ``_changed``."""
    from pyspark.sql import functions as F

    kept = ("fid", "type", "links")
    return outcome.select(
        "*",
        *(F.col("s_" + c).alias(c if c in kept else "n_" + c) for c in SNAPSHOT_FIELDS),
        F.col("c__changed").alias("_changed"),
        # a fid in the outcome existed before or exists after (merge_outcome's filter)
        (~F.col("exists_after") | ~F.coalesce(F.col("c_created"), F.lit(False))).alias("existed_before"),
    )


#: merge inputs (records + snapshot rows named) from which the merge runs on Spark end to end
CACHE_MIN_ROWS = 200_000


def cache_min_rows() -> int:
    """Input rows from which the merge writes its tables on Spark (``EPOCHSYNC_MERGE_CACHE_MIN_ROWS``)."""
    return int(os.environ.get("EPOCHSYNC_MERGE_CACHE_MIN_ROWS", CACHE_MIN_ROWS))


def _table_counts(out: MergeOutputs, *, snapshot: bool = True) -> dict:
    """The merge's figures from its outputs, read with pyarrow in this process."""
    import pyarrow.compute as pc

    from epochsync.warehouse.paths import local_path
    from epochsync.warehouse.snapshot_files import read_layout

    ds = dataset_module()

    def dataset(uri: str, **kw):
        return ds.dataset(local_path(uri), format="parquet", partitioning="hive", **kw)

    flags = [c for c in CHANGE_FIELDS if c in _FLAG_COLUMNS]
    changes = dataset(out.changes).to_table(columns=[*flags, "ranges"])
    counts: dict = {"changes": changes.num_rows}
    for c in flags:
        counts[c] = int(pc.sum(pc.cast(pc.fill_null(changes[c], scalar(False)), "int64")).as_py() or 0)
    lengths = pc.struct_field(pc.list_flatten(changes["ranges"]), "length")
    counts["range_bytes"] = int(pc.sum(lengths).as_py() or 0)
    if snapshot:
        layout = read_layout(out.snapshot)
        counts["_snapshot_fids"] = layout.rows if layout is not None else 0
        counts["_cookie_groups"] = dataset(out.cookie_groups).count_rows()
    return counts


_FLAG_COLUMNS = ("created", "deleted", "links_changed", "attrs_changed", "xattrs_changed", "data_changed", "whole_file")


#: what the merge's raise_error sentences say (each starts at "fid " or "record ")
_MERGE_ERRORS = ("gains a name in this window", "has no fid, parent fid or name", "in no order that applies")


def _clean_error(exc: Exception, target: str, first: int, last: int) -> EpochsyncError:
    text = str(exc)
    for marker in _MERGE_ERRORS:
        if marker in text:
            line = next((ln for ln in text.splitlines() if marker in ln), text)
            # raise_error messages arrive wrapped in Spark's error text; keep the sentence.
            start = line.find("record ") if marker.startswith("has no") else line.find("fid ")
            sentence = line[start:].split(" SQLSTATE:")[0].strip().rstrip("'")
            return EpochError(f"merge of target {target!r} epochs {first}..{last}: {sentence}")
    if isinstance(exc, EpochsyncError):
        return exc
    return EpochError(
        f"merge of target {target!r} epochs {first}..{last} failed: {text.splitlines()[0] if text else exc!r}"
    )
