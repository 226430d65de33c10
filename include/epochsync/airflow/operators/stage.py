"""The epoch DAG's Spark stages as thin clients of the long-lived Spark Connect server.

Each stage task is a :class:`EpochStageOperator`: the provider's ``PySparkOperator``
with a ``spark_connect`` connection (``spark_connect_default``). The provider opens a
Connect session on the server named by the connection (no JVM starts in the task),
:func:`run_stage_task` ships the ``epochsync`` package to it, tags its jobs
(``epochsync-<stage>-<target>-e<epoch>``: visible in the Spark UI and event log) and calls
the same stage function ``epochsync replicate`` calls. The stage's figures go to the
task log and to XCom.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from airflow.providers.apache.spark.operators.spark_pyspark import PySparkOperator

from epochsync.spark import SPARK_CONN_ID

log = logging.getLogger("epochsync.stage")

#: stages that run as Spark Connect clients
SPARK_STAGES = ("ingest", "merge", "translate", "apply", "verify", "publish")


def stage_tag(stage: str, target: str, epoch: int) -> str:
    """The session tag of a stage's Spark jobs (Spark's ``spark.job.tags``)."""
    return f"epochsync-{stage}-{target}-e{epoch}"


def run_stage_task(
    stage: str,
    config_path: str,
    target: str,
    source: str,
    skip_in_dry_run: bool = False,
    spark=None,
    ti=None,
    params=None,
    session_key: str | None = None,
    **_,
) -> Any:
    """One stage of the run's epochs (from the ``wait_epoch_closed`` XCom) on ``spark``; returns its figures."""
    from epochsync.airflow.tasks import EPOCHS_TASK
    from epochsync.core.config import load_config
    from epochsync.core.errors import EpochsyncError
    from epochsync.core.jsonable import jsonable
    from epochsync.spark import base_remote, is_connect, is_session_closed, keyed_remote, prepare_session

    params = dict(params or {})
    if spark is not None and session_key and is_connect(spark):
        # the session is the DAG's (EpochStageOperator.execute): the provider's stop()
        # after this task, whatever way it ends, must close the client only, not release it
        spark.release_session_on_close = False
    epochs = ti.xcom_pull(task_ids=EPOCHS_TASK)
    first, through = int(epochs["first"]), int(epochs["through"])
    if skip_in_dry_run and epochs.get("dry_run"):
        from airflow.sdk.exceptions import AirflowSkipException

        stops = (
            "a feed's dry run stops after merge: nothing is published"
            if stage == "publish"
            else ("a dry run stops after translate")
        )
        raise AirflowSkipException(f"dry run: {stage} skipped ({stops})")
    cfg = load_config(config_path)
    if stage == "ingest" and not params.get("reingest"):
        from epochsync.stages.ingest.commit import ingest_is_current

        reason = ingest_is_current(cfg, source, first, through, target)
        if reason:
            # a second target (or a retry) of an epoch whose records are in the warehouse
            log.info("ingest: %s; nothing to do (param reingest=true forces it)", reason)
            return {"skipped": reason}
    if spark is not None:
        try:
            prepare_session(spark)
        except Exception as exc:
            if not (session_key and is_session_closed(exc)):
                raise
            # the DAG's session was closed between the operator's check and here (idle
            # past the server's timeout): the DAG moves to a new one
            from pyspark.sql import SparkSession

            log.info("the DAG's Spark Connect session was closed (idle); opening a new one")
            spark = SparkSession.builder.remote(keyed_remote(base_remote(spark), session_key, renew=True)).create()
            spark.release_session_on_close = False
            prepare_session(spark)
        spark.addTag(stage_tag(stage, target, through))
    try:
        out = _call_stage(stage, cfg, target, source, first, through, spark, epochs, params)
    except EpochsyncError as exc:
        # one line a person can act on, not a traceback: the run is red with this message, and
        # the target's event log says why (``epochsync status``, the report, the demo)
        from airflow.sdk.exceptions import AirflowException

        _record_failure(cfg, target, through, stage, str(exc))
        raise AirflowException(f"{stage} of target {target} epochs {first}..{through}: {exc}") from None
    except Exception as exc:
        _record_failure(cfg, target, through, stage, f"{type(exc).__name__}: {exc}")
        raise
    log.info(
        "%s of target %s epochs %d..%d: %s", stage, target, first, through, json.dumps(jsonable(out), sort_keys=True)
    )
    if stage == "publish":
        # the feed's commit point (_feed.json) is written: its asset's event
        from epochsync.airflow.assets import mark_committed

        mark_committed(_.get("outlet_events"), target, through, first)
    if stage == "translate" and epochs.get("dry_run"):
        log.info(
            "dry run: plan of %s epochs %d..%d: %s", target, first, through, json.dumps(jsonable(out), sort_keys=True)
        )
    return jsonable(out)


def _record_failure(cfg, target: str, epoch: int, stage: str, message: str) -> None:
    """A FAILED event in ``target``'s event log: the epoch, the stage and why (never raises: the
    stage's own error is what the task must end with)."""
    from epochsync.warehouse.events import FAILED, record_event

    try:
        record_event(cfg.warehouse, target, FAILED, epoch, stage=stage, message=message[:500])
    except Exception:  # the warehouse itself may be what failed
        log.warning("could not record the failure of %s epoch %d in the event log", target, epoch, exc_info=True)


