"""Property tests: the Spark merge against the sequential oracle on simulated histories.

For random histories (hypothesis, plus fixed seeds kept as regressions):

- snapshot E from :func:`epochsync.stages.merge.merge_epoch` equals
  :func:`epochsync_dev.oracle.replay` of the same records on snapshot E-1, for every epoch and
  for catch-up windows E1..E2, also when every server's clock is off (issue 16), and the
  namespace (which fid holds which name) always equals the truth's;
- the merge refuses a name's adds and removes exactly when no order of them applies;
- the in-process merge (``run_merge``'s local path) gives the same snapshot and change rows
  on every batch, and the same outcome table as the Spark small path (cookie groups
  included) on skewed Lustre-like and Gluster-like histories (``support.merge_paths``);
- the data ranges of the change set cover every byte that differs between E-1 and E in
  the simulator's file contents (a byte past the old size counts as zero, since the
  replica grows a file by truncation), lie inside the new size, and no file whose bytes
  and size did not change is marked as changed.

Spark start-up and scheduling dominate tiny merges, so every batch of histories is one
Spark job: each (history, epoch) item gets its own fid, server and cookie prefix and its
own root.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.testing import assertDataFrameEqual
from support.merge_paths import assert_local_equals_merge, assert_local_equals_spark

from epochsync.core.model import SNAPSHOT_FIELDS, change_struct_type, snapshot_struct_type
from epochsync.core.schema import Record, record_struct_type
from epochsync_dev.oracle import replay
from epochsync_dev.simulate.workload import simulate_history


@dataclass(frozen=True)
class Params:
    seed: int
    epochs: int
    files: int
    mdts: int
    osts: int
    ops: int


@dataclass
class Item:
    """One merge to check: snapshot first-1 + records of first..last."""

    prefix: str
    root: str
    prev: list[dict]
    records: list[Record]
    old_contents: dict[str, bytes]
    new_contents: dict[str, bytes]
    truth: list[dict]  # the simulator's snapshot E


def _pf(prefix: str, fid: str | None) -> str | None:
    return None if fid is None else prefix + fid


def _rename_row(prefix: str, row: dict) -> tuple:
    r = dict(row, fid=prefix + row["fid"], links=sorted((prefix + p, n) for p, n in row["links"]))
    return tuple(r[f] for f in SNAPSHOT_FIELDS)


def _rename_record(prefix: str, r: Record) -> Record:
    # servers and cookies too: each item is a source of its own
    return r.replace(
        tfid=_pf(prefix, r.tfid),
        pfid=_pf(prefix, r.pfid),
        sfid=_pf(prefix, r.sfid),
        spfid=_pf(prefix, r.spfid),
        server=prefix + r.server,
        cookie=_pf(prefix, r.cookie),
    )


@dataclass(frozen=True)
class Skew:
    """Independent server clocks: each server's ``time_ns`` moved by up to ``max_us`` either
    way, then cut to a ``tick_us`` resolution (ties between servers)."""

    seed: int
    max_us: int
    tick_us: int

    def apply(self, records: list[Record]) -> list[Record]:
        rng = random.Random(self.seed)
        offset = {s: rng.randint(-self.max_us, self.max_us) * 1000 for s in sorted({r.server for r in records})}
        tick = self.tick_us * 1000
        return [r.replace(time_ns=(r.time_ns + offset[r.server]) // tick * tick) for r in records]


def items_of(n: int, p: Params, windows: bool = True, skew: Skew | None = None) -> list[Item]:
    """Every single epoch of a history, plus (when there are 3+) a catch-up window 2..last."""
    hist = simulate_history(
        p.seed, p.epochs, p.files, mdts=p.mdts, osts=p.osts, ops_per_epoch=p.ops, max_file_size=32 * 1024
    )
    spans = [(e, e) for e in range(1, p.epochs + 1)]
    if windows and p.epochs >= 3:
        spans.append((2, p.epochs))
    out = []
    for first, last in spans:
        prefix = f"h{n}e{first}-{last}/"
        recs = [r for e in range(first, last + 1) for r in hist.at(e).records]
        if skew is not None:
            recs = skew.apply(recs)
        out.append(
            Item(
                prefix=prefix,
                root=prefix + hist.root_fid,
                prev=hist.snapshot_before(first),
                records=recs,
                old_contents={} if first == 1 else hist.at(first - 1).contents,
                new_contents=hist.at(last).contents,
                truth=hist.at(last).snapshot,
            )
        )
    return out


def _gluster_like(r: Record) -> Record:
    """``r`` as a source without values logs it: no extents nor objects, attributes only on creates."""
    if r.type in ("CREAT", "MKDIR", "SLINK", "MKNOD"):
        return r.replace(extents=None, object=None)
    return r.replace(
        extents=None, object=None, mode=None, uid=None, gid=None, size=None, xattr_value=None,
        atime_ns=None, mtime_ns=None, ctime_ns=None,
    )  # fmt: skip


def check_batch(spark, items: list[Item], check_data: bool = True) -> None:
    """Snapshot E of the merge equals the oracle's; with ``check_data`` the change set covers
    every byte that changed in the simulator's files (clock skew moves the records, not the
    simulator's bytes: then only the namespace must equal the truth, see below). The
    in-process merge (``run_merge``'s local path) gives the same snapshot and change rows."""
    from epochsync.stages.merge import merge_epoch

    prev = [_rename_row(it.prefix, row) for it in items for row in it.prev]
    recs = [_rename_record(it.prefix, r) for it in items for r in it.records]
    expected = [
        _rename_row(it.prefix, row) for it in items for row in replay(it.root[len(it.prefix) :], it.prev, it.records)
    ]
    snap, changes = merge_epoch(
        spark.createDataFrame(prev, snapshot_struct_type()),
        spark.createDataFrame([r.to_row() for r in recs], record_struct_type()),
        [it.root for it in items],
        cache=True,
    )
    snap_rows = snap.collect()
    change_rows = changes.collect()
    assert_local_equals_merge(prev, recs, [it.root for it in items], True, snap_rows, change_rows)
    assertDataFrameEqual(
        spark.createDataFrame(snap_rows, snapshot_struct_type()),
        spark.createDataFrame(expected, snapshot_struct_type()),
    )
    by_fid = {r.fid: r for r in change_rows}
    assert len(by_fid) == len(change_rows), "one change row per fid"
    for it in items:
        if check_data:
            _check_data(it, by_fid)
        # which fid holds which name does not depend on any clock: always the truth's
        got = sorted(
            (r.fid, sorted((link.pfid, link.name) for link in r.links))
            for r in snap_rows
            if r.fid.startswith(it.prefix)
        )
        assert got == [(it.prefix + r["fid"], [(it.prefix + p, n) for p, n in r["links"]]) for r in it.truth]


def _check_data(it: Item, by_fid: dict) -> None:
    for fid, new in it.new_contents.items():
        row = by_fid.get(it.prefix + fid)
        existed = fid in it.old_contents
        old = it.old_contents.get(fid, b"")
        a = np.frombuffer(new, dtype=np.uint8)
        b = np.zeros(len(new), dtype=np.uint8)
        keep = min(len(old), len(new))
        b[:keep] = np.frombuffer(old, dtype=np.uint8)[:keep]
        differ = a != b
        unchanged = existed and old == new
        where = f"{it.prefix}{fid} (old size {len(old)}, new size {len(new)})"
        if row is None or not row.data_changed:
            assert not differ.any() and (not existed or len(old) == len(new)), f"data change missed for {where}"
            continue
        assert not unchanged, f"{where} marked as changed but its bytes and size are the same: {row}"
        assert row.new_size == len(new), where
        if row.whole_file:
            continue
        covered = np.zeros(len(new), dtype=bool)
        last_end = -1
        for rg in row.ranges:
            assert rg.length > 0 and rg.offset > last_end, f"ranges not disjoint, sorted, non-adjacent: {row.ranges}"
            assert rg.offset + rg.length <= len(new), f"range past the new size for {where}: {row.ranges}"
            covered[rg.offset : rg.offset + rg.length] = True
            last_end = rg.offset + rg.length
        missed = np.nonzero(differ & ~covered)[0]
        assert missed.size == 0, f"bytes {missed[:5].tolist()}... of {where} differ but are not in {row.ranges}"
    # files the oracle deleted: a change row says so, with no data
    for fid in set(it.old_contents) - set(it.new_contents):
        row = by_fid.get(it.prefix + fid)
        assert row is not None and row.deleted and not row.data_changed, f"{it.prefix}{fid} deletion: {row}"


params = st.builds(
    Params,
    seed=st.integers(0, 2**31),
    epochs=st.integers(1, 4),
    files=st.integers(0, 12),
    mdts=st.integers(1, 3),
    osts=st.integers(1, 4),
    ops=st.integers(1, 30),
)


@settings(
    max_examples=3,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(batch=st.lists(params, min_size=5, max_size=5))
def test_merge_equals_oracle_on_random_histories(spark, batch):
    """3 batches x 5 histories x (every epoch + a window): 15 histories, 3 Spark jobs."""
    check_batch(spark, [it for n, p in enumerate(batch) for it in items_of(n, p)])


skews = st.builds(Skew, seed=st.integers(0, 2**31), max_us=st.integers(0, 3000), tick_us=st.sampled_from([1, 10, 1000]))


@settings(
    max_examples=2,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(batch=st.lists(st.tuples(params, skews), min_size=4, max_size=4))
def test_merge_equals_oracle_under_clock_skew(spark, batch):
    """Issue 16: every server's clock off by up to 3 ms, ticks up to 1 ms (ties). The merge
    still equals the oracle (same causal order), and the namespace equals the truth's."""
    check_batch(
        spark,
        [it for n, (p, sk) in enumerate(batch) for it in items_of(n, p, skew=sk)],
        check_data=False,
    )


#: regressions and coverage of the bigger shapes: several MDTs and OSTs, more operations
FIXED = [
    Params(seed=1, epochs=4, files=20, mdts=2, osts=4, ops=40),
    Params(seed=7, epochs=3, files=10, mdts=1, osts=1, ops=60),
    Params(seed=42, epochs=5, files=15, mdts=3, osts=3, ops=30),
    Params(seed=2026, epochs=2, files=30, mdts=1, osts=4, ops=80),
]


def test_merge_equals_oracle_fixed_seeds(spark):
    check_batch(spark, [it for n, p in enumerate(FIXED) for it in items_of(n, p)])


@pytest.mark.parametrize("extents_known", [True, False], ids=["extents", "gluster-like"])
def test_local_path_equals_the_spark_small_path(spark, extents_known):
    """The in-process merge's outcome table equals the one the Spark small path collects
    (cookie groups and deleted fids' rows included) on simulated histories with several MDTs
    and OSTs, every server's clock off, cookies spanning servers and items; without extents
    the records carry only what a Gluster changelog does."""
    rng = random.Random(3)
    items = [
        it
        for n in range(6)
        for it in items_of(
            n,
            Params(
                rng.randint(0, 2**31), rng.randint(1, 4), rng.randint(0, 14), rng.randint(1, 3), rng.randint(1, 4), 30
            ),
            skew=Skew(rng.randint(0, 2**31), rng.choice([0, 50, 3000]), rng.choice([1, 10, 1000])),
        )
    ]
    prev = [_rename_row(it.prefix, row) for it in items for row in it.prev]
    recs = [_rename_record(it.prefix, r) for it in items for r in it.records]
    if not extents_known:
        recs = [_gluster_like(r) for r in recs]
    # an operation whose MARKs span servers of several items
    recs += [r.replace(type="MARK", cookie="shared", server=r.server + "x") for r in recs[:: len(recs) // 5]]
    assert assert_local_equals_spark(spark, prev, recs, [it.root for it in items], extents_known) > len(items)


def _orderable(sequences: list[list[int]], held: int) -> bool:
    """Brute force: can the servers' adds (+1) and removes (-1) of one name interleave, each
    server's in order, with the count staying 0 or 1 from ``held``?"""
    if not any(sequences):
        return True
    return any(
        0 <= held + s[0] <= 1 and _orderable([t[1:] if j == k else t for j, t in enumerate(sequences)], held + s[0])
        for k, s in enumerate(sequences)
        if s
    )


_pm = st.sampled_from([1, -1])
#: one name: the first server adds and removes; the others mostly only remove (a rename's old
#: name logged on the new parent's server), sometimes add too
name_histories = st.tuples(
    st.lists(_pm, max_size=5),
    st.lists(st.one_of(st.lists(st.just(-1), max_size=2), st.lists(_pm, max_size=3)), max_size=2),
).map(lambda t: [t[0], *t[1]])
#: names with no order that only the exact rule (one server adds) finds, and two that only the
#: running counts find (two servers add)
ALWAYS = [[[1, -1, -1, 1], [], [-1]], [[1, -1, -1, 1], [-1]], [[1], [1, -1, -1]], [[1], [-1, -1, 1]]]


@settings(max_examples=3, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories=st.lists(name_histories, min_size=1, max_size=80))
def test_merge_refuses_exactly_the_names_no_order_applies(spark, histories):
    """Per name: server k logs ``histories[i][k]`` (HLINK +1, UNLNK -1). The merge's check says
    "no order applies" iff brute force finds none, for the name held at E-1 and not, when at
    most one server adds the name; when several do, it never refuses a name some order
    applies to (and refuses what the running counts rule out)."""
    from epochsync.stages.merge import link_changes, prepare_records

    histories = [*ALWAYS, *histories]
    index: dict[str, int] = {}
    recs = []
    for i, per_server in enumerate(histories):
        for k, seq in enumerate(per_server):
            server = f"MDT000{k}"
            for d in seq:
                index[server] = index.get(server, 0) + 1
                recs.append(
                    Record(
                        server,
                        index[server],
                        1,
                        "HLINK" if d == 1 else "UNLNK",
                        time_ns=0,
                        tfid=f"F{i}",
                        pfid="P",
                        name="n",
                    )
                )
    got = {
        r.fid: r
        for r in link_changes(
            prepare_records(spark.createDataFrame([r.to_row() for r in recs], record_struct_type()))
        ).collect()
    }
    # the in-process merge's check says the same of every name
    from support.merge_paths import arrow_inputs

    from epochsync.stages import merge_rules

    local = {r["fid"]: r for r in merge_rules.link_changes(arrow_inputs([], recs)[1]).to_pylist()}
    for fid, row in got.items():
        for col in ("added", "removed", "bad_absent", "bad_present"):
            mine = sorted((p["pfid"], p["name"]) for p in local[fid][col] or [])
            assert mine == sorted((p.pfid, p.name) for p in row[col]), (fid, col)
    assert set(local) == set(got)
    for i, per_server in enumerate(histories):
        row = got.get(f"F{i}")
        adders = sum(1 in seq for seq in per_server)
        for held, refused in ((0, row and row.bad_absent), (1, row and row.bad_present)):
            possible = _orderable(per_server, held)
            where = f"name {i}: servers {per_server}, held {held}"
            if possible:
                assert not refused, f"refused though an order applies: {where}"
            elif adders <= 1 or i < len(ALWAYS):
                assert refused, f"accepted though no order applies: {where}"
        d = sum(sum(seq) for seq in per_server)
        if any(_orderable(per_server, h) for h in (0, 1)) and d != 0:
            assert (len(row.added), len(row.removed)) == ((1, 0) if d == 1 else (0, 1)), where


def test_data_check_is_not_vacuous():
    """_check_data fails on a missed byte, a stray range, and a change that is not one."""
    from types import SimpleNamespace as Row

    it = Item("p/", "p/R", [], [], {"f": b"abcd", "same": b"xy"}, {"f": b"abXd", "same": b"xy"}, [])

    def row(fid, ranges, **kw):
        base = dict(fid="p/" + fid, data_changed=True, whole_file=False, deleted=False, new_size=4)
        return Row(**{**base, **kw, "ranges": [Row(offset=o, length=n) for o, n in ranges]})

    _check_data(it, {"p/f": row("f", [(2, 1)])})  # exact: passes
    with pytest.raises(AssertionError, match="differ but are not in"):
        _check_data(it, {"p/f": row("f", [(0, 2)])})
    with pytest.raises(AssertionError, match="data change missed"):
        _check_data(it, {})
    with pytest.raises(AssertionError, match="range past the new size"):
        _check_data(it, {"p/f": row("f", [(2, 5)])})
    with pytest.raises(AssertionError, match="bytes and size are the same"):
        _check_data(it, {"p/f": row("f", [(2, 1)]), "p/same": row("same", [(0, 1)], new_size=2)})


def test_change_rows_have_the_model_columns(spark):
    from epochsync.stages.merge import merge_epoch

    it = items_of(0, Params(seed=5, epochs=1, files=3, mdts=1, osts=1, ops=1), windows=False)[0]
    snap, changes = merge_epoch(
        spark.createDataFrame([_rename_row("", r) for r in it.prev], snapshot_struct_type()),
        spark.createDataFrame([r.to_row() for r in it.records], record_struct_type()),
        it.root,
    )
    assert [f.name for f in changes.schema.fields] == [f.name for f in change_struct_type().fields]
    assert [f.name for f in snap.schema.fields] == list(SNAPSHOT_FIELDS)


@pytest.mark.parametrize("extents_known", [True, False], ids=["extents", "gluster-like"])
def test_fid_partitions_give_the_whole_windows_outcome(spark, extents_known):
    """The large path's plan (``merge.partitioned_outcome``: the records and snapshot rows
    partitioned by fid, ``merge_rules`` run on each partition) gives the outcome of the whole
    window in one call, whatever the number of partitions: renames over another fid put a
    copy of the record in that fid's partition, and each partition answers for its own fids."""
    import pyarrow as pa
    from support.merge_paths import arrow_inputs

    from epochsync.spark import collect_arrow
    from epochsync.stages.merge import partitioned_outcome
    from epochsync.stages.merge_rules import merge_outcome

    rng = random.Random(5)
    items = [
        it
        for n in range(5)
        for it in items_of(
            n,
            Params(
                rng.randint(0, 2**31), rng.randint(1, 4), rng.randint(2, 14), rng.randint(1, 3), rng.randint(1, 4), 40
            ),
            skew=Skew(rng.randint(0, 2**31), rng.choice([0, 3000]), rng.choice([1, 1000])),
        )
    ]
    prev = [_rename_row(it.prefix, row) for it in items for row in it.prev]
    recs = [_rename_record(it.prefix, r) for it in items for r in it.records]
    if not extents_known:
        recs = [_gluster_like(r) for r in recs]
    roots = [it.root for it in items]
    assert any(r.type == "RENME" and r.tfid is not None for r in recs)  # the copies are exercised
    want = merge_outcome(*arrow_inputs(prev, recs), roots, extents_known, cookies=False)
    want_rows = sorted(want.drop_columns([c for c in want.column_names if c.startswith("g_")]).to_pylist(), key=repr)
    prev_df = spark.createDataFrame(prev, snapshot_struct_type())
    rec_df = spark.createDataFrame([r.to_row() for r in recs], record_struct_type())
    for partitions in (1, 3, 8):
        got = collect_arrow(partitioned_outcome(prev_df, rec_df, roots, extents_known, partitions))
        assert isinstance(got, pa.Table)
        assert sorted(got.to_pylist(), key=repr) == want_rows, partitions
