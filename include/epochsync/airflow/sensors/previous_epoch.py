"""Epochs in order however the runs were made: ``wait_previous_epoch`` holds an epoch's write stages
until the previous epoch is committed.

``depends_on_past`` orders a task after the same task of the previous run: ``apply`` of epoch
E after ``apply`` of E-1, not after E-1's ``commit``. ``max_active_runs=1`` keeps scheduled and
manual runs apart, but a backfill has its own limit (``--max-active-runs``, 10 by default):
its runs overlap, and E's ``apply`` found the target still at E-2 ("would leave a gap").

So before ``apply`` a sensor (mode ``reschedule``: it holds no worker slot and no pool slot
while it waits, so the run it waits for can take them) looks at what decides it, the target's
manifest:

- the manifest is at ``first - 1`` or later: go (``apply`` of an epoch already committed is a
  no-op);
- otherwise it waits while a run that is ahead of this one (an earlier epoch; for the same
  epochs, the one that started first) is queued or running: it will commit, or fail;
- and when nothing is in flight to commit the missing epochs, it fails at once with their
  numbers and the command that runs them, never a silent wait.

A run's epochs are on record in the warehouse (``airflow_runs/target=T/<run>.json``, written by
``wait_epoch_closed``, dropped by ``commit``): the task SDK tells a run's state from its id, not
which runs hold which epochs. A run queued behind this one (a cleared run, a scheduled run
behind a manual one: ``max_active_runs`` lets it start only when this one ends) is waited for
:data:`QUEUED_GRACE_S` at most, so two runs never wait for each other.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from urllib.parse import quote

from airflow.sdk import BaseSensorOperator, PokeReturnValue

from epochsync.core.config import load_config
from epochsync.warehouse.paths import Warehouse, local_path

#: DAG run states of a run that may still commit
ACTIVE_STATES = ("queued", "running")
#: seconds a gate waits for a run ahead of it that is queued and never starts
QUEUED_GRACE_S = 600.0


def runs_dir(warehouse: str, target: str) -> str:
    """The local folder of ``target``'s runs on record (one JSON per run in flight)."""
    return local_path(Warehouse(warehouse).uri + f"/airflow_runs/target={target}")


def record_run(warehouse: str, target: str, dag_id: str, run_id: str, first: int, through: int) -> dict:
    """Put a run's epochs on record (``wait_epoch_closed``); a run cleared and run again keeps its place."""
    from epochsync.journal.undo import read_json, write_json_atomic

    path = os.path.join(runs_dir(warehouse, target), quote(run_id, safe="") + ".json")
    old = read_json(path) or {}
    doc = {
        "dag_id": dag_id,
        "run_id": run_id,
        "first": int(first),
        "through": int(through),
        "since": old.get("since") or time.time(),
    }
    if doc != old:
        write_json_atomic(path, doc)
    return doc


def forget_run(warehouse: str, target: str, run_id: str) -> None:
    """Drop a run from the record (its epochs are committed, or below the committed one)."""
    try:
        os.remove(os.path.join(runs_dir(warehouse, target), quote(run_id, safe="") + ".json"))
    except FileNotFoundError:
        pass


def runs_on_record(warehouse: str, target: str) -> list[dict]:
    """Every run on record for ``target``."""
    d = runs_dir(warehouse, target)
    out = []
    for name in sorted(os.listdir(d)) if os.path.isdir(d) else ():
        if name.endswith(".json"):
            try:
                with open(os.path.join(d, name)) as f:
                    out.append(json.load(f))
            except (OSError, ValueError):  # one being replaced right now
                continue
    return out


def _order(run: dict) -> tuple:
    return (int(run["through"]), float(run.get("since") or 0), str(run["run_id"]))


def _span(first: int, last: int) -> str:
    return f"{first}" if first == last else f"{first}..{last}"


@dataclass(frozen=True)
class Turn:
    """What the gate decides: ``go``, or ``wait`` for the runs in ``waiting_for``, or ``fail`` with ``message``."""

    action: str
    message: str
    waiting_for: list[dict] = field(default_factory=list)


