"""What the epoch DAG's Python tasks do: resolve the run's epochs, wait for closure, commit, roll back.

The functions here are thin adapters over the package's stage functions (the
same ones ``epochsync replicate`` calls); heavy modules are imported inside them.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from epochsync.airflow.timetable import epoch_of_interval
from epochsync.core.config import Config, load_config
from epochsync.core.errors import EpochError
from epochsync.core.jsonable import jsonable

#: the XCom the sensor publishes and every later task templates from
EPOCHS_TASK = "wait_epoch_closed"


@dataclass(frozen=True)
class RunEpochs:
    """The epochs one DAG run replicates: ``first..through`` inclusive, committed at ``through``."""

    first: int
    through: int
    dry_run: bool = False
    whole_file: bool = False

    def as_xcom(self) -> dict[str, Any]:
        """Returns the XCom the sensor pushes: ``{"first", "through", "dry_run", "whole_file"}``."""
        return asdict(self)


def resolve_run_epochs(
    *,
    start: datetime,
    interval_s: float,
    params: dict[str, Any],
    data_interval_end: datetime | None,
    committed: int | None = None,
) -> RunEpochs:
    """The epochs of a run: ``params.epoch`` if given, else the epoch of the run's data interval.

    With ``max_epochs_per_run = N > 1`` the run catches up: it merges the epochs after
    the target's committed one (at most N) and commits at the last boundary.
    """
    epoch = params.get("epoch")
    if epoch in (None, ""):
        if data_interval_end is None:
            raise EpochError("this run has no data interval and no 'epoch' param: trigger it with {'epoch': E}")
        epoch = epoch_of_interval(start, interval_s, data_interval_end)
    try:
        epoch = int(epoch)
    except (TypeError, ValueError):
        raise EpochError(f"param 'epoch' must be a whole number, got {epoch!r}") from None
    if epoch < 1:
        raise EpochError(f"param 'epoch' must be 1 or more (epoch 0 is the empty target), got {epoch}")
    most = int(params.get("max_epochs_per_run") or 1)
    if most < 1:
        raise EpochError(f"param 'max_epochs_per_run' must be 1 or more, got {most}")
    first = epoch
    if most > 1 and committed is not None and committed < epoch:
        first = max(committed + 1, epoch - most + 1)
    return RunEpochs(first, epoch, bool(params.get("dry_run")), bool(params.get("whole_file")))


def missing_epoch_servers(config: Config, source: str, epoch: int) -> list[str]:
    """Servers of ``source`` that have not yet written an ``EPOCH`` record for ``epoch`` or later."""
    from epochsync.stages.ingest.closure import missing_epoch_servers as missing

    return sorted(missing(config, source, epoch))


def committed_epoch(config: Config, target: str) -> int:
    """The epoch in the target's manifest (0 for an empty target)."""
    from epochsync.stages.context import committed_epoch as committed

    return int(committed(config, target))


def cut_task(config_path: str, source: str, params=None, data_interval_end=None, **_):
    """The ``cut`` task of a live source's epoch DAG: the cuts up to the run's epoch, taken now (a no-op
    for a cut another target's run or ``epochsync cut`` took already); returns their figures."""
    import logging

    from epochsync.stages.cut import cut_source

    log = logging.getLogger("epochsync.cut")
    config = load_config(config_path)
    src = config.source(source)
    epochs = resolve_run_epochs(
        start=src.epoch.start,
        interval_s=src.epoch.interval_s,
        params=dict(params or {}),
        data_interval_end=data_interval_end,
    )
    out = cut_source(config, source, epochs.through, progress=log.info)
    return jsonable(out)


