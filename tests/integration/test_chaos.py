"""Chaos on the real pipeline (SeaweedFS, the run's Spark Connect server): kill -9 anywhere,
two writers racing, SIGTERM/SIGINT mid-apply.

A small simulated history (``epochsync simulate``: 16 files, changelogs and versioned
objects in SeaweedFS) is replicated into a posix and an s3 target by ``epochsync
replicate`` subprocesses killed with SIGKILL at random points, epoch after epoch:

- an "apply" epoch: the apply is killed after a random share of the plan's mutations (the
  next one journaled but not done; in the data phase the kill comes from a Spark executor
  and the server's other tasks run on as stragglers), then the rollback the next run starts
  with is killed after a random number of undo entries; a rerun of the rollback must leave
  the target equal to the ground truth of the previous epoch, a rerun of the epoch equal to
  the ground truth of this one;
- a "commit" epoch: the commit is killed before a random one of its five steps (before or
  after the manifest); the rerun must leave the target equal to the ground truth.

The two targets take the two kinds in opposite orders; ``$EPOCHSYNC_CHAOS_ROUNDS`` (default
1) repeats the pair over more epochs. The reruns run in this process, through the same
``replicate`` / ``rollback_target`` the CLI calls. Then two ``epochsync replicate`` runs
start on one fresh target at a random offset of each other: exactly one proceeds, the
other exits 1 naming the first as the writer, and the target equals the ground truth.
Last, SIGTERM and SIGINT mid-apply (``replicate`` and the demo's shutdown path).

The seed is ``$EPOCHSYNC_CHAOS_SEED`` (default fixed); counts go to ``tests/output/chaos.json``.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from support.machine import wait_for

from epochsync.core.config import load_config
from epochsync.core.errors import BusyError
from epochsync.journal.undo import journal_dir, journal_exists, read_journal
from epochsync.stages.context import committed_epoch, unfinished_epochs
from epochsync.stages.replicate import replicate
from epochsync.stages.rollback import rollback_target
from epochsync.targets import open_target
from epochsync_dev.truth import compare_with_truth, load_truth, truth_path

pytestmark = [pytest.mark.usefixtures("data_on_executors"), pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = int(os.environ.get("EPOCHSYNC_CHAOS_ROUNDS") or 1)
EPOCHS = 2 * ROUNDS
RACES_PER_KIND = 2
SEED = int(os.environ.get("EPOCHSYNC_CHAOS_SEED") or 20261123)
COUNTS: dict = {
    "seed": SEED,
    "epochs": EPOCHS,
    "kills": {"apply": 0, "rollback": 0, "commit": 0},
    "kills_survived": 0,
    "commit_kills_after_manifest": 0,
    "lease_takeovers_logged": 0,
    "races": 0,
    "races_refused": 0,
    "signals": [],
}


@pytest.fixture(scope="module", autouse=True)
def chaos_report():
    t0 = time.monotonic()
    yield COUNTS
    COUNTS["seconds"] = round(time.monotonic() - t0, 1)
    out = ROOT / "tests" / "output"
    out.mkdir(parents=True, exist_ok=True)
    (out / "chaos.json").write_text(json.dumps(COUNTS, indent=1) + "\n")
    print("\nchaos:", json.dumps(COUNTS))


@pytest.fixture(scope="module")
def hist(seaweed, spark_connect, tmp_path_factory):
    """The simulated source and a config with the chaos targets, the race targets and the signal targets.

    ``spark_connect``: every ``epochsync replicate`` subprocess is a client of the run's one
    Spark Connect server (``$EPOCHSYNC_SPARK_REMOTE``), so the data phase of an apply runs on
    its executors: a kill there kills the writer, and the server's tasks are the stragglers.
    """
    from epochsync_dev.cli import main as dev_main

    out = tmp_path_factory.mktemp("chaos")
    os.environ["AIRFLOW_CONN_SOURCE_S3"] = seaweed.airflow_conn_json()
    os.environ["AIRFLOW_CONN_REPLICA_S3"] = seaweed.airflow_conn_json()
    rc = dev_main(
        [
            "simulate",
            "--out",
            str(out),
            "--seed",
            str(SEED % 1000),
            "--epochs",
            str(EPOCHS),
            "--files",
            "16",
            "--bucket",
            "chaos-" + uuid.uuid4().hex[:8],
            "--max-file-size",
            "48KiB",
            "--osts",
            "2",
            "--threads",
            "4",
        ]
    )
    assert rc == 0
    doc = yaml.safe_load((out / "epochsync.yaml").read_text())
    bucket = "chaos-rep-" + uuid.uuid4().hex[:8]

    def posix(name):
        return {"name": name, "source": "sim", "kind": "posix", "path": str(out / name)}

    def s3(name):
        return {
            "name": name,
            "source": "sim",
            "kind": "s3",
            "conn_id": "replica_s3",
            "bucket": bucket,
            "prefix": f"{name}/",
        }

    names = ["kill-p", "kill-s", "sig-p", "sig-s", "drv-s"]
    names += [f"race-p{i}" for i in range(RACES_PER_KIND)] + [f"race-s{i}" for i in range(RACES_PER_KIND)]
    doc["targets"] = [s3(n) if n.split("-")[1].startswith("s") else posix(n) for n in names]
    (out / "epochsync.yaml").write_text(yaml.safe_dump(doc))
    return out, load_config(out / "epochsync.yaml")


def env_for(inject: str | None = None) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "include"))
    env.pop("EPOCHSYNC_INJECT_FAILURE", None)
    if inject:
        env["EPOCHSYNC_INJECT_FAILURE"] = inject
    return env


def cli_replicate(cfg, target: str, *which: str, inject: str | None = None, timeout: float = 300):
    """``epochsync replicate`` in its own session (a kill fault kills its process group, not pytest)."""
    cmd = [sys.executable, "-m", "epochsync.cli", "replicate", "--config", cfg.file, "--target", target, *which]
    return subprocess.run(
        cmd, env=env_for(inject), capture_output=True, text=True, timeout=timeout, start_new_session=True
    )


def assert_at_truth(sim_dir: Path, cfg, target: str, epoch: int) -> None:
    assert committed_epoch(cfg, target) == epoch
    assert unfinished_epochs(cfg, cfg.target(target), epoch) == []
    truth = load_truth(truth_path(sim_dir, epoch)) if epoch else {}
    truth = {p: r for p, r in truth.items() if p not in ("", ".")}
    problems = compare_with_truth(open_target(cfg.target(target)), truth)
    assert problems == [], f"{target} vs the ground truth of epoch {epoch}"


def killed(proc: subprocess.CompletedProcess, what: str) -> None:
    assert proc.returncode == -signal.SIGKILL, (
        f"{what}: exit {proc.returncode}\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"
    )


@pytest.mark.parametrize("target", ["kill-p", "kill-s"])
def test_kill_9_in_apply_rollback_and_commit_then_rerun_equals_the_ground_truth(hist, spark, target, caplog):
    out, cfg = hist
    rng = random.Random(f"{SEED}-{target}")
    kinds = ("apply", "commit") if target == "kill-p" else ("commit", "apply")
    for e in range(1, EPOCHS + 1):
        point: dict = {"target": target, "epoch": e}
        if kinds[(e - 1) % 2] == "apply":
            # 1. apply killed after a random share of its mutations
            share = round(rng.uniform(0, 0.95), 3)
            killed(
                cli_replicate(cfg, target, "--epoch", str(e), inject=f"at={share},epoch={e},mode=kill,repeat=1"),
                f"apply at={share}",
            )
            COUNTS["kills"]["apply"] += 1
            jdir = journal_dir(cfg.warehouse, target, e)
            assert journal_exists(jdir) and committed_epoch(cfg, target) == e - 1
            # 2. the next run starts by rolling that back: killed after k undo entries (k = all: at the clean-up)
            journal = read_journal(jdir)
            entries = len(journal)
            k = rng.randrange(entries + 1)
            # which writers journaled before the kill: ns (driver), data-* (Spark executors), post (driver)
            writers = sorted({x["writer"].split("-")[0] for x in journal})
            point.update(apply_at=share, journal_entries=entries, journal_writers=writers, rollback_after=k)
            killed(
                cli_replicate(
                    cfg, target, "--epoch", str(e), inject=f"after={k},stage=rollback,epoch={e},mode=kill,repeat=1"
                ),
                f"rollback after={k}",
            )
            COUNTS["kills"]["rollback"] += 1
            assert journal_exists(jdir) and committed_epoch(cfg, target) == e - 1
            # a rerun of the rollback (the dead writers' lease is taken over) restores epoch e-1 exactly
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="epochsync.journal.lease"):
                r = rollback_target(cfg, target, spark)
            assert "taking over the lease" in caplog.text  # the killed writer never released it: said so
            COUNTS["lease_takeovers_logged"] += 1
            assert r["rolled_back"] == [e]
            assert_at_truth(out, cfg, target, e - 1)
            COUNTS["kills_survived"] += 2
        else:
            # 3. the commit killed before one of its six steps (1-2: before the manifest, 3-6: after it)
            step = rng.randrange(6)
            point.update(commit_after=step)
            killed(
                cli_replicate(
                    cfg, target, "--epoch", str(e), inject=f"after={step},stage=commit,epoch={e},mode=kill,repeat=1"
                ),
                f"commit after={step}",
            )
            COUNTS["kills"]["commit"] += 1
            assert committed_epoch(cfg, target) == (e if step >= 2 else e - 1)
            COUNTS["commit_kills_after_manifest"] += step >= 2
            COUNTS["kills_survived"] += 1
        # the rerun: a no-op after a manifest, else (roll back and) replicate the epoch again
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="epochsync.journal.lease"):
            replicate(cfg, target, e, spark=spark, progress=lambda line: None)
        assert "taking over the lease" in caplog.text or "commit_after" not in point
        COUNTS["lease_takeovers_logged"] += "taking over the lease" in caplog.text
        assert_at_truth(out, cfg, target, e)
        COUNTS.setdefault("points", []).append(point)


@pytest.mark.parametrize("kind", ["p", "s"])
def test_two_writers_racing_one_proceeds_the_other_is_refused_by_name(hist, kind):
    out, cfg = hist
    rng = random.Random(f"{SEED}-race-{kind}")
    for i in range(RACES_PER_KIND):
        target = f"race-{kind}{i}"
        offset = rng.uniform(0, 1.0)
        cmd = [
            sys.executable,
            "-m",
            "epochsync.cli",
            "replicate",
            "--config",
            cfg.file,
            "--target",
            target,
            "--through",
            "1",
        ]
        first = subprocess.Popen(cmd, env=env_for(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(offset)
        second = subprocess.Popen(cmd, env=env_for(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        runs = {p.pid: (p, *p.communicate(timeout=300)) for p in (first, second)}
        codes = sorted(p.returncode for p, _, _ in runs.values())
        assert codes == [0, BusyError.exit_code], {
            pid: (p.returncode, err[-1500:]) for pid, (p, _, err) in runs.items()
        }
        (winner, wout, _), (loser, _, lerr) = sorted(runs.values(), key=lambda r: r[0].returncode)
        # refused by name: the target, the writer's pid and run, "nothing was changed"; one line, no traceback
        assert f"target {target} is being written by pid {winner.pid} on host " in lerr, lerr
        assert "nothing was changed" in lerr and "Traceback" not in lerr and len(lerr.strip().splitlines()) == 1
        assert "epoch 1: committed" in wout
        assert_at_truth(out, cfg, target, 1)
        COUNTS["races"] += 1
        COUNTS["races_refused"] += 1
        COUNTS.setdefault("race_offsets_s", []).append(round(offset, 3))


def group_alive(pgid: int) -> list[int]:
    """Pids still in process group ``pgid`` (zombies of reaped processes excluded)."""
    import psutil

    alive = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(p.pid)
        except (ProcessLookupError, psutil.Error):
            pass
    return alive


@pytest.mark.parametrize(("target", "sig"), [("sig-p", signal.SIGTERM), ("sig-s", signal.SIGINT)])
def test_a_signal_mid_apply_rolls_back_says_so_and_leaves_nothing_running(hist, target, sig):
    """``epochsync replicate`` caught mid-apply by SIGTERM (a CI timeout) or SIGINT (Ctrl-C)."""
    from epochsync.journal.undo import plan_dir

    out, cfg = hist
    stalled = Path(plan_dir(cfg.warehouse, target, 1)) / "fault.fired.stalled"
    cmd = [
        sys.executable,
        "-m",
        "epochsync.cli",
        "replicate",
        "--config",
        cfg.file,
        "--target",
        target,
        "--through",
        "1",
    ]
    # as from a terminal: a test run started in the background (CI, `make test &`) inherits SIGINT
    # ignored, and Python then never turns it into KeyboardInterrupt
    proc = subprocess.Popen(
        cmd,
        env=env_for("after=2,epoch=1,mode=stall"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    wait_for(stalled, proc)
    assert journal_exists(journal_dir(cfg.warehouse, target, 1))
    t0 = time.monotonic()
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 128 + sig, stderr
    name = signal.Signals(sig).name
    last = stderr.strip().splitlines()[-1]
    assert "Traceback" not in stderr, stderr
    assert last.startswith(f"epochsync replicate: interrupted by {name}: epoch 1 rolled back in "), last
    assert last.endswith(f"target {target} is at epoch 0"), last
    assert group_alive(proc.pid) == []
    assert_at_truth(out, cfg, target, 0)
    # the next run carries on
    assert cli_replicate(cfg, target, "--through", "1").returncode == 0
    assert_at_truth(out, cfg, target, 1)
    COUNTS["signals"].append(
        {
            "entry": "epochsync replicate",
            "signal": name,
            "exit": proc.returncode,
            "seconds_to_exit": round(took, 2),
            "line": last,
        }
    )


DRIVER = """
import subprocess, sys, time
from epochsync.core.config import load_config
from epochsync_dev.demo import stop_demo
from epochsync.core.shutdown import Interrupted, signals_raise