def previous_epoch_turn(
    *,
    target: str,
    dag_id: str,
    committed: int,
    me: dict,
    others: list[dict],
    window_start,
    queued_grace_over: bool = False,
) -> Turn:
    """The gate's decision for run ``me`` (``run_id``, ``first``, ``through``, ``since``) of ``target``.

    ``others``: the other runs on record, each with its DAG run ``state``. ``window_start(E)``:
    the logical date of epoch E, for the backfill command of the message.
    """
    first, through = int(me["first"]), int(me["through"])
    ahead = [
        o
        for o in others
        if o["run_id"] != me["run_id"]
        and int(o["through"]) > committed
        and o.get("state") in ACTIVE_STATES
        and _order(o) < _order(me)
    ]
    queued = [o for o in ahead if o.get("state") == "queued"]
    in_flight = [o for o in ahead if o.get("state") == "running" or not queued_grace_over]
    if in_flight:
        names = ", ".join(
            f"epoch {_span(int(o['first']), int(o['through']))} ({o['run_id']}, {o['state']})" for o in in_flight
        )
        return Turn("wait", f"target {target} is at epoch {committed}: waiting for {names} to commit", in_flight)
    if committed >= first - 1:
        return Turn("go", f"target {target} is at epoch {committed}: epoch(s) {_span(first, through)} may apply")
    missing = _span(committed + 1, first - 1)
    why = "no run of them is queued or running"
    if queued:
        why = (
            f"the run(s) of {', '.join(o['run_id'] for o in queued)} are queued and did not start within "
            f"{QUEUED_GRACE_S:.0f} s (they wait for an active-run slot this run holds: max_active_runs)"
        )
    fix = (
        f"airflow backfill create --dag-id {dag_id} --from-date {window_start(committed + 1).isoformat()} "
        f"--to-date {window_start(through).isoformat()} --reprocess-behavior failed"
    )
    return Turn(
        "fail",
        f"epoch(s) {missing} of target {target} are not committed (the target is at epoch {committed}) and "
        f"{why}, so epoch(s) {_span(first, through)} cannot apply: nothing was written. Run the missing "
        f"epochs and this one again, in order: {fix} (or clear the failed runs of epochs {missing} first, "
        "then this run)",
    )


class PreviousEpochSensor(BaseSensorOperator):
    """``wait_previous_epoch``: holds ``apply`` until the target's manifest is at the run's first epoch - 1
    (see the module docstring). Reschedule mode; fails at once, naming the missing epochs, when
    nothing is in flight to commit them."""

    template_fields = ("config_path",)

    def __init__(self, *, config_path: str, source: str, target: str, **kwargs):
        kwargs.setdefault("mode", "reschedule")
        super().__init__(**kwargs)
        self.config_path = config_path
        self.source = source
        self.target = target

    def poke(self, context) -> PokeReturnValue | bool:
        """Go, wait or fail (:func:`previous_epoch_turn`)."""
        from airflow.sdk.exceptions import AirflowFailException

        # not from epochsync.airflow.tasks, which imports this module (no import cycle)
        from epochsync.stages.context import committed_epoch

        EPOCHS_TASK = "wait_epoch_closed"  # epochsync.airflow.tasks.EPOCHS_TASK: the run's epochs in XCom

        ti = context["ti"]
        epochs = ti.xcom_pull(task_ids=EPOCHS_TASK) or {}
        if epochs.get("dry_run"):
            return True  # a dry run writes nothing: apply skips
        config = load_config(self.config_path)
        committed = committed_epoch(config, self.target)
        me = {"run_id": ti.run_id, "first": int(epochs["first"]), "through": int(epochs["through"])}
        others = []
        for run in runs_on_record(config.warehouse, self.target):
            if run["run_id"] == ti.run_id:
                me["since"] = run.get("since")
                continue
            if int(run["through"]) <= committed:  # committed (or below): it cannot hold this one back
                forget_run(config.warehouse, self.target, run["run_id"])
                continue
            others.append({**run, "state": _run_state(ti, run)})
        src = config.source(self.source)
        turn = previous_epoch_turn(
            target=self.target,
            dag_id=ti.dag_id,
            committed=committed,
            me=me,
            others=others,
            queued_grace_over=self._waited(ti, context) > QUEUED_GRACE_S,
            window_start=lambda e: src.epoch.window(e)[0],
        )
        self.log.info("%s", turn.message)
        if turn.action == "fail":
            raise AirflowFailException(turn.message)
        return turn.action == "go"

    @staticmethod
    def _waited(ti, context) -> float:
        """Seconds since this task's first poke (0 on the first)."""
        from datetime import UTC, datetime

        try:
            first = ti.get_first_reschedule_date(context)
        except Exception:  # not under a supervisor (a unit test)
            return 0.0
        return (datetime.now(UTC) - first).total_seconds() if first else 0.0


def _run_state(ti, run: dict) -> str:
    """The DAG run state of a run on record (``gone`` when Airflow no longer knows it)."""
    try:
        state = ti.get_dagrun_state(dag_id=run["dag_id"], run_id=run["run_id"])
        return str(getattr(state, "value", state))
    except Exception:  # deleted from the database: it will never commit
        return "gone"