def commit_task(config_path: str, target: str, ti=None, **_):
    """The ``commit`` task: manifest at the run's last epoch, consumer cursors advanced, stats row."""
    from epochsync.stages.commit import commit_epoch

    epochs = ti.xcom_pull(task_ids=EPOCHS_TASK)
    if epochs.get("dry_run"):
        from airflow.sdk.exceptions import AirflowSkipException

        raise AirflowSkipException("dry run: nothing to commit")
    from epochsync.airflow.assets import mark_committed
    from epochsync.airflow.sensors.previous_epoch import forget_run

    config = load_config(config_path)
    result = commit_epoch(config, target, epochs["first"], epochs["through"])
    forget_run(config.warehouse, target, ti.run_id)
    mark_committed(_.get("outlet_events"), target, epochs["through"], epochs["first"])
    return jsonable(result)


def rollback_task(config_path: str, target: str, ti=None, spark=None, **_):
    """The ``rollback`` task: undo the failed epoch, then fail the run on purpose.

    Runs only when apply, verify or commit failed or could not run (trigger rule
    ``one_failed``). When this run wrote nothing (it failed before apply: in
    ``wait_previous_epoch``, say, or apply refused before its journal), there is nothing to
    undo and the task succeeds; the run is red by the task that failed. Above all, it then
    leaves alone the undo journal of another run in flight (a run of the same epoch ahead of
    it). Otherwise the rollback leaves the target exactly at its last committed epoch and this
    task ends failed (without retry), so the run shows red and holds the next epoch back
    until the operator retries this one.
    """
    import logging

    from airflow.sdk.exceptions import AirflowFailException

    from epochsync.spark import prepare_session
    from epochsync.stages.rollback import rollback_target

    epochs = ti.xcom_pull(task_ids=EPOCHS_TASK) or {}
    config = load_config(config_path)
    written = journal_of_run(config, target, epochs.get("through"), ti.run_id)
    if written is not None:
        back_at = committed_epoch(config, target)
        message = (
            f"nothing to roll back: this run wrote nothing to target {target!r} ({written}); it is at epoch {back_at}"
        )
        logging.getLogger("epochsync.rollback").info("%s", message)
        result = {"rolled_back": [], "committed": back_at, "undone": 0, "message": message}
        ti.xcom_push(key="rollback", value=result)
        # the run still ends red: a failed epoch is never a green run, whatever its rollback had to do
        raise AirflowFailException(
            f"epoch {epochs.get('through', '?')} of target {target!r} failed (see the failed task's log); "
            f"{message}. Fix the cause, then clear this run's failed tasks (or trigger the epoch again) to retry."
        )
    if spark is not None:
        prepare_session(spark)
    result = rollback_target(config, target, spark)
    ti.xcom_push(key="rollback", value=jsonable(result))
    back_at = committed_epoch(config, target)
    raise AirflowFailException(
        f"epoch {epochs.get('through', '?')} of target {target!r} failed in apply, verify or commit "
        f"(see those tasks' logs); rolled back: the target is at epoch {back_at} again. "
        f"Fix the cause, then clear this run's failed tasks (or trigger the epoch again) to retry."
    )


def journal_of_run(config: Config, target: str, through: int | None, run_id: str) -> str | None:
    """None when ``target`` holds an undo journal of this run's epoch ``through`` written by this run
    (or by a writer that did not name its run); otherwise why there is nothing of this run to undo."""
    from epochsync.journal.undo import journal_dir, read_json
    from epochsync.stages.context import unfinished_epochs

    if through is None:
        return "its epochs were never resolved"
    tcfg = config.target(target)
    if int(through) not in unfinished_epochs(config, tcfg, committed_epoch(config, target)):
        return f"no undo journal of epoch {through}"
    owner = (read_json(os.path.join(journal_dir(config.warehouse, target, int(through)), "meta.json")) or {}).get(
        "airflow_run"
    )
    if owner and owner != run_id:
        return f"the undo journal of epoch {through} is run {owner}'s, which is in flight or rolls back itself"
    return None


