"""Feed targets (``kind: feed``) over a simulated history, without an S3 store.

The simulator writes records only (``--no-data``): a feed publishes metadata and byte
ranges, never file bytes, so it needs no source store. Each feed runs the same epoch run
as a replica (``epochsync replicate``: ingest, merge, then publish in place of apply), and
what a consumer reads is held to the simulator's ground truth: a dump plus the epoch files
after it, replayed in order, give the namespace of every epoch.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
import yaml

from epochsync.cli import main
from epochsync.core.config import load_config
from epochsync.core.errors import EpochError, EpochsyncError
from epochsync.report.changes import KINDS, apply_to_listing
from epochsync.stages.context import committed_epoch
from epochsync.stages.publish import (
    FeedError,
    ack_consumer,
    consumer_status,
    epoch_file,
    hydrate_consumer,
    publish_epoch,
    purge_feed,
    read_dump,
    read_epoch,
    register_consumer,
)
from epochsync.stages.purge import PurgeBlocked, purge_source
from epochsync.stages.replicate import replicate
from epochsync.stages.translate.entries import in_fileset
from epochsync.targets.feed import FEED_DOC, open_feed_store
from epochsync.warehouse.paths import Warehouse, local_path
from epochsync_dev.cli import main as dev_main

EPOCHS = 4
FILESET = "/d00005"


@pytest.fixture(scope="module")
def sim(tmp_path_factory, spark):
    out = tmp_path_factory.mktemp("feed")
    assert (
        dev_main(
            [
                "simulate",
                "--out",
                str(out),
                "--no-data",
                "--epochs",
                str(EPOCHS),
                "--files",
                "40",
                "--mdts",
                "2",
                "--seed",
                "2",
            ]
        )
        == 0
    )
    doc = yaml.safe_load((out / "epochsync.yaml").read_text())
    feeds = out / "feeds"
    doc["targets"] = [
        {"name": "audit", "source": "sim", "kind": "feed", "path": str(feeds / "audit"), "snapshot_retention": 10},
        {"name": "audit2", "source": "sim", "kind": "feed", "path": str(feeds / "audit2")},
        {
            "name": "cam",
            "source": "sim",
            "kind": "feed",
            "path": str(feeds / "cam"),
            "format": "parquet",
            "fileset": [FILESET],
            "events": ["create", "delete", "rename", "data"],
        },
        {"name": "deletes", "source": "sim", "kind": "feed", "path": str(feeds / "deletes"), "events": ["delete"]},
        {
            "name": "ret",
            "source": "sim",
            "kind": "feed",
            "path": str(feeds / "ret"),
            "retention": {"epochs": 0, "max_epochs": 1, "idle_limit": "1s"},
        },
    ]
    (out / "epochsync.yaml").write_text(yaml.safe_dump(doc))
    cfg = load_config(out / "epochsync.yaml")
    # the one full epoch run (ingest, merge, publish); the other feeds share its merge output
    rows = replicate(cfg, "audit", EPOCHS, spark=spark, progress=lambda line: None)
    assert [r["epoch"] for r in rows] == list(range(1, EPOCHS + 1))
    return out, cfg


def truth(out: Path, epoch: int, fileset: str | None = None) -> dict[str, dict]:
    if epoch == 0:
        return {}
    rows = [json.loads(x) for x in (out / "truth" / f"epoch={epoch}.jsonl").read_text().splitlines() if x]
    return {r["path"]: r for r in rows if r["path"] and (fileset is None or in_fileset(r["path"], [fileset]))}


def listing(rows: dict[str, dict]) -> dict[str, str]:
    return {p: r["fid"] for p, r in rows.items()}


def run(cfg, target: str, through: int, spark, **kw) -> list[dict]:
    """Publish ``target`` up to ``through`` from the merge output of ``audit`` (the same source: the
    merge does not depend on the target), epoch by epoch; what ``replicate`` would do after its merge."""
    wh = Warehouse(cfg.warehouse)
    rows = []
    start = committed_epoch(cfg, target) + 1
    for e in range(start, through + 1):
        for uri in (wh.snapshot, wh.changes):
            src, dst = local_path(uri("audit", e)), local_path(uri(target, e))
            if not os.path.isdir(dst):
                shutil.copytree(src, dst)
        rows.append(publish_epoch(cfg, target, e, e, spark, **kw))
    return rows


def test_epoch_files_in_order_replay_to_the_ground_truth(sim, spark, capsys):
    out, cfg = sim
    store = open_feed_store(cfg.target("audit"))
    assert store.list("epochs") == [f"{e:010d}.jsonl.gz" for e in range(1, EPOCHS + 1)]
    doc = store.read_json(FEED_DOC)
    assert (doc["epoch"], doc["schema_version"], doc["format"], doc["file"]) == (
        EPOCHS,
        1,
        "jsonl",
        epoch_file(EPOCHS, "jsonl"),
    )
    state: dict[str, str] = {}
    order = {k: i for i, k in enumerate(KINDS)}
    for e in range(1, EPOCHS + 1):
        recs = read_epoch(cfg, "audit", e)
        assert [r["seq"] for r in recs] == list(range(len(recs))) and {r["epoch"] for r in recs} <= {e}
        keys = [(order[r["kind"]], r.get("old_path") or r["path"], r["path"]) for r in recs]
        assert keys == sorted(keys)
        state = apply_to_listing(state, recs)
        assert state == listing(truth(out, e)), e
    # the feed is a target like the others for status: committed = the last published epoch
    assert main(["status", "--config", str(cfg.file), "--target", "audit"]) == 0
    assert "audit   feed" in capsys.readouterr().out


def test_a_consumer_starts_from_a_dump_then_reads_the_epochs_after_it(sim, spark, capsys):
    out, cfg = sim
    run(cfg, "audit2", 3, spark)
    conf = str(cfg.file)
    assert main(["feed", "register", "--config", conf, "--target", "audit2", "--consumer", "indexer"]) == 0
    assert "registered at epoch 3" in capsys.readouterr().out
    dump = read_dump(cfg, "audit2", 3)
    want = truth(out, 3)
    assert [d["path"] for d in dump] == sorted(want)
    for d in dump:
        w = want[d["path"]]
        assert (d["fid"], d["type"], d.get("size"), d["mode"], d["uid"], d["gid"]) == (
            w["fid"],
            w["type"],
            w["size"],
            w["mode"],
            w["uid"],
            w["gid"],
        )
    run(cfg, "audit2", EPOCHS, spark)
    st = consumer_status(cfg, "audit2", "indexer")
    (c,) = st["consumers"]
    assert c["next_files"] == [epoch_file(e, "jsonl") for e in (4,)] and c["lag_epochs"] == 1
    state = {d["path"]: d["fid"] for d in dump}
    for e in (4,):
        state = apply_to_listing(state, read_epoch(cfg, "audit2", e))
        assert (
            main(["feed", "ack", "--config", conf, "--target", "audit2", "--consumer", "indexer", "--epoch", str(e)])
            == 0
        )
    assert state == listing(truth(out, EPOCHS))
    assert consumer_status(cfg, "audit2", "indexer")["consumers"][0]["next_files"] == []
    # acknowledgements only move forward and never past what is published
    with pytest.raises(FeedError, match="already acknowledged epoch 4"):
        ack_consumer(cfg, "audit2", "indexer", 3)
    with pytest.raises(FeedError, match="published epochs up to 4"):
        ack_consumer(cfg, "audit2", "indexer", 5)
    with pytest.raises(FeedError, match="already registered"):
        register_consumer(cfg, "audit2", "indexer", spark)
    # two feeds of one source with one config publish the same bytes
    a, b = open_feed_store(cfg.target("audit")), open_feed_store(cfg.target("audit2"))
    for e in range(1, EPOCHS + 1):
        assert a.read(epoch_file(e, "jsonl")) == b.read(epoch_file(e, "jsonl"))


def test_filters_fileset_and_event_mask(sim, spark):
    out, cfg = sim
    run(cfg, "cam", EPOCHS, spark)
    run(cfg, "deletes", EPOCHS, spark)
    assert open_feed_store(cfg.target("cam")).list("epochs") == [f"{e:010d}.parquet" for e in range(1, EPOCHS + 1)]
    state: dict[str, str] = {}
    crossed = 0
    for e in range(1, EPOCHS + 1):
        cam = read_epoch(cfg, "cam", e)
        full = read_epoch(cfg, "audit", e)
        # the fileset: replaying only the subtree's records gives the subtree's namespace
        state = apply_to_listing(state, cam)
        assert state == listing(truth(out, e, FILESET)), e
        assert all(in_fileset(r["path"], [FILESET]) for r in cam)
        # a move across the fileset's boundary is a NEW or a DELETE in the filtered feed
        full_moves = {r["fid"]: r for r in full if r["kind"] == "RENAME"}
        for r in cam:
            m = full_moves.get(r["fid"])
            if (
                r["kind"] in ("NEW", "DELETE")
                and m
                and (in_fileset(m["old_path"], [FILESET]) != in_fileset(m["path"], [FILESET]))
            ):
                crossed += 1
        # the mask: no attrs or xattrs; data changes are those of the full feed inside the subtree
        assert {w for r in cam if r["kind"] == "MODIFY" for w in r["changed"]} <= {"data"}
        # (a file moved into the subtree is NEW there, whole, with no MODIFY)
        arrived = {r["fid"] for r in cam if r["kind"] == "NEW"}
        assert {r["fid"] for r in cam if r["kind"] == "MODIFY"} == {
            r["fid"]
            for r in full
            if r["kind"] == "MODIFY"
            and "data" in r["changed"]
            and in_fileset(r["path"], [FILESET])
            and r["fid"] not in arrived
        }
        # a delete-only channel of the same source
        deletes = read_epoch(cfg, "deletes", e)
        strip = lambda rs: [{k: v for k, v in r.items() if k != "seq"} for r in rs]  # noqa: E731
        assert strip(deletes) == strip([r for r in full if r["kind"] == "DELETE"])
    assert crossed, "the history should move something across the fileset's boundary"


def test_republishing_is_byte_identical_and_a_crash_mid_publish_is_invisible(sim, spark):
    out, cfg = sim
    for name, fmt in (("audit", "jsonl"), ("cam", "parquet")):
        store = open_feed_store(cfg.target(name))
        before = store.read(epoch_file(EPOCHS, fmt))
        mtime = os.stat(os.path.join(store.root, epoch_file(EPOCHS, fmt))).st_mtime_ns
        # an epoch already published is a no-op
        assert publish_epoch(cfg, name, EPOCHS, EPOCHS, spark)["noop"]
        assert os.stat(os.path.join(store.root, epoch_file(EPOCHS, fmt))).st_mtime_ns == mtime
        # published again from scratch (the commit point moved back): the same bytes
        doc = store.read_json(FEED_DOC)
        store.write_json(FEED_DOC, dict(doc, epoch=EPOCHS - 1))
        store.delete(epoch_file(EPOCHS, fmt))
        row = publish_epoch(cfg, name, EPOCHS, EPOCHS, spark)
        assert store.read(epoch_file(EPOCHS, fmt)) == before and row["file"] == epoch_file(EPOCHS, fmt)
        assert store.read_json(FEED_DOC)["sha256"] == doc["sha256"]

    # a publish killed between its epoch file and _feed.json: the feed still says epoch 2
    fresh = dict(yaml.safe_load(Path(cfg.file).read_text()))
    fresh["targets"] = [dict(fresh["targets"][0], name="crash", path=str(out / "feeds" / "crash"))]
    Path(cfg.file).with_name("crash.yaml").write_text(yaml.safe_dump(fresh))
    ccfg = load_config(Path(cfg.file).with_name("crash.yaml"))
    run(ccfg, "crash", 2, spark)
    with pytest.raises(
        EpochsyncError, match=r"epoch 3 of feed crash was not published: injected failure at mutation 2"
    ):
        replicate(ccfg, "crash", 3, spark=spark, progress=lambda line: None, inject="after=1,epoch=3")
    store = open_feed_store(ccfg.target("crash"))
    assert store.read_json(FEED_DOC)["epoch"] == 2
    assert store.read(epoch_file(3, "jsonl")) is not None  # written, not published
    assert consumer_status(ccfg, "crash")["epoch_files"] == [1, 2]
    assert [r["epoch"] for r in run(ccfg, "crash", 3, spark)] == [3]
    golden = open_feed_store(cfg.target("audit"))
    assert store.read(epoch_file(3, "jsonl")) == golden.read(epoch_file(3, "jsonl"))


def test_consumers_behind_retention_are_refused_and_hydrate(sim, spark, capsys):
    out, cfg = sim
    conf = str(cfg.file)
    run(cfg, "ret", 1, spark)
    register_consumer(cfg, "ret", "fast", spark)
    register_consumer(cfg, "ret", "slow", spark)
    run(cfg, "ret", 3, spark)
    ack_consumer(cfg, "ret", "fast", 3)
    ack_consumer(cfg, "ret", "slow", 2)
    store = open_feed_store(cfg.target("ret"))
    # every consumer has 1 and 2: gone; 3 waits for slow
    r = purge_feed(cfg, "ret", log=lambda line: None)
    assert (r["files"], r["purged_through"], r["dropped"]) == (2, 2, [])
    assert store.list("epochs") == ["0000000003.jsonl.gz"]
    run(cfg, "ret", 4, spark)
    ack_consumer(cfg, "ret", "fast", 4)
    # max_epochs 1: epoch 3 goes although slow has not acknowledged it
    r = purge_feed(cfg, "ret", log=lambda line: None)
    assert (r["purged_through"], r["dropped"]) == (3, ["slow"])
    with pytest.raises(
        FeedError,
        match=r"consumer slow .* acknowledged epoch 2, but .* through epoch 3 were purged.*"
        r"epochsync feed hydrate --config .* --target ret --consumer slow",
    ):
        ack_consumer(cfg, "ret", "slow", 3)
    assert main(["feed", "status", "--config", conf, "--target", "ret", "--consumer", "slow"]) == EpochError.exit_code
    assert "epochsync feed hydrate" in capsys.readouterr().err
    assert main(["feed", "status", "--config", conf, "--target", "ret"]) == 0
    assert "slow: acknowledged 2, lag 2, behind retention: hydrate" in capsys.readouterr().out
    # idle past the limit with unacknowledged epochs: the source's purge fails naming it
    time.sleep(1.1)
    register_consumer(cfg, "ret", "late", spark)  # at epoch 4: nothing to acknowledge, never idle
    with pytest.raises(PurgeBlocked, match=r"feed consumers idle .*: slow \(feed ret\)"):
        purge_source(cfg, "sim", log=lambda line: None)
    hydrate_consumer(cfg, "ret", "slow", spark)
    st = consumer_status(cfg, "ret", "slow")["consumers"][0]
    assert (st["acked"], st["behind_retention"], st["dump"]) == (4, False, "dumps/0000000004.jsonl.gz")
    assert {d["path"]: d["fid"] for d in read_dump(cfg, "ret", 4)} == listing(truth(out, 4))
    purge_source(cfg, "sim", log=lambda line: None)  # nobody idle now


def test_feed_config_errors_name_the_key(tmp_path):
    from epochsync.core.config import config_from_dict
    from epochsync.core.errors import ConfigError

    def cfg(**target):
        return config_from_dict(
            {
                "sources": [
                    {
                        "name": "s",
                        "root_fid": "R",
                        "servers": ["MDT0000"],
                        "changelogs": {"uri": "/cl"},
                        "store": {"conn_id": "c", "bucket": "b"},
                        "epoch": {"interval": "1m", "start": "2026-01-01T00:00:00Z"},
                    }
                ],
                "targets": [{"name": "f", "source": "s", "kind": "feed", **target}],
            },
            file=str(tmp_path / "x.yaml"),
        )

    t = cfg(path="feeds/f", events=["data", "create"], retention={"max_epochs": 5, "idle_limit": "2h"}).targets[0]
    assert (t.path, t.format, t.events) == (str(tmp_path / "feeds" / "f"), "jsonl", ("create", "data"))
    assert (t.retention.epochs, t.retention.max_epochs, t.retention.idle_limit_s) == (10, 5, 7200.0)
    s3 = cfg(conn_id="c", bucket="b", prefix="feeds/f", format="parquet").targets[0]
    assert (s3.prefix, s3.format, s3.path) == ("feeds/f/", "parquet", None)
    cases = [
        ({}, r"targets\[0\]\.path: a feed needs a directory \(path\) or an S3 prefix"),
        ({"path": "/f", "bucket": "b"}, r"targets\[0\]\.bucket: a feed goes to a directory .* not both"),
        ({"path": "/f", "events": ["create", "chmod"]}, r"targets\[0\]\.events\[1\]: expected one of create, delete"),
        ({"path": "/f", "format": "csv"}, r"targets\[0\]\.format: expected one of jsonl, parquet"),
        ({"path": "/f", "retention": {"max_epochs": 0}}, r"targets\[0\]\.retention\.max_epochs"),
        ({"path": "/f", "stripe_size": 1}, r"targets\[0\]\.stripe_size: only s3 targets"),
    ]
    for target, message in cases:
        with pytest.raises(ConfigError, match=message):
            cfg(**target)
    # the feed keys are unknown on a replica target
    with pytest.raises(ConfigError, match=r"targets\[0\]\.events: unknown key"):
        config_from_dict(
            {
                "sources": [
                    {
                        "name": "s",
                        "root_fid": "R",
                        "servers": ["MDT0000"],
                        "changelogs": {"uri": "/cl"},
                        "store": {"conn_id": "c", "bucket": "b"},
                        "epoch": {"interval": "1m", "start": "2026-01-01T00:00:00Z"},
                    }
                ],
                "targets": [{"name": "p", "source": "s", "kind": "posix", "path": "/p", "events": ["data"]}],
            }
        )
