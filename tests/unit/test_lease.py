"""One writer per target: the lease (posix flock, s3 conditional writes) and the Airflow pools.

The s3 cases run against moto and against SeaweedFS (the ``seaweed`` fixture): both must
honour ``If-None-Match: *`` and ``If-Match`` atomically, or two writers could both win.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from epochsync.core.config import Config, TargetConfig
from epochsync.journal.lease import (
    LeaseLostError,
    TargetBusyError,
    airflow_pools,
    check_lease,
    holder,
    open_lease,
    pool_name,
    target_lease,
)

ROOT = Path(__file__).resolve().parents[2]


def posix_target(tmp_path: Path, name: str = "rep") -> tuple[Config, TargetConfig]:
    t = TargetConfig(name=name, source="src", kind="posix", path=str(tmp_path / name))
    return Config(str(tmp_path / "epochsync.yaml"), str(tmp_path / "wh"), (), (t,)), t


def s3_target(bucket: str, prefix: str = "p/", name: str = "rep") -> tuple[Config, TargetConfig]:
    t = TargetConfig(name=name, source="src", kind="s3", conn_id="lease_s3", bucket=bucket, prefix=prefix)
    return Config("epochsync.yaml", "/tmp/unused-warehouse", (), (t,)), t


HOLDER = """
import sys, time
from epochsync.core.config import Config, TargetConfig
from epochsync.journal.lease import target_lease
kind, where, bucket = sys.argv[1], sys.argv[2], sys.argv[3]
if kind == "posix":
    t = TargetConfig(name="rep", source="src", kind="posix", path=where)
else:
    t = TargetConfig(name="rep", source="src", kind="s3", conn_id="lease_s3", bucket=bucket, prefix="p/")
with target_lease(Config("x.yaml", "/tmp/wh", (), (t,)), t):
    print("HELD", flush=True)
    time.sleep(120)
