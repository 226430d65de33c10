"""The simulator: determinism, records that replay to its own namespace, content, index order, CLI."""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections import Counter, defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epochsync.core.config import load_config
from epochsync.core.errors import EpochsyncError, StoreError
from epochsync.core.model import DIR, FILE
from epochsync.core.schema import Record, record_to_json
from epochsync.formats.common import ParseOptions, RecordChecker
from epochsync_dev.cli import main as dev_main
from epochsync_dev.oracle import replay, snapshot_row_from_json
from epochsync_dev.simulate.workload import (
    EPOCH_INTERVAL_S,
    EPOCH_START,
    ROOT_FID,
    SimConfig,
    Workload,
    fast_record_json,
    read_file_at,
    simulate_history,
)


def test_same_seed_same_history_other_seed_other_history():
    a, b = simulate_history(7, 3, 20), simulate_history(7, 3, 20)
    assert [[record_to_json(r) for r in e.records] for e in a.epochs] == [
        [record_to_json(r) for r in e.records] for e in b.epochs
    ]
    assert [e.truth for e in a.epochs] == [e.truth for e in b.epochs]
    assert [e.contents for e in a.epochs] == [e.contents for e in b.epochs]
    c = simulate_history(8, 3, 20)
    assert [e.truth for e in a.epochs] != [e.truth for e in c.epochs]


def test_namespace_does_not_depend_on_data():
    with_data, without = simulate_history(3, 3, 25), simulate_history(3, 3, 25, data=False)
    assert [[record_to_json(r) for r in e.records] for e in with_data.epochs] == [
        [record_to_json(r) for r in e.records] for e in without.epochs
    ]
    assert {r["sha256"] for e in without.epochs for r in e.truth} == {None}


@pytest.mark.parametrize("seed, mdts, osts", [(0, 1, 4), (1, 2, 3), (2, 3, 1), (3, 1, 6)])
def test_records_replayed_by_the_oracle_give_the_simulators_namespace(seed, mdts, osts):
    h = simulate_history(seed, 5, 30, mdts=mdts, osts=osts)
    for e in h.epochs:
        assert replay(h.root_fid, h.snapshot_before(e.epoch), e.records) == e.snapshot, f"epoch {e.epoch}"
    # a catch-up window: all records from the empty root at once
    everything = [r for e in h.epochs for r in e.records]
    assert replay(h.root_fid, h.initial_snapshot, everything) == h.epochs[-1].snapshot


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32),
    epochs=st.integers(1, 4),
    files=st.integers(0, 25),
    mdts=st.integers(1, 3),
    osts=st.integers(1, 5),
)
def test_replay_matches_for_random_histories(seed, epochs, files, mdts, osts):
    h = simulate_history(seed, epochs, files, mdts=mdts, osts=osts, unstriped_ratio=0.3)
    for e in h.epochs:
        assert replay(h.root_fid, h.snapshot_before(e.epoch), e.records) == e.snapshot