class Store:  # the session's SeaweedFS stands in for the demo's own: not ours to stop
    class proc:
        pid = -1

cfg = load_config(sys.argv[1])
cmd = [sys.executable, "-m", "epochsync.cli", "replicate", "--config", sys.argv[1], "--target", sys.argv[2],
       "--through", "1"]
try:
    with signals_raise():
        # in a session of its own, like weed mini and the dag.test runs of make demo
        child = subprocess.Popen(cmd, start_new_session=True)
        print(child.pid, flush=True)
        child.wait()
except KeyboardInterrupt as exc:
    sig = Interrupted.of(exc)
    print(f"demo: stopped by {sig.name}: {stop_demo(Store, cfg, [], (sys.argv[2],))}", flush=True)
    sys.exit(sig.exit_code)
"""


def test_make_demo_s_shutdown_stops_children_in_their_own_sessions_and_leaves_the_target_committed(hist):
    """The demo's SIGTERM path (``epochsync_dev.demo.stop_demo``) on a driver whose child runs in its own session."""
    import psutil

    from epochsync.journal.undo import plan_dir

    out, cfg = hist
    target = "drv-s"
    stalled = Path(plan_dir(cfg.warehouse, target, 1)) / "fault.fired.stalled"
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, cfg.file, target],
        env=env_for("after=1,epoch=1,mode=stall"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    child = int(driver.stdout.readline())
    wait_for(stalled, driver)
    assert os.getpgid(child) == child != os.getpgid(driver.pid)  # its own session: a signal to the driver misses it
    driver.send_signal(signal.SIGTERM)
    stdout, stderr = driver.communicate(timeout=90)
    assert driver.returncode == 128 + signal.SIGTERM, stderr
    line = stdout.strip().splitlines()[-1]
    assert line.startswith("demo: stopped by SIGTERM: 1 processes stopped; target drv-s "), line
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    assert group_alive(child) == []
    # the child rolled its epoch back on the SIGTERM it was sent (or the driver did): committed, equal to the truth
    assert_at_truth(out, cfg, target, 0)
    COUNTS["signals"].append({"entry": "make demo shutdown (stop_demo)", "signal": "SIGTERM", "line": line})
