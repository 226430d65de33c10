"""A feed under an S3 prefix (moto): the same files, commit point, consumers and purge as on a directory."""

from __future__ import annotations

import json

import pytest
import yaml

from epochsync.cli import main
from epochsync.core.config import load_config
from epochsync.report.changes import apply_to_listing
from epochsync.stages.publish import consumer_status, purge_feed, read_dump, read_epoch
from epochsync.stages.replicate import replicate
from epochsync.targets.feed import FEED_DOC, open_feed_store
from epochsync_dev.cli import main as dev_main

pytestmark = [pytest.mark.integration]


def test_feed_on_s3(moto_s3, tmp_path, spark, monkeypatch, capsys):
    monkeypatch.setenv("AIRFLOW_CONN_FEED_S3", moto_s3.airflow_conn_json())
    out = tmp_path / "sim"
    assert dev_main(["simulate", "--out", str(out), "--no-data", "--epochs", "3", "--files", "20", "--seed", "4"]) == 0
    doc = yaml.safe_load((out / "epochsync.yaml").read_text())
    doc["targets"] = [
        {
            "name": "audit",
            "source": "sim",
            "kind": "feed",
            "conn_id": "feed_s3",
            "bucket": "feeds",
            "prefix": "sim/audit",
            "retention": {"epochs": 0},
        }
    ]
    (out / "epochsync.yaml").write_text(yaml.safe_dump(doc))
    cfg = load_config(out / "epochsync.yaml")
    conf = str(cfg.file)

    replicate(cfg, "audit", 1, spark=spark, progress=lambda line: None)
    assert main(["feed", "register", "--config", conf, "--target", "audit", "--consumer", "c1"]) == 0
    replicate(cfg, "audit", 3, spark=spark, progress=lambda line: None)
    keys = sorted(o["Key"] for o in moto_s3.client().list_objects_v2(Bucket="feeds")["Contents"])
    assert keys == [
        "sim/audit/_consumers/c1.json",
        "sim/audit/_feed.json",
        "sim/audit/dumps/0000000001.jsonl.gz",
        *(f"sim/audit/epochs/{e:010d}.jsonl.gz" for e in (1, 2, 3)),
    ]
    store = open_feed_store(cfg.target("audit"))
    assert store.read_json(FEED_DOC)["epoch"] == 3

    state = {d["path"]: d["fid"] for d in read_dump(cfg, "audit", 1)}
    for e in (2, 3):
        state = apply_to_listing(state, read_epoch(cfg, "audit", e))
    truth = [json.loads(x) for x in (out / "truth" / "epoch=3.jsonl").read_text().splitlines() if x]
    assert state == {r["path"]: r["fid"] for r in truth if r["path"]}

    assert main(["feed", "ack", "--config", conf, "--target", "audit", "--consumer", "c1", "--epoch", "3"]) == 0
    r = purge_feed(cfg, "audit", log=lambda line: None)
    assert (r["files"], r["purged_through"]) == (3, 3)
    assert store.list("epochs") == [] and consumer_status(cfg, "audit", "c1")["consumers"][0]["lag_epochs"] == 0