def config_path_from_env() -> str | None:
    """``$EPOCHSYNC_CONFIG`` made absolute (tasks may run in another working directory)."""
    path = os.environ.get("EPOCHSYNC_CONFIG")
    return os.path.abspath(path) if path else None


def hydrate_task(config_path: str, target: str, params=None, spark=None, **_):
    """The ``hydrate`` task of ``epochsync_hydrate__<target>``: :func:`epochsync.stages.hydrate.hydrate_target`."""
    import logging

    from epochsync.stages.hydrate import hydrate_target

    params = params or {}
    log = logging.getLogger("epochsync.hydrate")
    if spark is not None:
        from epochsync.spark import prepare_session

        prepare_session(spark)
    from epochsync.airflow.assets import mark_committed
    from epochsync.stages.context import committed_epoch

    config = load_config(config_path)
    result = hydrate_target(
        config, target, spark=spark, epoch=params.get("epoch"), dump_uri=params.get("dump_uri") or None, log=log.info
    )
    mark_committed(_.get("outlet_events"), target, committed_epoch(config, target))
    return result


def purge_task(config_path: str, source: str, params=None, **_):
    """The ``purge`` task of ``epochsync_purge__<source>``: :func:`epochsync.stages.purge.purge_source`."""
    import logging

    from epochsync.stages.purge import purge_source

    log = logging.getLogger("epochsync.purge")
    dry_run = bool((params or {}).get("dry_run"))
    return purge_source(load_config(config_path), source, dry_run=dry_run, log=log.info)


def audit_task(config_path: str, target: str, params=None, spark=None, **_):
    """The ``audit`` task of ``epochsync_audit__<target>``: :func:`epochsync.stages.audit.audit_target`
    at the committed epoch. Differences fail the task (no retry) naming the first ones, unless the
    ``repair`` param puts them right (then only what is left fails it); a target busy with a run
    (its lease held, or an epoch applied but not committed) fails it for a retry."""
    import logging

    from airflow.sdk.exceptions import AirflowFailException

    from epochsync.spark import prepare_session
    from epochsync.stages.audit import audit_target

    log = logging.getLogger("epochsync.audit")
    if spark is not None:
        prepare_session(spark)
    deep = bool((params or {}).get("deep"))
    repair = bool((params or {}).get("repair"))
    result = audit_target(load_config(config_path), target, deep=deep, spark=spark, repair=repair)
    diffs = result["differences"]
    for d in diffs[:100]:
        log.warning("%s", d)
    what = "metadata and bytes" if deep else "metadata"
    held = f", {result['held']} held back by the cut" if result.get("held") else ""
    summary = (
        f"audit of target {target} at epoch {result['epoch']} ({what}, {result['paths']} paths{held}, "
        f"{result['seconds']} s): " + (f"{len(diffs)} differences" if diffs else "clean")
    )
    log.info("%s", summary)
    fixed = result.get("repair")
    if diffs and fixed is not None:
        left = fixed["after"]
        log.info(
            "repair of target %s: %s paths (%s), %s s: %s",
            target,
            fixed["paths"],
            ", ".join(f"{n} {h}" for h, n in fixed["how"].items() if n),
            fixed["seconds"],
            f"{len(left)} differences left" if left else "clean",
        )
        if left:
            raise AirflowFailException(
                f"{summary}; repaired, but {len(left)} still differ, first: " + "; ".join(str(d) for d in left[:5])
            )
        return {
            "target": target,
            "epoch": result["epoch"],
            "deep": deep,
            "paths": result["paths"],
            "differences": len(diffs),
            "repaired": fixed["paths"],
        }
    if diffs:
        first = "; ".join(str(d) for d in diffs[:5])
        raise AirflowFailException(
            f"{summary}; first: {first}. The replica was changed behind epochsync's back (or a run lost "
            f"something): 'epochsync audit --config {config_path} --target {target}' lists every difference"
        )
    return {"target": target, "epoch": result["epoch"], "deep": deep, "paths": result["paths"], "differences": 0}
