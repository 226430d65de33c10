"""The DAG factory: one epoch DAG per (source, target), one hydrate and one audit DAG per target, one
purge DAG per source.

``dags/*.py`` call :func:`dags_from_env` with their markdown docstring; everything
is declared from the YAML config named by ``$EPOCHSYNC_CONFIG``. Parsing reads only
that small local file: no store, no Spark, no network at parse time.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime, timedelta

from airflow.sdk import DAG, Param
from airflow.task.trigger_rule import TriggerRule

from epochsync.airflow.assets import target_asset
from epochsync.airflow.operators.stage import EpochStageOperator, spark_conn_id
from epochsync.airflow.sensors.epoch_closed import EpochClosedSensor
from epochsync.airflow.tasks import commit_task, config_path_from_env, cut_task, rollback_task
from epochsync.airflow.timetable import NEVER, EpochTimetable
from epochsync.core.config import Config, SourceConfig, TargetConfig, load_config
from epochsync.journal.lease import pool_name

log = logging.getLogger(__name__)

#: the tasks of an epoch DAG (a live source's also start with ``cut``)
EPOCH_TASKS = (
    "wait_epoch_closed",
    "ingest",
    "merge",
    "translate",
    "wait_previous_epoch",
    "apply",
    "verify",
    "commit",
    "rollback",
)
#: the tasks that write the target: ordered by the target's manifest (``wait_previous_epoch``
#: before them), not by ``depends_on_past``, which orders a task after the same task of the
#: previous run only (apply after the previous apply, not after the previous commit) and, after
#: a failure, holds the next run silently for ever (``epochsync.airflow.sensors.previous_epoch``)
ORDERED_BY_MANIFEST = ("wait_previous_epoch", "apply", "verify", "commit", "rollback")
#: idempotent stages that only write their own warehouse output: safe to retry on a transient error.
#: apply, verify and commit are not retried: their failure means rollback.
TRANSIENT_STAGES = ("ingest", "merge", "translate")


def epoch_dag_id(source: str, target: str) -> str:
    """Returns the id of the epoch DAG of ``source`` into ``target``: ``epochsync__<source>__<target>``."""
    return f"epochsync__{source}__{target}"


def hydrate_dag_id(target: str) -> str:
    """Returns the id of ``target``'s hydrate DAG: ``epochsync_hydrate__<target>``."""
    return f"epochsync_hydrate__{target}"


def audit_dag_id(target: str) -> str:
    """The DAG id of ``target``'s scheduled audit."""
    return f"epochsync_audit__{target}"


def purge_dag_id(source: str) -> str:
    """Returns the id of ``source``'s purge DAG: ``epochsync_purge__<source>``."""
    return f"epochsync_purge__{source}"


def _target_where(t: TargetConfig) -> str:
    if t.kind == "s3" or (t.kind == "feed" and t.bucket):
        return f"`s3://{t.bucket}/{t.prefix}` (connection `{t.conn_id}`)"
    return f"`{t.path}`"


#: The doc of a feed target's epoch DAG (``dags/epochsync_epoch.py``'s docstring describes a replica's).
FEED_DOC_MD = """
## epochsync: publish one source's net change into a feed, one epoch per run

Each run publishes one **epoch** of the source (its time window is the run's data
interval) as one ordered file under the feed's folder or S3 prefix, for the feed's
consumers (`epochsync feed register|ack|status|hydrate`):

1. `wait_epoch_closed`: every server of the source has written its `EPOCH` record;
2. `ingest`: the epoch's changelog records → warehouse Parquet (Spark);
3. `merge`: the net change per file (Spark); a **dry run** stops here (nothing is published);
4. `publish`: the epoch's changes (`NEW`, `LINK`, `MODIFY`, `DELETE`, `RENAME`, filtered by
   the feed's `fileset` and `events`) as `epochs/<E>.jsonl.gz` (or `.parquet`), then
   `_feed.json`, the commit point, at E.

A failed publish leaves `_feed.json` at the previous epoch: nothing to roll back, the
rerun writes the same bytes. Runs never overlap and each epoch waits for the previous one
(`max_active_runs=1`, `depends_on_past`).

**Trigger** with params `epoch`, `dry_run`, `max_epochs_per_run` (a catch-up publishes one
file named by its last epoch), `inject_failure` (`after=0`: the publish fails before its
epoch file is written; `after=1`: after it, before `_feed.json`).
**Backfill** missed epochs: `airflow backfill create --dag-id <this dag> --from-date
<start of first epoch> --to-date <start of last epoch>`.
"""


