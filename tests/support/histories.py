"""Simulated histories for end-to-end tests: run the stages epoch by epoch, compare a target with the ground truth."""

from __future__ import annotations

import base64
import json
import os
import stat
import uuid
from pathlib import Path

import pytest
import yaml

from epochsync.core.config import load_config
from epochsync.warehouse.paths import Warehouse, local_path

pytestmark = [pytest.mark.integration, pytest.mark.slow]


EPOCHS = 5


def ingest_epoch(spark, cfg, epoch: int) -> None:
    """Put the simulator's changelog files of ``epoch`` into the warehouse as records.

    Uses the package's JSON Lines importer; the real ingest stage is tested by its own suite.
    """
    from epochsync.core.schema import record_struct_type
    from epochsync.formats import parse_file

    src = cfg.sources[0]
    base = local_path(src.changelogs.uri)
    rows = []
    for server in src.servers:
        path = os.path.join(base, server, f"{epoch:06d}.jsonl")
        rows += [r.to_row() for r in parse_file("jsonl", path)] if os.path.exists(path) else []
    df = spark.createDataFrame(rows, record_struct_type())
    df.write.mode("overwrite").partitionBy("server").parquet(Warehouse(cfg.warehouse).records(src.name, epoch))


def merge_once(spark, cfg, epoch: int) -> None:
    """Merge for the first target and share its output with the others.

    Targets without a fileset over one source have the same snapshots and change sets,
    so one merge per epoch keeps the suite fast; translate and everything after it
    still run per target.
    """
    import shutil

    from epochsync.stages.merge import run_merge

    first, *others = cfg.targets
    assert run_merge(cfg, first.name, epoch, epoch, spark)["changes"] > 0
    wh = Warehouse(cfg.warehouse)
    for t in others:
        assert not t.fileset
        for uri in (wh.snapshot, wh.changes):
            src, dst = local_path(uri(first.name, epoch)), local_path(uri(t.name, epoch))
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(src, dst)


def replicate_epoch(spark, cfg, target: str, epoch: int, **apply_kw) -> tuple[dict, dict]:
    from epochsync.stages.apply import run_apply
    from epochsync.stages.commit import run_commit
    from epochsync.stages.translate import run_translate
    from epochsync.stages.verify import run_verify

    summary = run_translate(cfg, target, epoch, spark)
    run_apply(cfg, target, epoch, spark, **apply_kw)
    run_verify(cfg, target, epoch, spark)
    return summary, run_commit(cfg, target, epoch)


def truth(out: Path, epoch: int) -> dict[str, dict]:
    rows = [json.loads(line) for line in (out / "truth" / f"epoch={epoch}.jsonl").read_text().splitlines() if line]
    return {r["path"]: r for r in rows if r["path"] not in ("", ".")}


def expected_entries(rows: dict[str, dict], *, posix: bool) -> dict[str, tuple]:
    out = {}
    for p, r in rows.items():
        xattrs = {k: base64.b64decode(v) for k, v in (r.get("xattrs") or {}).items()}
        if posix:
            xattrs = {k: v for k, v in xattrs.items() if k.startswith("user.")}
        kind = r["type"]
        out[p] = (
            kind,
            r["size"] if kind == "file" else 0,
            None if kind == "symlink" else stat.S_IMODE(r["mode"]),
            r["uid"],
            r["gid"],
            r.get("symlink") if kind == "symlink" else None,
            tuple(sorted(xattrs.items())) if kind != "symlink" else (),
            r["sha256"] if kind == "file" else None,
        )
    return out


def actual_entries(target) -> dict[str, tuple]:
    out = {}
    for e in target.walk():
        out[e.path] = (
            e.type,
            e.size if e.type == "file" else 0,
            e.mode,
            e.uid,
            e.gid,
            e.symlink,
            tuple(sorted(e.xattrs.items())) if e.type != "symlink" else (),
            e.sha256,
        )
    return out


def simulate(seaweed, out: Path, epochs: int, *, seed: int = 11):
    """Simulated source in SeaweedFS + a config with posix, s3 and striped s3 targets."""
    from epochsync_dev.cli import main as dev_main

    os.environ["AIRFLOW_CONN_SOURCE_S3"] = seaweed.airflow_conn_json()
    os.environ["AIRFLOW_CONN_REPLICA_S3"] = seaweed.airflow_conn_json()
    bucket = "sim-" + uuid.uuid4().hex[:8]
    rc = dev_main(
        [
            "simulate",
            "--out",
            str(out),
            "--seed",
            str(seed),
            "--epochs",
            str(epochs),
            "--files",
            "24",
            "--conn-id",
            "source_s3",
            "--bucket",
            bucket,
            "--max-file-size",
            "96KiB",
        ]
    )
    assert rc == 0
    doc = yaml.safe_load((out / "epochsync.yaml").read_text())
    replica = "rep-" + uuid.uuid4().hex[:8]
    doc["targets"] = [
        {"name": "local", "source": "sim", "kind": "posix", "path": str(out / "replica"), "coalesce_gap": 0},
        {
            "name": "s3",
            "source": "sim",
            "kind": "s3",
            "conn_id": "replica_s3",
            "bucket": replica,
            "prefix": "sim/",
            "coalesce_gap": 4096,
        },
        {
            "name": "striped",
            "source": "sim",
            "kind": "s3",
            "conn_id": "replica_s3",
            "bucket": replica,
            "prefix": "striped/",
            "stripe_size": 8192,
            "stripe_count": 3,
        },
    ]
    (out / "epochsync.yaml").write_text(yaml.safe_dump(doc))
    return out, load_config(out / "epochsync.yaml")


def assert_equals_truth(target, out: Path, epoch: int) -> None:
    got = actual_entries(target)
    exp = expected_entries(truth(out, epoch), posix=target.kind == "posix")
    diff = {p: (got.get(p), exp.get(p)) for p in set(got) | set(exp) if got.get(p) != exp.get(p)}
    assert diff == {}, f"{target.name} vs truth of epoch {epoch}"
