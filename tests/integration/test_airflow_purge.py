"""The purge DAG's logic on a simulated source: what every consumer applied goes, nothing else."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from epochsync.core.config import load_config
from epochsync.stages.purge import PurgeBlocked, plan_purge, purge_source

pytestmark = pytest.mark.integration


@pytest.fixture()
def source(tmp_path) -> Path:
    """4 simulated epochs (records only), their records in the warehouse, retention of 1 epoch."""
    out = tmp_path / "sim"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "epochsync_dev",
            "simulate",
            "--out",
            str(out),
            "--epochs",
            "4",
            "--files",
            "12",
            "--no-data",
            "--seed",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    config = out / "epochsync.yaml"
    doc = yaml.safe_load(config.read_text())
    doc["sources"][0]["retention"] = {"epochs": 1, "idle_limit": "1h"}
    config.write_text(yaml.safe_dump(doc))
    cfg = load_config(config)
    _records_to_warehouse(cfg)
    return config


def _records_to_warehouse(cfg):
    """What ingest leaves: records/source=sim/epoch=E/server=X/*.parquet (index column; server from the path)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from epochsync.formats import ParseOptions, parse_file
    from epochsync.warehouse.paths import Warehouse, local_path

    src = cfg.sources[0]
    for server in src.servers:
        for f in sorted((Path(local_path(src.changelogs.uri)) / server).iterdir()):
            by_epoch: dict[int, list[int]] = {}
            for r in parse_file("jsonl", str(f), ParseOptions(server=server)):
                by_epoch.setdefault(r.epoch, []).append(r.index)
            for epoch, idx in by_epoch.items():
                d = Path(local_path(Warehouse(cfg.warehouse).records(src.name, epoch))) / f"server={server}"
                d.mkdir(parents=True, exist_ok=True)
                pq.write_table(pa.table({"index": pa.array(idx, pa.int64())}), d / "part-0.parquet")


def cursor(cfg, consumer: str, epoch: int, *, age_s: float = 0.0):
    """A consumer cursor as commit writes it: every server's last index of ``epoch``."""
    import pyarrow.dataset as ds

    from epochsync.warehouse.paths import Warehouse, local_path

    wh = Warehouse(cfg.warehouse)
    servers = {}
    for e in range(1, epoch + 1):
        t = ds.dataset(local_path(wh.records("sim", e)), format="parquet", partitioning="hive").to_table()
        for s, i in zip(t.column("server").to_pylist(), t.column("index").to_pylist()):
            servers[s] = max(servers.get(s, 0), i)
    path = Path(local_path(wh.cursor("sim", consumer)))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"epoch": epoch, "servers": servers}))
    if age_s:
        old = time.time() - age_s
        os.utime(path, (old, old))


def changelogs(cfg) -> dict[str, list[str]]:
    from epochsync.warehouse.paths import local_path

    root = Path(local_path(cfg.sources[0].changelogs.uri))
    return {s: sorted(p.name for p in (root / s).iterdir()) for s in cfg.sources[0].servers}


def record_epochs(cfg) -> list[int]:
    from epochsync.warehouse.paths import Warehouse, local_path

    d = Path(local_path(Warehouse(cfg.warehouse).records("sim")))
    return sorted(int(p.name.split("=")[1]) for p in d.iterdir())


def test_purges_what_every_consumer_applied_minus_retention(source):
    cfg = load_config(source)
    cursor(cfg, "local", 4)
    cursor(cfg, "s3", 4)
    lines = []
    result = purge_source(cfg, "sim", log=lines.append)
    assert result["purged_through"] == 3
    assert changelogs(cfg) == {s: ["000004.jsonl"] for s in cfg.sources[0].servers}
    assert record_epochs(cfg) == [4]
    assert result["changelog_files"] == 3 * len(cfg.sources[0].servers)
    assert any("purging epochs <= 3" in line for line in lines)
    # a second purge finds nothing more and keeps what is needed
    assert purge_source(cfg, "sim", log=lines.append)["changelog_files"] == 0
    assert record_epochs(cfg) == [4]


def test_the_slowest_consumer_holds_the_purge_back_and_is_named_lagging(source):
    cfg = load_config(source)
    cursor(cfg, "local", 4)
    cursor(cfg, "s3", 2)
    lines = []
    result = purge_source(cfg, "sim", log=lines.append)
    assert result["purged_through"] == 1 and result["lagging"] == ["s3"]
    assert changelogs(cfg) == {s: ["000002.jsonl", "000003.jsonl", "000004.jsonl"] for s in cfg.sources[0].servers}
    assert record_epochs(cfg) == [2, 3, 4]
    assert any("lagging" in line and "s3" in line for line in lines)


def test_a_consumer_that_never_committed_blocks_nothing_from_being_kept(source):
    cfg = load_config(source)
    cursor(cfg, "local", 4)  # s3 never committed: cursor epoch 0
    plan = plan_purge(cfg, "sim")
    assert plan.purge_through == 0 and plan.changelog_files == [] and plan.record_dirs == []


def test_an_idle_consumer_fails_the_purge_by_name(source):
    cfg = load_config(source)
    cursor(cfg, "local", 4)
    cursor(cfg, "s3", 3, age_s=7200)
    with pytest.raises(PurgeBlocked, match=r"idle past 3600s.*: s3;"):
        purge_source(cfg, "sim", log=lambda _: None)
    # what was safe is still purged: epochs <= 2
    assert record_epochs(cfg) == [3, 4]


def test_dry_run_deletes_nothing(source):
    cfg = load_config(source)
    cursor(cfg, "local", 4)
    cursor(cfg, "s3", 4)
    before = (changelogs(cfg), record_epochs(cfg))
    result = purge_source(cfg, "sim", dry_run=True, log=lambda _: None)
    assert result["changelog_files"] == 3 * len(cfg.sources[0].servers)
    assert (changelogs(cfg), record_epochs(cfg)) == before