def _epoch_params(feed: bool) -> dict[str, Param]:
    """The epoch DAG's run params; a feed's say what they do to a publish (it has no translate or apply)."""
    params = {
        "epoch": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            title="epoch",
            description=f"Epoch to {'publish' if feed else 'replicate'}; empty = the epoch of the run's data interval.",
        ),
        "dry_run": Param(
            False,
            type="boolean",
            description="Stop after merge: nothing is published (the merge log shows the net change)."
            if feed
            else "Plan only: stop after translate and print the plan summary in its log.",
        ),
        "whole_file": Param(
            False,
            type="boolean",
            description="Pull every changed file whole instead of only its modified extents.",
        ),
        "inject_failure": Param(
            # null, not "": the UI's form counts an empty non-nullable string as missing
            None,
            type=["null", "string"],
            title="inject_failure (demo and tests)",
            description="Fault spec for the publish stage: 'after=0' fails before the epoch file is written, "
            "'after=1' after it, before _feed.json (fires once per feed and epoch; the rerun publishes the "
            "same bytes). Empty: no fault."
            if feed
            else "Fault spec for the apply stage, e.g. 'after=3': fail after 3 mutations to see "
            "the rollback (fires once per target and epoch). Empty: no fault.",
        ),
        "reingest": Param(
            False,
            type="boolean",
            description="Ingest the epoch again even if its records are in the warehouse and its changelog "
            "files are unchanged (by default a second target's run reuses them).",
        ),
        "max_epochs_per_run": Param(
            1,
            type="integer",
            minimum=1,
            description="Catch up: merge up to this many closed epochs after the published one and publish "
            "them as one file named by the last."
            if feed
            else "Catch up: merge up to this many closed epochs after the committed one and "
            "commit at the last boundary.",
        ),
    }
    if feed:  # a feed pulls no bytes: it publishes what changed, not the data
        del params["whole_file"]
    return params