def test_truth_matches_the_contents_and_the_snapshot():
    h = simulate_history(5, 4, 40)
    for e in h.epochs:
        rows = {r["fid"]: r for r in e.snapshot}
        assert set(e.contents) == {f for f, r in rows.items() if r["type"] == FILE}
        paths = Counter()
        for t in e.truth:
            row = rows[t["fid"]]
            paths[t["fid"]] += 1
            assert t["type"] == row["type"] and t["mode"] == row["mode"] and t["uid"] == row["uid"]
            assert t["xattrs"] == {n: base64.b64encode(v).decode() for n, v in row["xattrs"]}
            if t["type"] == FILE:
                data = e.contents[t["fid"]]
                assert (t["size"], t["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())
                assert row["size"] == len(data)
            else:
                assert t["size"] is None and t["sha256"] is None
        # one truth line per link: hard links appear under every name
        assert paths == {f: len(r["links"]) for f, r in rows.items() if f != h.root_fid}
        assert [t["path"] for t in e.truth] == sorted(t["path"] for t in e.truth)
        assert all(not t["path"].startswith("/") for t in e.truth)


def test_stored_object_versions_assemble_to_the_ground_truth():
    """Every object version the simulator stores, read at the snapshot's versions through the layout."""
    store: dict[tuple[str, str], bytes] = {}
    w = Workload(SimConfig(seed=11, epochs=5, files=40, osts=3, unstriped_ratio=0.25), lambda r: None)
    striped = unstriped = 0
    for e in range(1, 6):
        w.run_epoch(e)
        for u in w.uploads:
            store[(u.key, u.token)] = u.data
        contents = w.contents()
        for row in w.model.snapshot_rows():
            if row["type"] != FILE:
                continue
            got = read_file_at(row, lambda k, v: store[(k, v)])
            assert got == contents[row["fid"]], f"epoch {e} fid {row['fid']}"
            striped += row["layout"] is not None and row["layout"][1] > 1 and row["size"] > row["layout"][0]
            unstriped += row["layout"] is None and row["size"] > 0
        w.finish_epoch()
    assert striped > 10 and unstriped > 3  # the check covered both kinds


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    osts=st.integers(1, 6),
    unstriped=st.sampled_from([0.0, 0.3, 1.0]),
    max_size=st.sampled_from([1024, 8192, 65536]),
)
def test_store_matches_contents_for_random_geometries(seed, osts, unstriped, max_size):
    store: dict[tuple[str, str], bytes] = {}
    cfg = SimConfig(seed=seed, epochs=3, files=15, osts=osts, unstriped_ratio=unstriped, max_file_size=max_size)
    w = Workload(cfg, lambda r: None)
    for e in range(1, 4):
        w.run_epoch(e)
        store.update({(u.key, u.token): u.data for u in w.uploads})
        contents = w.contents()
        for row in w.model.snapshot_rows():
            if row["type"] == FILE:
                assert read_file_at(row, lambda k, v: store[(k, v)]) == contents[row["fid"]]
        w.finish_epoch()


def test_index_continuity_epoch_records_and_time_order():
    h = simulate_history(2, 5, 30, mdts=2, osts=3)
    last_index: dict[str, int] = defaultdict(int)
    last_time = 0
    checker = RecordChecker(ParseOptions())
    for e in h.epochs:
        start = int(EPOCH_START.timestamp() * 1e9) + (e.epoch - 1) * EPOCH_INTERVAL_S * 10**9
        by_server = defaultdict(list)
        for r in e.records:
            assert r.epoch == e.epoch
            assert start <= r.time_ns < start + EPOCH_INTERVAL_S * 10**9
            assert r.time_ns > last_time  # strictly increasing: time order is the true order
            last_time = r.time_ns
            assert r.index == last_index[r.server] + 1, f"gap on {r.server}"
            last_index[r.server] = r.index
            checker.check(r)  # safe names, known types
            assert Record.from_dict(json.loads(record_to_json(r))) == r
            by_server[r.server].append(r)
        assert set(by_server) == set(h.servers)
        for recs in by_server.values():
            assert recs[-1].type == "EPOCH" and [r.type for r in recs].count("EPOCH") == 1


def test_workload_exercises_every_rule():
    h = simulate_history(4, 6, 60, mdts=2, ops_per_epoch=150)
    recs = [r for e in h.epochs for r in e.records]
    types = Counter(r.type for r in recs)
    for t in ("CREAT", "MKDIR", "MKNOD", "SLINK", "HLINK", "UNLNK", "RMDIR", "RENME", "SATTR", "TRUNC"):
        assert types[t] > 0, t
    assert types["XATTR"] and any(r.type == "XATTR" and r.xattr_value is None for r in recs)
    assert any(r.type == "LYOUT" for r in recs)
    assert any(r.type == "RENME" and r.tfid for r in recs), "rename over an existing file"
    dirs = {f for e in h.epochs for f, t in ((r["fid"], r["type"]) for r in e.snapshot) if t == DIR}
    assert any(r.type == "RENME" and r.sfid in dirs for r in recs), "directory rename"
    assert any(r.type == "RENME" and r.sname.startswith(".tmp-") for r in recs), "swap through a temp name"
    assert any(r.type == "WRITE" and r.extents == () for r in recs), "truncate punch"
    assert any(r.type == "TRUNC" for r in recs)
    assert any(len(r["links"]) > 1 for r in h.epochs[-1].snapshot), "hard links"
    # created and deleted within one epoch: the fid appears in no snapshot
    seen = {r["fid"] for e in h.epochs for r in e.snapshot}
    assert any(r.type == "CREAT" and r.tfid not in seen for r in recs)
    # rename back: a RENME whose new name is an earlier old name of the same fid
    olds = {(r.sfid, r.spfid, r.sname) for r in recs if r.type == "RENME"}
    assert any((r.sfid, r.pfid, r.name) in olds for r in recs if r.type == "RENME")
    # the records of one operation spanning several servers share a cookie, and only they do
    groups = defaultdict(list)
    for r in recs:
        if r.cookie:
            groups[r.cookie].append(r)
    assert len(groups) > 20
    for group in groups.values():
        assert len({r.server for r in group}) >= 2 and len({r.tfid for r in group}) == 1
        assert max(r.time_ns for r in group) - min(r.time_ns for r in group) < 10 * len(group) * 1000
    # striped layouts of several sizes and counts, and unstriped files
    layouts = {r.layout and (r.layout.stripe_size, r.layout.stripe_count) for r in recs if r.type == "CREAT"}
    assert None in layouts and len({lay[0] for lay in layouts if lay}) >= 3
    assert len({lay[1] for lay in layouts if lay}) >= 3


def test_small_history_is_fast():
    t = time.perf_counter()
    simulate_history(1, 5, 30)
    assert time.perf_counter() - t < 2.0  # measured ~0.02 s; generous for a loaded machine


def test_fast_json_is_record_to_json():
    h = simulate_history(9, 3, 30, data=False)
    for e in h.epochs:
        for r in e.records:
            assert fast_record_json(r) == record_to_json(r)


def test_records_budget_and_write_share():
    h = simulate_history(1, 2, 50, data=False, records=6000)
    w = SimConfig(seed=1, epochs=2, files=50, data=False, records=6000, write_share=0.7)
    recs: list[Record] = []
    wl = Workload(w, recs.append)
    wl.run_epoch(1)
    wl.run_epoch(2)
    total = sum(len(e.records) for e in h.epochs)
    assert 6000 <= total < 6050
    per = simulate_history(1, 3, 50, data=False, records_per_epoch=2000)
    assert [2000 <= len(e.records) < 2030 for e in per.epochs[1:]] == [True, True]
    assert len(per.epochs[0].records) < 1000  # epoch 1: the initial tree and files/2 operations
    epoch2 = [r for r in recs if r.epoch == 2]
    share = sum(r.type == "WRITE" for r in epoch2) / len(epoch2)
    assert 0.67 < share < 0.73


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"epochs": 0}, "need epochs >= 1"),
        ({"records": 0}, "--records must be at least 1"),
        ({"unstriped_ratio": 1.5}, "--unstriped-ratio must be in"),
        ({"max_file_size": 10}, "--max-file-size must be at least 1024"),
    ],
)
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(EpochsyncError, match=message):
        simulate_history(**{"seed": 0, "epochs": 2, "files": 5, **kwargs})


