"""Every DAG imports in a clean DagBag, has its tasks in order, one run at a time, and a doc."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EPOCH_ORDER = ["wait_epoch_closed", "ingest", "merge", "translate", "wait_previous_epoch", "apply", "verify", "commit"]


def dagbag(config: Path | None, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    if config is None:
        monkeypatch.delenv("EPOCHSYNC_CONFIG", raising=False)
    else:
        monkeypatch.setenv("EPOCHSYNC_CONFIG", str(config))
    return DagBag(dag_folder=str(ROOT / "dags"))


@pytest.fixture()
def bag(dag_config, monkeypatch):
    return dagbag(dag_config, monkeypatch)


def test_no_import_errors(bag):
    assert bag.import_errors == {}


def test_one_epoch_dag_per_source_target_pair(bag):
    epoch_dags = sorted(d for d in bag.dag_ids if d.startswith("epochsync__"))
    assert epoch_dags == ["epochsync__lustre1__dr", "epochsync__lustre1__scratch"]


def test_epoch_dag_tasks_and_order(bag):
    dag = bag.dags["epochsync__lustre1__dr"]
    assert set(dag.task_ids) == set(EPOCH_ORDER) | {"rollback"}
    for up, down in zip(EPOCH_ORDER, EPOCH_ORDER[1:]):
        assert dag.get_task(up).downstream_task_ids == {down} | ({"rollback"} if up in ("apply", "verify") else set())
    assert dag.get_task("commit").downstream_task_ids == {"rollback"}
    rollback = dag.get_task("rollback")
    assert rollback.upstream_task_ids == {"apply", "verify", "commit"}
    assert rollback.trigger_rule == "one_failed"
    assert rollback.downstream_task_ids == set()


def test_epoch_dag_runs_one_epoch_at_a_time(bag):
    """The stages that read the source wait for the previous run's (depends_on_past); the ones that
    write the target wait for the previous epoch's commit (wait_previous_epoch, issue 50): a
    backfill's runs overlap, and apply after the previous apply found the target two epochs back."""
    dag = bag.dags["epochsync__lustre1__dr"]
    assert dag.max_active_runs == 1
    past = {t.task_id for t in dag.tasks if t.depends_on_past}
    assert past == {"wait_epoch_closed", "ingest", "merge", "translate"}
    assert dag.catchup is True
    gate = dag.get_task("wait_previous_epoch")
    assert gate.mode == "reschedule" and gate.pool == "default_pool", "it must hold no slot the run ahead needs"
    retries = {t.task_id: t.retries for t in dag.tasks}
    assert retries == {
        "wait_epoch_closed": 0,
        "ingest": 2,
        "merge": 2,
        "translate": 2,
        "wait_previous_epoch": 0,
        "apply": 0,
        "verify": 0,
        "commit": 0,
        "rollback": 2,
    }


def test_sensor_reschedules_instead_of_holding_a_slot(bag):
    wait = bag.dags["epochsync__lustre1__dr"].get_task("wait_epoch_closed")
    assert wait.mode == "reschedule"
    assert wait.timeout >= 600


def test_params_for_manual_runs(bag):
    params = bag.dags["epochsync__lustre1__dr"].params
    assert set(params.keys()) == {"epoch", "dry_run", "whole_file", "max_epochs_per_run", "inject_failure", "reingest"}
    assert params["epoch"] is None and params["dry_run"] is False and params["max_epochs_per_run"] == 1


def test_every_dag_has_a_doc_and_one_run_at_a_time(bag):
    assert bag.dags
    for dag_id, dag in bag.dags.items():
        assert dag.doc_md and len(dag.doc_md) > 200, dag_id
        assert dag.max_active_runs == 1, dag_id
        assert dag_id.startswith("epochsync"), dag_id


def test_epoch_dag_doc_names_its_source_and_target(bag):
    doc = bag.dags["epochsync__lustre1__scratch"].doc_md
    assert "`lustre1`" in doc and "`scratch` (posix)" in doc and "rollback" in doc


def test_epoch_dag_schedule_is_the_epoch_timetable(bag, dag_config):
    from epochsync.airflow.timetable import EpochTimetable

    dag = bag.dags["epochsync__lustre1__dr"]
    assert isinstance(dag.timetable, EpochTimetable)
    assert dag.timetable.interval_s == 420
    assert dag.timetable.window(1).start == dag.start_date