def build_epoch_dag(
    config: Config,
    source: SourceConfig,
    target: TargetConfig,
    *,
    doc_md: str = "",
    catchup: bool = True,
    schedule_from: datetime | str | None = None,
) -> DAG:
    """``epochsync__<source>__<target>``: one run per epoch, wait → ingest → … → commit, rollback on failure.

    ``schedule_from`` (a time, or ``"never"``): the scheduler creates runs only for the
    epochs starting at or after it; earlier epochs run when triggered or backfilled (a
    replica added to a source that is already old, or a demo driven by hand).
    """
    cfg = config.file
    interval = source.epoch.interval_s
    feed = target.kind == "feed"
    if feed:
        doc_md = FEED_DOC_MD
    filters = ""
    if feed:
        fileset = ", ".join(f"`{f}`" for f in target.fileset) or "the whole namespace"
        filters = f"| filters | fileset {fileset}; events {', '.join(target.events)} |\n| format | {target.format} |\n"
    doc = (
        f"{doc_md.strip()}\n\n"
        f"### This DAG\n\n"
        f"| | |\n|---|---|\n"
        f"| source | `{source.name}`: servers {', '.join(f'`{s}`' for s in source.servers)}; "
        f"changelogs `{source.changelogs.uri}` ({source.changelogs.format}) |\n"
        f"| target | `{target.name}` ({target.kind}) at {_target_where(target)} |\n"
        f"{filters}"
        f"| epochs | every {EpochTimetable(source.epoch.start, interval).summary} |\n"
        f"| config | `{cfg}` |\n"
        f"| warehouse | `{config.warehouse}` |\n"
    )
    dag = DAG(
        dag_id=epoch_dag_id(source.name, target.name),
        description=(
            f"publish {source.name}'s net change into the feed {target.name}, one epoch per run"
            if feed
            else f"replicate {source.name} into {target.name}, one epoch per run"
        ),
        doc_md=doc,
        schedule=EpochTimetable(source.epoch.start, interval, schedule_from),
        # the epoch grid's start, never later: a manual run dated before the start date
        # would get no task instances at all (and "succeed" doing nothing)
        start_date=source.epoch.start,
        catchup=catchup,
        max_active_runs=1,
        tags=["epochsync", f"source:{source.name}", f"target:{target.name}", *(["feed"] if feed else [])],
        default_args={
            "owner": "epochsync",
            "depends_on_past": True,
            "retries": 0,
        },
        params=_epoch_params(feed),
    )
    with dag:
        wait = EpochClosedSensor(
            task_id="wait_epoch_closed",
            config_path=cfg,
            source=source.name,
            target=target.name,
            poke_interval=max(5.0, min(60.0, interval / 10)),
            # an epoch that does not close within a few intervals means a server is down
            timeout=max(600.0, 3 * interval),
            doc_md="Waits for every server's `EPOCH` record of the run's epoch; names the missing ones on timeout.",
        )

        from airflow.providers.apache.spark.operators.spark_pyspark import PySparkOperator
        from airflow.providers.standard.operators.python import PythonOperator

        if source.kind == "gluster":
            # a live source closes an epoch by being cut: on the epoch schedule, shared by its targets
            cut = PythonOperator(
                task_id="cut",
                python_callable=cut_task,
                op_kwargs={"config_path": cfg, "source": source.name},
                retries=1,
                retry_delay=timedelta(seconds=10),
                doc_md="Cuts the volume up to the run's epoch (Gluster's barrier, a read-only btrfs snapshot of "
                "every brick) and publishes the epoch's records; a cut taken already is not taken again.",
            )
            cut >> wait

        def stage(name: str, **kw) -> EpochStageOperator:
            retry = name in TRANSIENT_STAGES
            if name in ORDERED_BY_MANIFEST:
                kw["depends_on_past"] = False
            return EpochStageOperator(
                task_id=name,
                stage=name,
                config_path=cfg,
                target=target.name,
                source=source.name,
                retries=2 if retry else 0,
                retry_delay=timedelta(seconds=30),
                retry_exponential_backoff=retry,
                **kw,
            )

        ingest = stage("ingest", doc_md="Parses every server's changelog files of the run's epochs into the warehouse.")
        # one writer per target: every task that writes the target or its warehouse state
        # (snapshot, change set, plan, journal, manifest) takes the target's one-slot pool
        pool = pool_name(target.name)
        merge = stage(
            "merge",
            doc_md="Net change per fid: snapshot E-1 + records of the epochs -> snapshot E, change set.",
            pool=pool,
        )
        if target.kind == "feed":
            # a feed publishes the net change: the file of the epoch, then _feed.json (its commit
            # point); a failed publish leaves _feed.json at the previous epoch, nothing to roll back
            publish = stage(
                "publish",
                pool=pool,
                skip_in_dry_run=True,
                outlets=[target_asset(target.name)],
                doc_md="Publishes the epoch's net change (filtered) as one file, then commits _feed.json.",
            )
            wait >> ingest >> merge >> publish
            return dag
        translate = stage(
            "translate", doc_md="The plan: namespace operations, pulls and writes in the target's layout.", pool=pool
        )
        from epochsync.airflow.sensors.previous_epoch import PreviousEpochSensor

        gate = PreviousEpochSensor(
            task_id="wait_previous_epoch",
            config_path=cfg,
            source=source.name,
            target=target.name,
            depends_on_past=False,
            poke_interval=15.0,
            # the wait ends when the runs ahead end (commit or fail); the timeout is a backstop
            timeout=7 * 24 * 3600.0,
            doc_md="Holds apply until the target is committed at the epoch before this run's: waits while a run "
            "of an earlier epoch is in flight; fails at once, naming the missing epochs and the backfill that "
            "runs them, when none is.",
        )
        apply = stage(
            "apply",
            skip_in_dry_run=True,
            pool=pool,
            doc_md="Namespace operations here, data operations on the Spark executors, journaled first.",
        )
        verify = stage(
            "verify",
            skip_in_dry_run=True,
            pool=pool,
            doc_md="Checks every touched path of the target against the source at the epoch (file contents on "
            "the Spark executors).",
        )
        commit = PythonOperator(
            task_id="commit",
            python_callable=commit_task,
            op_kwargs={"config_path": cfg, "target": target.name},
            pool=pool,
            depends_on_past=False,
            # the target's asset: an event at every commit, the epoch in its extra (epochsync.airflow.assets)
            outlets=[target_asset(target.name)],
            doc_md="Writes the target manifest at the run's last epoch (last, atomically) and advances cursors; "
            f"updates the asset `{target_asset(target.name).name}` with the epoch.",
        )
        rollback = PySparkOperator(
            task_id="rollback",
            python_callable=rollback_task,
            conn_id=spark_conn_id(),
            op_kwargs={"config_path": cfg, "target": target.name},
            trigger_rule=TriggerRule.ONE_FAILED,
            pool=pool,
            depends_on_past=False,
            # rollback is idempotent and resumable: a transient error is retried
            retries=2,
            retry_delay=timedelta(seconds=10),
            doc_md="Runs only if apply, verify or commit failed: replays the undo journal, then fails the run.",
        )
        wait >> ingest >> merge >> translate >> gate >> apply >> verify >> commit
        [apply, verify, commit] >> rollback
    return dag


