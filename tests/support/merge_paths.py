"""The merge's in-process path held to its Spark path: the same outcome, the same errors.

:func:`epochsync.stages.merge_rules.merge_outcome` must compute what the Spark merge
computes for the same snapshot rows and records. The tests that check the Spark merge
against the oracle and the rules compare the local path with the rows they already
collected (:func:`assert_local_equals_merge`: no Spark job more); one property test
compares whole outcome tables, cookie groups included (:func:`assert_local_equals_spark`).
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest


def arrow_inputs(prev: list[tuple], records: list):
    """Snapshot rows (tuples in :data:`SNAPSHOT_FIELDS` order) and :class:`Record` values as the
    Arrow tables the local path reads, built here (no Spark round trip)."""
    import pyarrow as pa

    from epochsync.core.schema import record_arrow_schema
    from epochsync.warehouse.snapshot_files import snapshot_arrow_schema

    snap, rec = snapshot_arrow_schema(), record_arrow_schema()
    prev_t = pa.Table.from_arrays([pa.array([r[i] for r in prev], f.type) for i, f in enumerate(snap)], schema=snap)
    rows = [r.to_row() for r in records]
    rec_t = pa.Table.from_arrays([pa.array([r[i] for r in rows], f.type) for i, f in enumerate(rec)], schema=rec)
    return prev_t, rec_t


def _plain(v):
    """Spark ``Row`` values and Arrow's Python values alike: dicts, lists, bytes."""
    if hasattr(v, "asDict"):
        v = v.asDict()
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    if isinstance(v, bytearray):
        return bytes(v)
    return v


def outcomes():
    """The in-process definitions of the outcome held to the Spark path (one since issue 52)."""
    from epochsync.stages.merge_rules import merge_outcome

    return (merge_outcome,)


def local_tables(prev_t, rec_t, roots: str | Iterable[str], extents_known: bool, outcome=None) -> tuple[list, list]:
    """Snapshot E and the change set from an in-process outcome, as ``merge_epoch`` returns them
    (sorted by fid): what ``_publish_small`` writes, read back."""
    from epochsync.core.model import CHANGE_FIELDS, SNAPSHOT_FIELDS
    from epochsync.stages.merge_rules import merge_outcome

    outcome = outcome or merge_outcome
    out = [r for r in outcome(prev_t, rec_t, roots, extents_known).to_pylist() if r["s_fid"] is not None]
    touched = {r["s_fid"] for r in out}
    snap = [r for r in prev_t.to_pylist() if r["fid"] not in touched]
    snap += [{c: r["s_" + c] for c in SNAPSHOT_FIELDS} for r in out if r["exists_after"]]
    changes = [{c: r["c_" + c] for c in CHANGE_FIELDS} for r in out if r["c__changed"]]
    return sorted(snap, key=lambda r: r["fid"]), sorted(changes, key=lambda r: r["fid"])


def assert_local_equals_merge(prev: list[tuple], records: list, roots, extents_known: bool, snap_rows, change_rows):
    """Each in-process path gives the snapshot rows and change rows ``merge_epoch`` gave (collected)."""
    inputs = arrow_inputs(prev, records)
    for outcome in outcomes():
        snap, changes = local_tables(*inputs, roots, extents_known, outcome)
        for got, want in ((snap, snap_rows), (changes, change_rows)):
            want = sorted((_plain(r) for r in want), key=lambda r: r["fid"])
            for g, w in zip(got, want, strict=False):
                assert g == w, (outcome.__name__, {k: (g[k], w[k]) for k in g if g[k] != w.get(k)})
            assert len(got) == len(want), outcome.__name__


def spark_outcome(prev, records, roots: str | Iterable[str], extents_known: bool):
    """The table ``merge._merge_small`` collects, from ``prev`` (snapshot rows) and ``records`` (DataFrames)."""
    from pyspark.sql import functions as F

    from epochsync.spark import collect_arrow
    from epochsync.stages.merge import COOKIE_FIELDS, cookie_groups, merge_state, state_outcome

    st = merge_state(prev, records, roots, extents_known)
    both = state_outcome(st, extents_known).unionByName(
        cookie_groups(records).select(*(F.col(c).alias("g_" + c) for c in COOKIE_FIELDS)), allowMissingColumns=True
    )
    return collect_arrow(both)


def _sorted_rows(table) -> list[dict]:
    return sorted(table.to_pylist(), key=lambda r: (r["s_fid"] or "", r["g_cookie"] or ""))


def assert_local_equals_spark(spark, prev: list[tuple], records: list, roots, extents_known: bool) -> int:
    """The local outcome equals the Spark small path's collected table: same column names and
    types, same rows (any order); or both fail with the same ``_clean_error`` message.
    Returns the rows compared."""
    from epochsync.core.model import snapshot_struct_type
    from epochsync.core.schema import record_struct_type
    from epochsync.stages.merge import _clean_error

    prev_t, rec_t = arrow_inputs(prev, records)
    prev_df = spark.createDataFrame(prev, snapshot_struct_type())
    rec_df = spark.createDataFrame([r.to_row() for r in records], record_struct_type())
    try:
        want = spark_outcome(prev_df, rec_df, roots, extents_known)
    except Exception as exc:  # noqa: BLE001 (the message is what is compared)
        wanted = str(_clean_error(exc, "t", 1, 1))
        for outcome in outcomes():
            with pytest.raises(Exception) as err:  # noqa: PT011
                outcome(prev_t, rec_t, roots, extents_known)
            assert str(_clean_error(err.value, "t", 1, 1)) == wanted, outcome.__name__
        return 0
    want_rows = _sorted_rows(want)
    for outcome in outcomes():
        got = outcome(prev_t, rec_t, roots, extents_known)
        assert [(f.name, f.type) for f in got.schema] == [(f.name, f.type) for f in want.schema], outcome.__name__
        got_rows = _sorted_rows(got)
        for g, w in zip(got_rows, want_rows, strict=False):
            assert g == w, (outcome.__name__, {k: (g[k], w[k]) for k in g if g[k] != w.get(k)})
        assert len(got_rows) == len(want_rows), outcome.__name__
    return len(want_rows)