# --------------------------------------------------------------------------- the CLI, without S3


def test_cli_no_data_writes_the_documented_layout(tmp_path, capsys):
    out = tmp_path / "sim"
    assert dev_main(["simulate", "--out", str(out), "--no-data", "--seed", "3", "--epochs", "3", "--files", "25"]) == 0
    h = simulate_history(3, 3, 25, data=False)
    cfg = load_config(out / "epochsync.yaml")
    src = cfg.source("sim")
    assert src.servers == h.servers and src.root_fid == ROOT_FID
    assert src.changelogs.uri == f"file://{out}/changelogs/" and src.store.conn_id == "source_s3"
    assert src.epoch.start == EPOCH_START and src.epoch.interval_s == EPOCH_INTERVAL_S
    assert {(t.name, t.kind) for t in cfg.targets} == {("local", "posix"), ("s3", "s3")}
    s3 = cfg.target("s3")
    assert (s3.bucket, s3.prefix, s3.conn_id) == ("replica", "sim/", "replica_s3")
    assert cfg.target("local").path == str(out / "replica")
    assert cfg.warehouse == f"file://{out}/warehouse"
    assert "secret" not in (out / "epochsync.yaml").read_text().lower()
    for e in h.epochs:
        for server in h.servers:
            lines = (out / "changelogs" / server / f"{e.epoch:06d}.jsonl").read_text().splitlines()
            assert [Record.from_dict(json.loads(x)) for x in lines] == [r for r in e.records if r.server == server]
        truth = [json.loads(x) for x in (out / "truth" / f"epoch={e.epoch}.jsonl").read_text().splitlines()]
        assert truth == e.truth
        dump = (out / "snapshot" / f"epoch={e.epoch}" / "part-0.jsonl").read_text().splitlines()
        assert [snapshot_row_from_json(json.loads(x)) for x in dump] == e.snapshot
    err = capsys.readouterr().err
    assert "epoch 3/3" in err


