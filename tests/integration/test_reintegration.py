"""Cache reintegration (docs/reintegration.md): a write-back cache's net changes flushed into its master.

The source is a cache (``epochsync simulate --cache``: its own changelogs, its files
unstriped or with a one-stripe delayed layout); the target is the master, an s3 target
striped with the master's own layout (64 KiB x 4). Epochs are reintegrated one by one and
the master equals the cache's ground truth after each; a change made on the master since
the last reintegration is refused by name with both versions and left as it is; a
failure mid-epoch rolls the master back to the epoch boundary.
"""

from __future__ import annotations

import json
import os
import uuid

import pytest
import yaml
from support.histories import assert_equals_truth, truth

from epochsync.cli import main
from epochsync.core.config import load_config
from epochsync.targets import open_target
from epochsync_dev.cli import main as dev_main

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def cache(seaweed, tmp_path_factory):
    os.environ["AIRFLOW_CONN_SOURCE_S3"] = seaweed.airflow_conn_json()
    os.environ["AIRFLOW_CONN_REPLICA_S3"] = seaweed.airflow_conn_json()
    out = tmp_path_factory.mktemp("cache")
    rc = dev_main(
        [
            "simulate",
            "--out",
            str(out),
            "--cache",
            "--seed",
            "5",
            "--epochs",
            "3",
            "--files",
            "24",
            "--conn-id",
            "source_s3",
            "--bucket",
            "cache-" + uuid.uuid4().hex[:8],
            "--max-file-size",
            "200KiB",
        ]
    )
    assert rc == 0
    doc = yaml.safe_load((out / "epochsync.yaml").read_text())
    assert [(s["name"]) for s in doc["sources"]] == ["cache"]
    (master,) = doc["targets"]
    assert (master["name"], master["stripe_size"], master["stripe_count"]) == ("master", 65536, 4)
    master["bucket"] = "master-" + uuid.uuid4().hex[:8]
    (out / "epochsync.yaml").write_text(yaml.safe_dump(doc))
    return out, load_config(out / "epochsync.yaml")


def test_reintegration_into_a_striped_master(cache, seaweed, spark, capsys):
    out, cfg = cache
    conf = str(cfg.file)
    # the cache's own layout: files are created without stripes
    creates = [json.loads(x) for p in (out / "changelogs").glob("MDT*/*.jsonl") for x in p.read_text().splitlines()]
    creates = [r for r in creates if r["type"] == "CREAT"]
    assert creates and all(r.get("layout") is None for r in creates)

    assert main(["replicate", "--config", conf, "--target", "master", "--through", "2"]) == 0
    master = open_target(cfg.target("master"))
    assert_equals_truth(master, out, 2)
    # the master's layout: a file over one stripe has several stripe objects of at most 64 KiB
    s3 = seaweed.client()
    stripes = s3.list_objects_v2(Bucket=master.bucket, Prefix=".epochsync/stripes/")["Contents"]
    assert max(o["Size"] for o in stripes) <= 65536 and any(o["Key"].endswith("/00001") for o in stripes)
    capsys.readouterr()

    # someone changed the master since the last reintegration: a file epoch 3 changes too
    before, after = truth(out, 2), truth(out, 3)
    victim = min(
        p for p in before if p in after and before[p]["type"] == "file" and before[p]["sha256"] != after[p]["sha256"]
    )
    foreign = s3.put_object(Bucket=master.bucket, Key=victim, Body=b"written on the master")["VersionId"]
    assert (
        main(["replicate", "--config", conf, "--target", "master", "--epoch", "3"]) == 10
    )  # FenceError: the write fence
    err = capsys.readouterr().err
    assert "write fence" in err and f"{victim}: " in err and "Nothing was written" in err
    assert f"now: version {foreign}, 21 bytes" in err and "at the last commit: version " in err
    assert master.read_manifest()["epoch"] == 2
    assert s3.get_object(Bucket=master.bucket, Key=victim)["Body"].read() == b"written on the master"

    # the operator decides; here the cache wins: the master's own version goes
    s3.delete_object(Bucket=master.bucket, Key=victim, VersionId=foreign)
    # a failure in the middle of the epoch: the master is back at the boundary, exactly
    assert (
        main(["replicate", "--config", conf, "--target", "master", "--epoch", "3", "--inject-failure", "after=3"]) == 1
    )
    assert "rolled back" in capsys.readouterr().out
    assert master.read_manifest()["epoch"] == 2
    assert_equals_truth(master, out, 2)
    assert main(["replicate", "--config", conf, "--target", "master", "--epoch", "3"]) == 0
    assert_equals_truth(master, out, 3)
