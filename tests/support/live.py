"""The live-schedule scenario of ``tests/integration/test_airflow_live.py``, run in a background thread.

``epochsync simulate --live`` produces a source in real time (30 s epochs; each epoch's
changelogs appear, closed, at the end of its window). ``airflow standalone`` runs with the
production schedule (no ``EPOCHSYNC_SCHEDULE_FROM``): the ``EpochTimetable`` gives the
scheduler one run per closed window, ``wait_epoch_closed`` releases it, and the posix
replica follows, watched as each commit lands.

Most of the scenario's three minutes are wall-clock waiting for epochs to close, so a
one-process ``make test`` starts it with the session (``tests/conftest.py``) and the other
tests run meanwhile; the test itself, ordered late, only reads what the thread recorded.
The thread stops Airflow as soon as the last epoch's run has ended.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
import traceback
import uuid
from datetime import UTC, datetime
from pathlib import Path

from support.airflow_stack import ROOT, airflow_env, replica, truth

EPOCHS = 4
INTERVAL = 30
#: seconds from now to the start of epoch 1 (about Airflow's start, the DAG's parse and its unpause;
#: if Airflow is slower, the scheduler still creates the runs of epochs already closed, in order)
LEAD = 40
DAG = "epochsync__sim__local"
OUTPUT = ROOT / "tests" / "output"


class LiveEpochs:
    """The live scenario in a thread: ``start()`` returns at once, ``wait()`` gives its facts."""

    def __init__(self, seaweed, base: Path):
        from epochsync_dev.embedded import free_port

        self.seaweed, self.base = seaweed, base
        # both environments from this thread, now: the other tests change os.environ
        # (monkeypatch) while the scenario runs
        self.port = free_port()
        extra = {"AIRFLOW__API__PORT": str(self.port)}
        self.env = airflow_env(base, seaweed, extra=extra)
        # the production schedule: no EPOCHSYNC_SCHEDULE_FROM; only this target's DAG runs
        self.run_env = airflow_env(base, seaweed, config=base / "sim" / "epochsync.yaml", extra=extra)
        self.run_env.pop("EPOCHSYNC_SCHEDULE_FROM", None)
        self.facts: dict = {}
        self.error: str | None = None
        self.started_at = time.time()
        self._thread = threading.Thread(target=self._run, name="live-epochs", daemon=True)
        self._stop = threading.Event()

    def start(self) -> LiveEpochs:
        self._thread.start()
        return self

    def wait(self, timeout: float = 1200) -> dict:
        """The recorded facts once the scenario has ended; raises what made it fail."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the live scenario did not end within {timeout:.0f}s")
        if self.error:
            raise AssertionError(self.error)
        return self.facts

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)

    def _run(self) -> None:
        try:
            self._scenario()
        except BaseException:  # recorded for the test, which re-raises it
            self.error = traceback.format_exc()

    def _scenario(self) -> None:
        from epochsync_dev.devstack import AirflowServices, AirflowStandalone, write_admin_password
        from epochsync_dev.postgres import EmbeddedPostgres, server_bin

        facts = self.facts
        base, port, env, run_env = self.base, self.port, self.env, self.run_env
        # epoch windows count from --start, whatever second it is: no wait for a round boundary
        start = datetime.fromtimestamp(math.ceil(time.time() + LEAD), tz=UTC)
        sim = base / "sim"
        cmd = [
            sys.executable,
            "-m",
            "epochsync_dev",
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
        simulator = subprocess.Popen(
            cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        config = sim / "epochsync.yaml"
        assert run_env["EPOCHSYNC_CONFIG"] == str(config)
        deadline = time.monotonic() + 120
        while not config.exists():
            assert simulator.poll() is None and time.monotonic() < deadline, simulator.stdout.read()
            time.sleep(0.5)

        home = base / "airflow-home"
        password = write_admin_password(home)
        # Airflow as docker-compose.yaml runs it (PostgreSQL, LocalExecutor, a process per component)
        # where PostgreSQL's server is installed; airflow standalone on SQLite elsewhere
        pg = None
        if server_bin() is not None:
            pg = EmbeddedPostgres().start()
            stack: AirflowStandalone = AirflowServices(home, run_env, port, pg.url)
            facts["database"] = "postgresql, LocalExecutor, a process per component"
        else:
            assert not os.environ.get("EPOCHSYNC_REQUIRE_POSTGRES"), (
                "PostgreSQL's server is not installed (apt-get install postgresql), and EPOCHSYNC_REQUIRE_POSTGRES "
                "says the live test must run on it"
            )
            stack = AirflowStandalone(home, run_env, port)
            facts["database"] = "sqlite, airflow standalone"
        delays: dict[int, float] = {}
        run_seconds: dict[int, float] = {}
        records: dict[int, int | None] = {}
        seen: dict[int, bool] = {}
        tasks: dict[int, dict] = {}
        facts.update(seen=seen, delays=delays, run_seconds=run_seconds, records=records, tasks=tasks)
        try:
            stack.start(timeout=600)
            stack.create_pools(config)  # as `make airflow`: the scheduler runs no task of a missing pool
            token = stack.token(password)
            stack.wait_for_dag(token, DAG)
            stack.api("PATCH", f"/dags/{DAG}", token, {"is_paused": False})
            facts["unpaused_before_epoch_1_closed"] = time.time() < start.timestamp() + INTERVAL

            # watch the manifest: each committed epoch must equal the ground truth while it is current
            deadline = start.timestamp() + EPOCHS * INTERVAL + 600
            last = 0
            while last < EPOCHS and time.time() < deadline and not self._stop.is_set():
                committed, rows = replica(config, "local", run_env)
                if committed > last:
                    for e in range(last + 1, committed):
                        seen[e] = False  # committed and overtaken between two looks: checked by its run's verify only
                    seen[committed] = rows == truth(sim, committed)
                    assert seen[committed], f"epoch {committed}: the replica differs from the ground truth"
                    last = committed
                time.sleep(1)
            facts["last"] = last
            assert last == EPOCHS, f"the replica reached epoch {last} of {EPOCHS}:\n{stack.tail()}"
            facts["simulator_exit"] = simulator.wait(timeout=60)

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
            facts["runs"] = runs
            closed = {
                json.loads(x)["epoch"]: json.loads(x)["closed_at"]
                for x in (sim / "closed.jsonl").read_text().splitlines()
            }
            for e in range(1, EPOCHS + 1):
                stats = json.loads((sim / "warehouse" / "stats" / "target=local" / f"epoch={e}.json").read_text())
                delays[e] = round(stats["committed_at"] - closed[e], 1)
                records[e] = stats.get("records_in")
            # the same figure as bench-warm's dag-run, under the scheduler: a run's start to its end
            for e, r in enumerate(runs, 1):
                if r.get("end_date") and r.get("start_date"):
                    run_seconds[e] = round(_ts(r["end_date"]) - _ts(r["start_date"]), 1)
                tasks[e] = _task_seconds(stack, token, r, closed.get(e))
        finally:
            if simulator.poll() is None:
                simulator.kill()
            stack.stop(grace=3)  # every run is over: no 30 s wait on SIGINT
            if pg is not None:
                pg.stop()
            facts["seconds"] = round(time.time() - self.started_at, 1)
            OUTPUT.mkdir(parents=True, exist_ok=True)
            (OUTPUT / "live.json").write_text(
                json.dumps(
                    {
                        "interval_s": INTERVAL,
                        "delay_s": delays,
                        "run_s": run_seconds,
                        "tasks": tasks,
                        "records": records,
                        "checked_against_truth": seen,
                        "unpaused_before_epoch_1_closed": facts.get("unpaused_before_epoch_1_closed"),
                        "beside_other_tests": facts.get("beside_other_tests"),
                    },
                    indent=1,
                )
                + "\n"
            )


def _ts(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _task_seconds(stack, token: str, run: dict, closed_at: float | None) -> dict:
    """Where a run's time went, per task: seconds from the epoch's close (or the run's start)
    to the task's queueing, its queue wait, and its run time."""
    zero = closed_at if closed_at is not None else _ts(run["start_date"])
    path = f"/dags/{run['dag_id']}/dagRuns/{run['dag_run_id']}/taskInstances?limit=100"
    out = {}
    for ti in stack.api("GET", path, token)["task_instances"]:
        if not ti.get("start_date") or not ti.get("end_date"):
            out[ti["task_id"]] = {"state": ti.get("state")}
            continue
        queued = _ts(ti["queued_when"]) if ti.get("queued_when") else _ts(ti["start_date"])
        out[ti["task_id"]] = {
            "queued_at": round(queued - zero, 1),
            "waited": round(_ts(ti["start_date"]) - queued, 1),
            "ran": round(_ts(ti["end_date"]) - _ts(ti["start_date"]), 1),
        }
    return dict(sorted(out.items(), key=lambda kv: kv[1].get("queued_at", 1e9)))
