"""What each Spark stage task of the epoch DAG sends to the stage functions, without running Spark.

The tasks are the provider's ``PySparkOperator`` on the ``spark_connect`` connection; here
the session is a stand-in that records tags, and the stage functions are replaced by
recorders, so each test checks the arguments a real run would pass.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


class FakeTI:
    def __init__(self, epochs):
        self.epochs = epochs

    def xcom_pull(self, task_ids=None, key="return_value", **_):
        assert task_ids == "wait_epoch_closed" and key == "return_value"
        return self.epochs


class FakeSpark:
    """Records what a stage does to its session (tags); Spark Connect is not contacted."""

    def __init__(self):
        self.tags: list[str] = []

    def addTag(self, tag):  # noqa: N802 - pyspark's name
        self.tags.append(tag)


@pytest.fixture()
def dag(with_config):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(ROOT / "dags"))
    assert not bag.import_errors
    return bag.dags["epochsync__lustre1__dr"]


@pytest.fixture()
def calls(monkeypatch):
    """Replace the stage functions by recorders: ``calls`` lists (name, args, kwargs)."""
    import epochsync.spark
    import epochsync.stages.apply
    import epochsync.stages.ingest
    import epochsync.stages.ingest.commit
    import epochsync.stages.merge
    import epochsync.stages.translate
    import epochsync.stages.verify

    seen: list = []

    def recorder(name, result):
        def fn(*args, **kwargs):
            seen.append((name, args, kwargs))
            return result

        return fn

    monkeypatch.setattr(epochsync.spark, "prepare_session", recorder("prepare_session", None))
    monkeypatch.setattr(epochsync.stages.ingest, "run_ingest", recorder("run_ingest", {"records": 7}))
    monkeypatch.setattr(epochsync.stages.ingest.commit, "ingest_is_current", recorder("ingest_is_current", None))
    monkeypatch.setattr(epochsync.stages.merge, "run_merge", recorder("run_merge", {"changes": 3}))
    monkeypatch.setattr(epochsync.stages.translate, "run_translate", recorder("run_translate", {"namespace_ops": 1}))
    monkeypatch.setattr(epochsync.stages.apply, "run_apply", recorder("run_apply", {"bytes_pulled": 5}))
    monkeypatch.setattr(epochsync.stages.verify, "run_verify", recorder("run_verify", {"ok": True}))
    monkeypatch.setattr("epochsync.journal.undo.write_stage_stats", recorder("write_stage_stats", None))
    return seen


def run(dag, task_id, epochs, params=None, spark=None):
    task = dag.get_task(task_id)
    kwargs = dict(task.op_kwargs)
    from epochsync.airflow.operators.stage import run_stage_task

    assert task.python_callable is run_stage_task
    full = {
        "epoch": None,
        "dry_run": False,
        "whole_file": False,
        "inject_failure": None,
        "reingest": False,
        "max_epochs_per_run": 1,
        **(params or {}),
    }
    return run_stage_task(**kwargs, spark=spark, ti=FakeTI(epochs), params=full)


def epochs(first, through, dry_run=False, whole_file=False):
    return {"first": first, "through": through, "dry_run": dry_run, "whole_file": whole_file}


def test_spark_stages_are_pyspark_tasks_on_the_spark_connect_connection(dag):
    from airflow.providers.apache.spark.operators.spark_pyspark import PySparkOperator

    for name in ("ingest", "merge", "translate", "apply", "verify", "rollback"):
        task = dag.get_task(name)
        assert isinstance(task, PySparkOperator), name
        assert task.conn_id == "spark_connect_default", name
    # commit writes the manifest and the cursors only: no Spark session
    assert not isinstance(dag.get_task("commit"), PySparkOperator)


def test_the_connection_names_the_connect_server(monkeypatch):
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

    from epochsync.airflow.operators.stage import spark_connect_conn_json

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT_DEFAULT", spark_connect_conn_json("sc://127.0.0.1:15002"))
    assert SparkConnectHook("spark_connect_default").get_connection_url() == "sc://127.0.0.1:15002/"


def test_every_stage_task_of_every_run_opens_the_dags_session(dag, monkeypatch):
    """One Connect session per DAG and config (its runs are serial): each task's ``spark.remote``
    names the DAG's kept session, whatever the run, so a run finds the previous run's package
    and Python workers warm. (The renewal of a closed one: tests/unit/test_run_session.py.)"""
    from airflow.providers.apache.spark.operators.spark_pyspark import PySparkOperator

    import epochsync.spark
    from epochsync.airflow.operators.stage import spark_connect_conn_json
    from epochsync.spark import keyed_remote, package_zip

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT_DEFAULT", spark_connect_conn_json("sc://127.0.0.1:15002"))
    opened = []
    # no server here: the check of the kept session returns its URL
    monkeypatch.setattr(
        epochsync.spark, "open_keyed_remote", lambda url, key: opened.append(key) or keyed_remote(url, key)
    )
    seen = {}
    monkeypatch.setattr(
        PySparkOperator, "execute", lambda self, context: seen.setdefault(self.task_id, dict(self.config_kwargs))
    )

    class Run:
        dag_id, run_id = dag.dag_id, "manual__2026-11-23T00:00:00+00:00"

    class Later:
        dag_id, run_id = dag.dag_id, "scheduled__2026-11-24T00:00:00+00:00"

    for name in ("ingest", "merge", "translate", "apply", "verify"):
        dag.get_task(name).execute({"dag_run": Run})
    later = {}
    monkeypatch.setattr(
        PySparkOperator, "execute", lambda self, context: later.setdefault(self.task_id, dict(self.config_kwargs))
    )
    for name in ("ingest", "apply"):
        dag.get_task(name).execute({"dag_run": Later})
    config_path = dag.get_task("ingest").op_kwargs["config_path"]
    key = f"{Run.dag_id}/{config_path}/{os.path.basename(package_zip())}"
    want = keyed_remote("sc://127.0.0.1:15002/", key)
    assert {name: kw["spark.remote"] for name, kw in seen.items()} == dict.fromkeys(seen, want)
    assert len(seen) == 5
    assert {name: kw["spark.remote"] for name, kw in later.items()} == dict.fromkeys(later, want)
    assert opened == [key] * 7


def test_ingest_merge_translate_apply_verify_get_the_run_epochs(dag, calls, with_config):
    spark = FakeSpark()
    assert run(dag, "ingest", epochs(3, 5), spark=spark) == {"records": 7}
    assert run(dag, "merge", epochs(3, 5), spark=spark) == {"changes": 3}
    run(dag, "translate", epochs(3, 5, whole_file=True), spark=spark)
    run(dag, "apply", epochs(3, 5), params={"inject_failure": "after=3"}, spark=spark)
    run(dag, "verify", epochs(3, 5), spark=spark)
    by = {name: (args, kw) for name, args, kw in calls}
    args, kw = by["run_ingest"]
    assert args[1:] == ("lustre1", 3, 5, spark) and kw["consumer"] == "dr"
    assert by["run_merge"][0][1:] == ("dr", 3, 5, spark)
    args, kw = by["run_translate"]
    assert args[1:] == ("dr", 5, spark) and kw == {"whole_file": True, "first_epoch": 3}
    args, kw = by["run_apply"]
    assert args[1:] == ("dr", 5, spark) and kw == {"inject": "after=3", "first_epoch": 3}
    # verify's file contents are read on the executors of the run's session
    args, kw = by["run_verify"]
    assert args[1:] == ("dr", 5, spark) and kw == {"first_epoch": 3}
    # every stage's Spark jobs carry its tag (the Spark UI and the event log show them)
    assert spark.tags == [
        "epochsync-ingest-dr-e5",
        "epochsync-merge-dr-e5",
        "epochsync-translate-dr-e5",
        "epochsync-apply-dr-e5",
        "epochsync-verify-dr-e5",
    ]


def test_dry_run_skips_apply_and_verify(dag, calls):
    from airflow.sdk.exceptions import AirflowSkipException

    for name in ("apply", "verify"):
        with pytest.raises(AirflowSkipException, match="dry run"):
            run(dag, name, epochs(2, 2, dry_run=True), spark=FakeSpark())
    assert not [c for c in calls if c[0] in ("run_apply", "run_verify")]


def test_ingest_is_skipped_when_the_epoch_is_already_ingested(dag, calls, monkeypatch):
    import epochsync.stages.ingest
    import epochsync.stages.ingest.commit

    monkeypatch.setattr(
        epochsync.stages.ingest.commit, "ingest_is_current", lambda *a: "already ingested from the same files"
    )
    spark = FakeSpark()
    assert run(dag, "ingest", epochs(4, 4), spark=spark) == {"skipped": "already ingested from the same files"}
    assert not [c for c in calls if c[0] == "run_ingest"] and spark.tags == []
    # the reingest param forces it
    run(dag, "ingest", epochs(4, 4), params={"reingest": True}, spark=spark)
    assert [c for c in calls if c[0] == "run_ingest"]


def test_a_stage_error_is_one_line_naming_stage_target_and_epochs(dag, calls, monkeypatch):
    from airflow.sdk.exceptions import AirflowException

    import epochsync.stages.merge
    from epochsync.core.errors import EpochError

    def boom(*a, **k):
        raise EpochError("no snapshot for epoch 2: run the merge of epoch 2 first")

    monkeypatch.setattr(epochsync.stages.merge, "run_merge", boom)
    with pytest.raises(AirflowException, match=r"^merge of target dr epochs 3\.\.3: no snapshot for epoch 2"):
        run(dag, "merge", epochs(3, 3), spark=FakeSpark())


def test_package_zip_holds_the_package(tmp_path, monkeypatch):
    from epochsync.spark import package_zip

    monkeypatch.setenv("EPOCHSYNC_BUILD_DIR", str(tmp_path))
    path = package_zip()
    assert package_zip() == path  # built once per source tree
    names = zipfile.ZipFile(path).namelist()
    assert "epochsync/__init__.py" in names and "epochsync/stages/merge.py" in names
    assert not [n for n in names if "__pycache__" in n]
    assert json.loads(json.dumps(names))  # plain names, stable order


def feed_dag(tmp_path, **feed):
    """The epoch DAG of a config whose one target is the feed ``audit`` (``feed``: more of its keys)."""
    import yaml

    from epochsync.airflow.dags import build_epoch_dag
    from epochsync.core.config import load_config

    (tmp_path / "epochsync.yaml").write_text(
        yaml.safe_dump(
            {
                "warehouse": f"file://{tmp_path / 'wh'}",
                "sources": [
                    {
                        "name": "s",
                        "root_fid": "[0x1:0x1:0x0]",
                        "servers": ["MDT0000"],
                        "changelogs": {"uri": f"file://{tmp_path}/cl/", "format": "jsonl"},
                        "store": {"conn_id": "source_s3", "bucket": "b"},
                        "epoch": {"interval": "1m", "start": "2026-01-01T00:00:00Z"},
                    }
                ],
                "targets": [{"name": "audit", "source": "s", "kind": "feed", "path": str(tmp_path / "feed"), **feed}],
            }
        )
    )
    cfg = load_config(tmp_path / "epochsync.yaml")
    return build_epoch_dag(cfg, cfg.sources[0], cfg.targets[0], doc_md="## replicate one source into one target")


def test_a_feed_target_gets_ingest_merge_publish(tmp_path, calls):
    """A ``kind: feed`` target's epoch DAG publishes in place of translate..commit, and has no hydrate DAG."""
    dag = feed_dag(tmp_path)
    assert set(dag.task_ids) == {"wait_epoch_closed", "ingest", "merge", "publish"}
    assert dag.get_task("publish").upstream_task_ids == {"merge"}
    assert dag.get_task("publish").pool == "epochsync_target_audit" or dag.get_task("publish").pool.endswith("audit")
    import epochsync.stages.publish
    from epochsync.airflow.operators.stage import run_stage_task

    published = []
    epochsync.stages.publish.publish_epoch, original = (
        (lambda *a, **k: published.append((a, k)) or {"epoch": 3}),
        epochsync.stages.publish.publish_epoch,
    )
    try:
        task = dag.get_task("publish")
        out = run_stage_task(
            **task.op_kwargs, spark=FakeSpark(), ti=FakeTI(epochs(3, 3)), params={"inject_failure": None}
        )
    finally:
        epochsync.stages.publish.publish_epoch = original
    assert out == {"epoch": 3} and published[0][0][1:4] == ("audit", 3, 3)


