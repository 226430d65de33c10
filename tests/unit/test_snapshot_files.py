"""Snapshots stored by fid bucket with one delta per epoch: what every reader sees equals the oracle.

The merge writes snapshot E as E-1's files (hard links) plus the rows its records named;
these tests run it epoch after epoch with compaction held off, with tiny buckets (so the
bucket count grows and buckets split), on the three merge paths (local, Spark small, Spark
large), and compare every way of
reading a snapshot (Spark's whole read, the lookups by fid, the directories, the links
under a directory) with the sequential oracle's state.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.testing import assertDataFrameEqual
from support.configs import sim_config

from epochsync.core.config import load_config
from epochsync.core.model import SNAPSHOT_FIELDS, snapshot_struct_type
from epochsync.core.schema import record_struct_type
from epochsync.warehouse import snapshot_files as sf
from epochsync.warehouse.paths import Warehouse, local_path
from epochsync.warehouse.snapshots import prune_snapshots, read_snapshot, snapshot_files
from epochsync_dev.simulate.workload import ROOT_FID, simulate_history

EPOCHS = 5
TARGETS = ("local", "buckets", "large", "legacy")


def _config(tmp: Path) -> Path:
    return sim_config(
        tmp,
        [{"name": t, "kind": "posix", "path": f"{tmp}/replica-{t}", "snapshot_retention": 2} for t in TARGETS],
    )


def _rows(spark, rows):
    return spark.createDataFrame([tuple(r[f] for f in SNAPSHOT_FIELDS) for r in rows], snapshot_struct_type())


def _plain(spark, rows) -> list[dict]:
    """Oracle rows as the Python values pyarrow gives, sorted by fid."""
    return sorted(_rows(spark, rows).toArrow().to_pylist(), key=lambda r: r["fid"])


@pytest.fixture(scope="module")
def merged(spark, tmp_path_factory):
    """Every epoch of a simulated history merged into four targets, one epoch per run."""
    from epochsync.stages.merge import run_merge

    tmp = tmp_path_factory.mktemp("snapshot-files")
    hist = simulate_history(5, EPOCHS, 14, mdts=2, osts=2, ops_per_epoch=18, data=False)
    cfg = load_config(_config(tmp))
    wh = Warehouse(cfg.warehouse)
    records = [r for e in hist.epochs for r in e.records]
    spark.createDataFrame([r.to_row() for r in records], record_struct_type()).write.partitionBy(
        "epoch", "server"
    ).parquet(wh.records("sim"))
    # "legacy": epoch 1 as a plain Parquet table, as snapshots were written before the layout
    _rows(spark, hist.at(1).snapshot).coalesce(1).write.parquet(wh.snapshot("legacy", 1))
    layouts: dict[str, list] = {t: [] for t in TARGETS}
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(sf, "COMPACT_RATIO", 1000.0)  # deltas pile up until MAX_DELTAS
        mp.setattr(sf, "MAX_DELTAS", 3)
        for e in range(1, EPOCHS + 1):
            for t in TARGETS:
                if t == "legacy" and e == 1:
                    continue
                with mp.context() as m:
                    if t == "buckets":
                        m.setattr(sf, "BUCKET_ROWS", 4)  # the namespace outgrows its buckets, which split
                        m.setenv("EPOCHSYNC_MERGE_LOCAL_MAX_ROWS", "0")  # on the Spark small path
                    if t == "large":
                        m.setenv("EPOCHSYNC_MERGE_LOCAL_MAX_ROWS", "0")
                        m.setenv("EPOCHSYNC_MERGE_CACHE_MIN_ROWS", "0")
                    stats = run_merge(cfg, t, e, e, spark)
                    assert stats["snapshot_fids"] == len(hist.at(e).snapshot), (t, e)
                    layouts[t].append(sf.read_layout(wh.snapshot(t, e)))
    finally:
        mp.undo()
    return hist, cfg, wh, layouts


def test_every_reader_sees_the_oracle_state(spark, merged):
    hist, cfg, wh, layouts = merged
    for t in TARGETS:
        for e in range(max(1, EPOCHS - 1), EPOCHS + 1):  # retention keeps the last two
            want = hist.at(e).snapshot
            assertDataFrameEqual(read_snapshot(spark, wh, t, e, ROOT_FID), _rows(spark, want))
            files = snapshot_files(wh, t, e, ROOT_FID)
            plain = _plain(spark, want)
            assert files.rows_count == len(want)
            some = [r["fid"] for r in plain[::2]] + ["no-such-fid"]
            got = sorted(files.rows(some).to_pylist(), key=lambda r: r["fid"])
            assert got == [r for r in plain if r["fid"] in some], (t, e)
            # fids gone since an earlier epoch (tombstones in a delta, or absent from a new base)
            gone = {r["fid"] for k in range(1, e) for r in hist.at(k).snapshot} - {r["fid"] for r in want}
            assert gone and files.rows(sorted(gone)).num_rows == 0, (t, e)
            dirs = sorted(
                (r["fid"], [tuple(lk.values()) for lk in r["links"]]) for r in files.directories().to_pylist()
            )
            assert dirs == sorted(
                (r["fid"], [tuple(lk.values()) for lk in r["links"]]) for r in plain if r["type"] == "dir"
            )
            for d in [r["fid"] for r in plain if r["type"] == "dir"][:3]:
                under = sorted(r["fid"] for r in plain if any(lk["pfid"] == d for lk in r["links"]))
                assert files.linked_under([d]) == under


def test_the_rows_a_delta_holds_are_read_without_the_base(spark, merged, monkeypatch):
    """translate's new side: the fids the epoch's merge wrote come from its delta alone; the base
    (every fid's row) is opened only for fids the deltas do not hold."""
    hist, cfg, wh, layouts = merged
    e = next(i + 1 for i, lay in reversed(list(enumerate(layouts["local"]))) if lay.has_deltas)
    assert e >= EPOCHS - 1  # retention keeps the last two
    files = snapshot_files(wh, "local", e, ROOT_FID)
    newest = max(f["gen"] for f in files.layout.files if f["kind"] == "delta")
    delta = files._read_files([f for f in files.layout.files if f["gen"] == newest], None, ["fid", sf.DELETED])
    in_delta = sorted(set(delta["fid"].to_pylist()))
    read: list[str] = []
    real = files._read_files
    monkeypatch.setattr(files, "_read_files", lambda fs, *a: read.extend(f["kind"] for f in fs) or real(fs, *a))
    plain = _plain(spark, hist.at(e).snapshot)
    got = sorted(files.rows(in_delta).to_pylist(), key=lambda r: r["fid"])
    assert got == [r for r in plain if r["fid"] in in_delta]
    assert read and "base" not in read, read
    read.clear()
    in_base = [r["fid"] for r in plain if r["fid"] not in in_delta][:3]
    got = sorted(files.rows([*in_delta, *in_base]).to_pylist(), key=lambda r: r["fid"])
    assert got == [r for r in plain if r["fid"] in {*in_delta, *in_base}]
    assert "base" in read


def test_deltas_pile_up_then_compact_and_buckets_split(merged):
    _, _, _, layouts = merged
    kinds = [sorted({f["kind"] for f in lay.files}) for lay in layouts["local"]]
    assert kinds[0] == ["base"] and ["base", "delta"] in kinds  # epoch 1 is a base, later ones add deltas
    deltas = [len({f["gen"] for f in lay.files if f["kind"] == "delta"}) for lay in layouts["local"]]
    assert max(deltas) == 3 and 0 in deltas[1:]  # at MAX_DELTAS + 1 a new base replaces them
    buckets = [lay.buckets for lay in layouts["buckets"]]
    assert buckets == sorted(buckets) and buckets[-1] > 1
    assert any(f["kind"] == "delta" for lay in layouts["large"] for f in lay.files)  # Spark wrote deltas too
    assert not layouts["legacy"][0].legacy  # the plain table was read and compacted into a base


def test_files_are_shared_and_survive_pruning(spark, merged):
    hist, cfg, wh, layouts = merged
    # "large" at EPOCHS - 1 holds a delta on the base of an earlier epoch: the same inode
    e = EPOCHS - 1
    lay = layouts["large"][e - 1]
    base = next(f for f in lay.files if f["kind"] == "base")
    assert base["gen"] < e and os.stat(os.path.join(local_path(wh.snapshot("large", e)), base["name"])).st_nlink >= 2
    assert prune_snapshots(spark, wh, "large", 1, committed_epoch=e) == [e - 1]
    assertDataFrameEqual(read_snapshot(spark, wh, "large", e, ROOT_FID), _rows(spark, hist.at(e).snapshot))


def test_buckets_agree_between_python_and_spark(spark):
    fids = ["[0x200000400:0x1:0x0]", "f", "é-ü", "0123456789" * 10, "naïve\u2603"]
    sql = sf.bucket_sql(8, "fid")
    got = {
        r["fid"]: r["b"]
        for r in spark.createDataFrame([(f,) for f in fids], "fid string").selectExpr("fid", f"{sql} AS b").collect()
    }
    assert got == {f: sf.bucket_of(f, 8) for f in fids}
    assert all(sf.bucket_of(f, 8) == zlib.crc32(f.encode()) % 8 for f in fids)


def test_newest_rows_keep_the_highest_generation():
    t = pa.table({"fid": ["b", "a", "b", "a", "c"], sf.GEN: [1, 1, 3, 2, 1], "v": [1, 2, 3, 4, 5]})
    assert sf.newest_rows(t).to_pylist() == [
        {"fid": "a", sf.GEN: 2, "v": 4},
        {"fid": "b", sf.GEN: 3, "v": 3},
        {"fid": "c", sf.GEN: 1, "v": 5},
    ]
