"""Backfill under a real scheduler: `airflow backfill create` replays three epochs, in order."""

from __future__ import annotations

import time

import pytest
from support.airflow_stack import replica, scheduler_stack_fixture, truth

# each epoch run is a few spark-submits: minutes on two shared cores, more than the default timeout
pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(3600),
    pytest.mark.usefixtures("spark_connect"),
]

DAG = "epochsync__sim__s3"

scheduler_stack = pytest.fixture(scope="session")(scheduler_stack_fixture)


def test_backfill_replays_missed_epochs_in_order(scheduler_stack):
    from epochsync.core.config import load_config

    stack = scheduler_stack
    stack.unpause(DAG)
    epoch = load_config(stack.config).source("sim").epoch
    first, last = epoch.window(1)[0], epoch.window(3)[0]
    for attempt in range(3):
        try:
            out = stack.airflow.airflow(
                "backfill",
                "create",
                "--dag-id",
                DAG,
                "--from-date",
                first.isoformat(),
                "--to-date",
                last.isoformat(),
                "--max-active-runs",
                "1",
                # required with depends_on_past: re-run failed epochs, skip the ones already done
                "--reprocess-behavior",
                "failed",
            )
            break
        except RuntimeError as exc:
            # SQLite: the busy scheduler can hold the write lock past the 60 s timeout; the
            # failed command wrote nothing (its transaction rolled back), so it is run again
            if "database is locked" not in str(exc) or attempt == 2:
                raise
            time.sleep(5)
    assert "error" not in out.stderr.lower(), out.stderr
    runs = stack.wait_runs_done(DAG, 3, timeout=1800)

    assert [r["run_type"] for r in runs] == ["backfill"] * 3
    assert [r["logical_date"][:19] for r in runs] == [
        epoch.window(e)[0].strftime("%Y-%m-%dT%H:%M:%S") for e in (1, 2, 3)
    ]
    assert [r["state"] for r in runs] == ["success"] * 3, [stack.task_states(DAG, r["dag_run_id"]) for r in runs]
    # one after the other: each epoch started after the previous one ended
    for before, after in zip(runs, runs[1:]):
        assert after["start_date"] >= before["end_date"], (before, after)
    for r in runs:
        states = stack.task_states(DAG, r["dag_run_id"])
        assert states["commit"] == "success" and states["rollback"] == "skipped", states
    # the tasks that write the target ran in its one-slot pool, which the stack created
    from urllib.parse import quote

    tis = stack.api("GET", f"/dags/{DAG}/dagRuns/{quote(runs[-1]['dag_run_id'], safe='')}/taskInstances")
    pools = {t["task_id"]: t["pool"] for t in tis["task_instances"]}
    assert {k for k, v in pools.items() if v == "epochsync_target_s3"} == {
        "merge",
        "translate",
        "apply",
        "verify",
        "commit",
        "rollback",
    }, pools
    assert stack.api("GET", "/pools/epochsync_target_s3")["slots"] == 1
    committed, rows = replica(stack.config, "s3", stack.env)
    assert committed == 3
    assert rows == truth(stack.sim, 3)