def test_cli_rerun_replaces_its_output(tmp_path):
    out = tmp_path / "sim"
    dev_main(["simulate", "--out", str(out), "--no-data", "--epochs", "3", "--files", "5"])
    dev_main(["simulate", "--out", str(out), "--no-data", "--epochs", "2", "--files", "5"])
    assert sorted(p.name for p in (out / "changelogs" / "MDT0000").iterdir()) == ["000001.jsonl", "000002.jsonl"]
    assert sorted(p.name for p in (out / "truth").iterdir()) == ["epoch=1.jsonl", "epoch=2.jsonl"]


def test_cli_unreachable_store_is_one_clear_error(tmp_path, capsys, monkeypatch):
    from epochsync_dev.embedded import free_port

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    url = f"http://127.0.0.1:{free_port()}"
    rc = dev_main(["simulate", "--out", str(tmp_path / "s"), "--endpoint", url, "--epochs", "1", "--files", "2"])
    assert rc == StoreError.exit_code == 5
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "epochsync_dev simulate: error: source store" in err[0] and url in err[0]


def test_cli_missing_connection_is_one_clear_error(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_NOPE_S3", raising=False)
    rc = dev_main(["simulate", "--out", str(tmp_path / "s"), "--conn-id", "nope_s3", "--epochs", "1"])
    assert rc == StoreError.exit_code
    assert "AIRFLOW_CONN_NOPE_S3" in capsys.readouterr().err


def test_snapshot_dump_reads_in_spark_with_the_snapshot_schema(spark, tmp_path):
    from epochsync.core.model import snapshot_struct_type
    from epochsync_dev.oracle import FsModel

    out = tmp_path / "sim"
    assert dev_main(["simulate", "--out", str(out), "--no-data", "--seed", "2", "--epochs", "2", "--files", "30"]) == 0
    h = simulate_history(2, 2, 30, data=False)
    rows = spark.read.schema(snapshot_struct_type()).json(str(out / "snapshot" / "epoch=2")).collect()
    assert FsModel.from_snapshot_rows(ROOT_FID, rows).snapshot_rows() == h.at(2).snapshot
    assert any(r["xattrs"] for r in rows)  # binary values came back from base64
    assert h.at(2).truth_by_path() == {t["path"]: t for t in h.at(2).truth}