def test_make_airflow_shows_a_feed_dag_next_to_the_replicas(tmp_path, monkeypatch):
    from epochsync.airflow.dags import dags_from_env
    from epochsync_dev.devstack import add_feed_target
    from epochsync_dev.simulate.verb import write_config

    config = write_config(tmp_path, bucket="b", conn_id="source_s3", servers=("MDT0000",), root_fid="[0x1:0x1:0x0]")
    add_feed_target(config)
    add_feed_target(config)  # once
    monkeypatch.setenv("EPOCHSYNC_CONFIG", str(config))
    epoch_dags = dags_from_env("epoch", "doc")
    assert set(epoch_dags) == {"epochsync__sim__local", "epochsync__sim__s3", "epochsync__sim__audit"}
    assert "publish" in epoch_dags["epochsync__sim__audit"].task_ids
    assert set(dags_from_env("hydrate", "doc")) == {"epochsync_hydrate__local", "epochsync_hydrate__s3"}


def test_the_feed_dag_says_what_it_does_and_its_dry_run_publishes_nothing(tmp_path, calls):
    """Seen in the UI of make airflow: the feed DAG carried the replica's doc (translate, apply,
    rollback), a whole_file param, and a dry_run param "stop after translate" that published anyway."""
    from airflow.sdk.exceptions import AirflowSkipException

    import epochsync.stages.publish

    dag = feed_dag(tmp_path, fileset=["/d00005"], events=["create", "delete"])
    assert dag.description == "publish s's net change into the feed audit, one epoch per run"
    assert "feed" in dag.tags
    assert "publish one source's net change into a feed" in dag.doc_md
    assert "replicate one source into one target" not in dag.doc_md and "rollback" not in dag.doc_md
    assert "| filters | fileset `/d00005`; events create, delete |" in dag.doc_md
    assert set(dag.params.keys()) == {"epoch", "dry_run", "max_epochs_per_run", "inject_failure", "reingest"}
    assert "publish" in dag.params.get_param("inject_failure").description
    assert "nothing is published" in dag.params.get_param("dry_run").description
    published = []
    original, epochsync.stages.publish.publish_epoch = (
        epochsync.stages.publish.publish_epoch,
        lambda *a, **k: published.append(a),
    )
    try:
        task = dag.get_task("publish")
        with pytest.raises(AirflowSkipException, match="nothing is published"):
            run_stage = task.python_callable
            run_stage(**task.op_kwargs, spark=FakeSpark(), ti=FakeTI(epochs(2, 2, dry_run=True)), params={})
    finally:
        epochsync.stages.publish.publish_epoch = original
    assert published == []