def _call_stage(stage: str, cfg, target: str, source: str, first: int, through: int, spark, epochs: dict, params):
    import time

    from epochsync.journal.undo import write_stage_stats
    from epochsync.stages import apply, translate, verify

    if stage == "ingest":
        from epochsync.stages.ingest import run_ingest

        t0 = time.monotonic()
        out = run_ingest(cfg, source, first, through, spark, consumer=target, progress=log.info)
        write_stage_stats(
            cfg.warehouse, target, through, "ingest", {**_flat(out), "seconds": round(time.monotonic() - t0, 3)}
        )
        return out
    if stage == "merge":
        from epochsync.stages.merge import run_merge

        out = run_merge(cfg, target, first, through, spark)
        write_stage_stats(cfg.warehouse, target, through, "merge", _flat(out))
        return out
    if stage == "translate":
        return translate.run_translate(
            cfg, target, through, spark, whole_file=bool(epochs.get("whole_file")), first_epoch=first
        )
    if stage == "apply":
        return apply.run_apply(
            cfg, target, through, spark, inject=params.get("inject_failure") or None, first_epoch=first
        )
    if stage == "publish":  # feed targets: in place of translate, apply, verify and commit
        from epochsync.stages.publish import publish_epoch

        return publish_epoch(cfg, target, first, through, spark, inject=params.get("inject_failure") or None)
    if stage == "verify":  # attributes here, file contents on the executors
        return verify.run_verify(cfg, target, through, spark, first_epoch=first)
    raise ValueError(f"unknown stage {stage!r}")


def _flat(d: dict) -> dict:
    return {k: v for k, v in (d or {}).items() if isinstance(v, (int, float, str, bool))}


class EpochStageOperator(PySparkOperator):
    """One Spark stage of the epoch DAG: a ``PySparkOperator`` on the ``spark_connect`` connection.

    ``EPOCHSYNC_SPARK_CONN_ID`` names another connection (a cluster's Connect server).
    """

    def __init__(
        self,
        *,
        stage: str,
        config_path: str,
        target: str,
        source: str,
        skip_in_dry_run: bool = False,
        conn_id: str | None = None,
        **kwargs,
    ):
        super().__init__(
            python_callable=run_stage_task,
            conn_id=conn_id or os.environ.get("EPOCHSYNC_SPARK_CONN_ID", SPARK_CONN_ID),
            op_kwargs={
                "stage": stage,
                "config_path": config_path,
                "target": target,
                "source": source,
                "skip_in_dry_run": skip_in_dry_run,
            },
            **kwargs,
        )
        self.stage = stage

    def execute(self, context):
        """Open the DAG's shared Connect session (:func:`epochsync.spark.open_keyed_remote`, keyed by
        the DAG, the config and the package); returns what the stage returns."""
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
        from airflow.providers.common.compat.sdk import BaseHook

        from epochsync.spark import forget_default_session, open_keyed_remote, package_zip

        if not self.conn_id or "spark.remote" in self.config_kwargs:  # a task that names its own
            return super().execute(context)
        conn = BaseHook.get_connection(self.conn_id)
        if conn.conn_type != SparkConnectHook.conn_type:
            return super().execute(context)
        run = context["dag_run"]
        url = SparkConnectHook(self.conn_id).get_connection_url()
        own, own_args = self.config_kwargs, self.op_kwargs
        # One session per DAG and config, kept across the DAG's runs: they are serial
        # (max_active_runs=1, one writer per target), and a session keeps its package and
        # its Python workers, so a run after the first finds them warm (bench-warm's DAG
        # run 25.1 -> 21.6 s). The server closes a session idle for its timeout (10 min on
        # the embedded server): open_keyed_remote renews the key before the provider's
        # getOrCreate, which would fail on the closed session. The config path in the key:
        # two deployments with the same DAG id never share a session; the package's hash:
        # changed code never shares Python workers with the old.
        key = f"{run.dag_id}/{own_args.get('config_path', '')}/{os.path.basename(package_zip())}"
        self.config_kwargs = {**own, "spark.remote": open_keyed_remote(url, key)}
        self.op_kwargs = {**own_args, "session_key": key}
        forget_default_session()  # the provider's getOrCreate must open the URL above
        try:
            return super().execute(context)
        finally:  # the operator object may serve another run in this process (dag.test())
            self.config_kwargs, self.op_kwargs = own, own_args


def spark_conn_id() -> str:
    """The Spark Connect connection every Spark task uses."""
    return os.environ.get("EPOCHSYNC_SPARK_CONN_ID", SPARK_CONN_ID)


def spark_connect_conn_json(url: str) -> str:
    """``AIRFLOW_CONN_SPARK_CONNECT_DEFAULT`` for a server at ``sc://host:port``."""
    from urllib.parse import urlparse

    u = urlparse(url)
    return json.dumps({"conn_type": "spark_connect", "host": u.hostname, "port": u.port})
