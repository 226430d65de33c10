"""The merge's in-process path held to its Spark path: the same outcome table, the same errors.

:func:`epochsync.stages.merge_local.local_outcome` must return what the Spark small path
collects (``state_outcome`` united with ``cookie_groups``) for the same snapshot rows and
records: the tests that check the Spark merge against the oracle and the rules call
:func:`assert_local_equals_spark` on their inputs too.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest


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


def assert_local_equals_spark(prev, records, roots: str | Iterable[str], extents_known: bool) -> int:
    """The local outcome equals the Spark one: same column names and types, same rows (any
    order); or both fail with the same ``_clean_error`` message. Returns the rows compared."""
    from epochsync.stages.merge import _clean_error
    from epochsync.stages.merge_local import local_outcome

    prev_rows, record_rows = prev.toArrow(), records.toArrow()
    try:
        want = spark_outcome(prev, records, roots, extents_known)
    except Exception as exc:  # noqa: BLE001 (the message is what is compared)
        wanted = str(_clean_error(exc, "t", 1, 1))
        with pytest.raises(Exception) as err:  # noqa: PT011
            local_outcome(prev_rows, record_rows, roots, extents_known)
        assert str(_clean_error(err.value, "t", 1, 1)) == wanted
        return 0
    got = local_outcome(prev_rows, record_rows, roots, extents_known)
    assert [(f.name, f.type) for f in got.schema] == [(f.name, f.type) for f in want.schema]
    got_rows, want_rows = _sorted_rows(got), _sorted_rows(want)
    for g, w in zip(got_rows, want_rows, strict=False):
        assert g == w, {k: (g[k], w[k]) for k in g if g[k] != w.get(k)}
    assert len(got_rows) == len(want_rows)
    return len(want_rows)
