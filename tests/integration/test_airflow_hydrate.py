"""Hydrate a new replica from the source's namespace dump, a dry run, then the epoch DAG carries on."""

from __future__ import annotations

import pytest
from support.airflow_stack import airflow_env, dagtest, replica, simulate, truth

from epochsync.airflow.dagtest import close_kept_processes

# four DAG runs in one kept dag.test process, on the session's Connect server
pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(3600),
    pytest.mark.usefixtures("spark_connect"),
]


@pytest.fixture(autouse=True)
def _kept_dagtest_process():
    yield
    close_kept_processes()


def test_hydrate_at_a_closed_epoch_then_the_next_epoch_replicates(seaweed, tmp_path):
    env = airflow_env(tmp_path, seaweed)
    config = simulate(tmp_path, env, epochs=3, files=20, seed=5)
    env["EPOCHSYNC_CONFIG"] = str(config)
    sim = config.parent

    run = dagtest(env, "epochsync_hydrate__local", 2)
    assert run["state"] == "success", run["log"][-6000:]
    # every commit updates the target's asset, the epoch in the event's extra (a dry run: none)
    asset = "epochsync_target_local"
    assert run["assets"] == [{"uri": asset, "task": "hydrate", "extra": {"target": "local", "epoch": 2}}]
    committed, rows = replica(config, "local", env)
    assert committed == 2
    assert rows == truth(sim, 2), "the hydrated replica must equal the source at the dump's epoch"

    # a dry run of epoch 3 stops after translate, prints the plan summary and changes nothing
    run = dagtest(env, "epochsync__sim__local", 3, conf={"dry_run": True})
    assert run["state"] == "success", run["log"][-6000:]
    assert run["tasks"]["translate"] == "success"
    assert run["tasks"]["apply"] == run["tasks"]["verify"] == run["tasks"]["commit"] == "skipped"
    assert "dry run: plan of local epochs 3..3" in run["log"]
    assert run["assets"] == []
    assert replica(config, "local", env) == (2, truth(sim, 2))

    # the epoch DAG goes on from 3 (its changelogs are still there; the dry run's ingest is reused)
    run = dagtest(env, "epochsync__sim__local", 3)
    assert "already ingested" in run["log"]
    assert run["state"] == "success", run["log"][-6000:]
    assert run["assets"] == [{"uri": asset, "task": "commit", "extra": {"target": "local", "epoch": 3}}]
    committed, rows = replica(config, "local", env)
    assert committed == 3
    assert rows == truth(sim, 3)

    # hydrating a replica that is already there is refused with the reason
    run = dagtest(env, "epochsync_hydrate__local", 2)
    assert run["state"] == "failed"
    assert "already at epoch 3" in run["log"]
