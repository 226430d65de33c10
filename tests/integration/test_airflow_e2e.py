"""End to end through the epoch DAG with dag.test(): SeaweedFS source, local[2] Spark, a posix replica."""

from __future__ import annotations

import pytest
from airflow_stack import airflow_env, dagtest, replica, simulate, truth

# each epoch run is a few spark-submits: minutes on two shared cores, more than the default timeout
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(3600)]

DAG = "epochsync__sim__local"
ORDER = ["wait_epoch_closed", "ingest", "merge", "translate", "apply", "verify", "commit"]


@pytest.fixture(scope="module")
def stack(seaweed, tmp_path_factory):
    base = tmp_path_factory.mktemp("airflow-e2e")
    env = airflow_env(base, seaweed)
    config = simulate(base, env, epochs=3, files=24, seed=11)
    env["EPOCHSYNC_CONFIG"] = str(config)
    return {"base": base, "env": env, "config": config, "sim": config.parent}


def test_three_epochs_one_failing_once_rolls_back_and_the_retry_succeeds(stack):
    """Epochs 1, 2, 3 match the ground truth; a dry run of 3 changes nothing; 3 first fails and is rolled back."""
    env, config, sim = stack["env"], stack["config"], stack["sim"]

    for epoch in (1, 2):
        run = dagtest(env, DAG, epoch)
        assert run["state"] == "success", run["log"][-6000:]
        assert {t: run["tasks"][t] for t in ORDER} == dict.fromkeys(ORDER, "success")
        assert run["tasks"]["rollback"] == "skipped"
        committed, rows = replica(config, "local", env)
        assert committed == epoch
        assert rows == truth(sim, epoch), f"replica differs from the ground truth at epoch {epoch}"

    # a dry run of epoch 3 stops after translate, prints the plan summary and changes nothing
    before = replica(config, "local", env)
    run = dagtest(env, DAG, 3, conf={"dry_run": True})
    assert run["state"] == "success", run["log"][-6000:]
    assert run["tasks"]["translate"] == "success"
    assert run["tasks"]["apply"] == run["tasks"]["verify"] == run["tasks"]["commit"] == "skipped"
    assert "dry run: plan of local epochs 3..3" in run["log"]
    assert replica(config, "local", env) == before

    # epoch 3: the apply fails after 3 mutations (the DAG's fault param; it fires once per target and epoch)
    fault = {"inject_failure": "after=3,epoch=3"}
    run = dagtest(env, DAG, 3, conf=fault)
    assert run["state"] == "failed"
    assert run["tasks"]["apply"] == "failed"
    assert run["tasks"]["verify"] == run["tasks"]["commit"] == "upstream_failed"
    # the rollback ran (and fails the run on purpose, without retrying)
    assert run["tasks"]["rollback"] == "failed" and run["tries"]["rollback"] == 1
    assert "rolled back: the target is at epoch 2 again" in run["log"]
    committed, rows = replica(config, "local", env)
    assert committed == 2
    assert rows == truth(sim, 2), "after rollback the replica must equal epoch 2 exactly"

    # the next run of that epoch (same params: the fault already fired) succeeds
    run = dagtest(env, DAG, 3, conf=fault)
    assert run["state"] == "success", run["log"][-6000:]
    assert run["tasks"]["rollback"] == "skipped"
    committed, rows = replica(config, "local", env)
    assert committed == 3
    assert rows == truth(sim, 3)
