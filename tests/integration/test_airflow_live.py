"""Scheduled epochs, live: the scheduler itself creates one run per epoch as the source closes it.

``epochsync simulate --live`` produces a source in real time (30 s epochs; each epoch's
changelogs appear, closed, at the end of its window). ``airflow standalone`` runs with the
production schedule (no ``EPOCHSYNC_SCHEDULE_FROM``): the ``EpochTimetable`` gives the
scheduler one run per closed window, ``wait_epoch_closed`` releases it, and the posix
replica follows. Every run must be of type ``scheduled`` and succeed, and the replica must
equal the ground truth at every epoch (watched as each commit lands). The replication delay
per epoch (commit time minus the moment the simulator closed the epoch) is written to
``tests/output/live.json``: a figure to read, not a timed assertion.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime

import pytest
from support.airflow_stack import ROOT, airflow_env, replica, truth

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1800)]

EPOCHS = 4
INTERVAL = 30
#: seconds from now to the start of epoch 1 (about Airflow's start, the DAG's parse and its unpause;
#: if Airflow is slower, the scheduler still creates the runs of epochs already closed, in order)
LEAD = 40
DAG = "epochsync__sim__local"
OUTPUT = ROOT / "tests" / "output"


def test_the_scheduler_replicates_each_live_epoch_as_it_closes(seaweed, spark_connect, tmp_path):
    from epochsync_dev.devstack import AirflowStandalone, write_admin_password
    from epochsync_dev.embedded import free_port

    port = free_port()
    env = airflow_env(tmp_path, seaweed, extra={"AIRFLOW__API__PORT": str(port)})
    # epoch windows count from --start, whatever second it is: no wait for a round boundary
    start = datetime.fromtimestamp(math.ceil(time.time() + LEAD), tz=UTC)
    sim = tmp_path / "sim"
    cmd = [
        sys.executable,
        "-m",
        "epochsync.cli",
        "simulate",
        "--out",
        str(sim),
        "--live",
        "--interval",
        f"{INTERVAL}s",
        "--start",
        start.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "--epochs",
        str(EPOCHS),
        "--files",
        "24",
        "--seed",
        "9",
        "--osts",
        "2",
        "--threads",
        "4",
        "--bucket",
        "live-" + uuid.uuid4().hex[:8],
    ]
    simulator = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    config = sim / "epochsync.yaml"
    deadline = time.monotonic() + 60
    while not config.exists():
        assert simulator.poll() is None and time.monotonic() < deadline, simulator.stdout.read()
        time.sleep(0.5)

    home = tmp_path / "airflow-home"
    password = write_admin_password(home)
    # the production schedule: no EPOCHSYNC_SCHEDULE_FROM; only this target's DAG runs
    run_env = airflow_env(tmp_path, seaweed, config=config, extra={"AIRFLOW__API__PORT": str(port)})
    run_env.pop("EPOCHSYNC_SCHEDULE_FROM", None)
    stack = AirflowStandalone(home, run_env, port)
    delays: dict[int, float] = {}
    run_seconds: dict[int, float] = {}
    records: dict[int, int | None] = {}
    seen: dict[int, bool] = {}
    try:
        stack.start(timeout=600)
        stack.create_pools(config)  # as `make airflow`: the scheduler runs no task of a missing pool
        token = stack.token(password)
        _wait_for_dag(stack, token, DAG)
        stack.api("PATCH", f"/dags/{DAG}", token, {"is_paused": False})
        unpaused_before_close = time.time() < start.timestamp() + INTERVAL

        # watch the manifest: each committed epoch must equal the ground truth while it is current
        deadline = start.timestamp() + EPOCHS * INTERVAL + 600
        last = 0
        while last < EPOCHS and time.time() < deadline:
            committed, rows = replica(config, "local", run_env)
            if committed > last:
                for e in range(last + 1, committed):
                    seen[e] = False  # committed and overtaken between two looks: checked by its run's verify only
                seen[committed] = rows == truth(sim, committed)
                assert seen[committed], f"epoch {committed}: the replica differs from the ground truth"
                last = committed
            time.sleep(1)
        assert last == EPOCHS, f"the replica reached epoch {last} of {EPOCHS}:\n{stack.tail()}"
        assert simulator.wait(timeout=60) == 0

        # the last run ends a moment after its commit (the rollback task is skipped, the run closed).
        # The scheduler goes on: once epoch EPOCHS + 1's window has ended it creates that run too
        # (its wait_epoch_closed then waits for changelogs the simulator never writes), so only
        # the runs of the simulated epochs count
        last_start = start.timestamp() + (EPOCHS - 1) * INTERVAL
        deadline = time.monotonic() + 180
        while True:
            runs = stack.api("GET", f"/dags/{DAG}/dagRuns?order_by=logical_date&limit=100", token)["dag_runs"]
            runs = [r for r in runs if _ts(r["data_interval_start"]) <= last_start + 0.5]
            if all(r["state"] in ("success", "failed") for r in runs) or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert [r["run_type"] for r in runs] == ["scheduled"] * EPOCHS, runs
        assert [r["state"] for r in runs] == ["success"] * EPOCHS, runs
        closed = {
            json.loads(x)["epoch"]: json.loads(x)["closed_at"] for x in (sim / "closed.jsonl").read_text().splitlines()
        }
        for e in range(1, EPOCHS + 1):
            stats = json.loads((sim / "warehouse" / "stats" / "target=local" / f"epoch={e}.json").read_text())
            delays[e] = round(stats["committed_at"] - closed[e], 1)
            records[e] = stats.get("records_in")
        # the same figure as bench-warm's dag-run, under the scheduler: a run's start to its end
        for e, r in enumerate(runs, 1):
            run_seconds[e] = round(_ts(r["end_date"]) - _ts(r["start_date"]), 1)
        # most epochs are seen as they land (an epoch overtaken within a second is the exception)
        assert sum(seen.values()) >= EPOCHS - 1, seen
    finally:
        if simulator.poll() is None:
            simulator.kill()
        stack.stop(grace=3)  # every run is over: no 30 s wait on SIGINT
        OUTPUT.mkdir(parents=True, exist_ok=True)
        (OUTPUT / "live.json").write_text(
            json.dumps(
                {
                    "interval_s": INTERVAL,
                    "delay_s": delays,
                    "run_s": run_seconds,
                    "records": records,
                    "checked_against_truth": seen,
                    "unpaused_before_epoch_1_closed": locals().get("unpaused_before_close"),
                },
                indent=1,
            )
            + "\n"
        )
    print(f"live epochs: replication delay (commit - close) per epoch: {delays}; run seconds {run_seconds}")


def _ts(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _wait_for_dag(stack, token: str, dag_id: str, timeout: float = 300) -> None:
    import urllib.error

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            stack.api("GET", f"/dags/{dag_id}", token)
            return
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise
        time.sleep(2)
    raise TimeoutError(f"DAG {dag_id} not parsed within {timeout:.0f}s:\n{stack.tail()}")
