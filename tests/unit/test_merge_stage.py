"""The merge stage around the transform: warehouse in, warehouse out, and its Spark app."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.testing import assertDataFrameEqual
from support.configs import sim_config

from epochsync.core.config import load_config
from epochsync.core.errors import EpochError
from epochsync.core.model import SNAPSHOT_FIELDS, snapshot_struct_type
from epochsync.core.schema import Record, record_struct_type
from epochsync.warehouse.paths import Warehouse
from epochsync_dev.oracle import replay
from epochsync_dev.simulate.workload import ROOT_FID, simulate_history

ROOT = Path(__file__).resolve().parents[2]


def _config(tmp_path: Path) -> Path:
    return sim_config(
        tmp_path,
        [
            {"name": "t", "kind": "posix", "path": f"{tmp_path}/replica"},
            {"name": "cached", "kind": "posix", "path": f"{tmp_path}/replica-cached"},
            {"name": "spark-small", "kind": "posix", "path": f"{tmp_path}/replica-spark-small"},
            {"name": "keep1", "kind": "posix", "path": f"{tmp_path}/replica-keep1", "snapshot_retention": 1},
        ],
    )


@pytest.fixture(scope="module")
def stage(spark, tmp_path_factory):
    """A warehouse holding 3 ingested epochs of a simulated history (as ingest writes them)."""
    tmp = tmp_path_factory.mktemp("merge-stage")
    hist = simulate_history(11, 3, 12, mdts=2, osts=2, ops_per_epoch=25, max_file_size=16 * 1024)
    records = [r for e in hist.epochs for r in e.records]
    # one distributed operation: two servers' records sharing a cookie
    records += [
        Record("MDT0000", 10_000, 2, "MARK", time_ns=1, cookie="x-op", tfid="[0x1:0x2:0x0]"),
        Record("MDT0001", 10_000, 3, "MARK", time_ns=2, cookie="x-op", sfid="[0x1:0x3:0x0]"),
        Record("MDT0000", 10_001, 3, "MARK", time_ns=3, cookie="x-solo"),
    ]
    cfg_path = _config(tmp)
    wh = Warehouse(load_config(cfg_path).warehouse)
    df = spark.createDataFrame([r.to_row() for r in records], record_struct_type())
    df.write.partitionBy("epoch", "server").parquet(wh.records("sim"))
    return hist, cfg_path, wh, records


def test_app_then_window_match_the_oracle(spark, stage, capsys):
    hist, cfg_path, wh, records = stage
    import runpy

    merge_app_main = runpy.run_path(str(ROOT / "spark_apps" / "merge.py"))["main"]
    assert merge_app_main(["--config", str(cfg_path), "--target", "t", "--epoch", "1"]) == 0
    stats = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert stats["epoch"] == 1 and stats["changes"] > 0 and stats["created"] > 0
    assert stats["merge_path"] == "local"  # a small epoch: no Spark job
    assert stats["snapshot_fids"] == len(hist.at(1).snapshot)

    from epochsync.stages.merge import run_merge

    # catch-up: epochs 2..3 in one run, onto snapshot 1
    stats = run_merge(load_config(cfg_path), "t", 2, 3, spark)
    servers_of: dict[str, set] = {}
    for r in records:
        if r.cookie and r.epoch in (2, 3):
            servers_of.setdefault(r.cookie, set()).add(r.server)
    multi = sorted(c for c, s in servers_of.items() if len(s) > 1)
    assert (stats["first_epoch"], stats["epoch"], stats["cookie_groups"]) == (2, 3, len(multi))
    expected = replay(ROOT_FID, hist.at(1).snapshot, hist.at(2).records + hist.at(3).records)
    from epochsync.warehouse.snapshots import read_snapshot

    assertDataFrameEqual(
        read_snapshot(spark, wh, "t", 3, ROOT_FID),
        spark.createDataFrame([tuple(r[f] for f in SNAPSHOT_FIELDS) for r in expected], snapshot_struct_type()),
    )
    changes = spark.read.parquet(wh.changes("t", 3))
    assert changes.count() == stats["changes"]
    cookies = spark.read.parquet(wh.cookie_groups("t", 3)).collect()
    assert sorted(c.cookie for c in cookies) == multi
    assert [
        (c.servers, c.fids, c.types, c.records, c.first_epoch, c.last_epoch) for c in cookies if c.cookie == "x-op"
    ] == [(["MDT0000", "MDT0001"], ["[0x1:0x2:0x0]", "[0x1:0x3:0x0]"], ["MARK"], 2, 2, 3)]


def test_missing_inputs_name_what_to_run(spark, stage, capsys):
    _, cfg_path, wh, _ = stage
    from epochsync.stages.entry import stage_main
    from epochsync.stages.merge import run_merge

    with pytest.raises(EpochError, match=r"no snapshot of target 't' at epoch 6 .*merge epoch 6 first"):
        run_merge(load_config(cfg_path), "t", 7, 7, spark)
    assert stage_main("merge", ["--config", str(cfg_path), "--target", "t", "--epoch", "9"]) == EpochError.exit_code
    assert "error" in capsys.readouterr().err
    with pytest.raises(EpochError, match="bad epoch window"):
        run_merge(load_config(cfg_path), "t", 3, 2, spark)


def test_merge_prunes_snapshots_past_retention(spark, stage):
    from epochsync.stages.merge import run_merge
    from epochsync.warehouse.snapshots import snapshot_epochs

    _, cfg_path, wh, _ = stage
    cfg = load_config(cfg_path)
    pruned = [run_merge(cfg, "keep1", e, e, spark)["snapshots_pruned"] for e in (1, 2, 3)]
    # merging epoch E means E-1 is the committed one: it and everything newer stay
    assert 1 in pruned[2] and snapshot_epochs(spark, wh, "keep1") == [2, 3]


def test_local_small_and_large_input_paths_write_the_same_tables(spark, stage, monkeypatch):
    """Small inputs are merged in this process ("t"), or with EPOCHSYNC_MERGE_LOCAL_MAX_ROWS=0
    in one Spark collect, and written here; large ones are written on Spark."""
    from epochsync.stages.merge import run_merge
    from epochsync.warehouse.snapshots import read_snapshot

    _, cfg_path, wh, _ = stage
    cfg = load_config(cfg_path)
    with monkeypatch.context() as m:
        m.setenv("EPOCHSYNC_MERGE_LOCAL_MAX_ROWS", "0")  # today's small path, on Spark
        assert [run_merge(cfg, "spark-small", *w, spark)["merge_path"] for w in ((1, 1), (2, 3))] == ["small"] * 2
    monkeypatch.setenv("EPOCHSYNC_MERGE_LOCAL_MAX_ROWS", "0")
    monkeypatch.setenv("EPOCHSYNC_MERGE_CACHE_MIN_ROWS", "0")  # every input counts as large here
    assert run_merge(cfg, "cached", 1, 1, spark)["merge_path"] == "large"
    run_merge(cfg, "cached", 2, 3, spark)
    for other in ("cached", "spark-small"):
        for table in (wh.changes, wh.cookie_groups):
            assertDataFrameEqual(spark.read.parquet(table(other, 3)), spark.read.parquet(table("t", 3)))
        assertDataFrameEqual(read_snapshot(spark, wh, other, 3, ROOT_FID), read_snapshot(spark, wh, "t", 3, ROOT_FID))
    leftovers = [
        p.name
        for table in (wh.changes, wh.snapshot)
        for p in Path(table("t", 3).removeprefix("file://")).parent.iterdir()
        if ".tmp-" in p.name or ".write-" in p.name
    ]
    assert leftovers == []  # nothing staged is left behind
