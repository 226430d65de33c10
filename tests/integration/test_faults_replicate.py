"""Fault injection on a real pipeline: the target ends exactly at E-1 after a rollback,
or exactly at E after retries, never in between; a rerun then succeeds.

A simulated source (SeaweedFS) is replicated to epoch 1 into a posix and an s3 target;
epoch 2 is then applied with failures: after k mutations for several k (before
anything, in the middle of the namespace operations, inside the executors' data phase,
at the last post operation), a process killed with SIGKILL mid-apply, S3 503s and
connection resets from a loopback fault proxy in front of the source store.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.histories import (
    assert_equals_truth,
    ingest_epoch,
    merge_once,
    replicate_epoch,
    simulate,
)

from epochsync.core.errors import EpochsyncError
from epochsync.journal.undo import journal_dir, journal_exists, read_json
from epochsync.stages.apply import conditional_keys, run_apply
from epochsync.stages.context import check_preconditions, committed_epoch, plan_path, source_access
from epochsync.stages.rollback import rollback_target
from epochsync.stages.translate import run_translate
from epochsync.stages.verify import run_verify
from epochsync.targets import open_target

pytestmark = [pytest.mark.usefixtures("data_on_executors"), pytest.mark.integration, pytest.mark.slow]
TARGETS = ("local", "s3")


@pytest.fixture(scope="module")
def hist(seaweed, tmp_path_factory, spark):
    import dataclasses

    out, cfg = simulate(seaweed, tmp_path_factory.mktemp("faults"), 2, seed=23)
    crash = dataclasses.replace(cfg.target("local"), name="crash", path=str(out / "crash-replica"))
    targets = (*(t for t in cfg.targets if t.name in TARGETS), crash)
    cfg = cfg.__class__(cfg.file, cfg.warehouse, cfg.sources, targets)
    for e in (1, 2):
        ingest_epoch(spark, cfg, e)
        merge_once(spark, cfg, e)
    for t in (*TARGETS, "crash"):
        replicate_epoch(spark, cfg, t, 1)
        run_translate(cfg, t, 2, spark)
    return out, cfg


def next_second() -> None:
    """Sleep into the next whole second (listings and the fence instant have whole seconds)."""
    import time

    time.sleep(1.05 - time.time() % 1)


def back_at_1(hist, t, spark):
    out, cfg = hist
    r = rollback_target(cfg, t, spark)
    assert r["committed"] == 1
    assert not journal_exists(journal_dir(cfg.warehouse, t, 2))
    assert committed_epoch(cfg, t) == 1
    assert_equals_truth(open_target(cfg.target(t)), out, 1)
    # rollback is idempotent: nothing left to do
    assert rollback_target(cfg, t, spark)["rolled_back"] == []


def mutation_points(cfg, t) -> list[int]:
    plan = read_json(plan_path(cfg, t, 2))
    ns, data, post = len(plan["namespace"]), len(plan["data"]), len(plan["post"])
    assert ns + data + post >= 3
    # before anything; mid namespace; inside the executors' data phase; the last post op
    points = {0, max(0, ns // 2), ns + max(0, data // 2), ns + data + post - 1}
    return sorted(p for p in points if p < ns + data + post)


@pytest.mark.parametrize("t", TARGETS)
def test_fail_after_k_mutations_then_rollback_then_rerun(hist, spark, t):
    out, cfg = hist
    if t == "s3":  # the namespace phase runs batches of independent keys concurrently: a fault lands mid-batch
        from epochsync.stages.apply import independent_batches
        from epochsync.targets.s3 import S3Target

        ns = read_json(plan_path(cfg, t, 2))["namespace"]
        assert max(len(b) for b in independent_batches(ns, lambda op: S3Target.op_keys(None, op))) >= 4
    for k in mutation_points(cfg, t):
        with pytest.raises(EpochsyncError, match="injected failure"):
            run_apply(cfg, t, 2, spark, inject=f"after={k},epoch=2,repeat=1")
        assert journal_exists(journal_dir(cfg.warehouse, t, 2))
        assert check_preconditions(cfg, t, 2)["action"] == "rollback_first"
        back_at_1(hist, t, spark)
    # a rerun without the fault reaches epoch 2 exactly (verified), then is undone for the next test
    run_apply(cfg, t, 2, spark)
    run_verify(cfg, t, 2, spark)
    assert_equals_truth(open_target(cfg.target(t)), out, 2)
    back_at_1(hist, t, spark)


@pytest.mark.parametrize("t", TARGETS)
def test_process_killed_mid_apply(hist, spark, t):
    out, cfg = hist
    plan = read_json(plan_path(cfg, t, 2))
    k = max(1, len(plan["namespace"]) // 2 + len(plan["data"]) // 2)
    code = (
        "import sys; from epochsync.stages.apply import run_apply; "
        f"run_apply(sys.argv[1], {t!r}, 2, None, inject='after={k},mode=kill,repeat=1')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, cfg.file], start_new_session=True, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert journal_exists(journal_dir(cfg.warehouse, t, 2))
    # the next run finds the unfinished epoch, rolls it back first, then applies
    run_apply(cfg, t, 2, spark)
    run_verify(cfg, t, 2, spark)
    assert_equals_truth(open_target(cfg.target(t)), out, 2)
    back_at_1(hist, t, spark)


def test_s3_503s_and_resets_are_retried_or_fail_clearly(hist, spark, seaweed):
    from epochsync_dev.s3proxy import S3Proxy

    out, cfg = hist
    t = "s3"
    plain = os.environ["AIRFLOW_CONN_SOURCE_S3"]
    with S3Proxy(seaweed.url) as proxy:
        os.environ["AIRFLOW_CONN_SOURCE_S3"] = plain.replace(seaweed.url, proxy.url)
        try:
            # transient: two 503s and a dropped connection on the source's GETs
            proxy.add_fault("503", method="GET", nth=1, times=2)
            proxy.add_fault("reset", method="GET", nth=4, times=1)
            fig = run_apply(cfg, t, 2, spark)
            assert (
                fig["source_requests"]["retries"] >= 2
            )  # a reset on a kept-alive connection may be re-sent below botocore
            run_verify(cfg, t, 2, spark)
            assert_equals_truth(open_target(cfg.target(t)), out, 2)
            back_at_1(hist, t, spark)
            # permanent: every GET fails; a bounded number of attempts, then a clear error
            proxy.clear_faults()
            proxy.add_fault("503", method="GET", nth=1, times=10_000)
            with pytest.raises(EpochsyncError, match="failed after 6 attempts"):
                run_apply(cfg, t, 2, spark)
            back_at_1(hist, t, spark)
        finally:
            os.environ["AIRFLOW_CONN_SOURCE_S3"] = plain


def test_a_commit_that_dies_after_its_manifest_is_finished_by_a_rerun(hist, spark, monkeypatch):
    from epochsync.stages.commit import run_commit
    from epochsync.targets.posix import PosixTarget

    out, cfg = hist
    run_apply(cfg, "crash", 2, spark)
    run_verify(cfg, "crash", 2, spark)
    target = open_target(cfg.target("crash"))

    def die(self, epoch):
        raise OSError("killed right after the manifest was written")

    with monkeypatch.context() as m:
        m.setattr(PosixTarget, "finish_commit", die)
        with pytest.raises(OSError):
            run_commit(cfg, "crash", 2)
    # the manifest is the commit point: the target is at 2, whatever garbage is left
    assert committed_epoch(cfg, "crash") == 2
    assert check_preconditions(cfg, "crash", 2)["action"] == "noop"
    assert_equals_truth(target, out, 2)
    assert os.path.isdir(target.tmp_dir(2)) and journal_exists(journal_dir(cfg.warehouse, "crash", 2))
    assert run_commit(cfg, "crash", 2)["noop"]
    assert not os.path.exists(target.tmp_dir(2)) and not journal_exists(journal_dir(cfg.warehouse, "crash", 2))
    assert rollback_target(cfg, "crash", spark)["rolled_back"] == []
    assert_equals_truth(target, out, 2)


@pytest.mark.parametrize("t", TARGETS)
def test_write_fence_refuses_keys_changed_by_someone_else(hist, spark, seaweed, t):
    """Runs last in this module: it leaves foreign changes in the targets."""
    out, cfg = hist
    plan = read_json(plan_path(cfg, t, 2))
    target = open_target(cfg.target(t))
    if t == "local":
        files = [i["path"] for i in plan["fence"] if i.get("type") == "file"]
        existing = [p for p in files if os.path.isfile(os.path.join(target.root, p))]
        assert existing, (files, sorted(os.listdir(target.root)))
        victim = existing[0]
        with open(os.path.join(target.root, victim), "ab") as f:
            f.write(b"foreign")
        intruder = next(i["path"] for i in plan["fence"] if i.get("type") is None and "/" not in i["path"])
        Path(target.root, intruder).write_bytes(b"squatter")
    else:
        # keys the fence lists: not those a conditional write fences itself (below)
        conditional = conditional_keys(plan, target, source_access(cfg, cfg.target(t), 2)[0])
        listed = [i for i in plan["fence"] if i["key"] not in conditional]
        victim = next(i["key"] for i in listed if i.get("present"))
        intruder = next(i["key"] for i in listed if not i.get("present"))
        c = seaweed.client()
        next_second()  # a foreign write in the last commit's own second is one no fence sees
        c.put_object(Bucket=target.bucket, Key=target.prefix + victim, Body=b"foreign")
        c.put_object(Bucket=target.bucket, Key=target.prefix + intruder, Body=b"squatter")
    with pytest.raises(EpochsyncError, match="write fence") as exc:
        run_apply(cfg, t, 2, spark)
    assert victim in str(exc.value) and intruder in str(exc.value)
    assert "Nothing was written" in str(exc.value)
    assert not journal_exists(journal_dir(cfg.warehouse, t, 2))
    assert committed_epoch(cfg, t) == 1
    if t != "s3":
        return
    # a key whose write carries the fence (If-Unmodified-Since the last commit): the store refuses
    # that write (412), the epoch fails naming it, and the rollback takes back every other write;
    # its check names the foreign key until someone restores it
    assert conditional, "the simulated epoch has whole-file writes on the store of the source"
    for key in (victim, intruder):
        c.delete_object(Bucket=target.bucket, Key=target.prefix + key, VersionId=target.head(key)["VersionId"])
    victim = sorted(conditional)[0]
    next_second()
    made = c.put_object(Bucket=target.bucket, Key=target.prefix + victim, Body=b"foreign")["VersionId"]
    with pytest.raises(EpochsyncError, match=f"{re.escape(victim)} was changed by someone else.*412"):
        run_apply(cfg, t, 2, spark)
    assert journal_exists(journal_dir(cfg.warehouse, t, 2))
    with pytest.raises(EpochsyncError, match=f"does not match snapshot 1: {re.escape(victim)}"):
        rollback_target(cfg, t, spark)
    assert target.key_versions(victim)["current"]["version"] == made  # the foreign write is left as it was
    c.delete_object(Bucket=target.bucket, Key=target.prefix + victim, VersionId=made)
    back_at_1(hist, t, spark)