"""


def start_holder(kind: str, where: str = "", bucket: str = "") -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "include"), EPOCHSYNC_RUN_ID="holder-run")
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, kind, where, bucket],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout.readline().strip() == "HELD"
    return proc


def kill(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


@pytest.fixture(params=["moto", "seaweed"])
def store(request, monkeypatch):
    ep = request.getfixturevalue("moto_s3" if request.param == "moto" else "seaweed")
    monkeypatch.setenv("AIRFLOW_CONN_LEASE_S3", ep.airflow_conn_json())
    return ep


# --------------------------------------------------------------------------- posix


def test_posix_second_writer_is_refused_by_name_and_changes_nothing(tmp_path):
    cfg, t = posix_target(tmp_path)
    proc = start_holder("posix", t.path)
    try:
        with pytest.raises(TargetBusyError) as exc:
            with target_lease(cfg, t):
                raise AssertionError("must not get here")
        msg = str(exc.value)
        assert msg.startswith(f"target rep is being written by pid {proc.pid} on host ")
        assert "(run holder-run) since 20" in msg and "; nothing was changed" in msg
        assert holder(t)["pid"] == proc.pid
    finally:
        kill(proc)


def test_posix_lease_of_a_killed_writer_is_taken_over_with_a_log_line(tmp_path, caplog):
    cfg, t = posix_target(tmp_path)
    proc = start_holder("posix", t.path)
    kill(proc)
    assert holder(t) is None  # the kernel released the flock with the process
    with caplog.at_level(logging.WARNING, logger="epochsync.journal.lease"):
        with target_lease(cfg, t):
            assert holder(t)["pid"] == os.getpid()
    assert f"taking over the lease of pid {proc.pid}" in caplog.text and "without releasing it" in caplog.text
    # a clean release leaves nothing to take over
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="epochsync.journal.lease"):
        with target_lease(cfg, t):
            pass
    assert "taking over" not in caplog.text and holder(t) is None


def test_the_lease_is_reentrant_in_one_process_and_released_at_the_outermost_exit(tmp_path):
    cfg, t = posix_target(tmp_path)
    with target_lease(cfg, t):
        with target_lease(cfg, t):
            assert holder(t)["pid"] == os.getpid()
        assert holder(t)["pid"] == os.getpid()
    assert holder(t) is None


def test_a_stage_function_takes_the_lease_before_it_writes(tmp_path):
    """A busy target: run_apply refuses before the precondition check, the plan read or the journal."""
    from epochsync.stages.apply import run_apply
    from epochsync.stages.commit import run_commit
    from epochsync.stages.rollback import rollback_target

    cfg, t = posix_target(tmp_path)
    proc = start_holder("posix", t.path)
    try:
        for call in (lambda: run_apply(cfg, t, 1), lambda: run_commit(cfg, t, 1), lambda: rollback_target(cfg, t)):
            with pytest.raises(TargetBusyError, match="nothing was changed"):
                call()
        assert not (tmp_path / "wh").exists()
    finally:
        kill(proc)


# --------------------------------------------------------------------------- s3


def test_s3_conditional_writes_are_honoured_and_atomic(store, bucket_name):
    """If-None-Match: * and If-Match, each raced by 4 clients 3 times: exactly one wins every time.

    (SeaweedFS serialises contended conditional writes behind a lock with a back-off of about
    a second: correct, but each race costs 1-3 s there.)
    """
    from botocore.exceptions import ClientError

    clients = [store.client() for _ in range(4)]
    clients[0].create_bucket(Bucket=bucket_name)
    clients[0].put_bucket_versioning(Bucket=bucket_name, VersioningConfiguration={"Status": "Enabled"})
    for r in range(3):
        key = f"k{r}"
        for cond in ({"IfNoneMatch": "*"}, "if-match"):
            if cond == "if-match":
                cond = {"IfMatch": clients[0].head_object(Bucket=bucket_name, Key=key)["ETag"]}
            wins, barrier = [], threading.Barrier(len(clients))

            def put(i, cond=cond, key=key, wins=wins, barrier=barrier):
                barrier.wait()
                try:
                    clients[i].put_object(Bucket=bucket_name, Key=key, Body=f"{i}{cond}".encode(), **cond)
                    wins.append(i)
                except ClientError as exc:
                    assert exc.response["ResponseMetadata"]["HTTPStatusCode"] in (409, 412), exc

            threads = [threading.Thread(target=put, args=(i,)) for i in range(len(clients))]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            assert len(wins) == 1, (r, cond, wins)
    # a delete marker counts as absent for If-None-Match (versioned buckets)
    clients[0].delete_object(Bucket=bucket_name, Key="k0")
    clients[0].put_object(Bucket=bucket_name, Key="k0", Body=b"again", IfNoneMatch="*")


def test_s3_second_writer_refused_then_free_after_release(store, bucket_name):
    cfg, t = s3_target(bucket_name)
    proc = start_holder("s3", bucket=bucket_name)
    try:
        with pytest.raises(
            TargetBusyError, match=rf"target rep is being written by pid {proc.pid} .*nothing was changed"
        ):
            with target_lease(cfg, t):
                pass
    finally:
        proc.send_signal(signal.SIGTERM)  # no handler: dies without releasing, like a crash
        proc.wait(timeout=10)
    # its process is gone on this host: taken over at once, without waiting for the expiry
    with target_lease(cfg, t) as lease:
        assert lease.doc["pid"] == os.getpid()
        assert holder(t)["pid"] == os.getpid()
    assert holder(t) is None
    # the released lease left no old versions behind (versioned bucket)
    versions = store.client().list_object_versions(Bucket=bucket_name, Prefix="p/.epochsync/lease.json")
    assert len(versions.get("Versions", [])) == 0


def foreign_lease(store, bucket: str, *, expires_in: float) -> None:
    """A lease written by a writer on another host (its liveness is unknown here)."""
    doc = {
        "host": "elsewhere",
        "boot_id": "other-boot",
        "pid_ns": "pid:[1]",
        "pid": 77,
        "pid_start": "1",
        "run_id": "remote run",
        "token": "t",
        "since": "2026-01-01T00:00:00Z",
        "expires": time.time() + expires_in,
        "ttl_s": 120,
    }
    c = store.client()
    if bucket not in [b["Name"] for b in c.list_buckets().get("Buckets", [])]:
        c.create_bucket(Bucket=bucket)
    c.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    c.put_object(Bucket=bucket, Key="p/.epochsync/lease.json", Body=json.dumps(doc).encode())


def test_s3_lease_from_another_host_holds_until_it_expires(store, bucket_name, caplog):
    cfg, t = s3_target(bucket_name)
    foreign_lease(store, bucket_name, expires_in=60)
    with pytest.raises(TargetBusyError, match="pid 77 on host elsewhere \\(run remote run\\) since 2026-01-01"):
        with target_lease(cfg, t):
            pass
    foreign_lease(store, bucket_name, expires_in=-1)
    with caplog.at_level(logging.WARNING, logger="epochsync.journal.lease"):
        with target_lease(cfg, t):
            pass
    assert "taking over the lease of pid 77 on host elsewhere" in caplog.text and "expired" in caplog.text


def test_s3_stale_lease_is_taken_over_by_exactly_one_of_many(store, bucket_name):
    cfg, t = s3_target(bucket_name)
    foreign_lease(store, bucket_name, expires_in=-1)
    results, barrier = [], threading.Barrier(5)

    def contender():
        lease = open_lease(t)[1]
        barrier.wait()
        try:
            lease.acquire()
            results.append(lease)
        except TargetBusyError:
            results.append(None)

    threads = [threading.Thread(target=contender) for _ in range(5)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    winners = [x for x in results if x is not None]
    assert len(winners) == 1 and len(results) == 5
    winners[0].release()


def test_s3_lease_is_renewed_and_a_lost_lease_stops_the_commit(store, bucket_name, monkeypatch):
    monkeypatch.setenv("EPOCHSYNC_LEASE_TTL_S", "3")
    cfg, t = s3_target(bucket_name)
    c = store.client()
    with pytest.raises(LeaseLostError), target_lease(cfg, t) as lease:
        first = json.loads(c.get_object(Bucket=bucket_name, Key=lease.key)["Body"].read())
        time.sleep(4.5)  # past the time to live: renewed meanwhile, so still ours and valid
        now = json.loads(c.get_object(Bucket=bucket_name, Key=lease.key)["Body"].read())
        assert now["token"] == first["token"] and now["expires"] > time.time()
        check_lease(t)
        # someone else overwrites it (a writer that wrongly judged it stale)
        c.put_object(Bucket=bucket_name, Key=lease.key, Body=json.dumps({"pid": 1, "token": "x"}).encode())
        deadline = time.time() + 10
        while not lease.lost and time.time() < deadline:
            time.sleep(0.2)
        assert lease.lost and "lost the lease" in lease.lost
        with pytest.raises(LeaseLostError):
            check_lease(t)
        # leaving the block raises too; the release leaves the other writer's lease alone
    assert json.loads(c.get_object(Bucket=bucket_name, Key=lease.key)["Body"].read())["token"] == "x"


# --------------------------------------------------------------------------- Airflow pools


def test_one_pool_per_target_with_one_slot(tmp_path):
    cfg, _ = posix_target(tmp_path)
    two = Config(
        cfg.file, cfg.warehouse, (), (*cfg.targets, TargetConfig(name="b-2", source="src", kind="posix", path="/x"))
    )
    pools = airflow_pools(two)
    assert set(pools) == {pool_name("rep"), pool_name("b-2")} == {"epochsync_target_rep", "epochsync_target_b-2"}
    assert all(p["slots"] == 1 and p["description"] for p in pools.values())