def test_dags_serialize_for_the_scheduler(bag):
    """The scheduler stores DAGs as JSON: every DAG must round-trip (the timetable through the plugin)."""
    from airflow.serialization.serialized_objects import DagSerialization

    for dag_id, dag in bag.dags.items():
        back = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag))
        assert back.dag_id == dag_id
        assert type(back.timetable).__name__ == type(dag.timetable).__name__
        if dag_id.startswith("epochsync__"):
            assert back.timetable == dag.timetable
            assert set(back.task_ids) == set(dag.task_ids)


def test_no_config_means_no_dags_and_no_error(monkeypatch):
    bag = dagbag(None, monkeypatch)
    assert bag.import_errors == {}
    assert not [d for d in bag.dag_ids if d.startswith("epochsync")]


def test_bad_config_is_an_import_error_naming_the_key(tmp_path, monkeypatch):
    bad = tmp_path / "bad.yaml"
    bad.write_text("sources:\n  - name: s\n    servers: []\n")
    bag = dagbag(bad, monkeypatch)
    messages = "\n".join(bag.import_errors.values())
    assert "sources[0].root_fid" in messages and str(bad) in messages


def test_parsing_imports_no_heavy_module(dag_config):
    """No pyspark, boto3, pandas at DAG parse time (checked in a fresh interpreter)."""
    code = (
        "import sys, os\n"
        "from airflow.dag_processing.dagbag import DagBag\n"
        f"bag = DagBag(dag_folder={str(ROOT / 'dags')!r})\n"
        "assert not bag.import_errors, bag.import_errors\n"
        "assert bag.dags\n"
        "heavy = sorted(m for m in ('pyspark', 'boto3', 'botocore', 'pandas', 'pyarrow') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    import os

    env = dict(os.environ, EPOCHSYNC_CONFIG=str(dag_config))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "HEAVY []" in out.stdout, out.stdout


def test_ruff_bans_heavy_module_level_imports_in_dags():
    ruff = Path(sys.executable).parent / "ruff"
    for folder in ("dags", "plugins"):
        bad = subprocess.run(
            [str(ruff), "check", "--stdin-filename", f"{folder}/example.py", "-"],
            input="import pyspark\nimport boto3\nimport pandas\n\nprint(pyspark, boto3, pandas)\n",
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        assert bad.returncode == 1
        assert bad.stdout.count("TID253") == 3, bad.stdout
        good = subprocess.run(
            [str(ruff), "check", "--stdin-filename", f"{folder}/example.py", "-"],
            input="def f():\n    import pyspark\n\n    return pyspark\n",
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        assert good.returncode == 0, good.stdout


def test_schedule_from_holds_the_scheduler_back_not_the_start_date(dag_config, monkeypatch):
    """EPOCHSYNC_SCHEDULE_FROM: scheduled runs from that time on; earlier epochs by backfill or trigger."""
    from datetime import UTC, datetime

    monkeypatch.setenv("EPOCHSYNC_SCHEDULE_FROM", "2026-01-01T01:00:00Z")
    dag = dagbag(dag_config, monkeypatch).dags["epochsync__lustre1__dr"]
    # the start date stays at the first epoch: manual runs of early epochs get their tasks
    assert dag.start_date == datetime(2026, 1, 1, tzinfo=UTC)
    assert dag.timetable.schedule_from == datetime(2026, 1, 1, 1, 0, tzinfo=UTC)
    monkeypatch.setenv("EPOCHSYNC_SCHEDULE_FROM", "never")
    assert dagbag(dag_config, monkeypatch).dags["epochsync__lustre1__dr"].timetable.schedule_from == "never"
    monkeypatch.setenv("EPOCHSYNC_SCHEDULE_FROM", "yesterday")
    bag = dagbag(dag_config, monkeypatch)
    assert "EPOCHSYNC_SCHEDULE_FROM" in "\n".join(bag.import_errors.values())


def test_purge_dag_per_source(bag):
    dag = bag.dags["epochsync_purge__lustre1"]
    assert dag.task_ids == ["purge"]
    assert dag.catchup is False and dag.max_active_runs == 1
    assert "idle" in dag.doc_md and "`dr`" in dag.doc_md and "`scratch`" in dag.doc_md


def test_hydrate_dag_per_target(bag):
    dag = bag.dags["epochsync_hydrate__dr"]
    assert dag.task_ids == ["hydrate"]
    assert dag.timetable.can_be_scheduled is False  # manual only
    assert set(dag.params.keys()) == {"epoch", "dump_uri"}
    assert "snapshot/epoch=E/" in dag.doc_md and "`dr` (s3)" in dag.doc_md


def test_audit_dag_per_target(bag):
    """A day between audits by default, metadata only; ``audit: {interval: never, deep: true}``:
    only when triggered, the bytes too. In the target's pool, retried while the target is busy."""
    from datetime import timedelta

    from epochsync.journal.lease import pool_name

    dr, scratch = bag.dags["epochsync_audit__dr"], bag.dags["epochsync_audit__scratch"]
    for dag, target in ((dr, "dr"), (scratch, "scratch")):
        assert dag.task_ids == ["audit"]
        assert dag.catchup is False and dag.max_active_runs == 1
        task = dag.get_task("audit")
        assert task.pool == pool_name(target) and task.retries == 3
        assert f"`{target}`" in dag.doc_md and "the first differences" in dag.doc_md
    assert dr.schedule == timedelta(days=1)
    assert dr.params["deep"] is False and "metadata" in dr.doc_md
    assert scratch.schedule is None and scratch.params["deep"] is True


def test_dag_ids(bag):
    assert sorted(bag.dag_ids) == [
        "epochsync__lustre1__dr",
        "epochsync__lustre1__scratch",
        "epochsync_audit__dr",
        "epochsync_audit__scratch",
        "epochsync_hydrate__dr",
        "epochsync_hydrate__scratch",
        "epochsync_purge__lustre1",
    ]


def test_every_task_that_writes_a_target_takes_its_one_slot_pool(bag, dag_config):
    """Runs of the epoch DAG and the hydrate DAG of one target never write it at the same time."""
    from epochsync.core.config import load_config
    from epochsync.journal.lease import airflow_pools, pool_name

    writers = {"merge", "translate", "apply", "verify", "commit", "rollback"}
    for target in ("dr", "scratch"):
        epoch_dag = bag.dags[f"epochsync__lustre1__{target}"]
        pools = {t.task_id: t.pool for t in epoch_dag.tasks}
        assert {k for k, v in pools.items() if v == pool_name(target)} == writers, pools
        # the sensors (they hold nothing while they wait) and the shared ingest
        assert {pools[k] for k in set(pools) - writers} == {"default_pool"}
        assert bag.dags[f"epochsync_hydrate__{target}"].get_task("hydrate").pool == pool_name(target)
        assert bag.dags[f"epochsync_audit__{target}"].get_task("audit").pool == pool_name(target)
    # the pools every Airflow stack creates for this config: exactly those, one slot each
    assert {k: v["slots"] for k, v in airflow_pools(load_config(dag_config)).items()} == {
        "epochsync_target_dr": 1,
        "epochsync_target_scratch": 1,
    }


def test_every_commit_updates_the_targets_asset(bag):
    """The tasks that commit a target name its asset among their outlets (the events themselves:
    tests/integration/test_airflow_hydrate.py)."""
    from epochsync.airflow.assets import target_asset

    for target in ("dr", "scratch"):
        want = [target_asset(target)]
        assert bag.dags[f"epochsync__lustre1__{target}"].get_task("commit").outlets == want
        assert bag.dags[f"epochsync_hydrate__{target}"].get_task("hydrate").outlets == want
        others = [t for t in bag.dags[f"epochsync__lustre1__{target}"].tasks if t.task_id != "commit"]
        assert not any(t.outlets for t in others)


def test_the_documented_dag_schedules_on_a_targets_asset(tmp_path, monkeypatch, dag_config):
    """The example of docs/airflow/assets.md, as a file of a DAG folder: it parses, and its schedule
    is replica dr's asset."""
    import re
    from pathlib import Path

    from airflow.dag_processing.dagbag import DagBag

    from epochsync.airflow.assets import target_asset

    page = (Path(__file__).resolve().parents[2] / "docs" / "airflow" / "assets.md").read_text()
    (code,) = re.findall(r'```python title="dags/after_dr_commits.py"\n(.*?)```', page, re.S)
    (tmp_path / "after_dr_commits.py").write_text(code)
    monkeypatch.setenv("EPOCHSYNC_CONFIG", str(dag_config))
    bag = DagBag(dag_folder=str(tmp_path))
    assert not bag.import_errors, bag.import_errors
    dag = bag.dags["after_dr_commits"]
    assert list(dag.timetable.asset_condition.objects) == [target_asset("dr")]