def build_hydrate_dag(config: Config, target: TargetConfig, *, doc_md: str = "") -> DAG:
    """``epochsync_hydrate__<target>``: seed the target from a source dump at a closed epoch (manual)."""
    from epochsync.airflow.tasks import hydrate_task

    source = config.source_of(target)
    dag = DAG(
        dag_id=hydrate_dag_id(target.name),
        description=f"seed {target.name} from a {source.name} namespace dump at a closed epoch",
        doc_md=f"{doc_md.strip()}\n\n### This DAG\n\nTarget `{target.name}` ({target.kind}) at "
        f"{_target_where(target)}, from source `{source.name}`; config `{config.file}`.\n",
        schedule=None,
        start_date=source.epoch.start,
        catchup=False,
        max_active_runs=1,
        tags=["epochsync", "hydrate", f"target:{target.name}"],
        default_args={"owner": "epochsync", "retries": 0},
        params={
            "epoch": Param(
                None,
                type=["null", "integer"],
                minimum=1,
                description="Closed epoch whose snapshot/epoch=E/ dump seeds the target; empty = the latest dump.",
            ),
            "dump_uri": Param(
                "",
                type="string",
                description="Where the source publishes snapshot/epoch=E/ dumps (file:// or s3://); "
                "empty = next to the changelogs.",
            ),
        },
    )
    with dag:
        _target_spark_task(
            "hydrate",
            hydrate_task,
            config,
            target,
            outlets=[target_asset(target.name)],
            doc_md="Full-object copies of every file in the dump, then the manifest at E (the target's asset "
            "updated with E).",
        )
    return dag


def _target_spark_task(task_id: str, fn, config: Config, target: TargetConfig, **kw):
    """A task of ``target``'s on the Spark Connect server, in the target's one-slot pool."""
    from airflow.providers.apache.spark.operators.spark_pyspark import PySparkOperator

    return PySparkOperator(
        task_id=task_id,
        python_callable=fn,
        conn_id=spark_conn_id(),
        op_kwargs={"config_path": config.file, "target": target.name},
        pool=pool_name(target.name),
        **kw,
    )


def build_purge_dag(config: Config, source: SourceConfig, *, doc_md: str = "") -> DAG:
    """``epochsync_purge__<source>``: drop changelogs and records below every consumer's cursor."""
    from epochsync.airflow.tasks import purge_task

    dag = DAG(
        dag_id=purge_dag_id(source.name),
        description=f"purge {source.name} changelogs and records every consumer has applied",
        doc_md=f"{doc_md.strip()}\n\n### This DAG\n\nSource `{source.name}`, changelogs "
        f"`{source.changelogs.uri}`, retention {source.retention.epochs} epochs, idle limit "
        f"{source.retention.idle_limit_s:g}s; consumers: "
        f"{', '.join(f'`{t.name}`' for t in config.targets if t.source == source.name) or 'none'}.\n",
        schedule=timedelta(seconds=max(3600.0, source.epoch.interval_s)),
        start_date=source.epoch.start,
        catchup=False,
        max_active_runs=1,
        tags=["epochsync", "purge", f"source:{source.name}"],
        default_args={"owner": "epochsync", "retries": 1, "retry_delay": timedelta(minutes=5)},
        params={"dry_run": Param(False, type="boolean", description="List what would be deleted, delete nothing.")},
    )
    with dag:
        from airflow.providers.standard.operators.python import PythonOperator

        PythonOperator(
            task_id="purge",
            python_callable=purge_task,
            op_kwargs={"config_path": config.file, "source": source.name},
            doc_md="Deletes below the minimum cursor and past retention; fails if a consumer blocks purging.",
        )
    return dag


