"""The spark-submit commands the epoch DAG runs, rendered from its templates without running Spark."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


class FakeTI:
    """What templates and tasks read from the task instance: the sensor's XCom."""

    def __init__(self, epochs):
        self.epochs = epochs

    def xcom_pull(self, task_ids=None, key="return_value", **_):
        assert task_ids == "wait_epoch_closed" and key == "return_value"
        return self.epochs


@pytest.fixture()
def dag(with_config, monkeypatch, tmp_path):
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("EPOCHSYNC_BUILD_DIR", str(tmp_path / "build"))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    for c in ("SOURCE_S3", "REPLICA_S3"):
        monkeypatch.setenv(
            f"AIRFLOW_CONN_{c}",
            json.dumps({"conn_type": "aws", "login": "k", "password": "s", "extra": {"endpoint_url": "http://x"}}),
        )
    bag = DagBag(dag_folder=str(ROOT / "dags"))
    assert not bag.import_errors
    return bag.dags["epochsync__lustre1__dr"]


def render(dag, task_id, epochs, params=None):
    task = dag.get_task(task_id)
    context = {
        "ti": FakeTI(epochs),
        "params": {
            "epoch": None,
            "dry_run": False,
            "whole_file": False,
            "inject_failure": "",
            "max_epochs_per_run": 1,
            **(params or {}),
        },
    }
    task.render_template_fields(context)
    task.prepare(context)
    return task, task.spark_submit_command()


def epochs(first, through, dry_run=False, whole_file=False):
    return {"first": first, "through": through, "dry_run": dry_run, "whole_file": whole_file}


def test_ingest_command(dag, with_config, tmp_path):
    task, cmd = render(dag, "ingest", epochs(7, 7))
    zip_path = next((tmp_path / "build").glob("epochsync-*.zip"))
    assert cmd == [
        "spark-submit",
        "--master",
        "local[2]",
        "--py-files",
        str(zip_path),
        "--name",
        "epochsync-ingest",
        str(ROOT / "spark_apps" / "ingest.py"),
        "--config",
        str(with_config),
        "--epoch",
        "7",
        "--through",
        "7",
        "--source",
        "lustre1",
        "--target",
        "dr",
    ]


def test_translate_command_in_a_dry_run_whole_file_catch_up(dag, with_config):
    _, cmd = render(dag, "translate", epochs(4, 6, dry_run=True, whole_file=True))
    app = cmd.index(str(ROOT / "spark_apps" / "translate.py"))
    assert cmd[app + 1 :] == [
        "--config",
        str(with_config),
        "--epoch",
        "4",
        "--through",
        "6",
        "--target",
        "dr",
        "--whole-file",
        "--dry-run",
    ]


def test_optional_flags_leave_no_empty_arguments(dag):
    for task_id in ("merge", "translate", "apply", "verify"):
        _, cmd = render(dag, task_id, epochs(3, 3))
        assert "" not in cmd
        assert "--dry-run" not in cmd and "--whole-file" not in cmd
        assert cmd[-6:] == ["--epoch", "3", "--through", "3", "--target", "dr"]


def test_package_zip_holds_the_package(dag, tmp_path):
    render(dag, "merge", epochs(1, 1))
    (zip_path,) = (tmp_path / "build").glob("epochsync-*.zip")
    names = zipfile.ZipFile(zip_path).namelist()
    assert "epochsync/__init__.py" in names and "epochsync/config.py" in names
    assert "epochsync/airflow/timetable.py" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    # deterministic: rendering again reuses the same file
    render(dag, "apply", epochs(1, 1))
    assert list((tmp_path / "build").glob("epochsync-*.zip")) == [zip_path]


def test_spark_job_gets_the_venv_python_and_spark_submit(dag):
    import sys

    task, _ = render(dag, "verify", epochs(2, 2))
    assert task.env_vars["PYSPARK_PYTHON"] == sys.executable
    assert task.env_vars["PATH"].split(":")[0] == str(Path(sys.executable).parent)
    assert (Path(sys.executable).parent / "spark-submit").exists()


def test_connections_from_airflow_are_handed_to_the_spark_job(dag, monkeypatch):
    """A connection defined only in Airflow reaches the Spark driver through its environment."""
    from unittest import mock

    monkeypatch.delenv("AIRFLOW_CONN_REPLICA_S3")

    class Conn:
        conn_type, host, login, password, port = "aws", None, "key", "secret", None
        extra_dejson = {"endpoint_url": "http://127.0.0.1:9"}

    from airflow.sdk import BaseHook

    real = BaseHook.get_connection
    with mock.patch(
        "airflow.sdk.BaseHook.get_connection", side_effect=lambda c: Conn() if c == "replica_s3" else real(c)
    ) as get:
        task, _ = render(dag, "apply", epochs(2, 2))
    assert [c.args[0] for c in get.call_args_list].count("replica_s3") == 1
    conn = json.loads(task.env_vars["AIRFLOW_CONN_REPLICA_S3"])
    assert conn["login"] == "key" and conn["extra"]["endpoint_url"] == "http://127.0.0.1:9"
    from epochsync.connections import resolve_s3

    monkeypatch.setenv("AIRFLOW_CONN_REPLICA_S3", task.env_vars["AIRFLOW_CONN_REPLICA_S3"])
    s3 = resolve_s3("replica_s3")
    assert (s3.access_key, s3.secret_key, s3.endpoint_url) == ("key", "secret", "http://127.0.0.1:9")


def test_inject_failure_param_reaches_the_apply_only(dag):
    _, cmd = render(dag, "apply", epochs(2, 2), params={"inject_failure": "after=3,epoch=2"})
    assert cmd[-2:] == ["--inject-failure", "after=3,epoch=2"]
    _, cmd = render(dag, "verify", epochs(2, 2), params={"inject_failure": "after=3"})
    assert "--inject-failure" not in cmd


def test_dry_run_skips_apply_and_verify(dag):
    from airflow.sdk.exceptions import AirflowSkipException

    for task_id in ("apply", "verify"):
        task = dag.get_task(task_id)
        with pytest.raises(AirflowSkipException, match="dry run"):
            task.execute({"params": {"dry_run": True}, "ti": FakeTI(epochs(1, 1, dry_run=True))})


def test_cluster_master_from_the_connection(dag, monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "spark://spark-master", "port": 7077})
    )
    _, cmd = render(dag, "merge", epochs(1, 1))
    assert cmd[1:3] == ["--master", "spark://spark-master:7077"]


def test_ingest_task_skips_spark_submit_when_the_epoch_is_already_ingested(dag, monkeypatch):
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    import epochsync.ingest

    asked, submitted = [], []
    monkeypatch.setattr(
        epochsync.ingest, "ingest_is_current", lambda cfg, source, first, last, consumer: asked.append(
            (source, first, last, consumer)) or "epoch 7 of source 'lustre1' already ingested"
    )  # fmt: skip
    monkeypatch.setattr(SparkSubmitOperator, "execute", lambda self, context: submitted.append(self.task_id))
    task = dag.get_task("ingest")
    context = {"ti": FakeTI(epochs(7, 7)), "params": {"dry_run": False, "reingest": False}}
    task.render_template_fields(context)
    assert task.execute(context) is None
    assert asked == [("lustre1", 7, 7, "dr")] and submitted == []
    # the reingest param forces the spark-submit
    task.execute({**context, "params": {"dry_run": False, "reingest": True}})
    assert submitted == ["ingest"]
