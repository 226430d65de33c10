"""Rollback of an s3 target replays its undo journal with keys in threads (``S3Target.undo_all``);
a posix target's replay stays sequential in reverse journal order.

The s3 tests apply real plans to a versioned SeaweedFS bucket, roll them back with
``rollback_target`` and compare the replica's namespace and bytes with the epoch before.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import traceback
import uuid

import pytest
from support.plans import entry, row

from epochsync.core.config import config_from_dict
from epochsync.journal.faults import InjectedFailure
from epochsync.journal.undo import UNDONE_LOG, journal_dir, journal_exists, read_journal
from epochsync.stages.apply import apply_plan
from epochsync.stages.context import _target_dict
from epochsync.stages.rollback import rollback_target
from epochsync.stages.translate import build_plan
from epochsync.stores.connections import resolve_s3
from epochsync.stores.s3_access import S3Access
from epochsync.targets import open_target
from epochsync.targets.s3 import S3Target

pytestmark = pytest.mark.integration

FILES = 160  # epoch 2 journals about 2 entries per file: several hundred entries in all


@pytest.fixture()
def world(seaweed, tmp_path):
    os.environ["AIRFLOW_CONN_UNDO_S3"] = seaweed.airflow_conn_json()
    client = seaweed.client()
    src_bucket = "src-" + uuid.uuid4().hex[:8]
    client.create_bucket(Bucket=src_bucket)
    client.put_bucket_versioning(Bucket=src_bucket, VersioningConfiguration={"Status": "Enabled"})
    name = "u" + uuid.uuid4().hex[:6]
    cfg = config_from_dict(
        {
            "warehouse": str(tmp_path / "wh"),
            "sources": [
                {
                    "name": "s",
                    "root_fid": "R",
                    "servers": ["M"],
                    "changelogs": {"uri": "/x"},
                    "store": {"conn_id": "undo_s3", "bucket": src_bucket},
                    "epoch": {"interval": 60, "start": "2026-01-01"},
                }
            ],
            "targets": [
                {
                    "name": name,
                    "source": "s",
                    "kind": "s3",
                    "conn_id": "undo_s3",
                    "bucket": "replica-undo",
                    "prefix": f"{name}/",
                    "small_object": 1024,  # a partial update of a larger file is a multipart upload
                }
            ],
        },
        file=str(tmp_path / "c.yaml"),
    )
    target = open_target(cfg.target(name))
    target.ensure_bucket()
    store = {"key": "{ost}/{oid}", "unstriped_key": "data/{fid}", "bucket": src_bucket}

    def put(fid: str, data: bytes) -> str:
        return client.put_object(Bucket=src_bucket, Key=f"data/{fid}", Body=data)["VersionId"]

    def apply(entries, epoch):
        plan = build_plan(entries, target=_target_dict(cfg.target(name)), store=store, epoch=epoch)
        problems, state = target.fence_check(plan["fence"], target.fence_time_ns())
        assert problems == []
        apply_plan(
            plan, target, S3Access(resolve_s3("undo_s3")), src_bucket, journal_dir(cfg.warehouse, name, epoch), state
        )

    return {"cfg": cfg, "name": name, "target": target, "put": put, "apply": apply}


def _tree(target) -> dict:
    return {e.path: (e.type, e.sha256, e.mode) for e in target.walk()}


def _two_epochs(world) -> dict:
    """Epoch 1 (committed): directories a/ and b/ with FILES files. Epoch 2 (applied, not
    committed): a/ renamed to z/, every third file rewritten, a new file at each old name
    under b/ whose file moved to c/ (a delete and a put on one key), and new files."""
    put, apply, target = world["put"], world["apply"], world["target"]
    d = row("dir", mode=0o755)
    files, contents = {}, {}
    e1 = [entry("DA", new=d, new_paths=["a"]), entry("DB", new=d, new_paths=["b"])]
    for i in range(FILES):
        data = contents[i] = os.urandom(2000 + i)
        files[i] = row("file", size=len(data), version=put(f"F{i}", data), fid=f"F{i}")
        parent = "a" if i % 2 == 0 else "b"
        e1.append(entry(f"F{i}", new=files[i], new_paths=[f"{parent}/f{i}"]))
    apply(e1, 1)
    target.write_manifest({"epoch": 1})
    before = _tree(target)
    e2 = [
        entry("DA", old=d, new=d, old_paths=["a"], new_paths=["z"]),
        entry("DC", new=d, new_paths=["c"]),
    ]
    for i in range(FILES):
        old = files[i]
        new = old
        change = None
        if i % 3 == 0:
            data = os.urandom(300 + i)
            new = row("file", size=len(data), version=put(f"F{i}", data), fid=f"F{i}")
            change = {"data_changed": True, "whole_file": True, "ranges": []}
        elif i % 4 == 1:  # a range rewritten in place: a multipart upload and a put on one key
            data = bytearray(contents[i])
            data[100:150] = os.urandom(50)
            new = row("file", size=len(data), version=put(f"F{i}", bytes(data)), fid=f"F{i}")
            e2.append(
                entry(
                    f"F{i}",
                    old=old,
                    new=new,
                    old_paths=[f"b/f{i}"],
                    new_paths=[f"b/f{i}"],
                    change={"data_changed": True, "whole_file": False, "ranges": [{"offset": 100, "length": 50}]},
                )
            )
            continue
        if i % 2 == 0:
            e2.append(entry(f"F{i}", old=old, new=new, old_paths=[f"a/f{i}"], new_paths=[f"z/f{i}"], change=change))
        else:
            e2.append(entry(f"F{i}", old=old, new=new, old_paths=[f"b/f{i}"], new_paths=[f"c/f{i}"], change=change))
            data = os.urandom(100)
            g = row("file", size=100, version=put(f"G{i}", data), fid=f"G{i}")
            e2.append(entry(f"G{i}", new=g, new_paths=[f"b/f{i}"]))
    apply(e2, 2)
    return before


def test_s3_rollback_of_hundreds_of_entries_in_threads_restores_the_previous_epoch(world):
    before = _two_epochs(world)
    target, cfg, name = world["target"], world["cfg"], world["name"]
    assert _tree(target) != before
    journal = read_journal(journal_dir(cfg.warehouse, name, 2))
    per_key = collections.Counter(e["key"] for e in journal)
    assert len(journal) >= 300 and len(per_key) >= 200, (len(journal), len(per_key))
    assert sum(1 for n in per_key.values() if n >= 2) >= 20  # keys undone by several entries, in order
    seen_threads = set()
    undo = S3Target.undo

    def spy(self, entry, jdir):
        seen_threads.add(threading.current_thread().name)
        return undo(self, entry, jdir)

    lines: list[str] = []
    mp = pytest.MonkeyPatch()
    mp.setattr(S3Target, "undo", spy)
    mp.setattr("epochsync.targets.base.UNDO_PROGRESS_EVERY_S", 0.0)
    try:
        r = rollback_target(cfg, name, check=False, progress=lines.append)
    finally:
        mp.undo()
    assert r["rolled_back"] == [2] and r["undone"] == len(journal)
    assert _tree(target) == before
    assert len(seen_threads) > 1 and all(t.startswith("s3-undo") for t in seen_threads)
    assert any("journal entries undone (" in line and line.startswith("rollback: epoch 2: ") for line in lines)
    assert not journal_exists(journal_dir(cfg.warehouse, name, 2))


@pytest.mark.parametrize("after", [0, 57, 250])
def test_s3_fault_mid_replay_then_a_second_rollback_converges(world, monkeypatch, after):
    before = _two_epochs(world)
    target, cfg, name = world["target"], world["cfg"], world["name"]
    jdir = journal_dir(cfg.warehouse, name, 2)
    total = len(read_journal(jdir))
    monkeypatch.setenv("EPOCHSYNC_INJECT_FAILURE", f"after={after},stage=rollback,epoch=2")
    with pytest.raises(InjectedFailure, match="rollback step"):
        rollback_target(cfg, name, check=False)
    # every entry logged done was undone (its key holds no version it did not know); the
    # rest is left for the next rollback
    logged = []
    if os.path.exists(os.path.join(jdir, UNDONE_LOG)):
        with open(os.path.join(jdir, UNDONE_LOG), encoding="utf-8") as f:
            logged = [(w, int(q)) for w, q in (line.split() for line in f)]
    assert len(logged) == len(set(logged))
    assert after <= len(logged) < total
    by_id = {(e["writer"], e["seq"]): e for e in read_journal(jdir)}
    for x in logged:
        en = by_id[x]
        if en["op"] != "mpu":
            assert set(target.key_versions(en["key"])["known"]) <= set(en["known"]), en
    assert journal_exists(jdir) and _tree(target) != before
    monkeypatch.delenv("EPOCHSYNC_INJECT_FAILURE")
    r = rollback_target(cfg, name, check=False)
    assert r["rolled_back"] == [2] and r["undone"] == total - len(logged)
    assert _tree(target) == before


def test_s3_replay_error_stops_the_other_threads_and_is_raised_once_they_finished(world, monkeypatch):
    _two_epochs(world)
    target, cfg, name = world["target"], world["cfg"], world["name"]
    jdir = journal_dir(cfg.warehouse, name, 2)
    entries = list(reversed(read_journal(jdir)))
    running = {"now": 0, "after_error": 0}
    lock = threading.Lock()
    failed = threading.Event()
    undo = S3Target.undo
    bad = entries[40]

    def flaky(self, entry, jd):
        if entry is bad:
            failed.set()
            raise OSError("the store went away")
        with lock:
            running["now"] += 1
            running["after_error"] += failed.is_set()
        try:
            return undo(self, entry, jd)
        finally:
            with lock:
                running["now"] -= 1

    done: list[dict] = []
    monkeypatch.setattr(S3Target, "undo", flaky)
    with pytest.raises(OSError, match="the store went away"):
        target.undo_all(entries, jdir, done.append)
    assert running["now"] == 0  # every undo that started had finished when it raised
    assert bad not in done and len(done) < len(entries)
    assert running["after_error"] <= 16  # only undos already past their stop check


def test_posix_replay_is_sequential_in_the_order_given(tmp_path):
    from epochsync.core.config import TargetConfig

    target = open_target(TargetConfig(name="p", source="s", kind="posix", path=str(tmp_path / "r")))
    entries = [{"op": "x", "writer": "ns", "seq": i, "phase": 1, "path": f"same/{i % 3}"} for i in range(50)]
    order: list[tuple[str, int, str]] = []

    def record(entry, jd):
        order.append(("undo", entry["seq"], threading.current_thread().name))

    target.undo = record  # type: ignore[method-assign]
    n = target.undo_all(
        list(reversed(entries)),
        str(tmp_path),
        lambda e: order.append(("done", e["seq"], threading.current_thread().name)),
        before=lambda e: order.append(("before", e["seq"], threading.current_thread().name)),
    )
    assert n == 50
    expected = [(step, seq) for seq in range(49, -1, -1) for step in ("before", "undo", "done")]
    assert [(s, q) for s, q, _ in order] == expected
    assert {t for _, _, t in order} == {threading.current_thread().name}


def test_s3_replay_keeps_each_keys_entries_in_order_and_reports_done_after_the_undo():
    """No store: a target whose undo records; entries on one key keep their order."""
    from epochsync.core.config import TargetConfig
    from epochsync.stores.connections import S3Settings

    cfg = TargetConfig(name="q", source="s", kind="s3", conn_id="none", bucket="b", prefix="q/")
    target = S3Target(cfg, settings=S3Settings("none"))
    target.io = type("NoIO", (), {"client": None})()  # type: ignore[assignment]
    entries = [
        {"op": ("put", "delete", "mpu")[i % 3], "writer": "ns", "seq": i, "key": f"k{i % 37}", "known": []}
        for i in range(400)
    ]
    events: list[tuple[str, int]] = []
    lock = threading.Lock()

    def record(entry, jd):
        with lock:
            events.append(("undo", entry["seq"]))

    target.undo = record  # type: ignore[method-assign]
    replay = list(reversed(entries))
    n = target.undo_all(replay, "/nonexistent", lambda e: events.append(("done", e["seq"])))
    assert n == 400
    undone = [q for s, q in events if s == "undo"]
    assert sorted(undone) == list(range(400))
    for k in range(37):
        mine = [q for q in undone if q % 37 == k]
        assert mine == sorted(mine, reverse=True)  # reversed journal order within a key
    for q in range(400):
        assert events.index(("undo", q)) < events.index(("done", q))


def test_s3_signal_while_a_replay_thread_stalls_stops_the_replay_and_a_rerun_converges(world, monkeypatch):
    """A rollback stalled in one replay thread (``mode=stall``) and stopped by SIGTERM: the signal
    reaches the main thread, the other threads stop, the stalled one returns, and the rollback
    raises :class:`Interrupted`; the next rollback finishes the journal."""
    import signal

    from epochsync.core.shutdown import INTERRUPTED, Interrupted, signals_raise
    from epochsync.journal.undo import plan_dir

    before = _two_epochs(world)
    target, cfg, name = world["target"], world["cfg"], world["name"]
    stalled = os.path.join(plan_dir(cfg.warehouse, name, 2), "fault-rollback.fired.stalled")
    monkeypatch.setenv("EPOCHSYNC_INJECT_FAILURE", "after=30,stage=rollback,epoch=2,mode=stall")

    def signal_once_stalled():
        for _ in range(600):
            if os.path.exists(stalled):
                os.kill(os.getpid(), signal.SIGTERM)
                return
            threading.Event().wait(0.05)

    killer = threading.Thread(target=signal_once_stalled)
    try:
        with signals_raise(), pytest.raises(Interrupted):
            killer.start()
            rollback_target(cfg, name, check=False)
    finally:
        killer.join()
        INTERRUPTED.clear()  # process-wide: later tests must not see this signal
    assert os.path.exists(stalled)
    left = [t for t in threading.enumerate() if t.name.startswith("s3-undo")]
    frames = sys._current_frames()
    assert left == [], "undo threads still running after the rollback raised:\n" + "\n".join(
        f"{t.name}: {''.join(traceback.format_stack(frames[t.ident])[-3:]) if t.ident in frames else '-'}" for t in left
    )
    monkeypatch.delenv("EPOCHSYNC_INJECT_FAILURE")
    assert rollback_target(cfg, name, check=False)["rolled_back"] == [2]
    assert _tree(target) == before