def auditable(config: Config, target: TargetConfig) -> bool:
    """Can ``target`` be audited (an s3 or posix replica, of any source: ``epochsync audit``)?"""
    return target.kind != "feed"


def build_audit_dag(config: Config, target: TargetConfig, *, doc_md: str = "") -> DAG:
    """``epochsync_audit__<target>``: the committed epoch compared in full with the source, every
    ``targets[].audit.interval`` (only when triggered: ``never``)."""
    from epochsync.airflow.tasks import audit_task

    source = config.source_of(target)
    every = None if target.audit.interval_s == "never" else float(target.audit.interval_s)
    dag = DAG(
        dag_id=audit_dag_id(target.name),
        description=f"audit target {target.name}: its committed epoch against the source, in full",
        doc_md=f"{doc_md.strip()}\n\n### This DAG\n\nTarget `{target.name}` ({_target_where(target)}) of source "
        f"`{source.name}`, "
        + (f"every {every:g} s" if every else "only when triggered")
        + (", bytes too (`deep`)" if target.audit.deep else ", metadata (trigger with `deep` for the bytes)")
        + ("; what differs is repaired (`repair`)" if target.audit.repair else "")
        + ".\n",
        schedule=timedelta(seconds=every) if every else None,
        start_date=source.epoch.start if source.epoch is not None else None,
        catchup=False,
        max_active_runs=1,
        tags=["epochsync", "audit", f"target:{target.name}"],
        # a target busy with a run refuses the audit: it is tried again later
        default_args={"owner": "epochsync", "retries": 3, "retry_delay": timedelta(minutes=10)},
        params={
            "deep": Param(
                target.audit.deep, type="boolean", description="Compare every file's bytes too (reads everything)."
            ),
            "repair": Param(
                target.audit.repair,
                type="boolean",
                description="Put what differs right, as an epoch of its own (epochsync audit ... --repair).",
            ),
        },
    )
    with dag:
        _target_spark_task(
            "audit",
            audit_task,
            config,
            target,
            doc_md="Walks the target and compares every path with the source at the committed epoch; fails "
            "naming the first differences.",
        )
    return dag


def dags_from_env(kind: str, doc_md: str) -> dict[str, DAG]:
    """The DAGs of one kind (``epoch``, ``hydrate``, ``audit``, ``purge``) for ``$EPOCHSYNC_CONFIG``; none if unset."""
    path = config_path_from_env()
    if not path:
        log.warning("EPOCHSYNC_CONFIG is not set: no epochsync DAGs")
        return {}
    config = load_config(path)
    catchup = os.environ.get("EPOCHSYNC_CATCHUP", "true").lower() not in ("0", "false", "no")
    schedule_from: datetime | str | None = os.environ.get("EPOCHSYNC_SCHEDULE_FROM") or None
    if schedule_from and schedule_from != NEVER:
        from epochsync.core.config_values import parse_datetime

        try:
            schedule_from = parse_datetime(schedule_from)
        except ValueError as exc:
            raise ValueError(f"EPOCHSYNC_SCHEDULE_FROM: {exc} (or 'never')") from None
    out: dict[str, DAG] = {}
    if kind == "epoch":
        for t in config.targets:
            d = build_epoch_dag(
                config, config.source_of(t), t, doc_md=doc_md, catchup=catchup, schedule_from=schedule_from
            )
            out[d.dag_id] = d
    elif kind == "hydrate":
        # a feed consumer hydrates from a dump with `epochsync feed hydrate`, not by copying files
        for t in (t for t in config.targets if t.kind != "feed"):
            d = build_hydrate_dag(config, t, doc_md=doc_md)
            out[d.dag_id] = d
    elif kind == "audit":
        for t in (t for t in config.targets if auditable(config, t)):
            d = build_audit_dag(config, t, doc_md=doc_md)
            out[d.dag_id] = d
    elif kind == "purge":
        for s in config.sources:
            d = build_purge_dag(config, s, doc_md=doc_md)
            out[d.dag_id] = d
    else:
        raise ValueError(f"unknown DAG kind {kind!r}: expected epoch, hydrate, audit or purge")
    return out
