"""``wait_previous_epoch``: an epoch's write stages wait for the previous epoch's commit, however the
runs were made (issue 50: a backfill's overlapping runs applied epoch 2 onto a target at epoch 0).

The scheduler-level proof is tests/integration/test_airflow_backfill.py; here, the decision and
the tasks' behaviour on a target's warehouse, without a scheduler.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from epochsync.airflow.sensors.previous_epoch import previous_epoch_turn

ROOT = Path(__file__).resolve().parents[2]
START = datetime(2026, 1, 1, tzinfo=UTC)


def window_start(e: int) -> datetime:
    return START + timedelta(minutes=7 * (e - 1))


def turn(committed, me, others, **kw):
    return previous_epoch_turn(
        target="dr", dag_id="epochsync__lustre1__dr", committed=committed, me=me, others=others,
        window_start=window_start, **kw,
    )  # fmt: skip


def run(run_id, first, through=None, since=0.0, state="running"):
    return {"run_id": run_id, "first": first, "through": through or first, "since": since, "state": state}


def test_an_epoch_goes_once_the_previous_one_is_committed():
    assert turn(1, run("r2", 2), []).action == "go"
    # an epoch already committed goes too: its apply is a no-op
    assert turn(5, run("r2", 2), []).action == "go"
    # a catch-up run of epochs 3..5 needs epoch 2
    assert turn(2, run("r5", 3, 5), []).action == "go"
    assert turn(1, run("r5", 3, 5), [run("r2", 2)]).action == "wait"


def test_an_epoch_waits_while_a_run_of_an_earlier_epoch_is_in_flight():
    """The backfill of issue 50: epoch 2's run reaches apply while epoch 1's verifies."""
    t = turn(0, run("r2", 2), [run("r1", 1, state="running"), run("r3", 3, state="running")])
    assert t.action == "wait"
    assert [o["run_id"] for o in t.waiting_for] == ["r1"], "never for a later epoch: they wait for this one"
    assert "epoch 1 (r1, running)" in t.message
    # a queued run ahead (a cleared one) is waited for, too
    assert turn(0, run("r2", 2), [run("r1", 1, state="queued")]).action == "wait"


def test_a_missing_epoch_with_nothing_in_flight_fails_at_once_naming_it_and_the_fix():
    """Epoch 1 failed and rolled back: epochs 2 and 3 must not wait for ever behind it."""
    t = turn(0, run("r3", 3), [run("r1", 1, state="failed"), run("r2", 2, state="failed")])
    assert t.action == "fail"
    assert "epoch(s) 1..2 of target dr are not committed (the target is at epoch 0)" in t.message
    assert "no run of them is queued or running" in t.message and "nothing was written" in t.message
    assert (
        "airflow backfill create --dag-id epochsync__lustre1__dr --from-date 2026-01-01T00:00:00+00:00 "
        "--to-date 2026-01-01T00:14:00+00:00 --reprocess-behavior failed" in t.message
    )
    # a run Airflow no longer knows (deleted) will not commit either
    assert turn(0, run("r2", 2), [run("r1", 1, state="gone")]).action == "fail"


def test_the_airflow_docs_show_the_message_the_gate_gives():
    """docs/airflow/schedules.md quotes the failure a user sees for a missing epoch: the code's, word for word."""
    import re

    from support.docs import fenced_blocks

    page = (ROOT / "docs" / "airflow" / "schedules.md").read_text()
    shown = [body for _, _, body in fenced_blocks(page) if body.startswith("epoch(s) ")]
    assert len(shown) == 1, "schedules.md shows the missing-epoch message once"
    t = previous_epoch_turn(
        target="s3", dag_id="epochsync__sim__s3", committed=0, me=run("r2", 2), others=[],
        window_start=lambda e: START + timedelta(minutes=5 * (e - 1)),
    )  # fmt: skip
    assert re.sub(r"\s+", " ", shown[0]).strip() == t.message


def test_runs_of_the_same_epoch_take_turns_by_who_started_first():
    """A backfill of epoch 2 beside the scheduler's run of epoch 2: one applies, the other waits, then
    finds the epoch committed (its apply is a no-op)."""
    first, second = run("scheduled", 2, since=10.0), run("backfill", 2, since=20.0)
    assert turn(1, first, [second]).action == "go"
    assert turn(1, second, [first]).action == "wait"
    assert turn(2, second, []).action == "go"


def test_a_queued_run_ahead_that_never_starts_is_waited_for_a_while_only():
    """A run queued behind this one (max_active_runs: it starts only when this one ends) would wait
    for this one while this one waits for it."""
    queued = run("scheduled__e2", 2, state="queued")
    assert turn(1, run("manual__e3", 3), [queued]).action == "wait"
    t = turn(1, run("manual__e3", 3), [queued], queued_grace_over=True)
    assert t.action == "fail" and "scheduled__e2 are queued and did not start" in t.message
    # once the grace is over a running run ahead is still waited for
    assert turn(1, run("m", 3), [run("s", 2, state="running")], queued_grace_over=True).action == "wait"


# --------------------------------------------------------------------------- the tasks on a warehouse


class FakeTI:
    """What the tasks use of the task SDK's task instance."""

    def __init__(self, run_id, epochs, states=None):
        self.run_id = run_id
        self.dag_id = "epochsync__lustre1__scratch"
        self.epochs = epochs
        self.states = states or {}
        self.pushed = {}

    def xcom_pull(self, task_ids=None, key="return_value", **_):
        assert task_ids == "wait_epoch_closed"
        return self.epochs

    def xcom_push(self, key, value):
        self.pushed[key] = value

    def get_dagrun_state(self, dag_id, run_id):
        if run_id not in self.states:
            raise RuntimeError("404")
        return self.states[run_id]

    def get_first_reschedule_date(self, context):
        return None


@pytest.fixture()
def bag(with_config):
    """The DagBag of the DAG tests' config; what these tests write in its (shared) warehouse goes after."""
    import shutil

    from airflow.dag_processing.dagbag import DagBag

    from epochsync.airflow.sensors.previous_epoch import runs_dir
    from epochsync.core.config import load_config
    from epochsync.journal.undo import journal_dir

    bag = DagBag(dag_folder=str(ROOT / "dags"))
    assert not bag.import_errors
    yield bag
    wh = load_config(with_config).warehouse
    shutil.rmtree(runs_dir(wh, "scratch"), ignore_errors=True)
    shutil.rmtree(journal_dir(wh, "scratch", 2), ignore_errors=True)


def test_the_gate_reads_the_runs_on_record_and_the_manifest(bag, with_config, monkeypatch):
    from airflow.sdk.exceptions import AirflowFailException

    import epochsync.airflow.tasks
    from epochsync.airflow.sensors.previous_epoch import record_run, runs_on_record
    from epochsync.core.config import load_config

    wh = load_config(with_config).warehouse
    committed = {"epoch": 0}
    import epochsync.stages.context

    monkeypatch.setattr(epochsync.stages.context, "committed_epoch", lambda cfg, target: committed["epoch"])
    gate = bag.dags["epochsync__lustre1__scratch"].get_task("wait_previous_epoch")
    assert gate.mode == "reschedule" and not gate.depends_on_past
    for e in (1, 2, 3):
        record_run(wh, "scratch", "epochsync__lustre1__scratch", f"r{e}", e, e)
    epochs = lambda e: {"first": e, "through": e, "dry_run": False, "whole_file": False}  # noqa: E731

    assert gate.poke({"ti": FakeTI("r1", epochs(1), {"r2": "running", "r3": "running"})}) is True
    assert gate.poke({"ti": FakeTI("r2", epochs(2), {"r1": "running", "r3": "running"})}) is False
    with pytest.raises(AirflowFailException, match=r"epoch\(s\) 1 of target scratch are not committed"):
        gate.poke({"ti": FakeTI("r2", epochs(2), {"r1": "failed", "r3": "running"})})
    # a dry run writes nothing: it never waits
    assert gate.poke({"ti": FakeTI("r3", {**epochs(3), "dry_run": True})}) is True
    # epoch 1 committed: its record is dropped by the next gate (commit drops its own)
    committed["epoch"] = 1
    assert gate.poke({"ti": FakeTI("r2", epochs(2), {"r3": "running"})}) is True
    assert sorted(r["run_id"] for r in runs_on_record(wh, "scratch")) == ["r2", "r3"]
    # a run cleared and run again keeps its place in line
    since = {r["run_id"]: r["since"] for r in runs_on_record(wh, "scratch")}
    record_run(wh, "scratch", "epochsync__lustre1__scratch", "r2", 2, 2)
    assert {r["run_id"]: r["since"] for r in runs_on_record(wh, "scratch")} == since


def test_rollback_of_a_run_that_wrote_nothing_succeeds_and_leaves_others_journals(bag, with_config, monkeypatch):
    """Issue 50: epoch 2's apply refused (a gap), then its rollback failed too. A run that wrote
    nothing has nothing to undo, and the undo journal of the epoch may be another run's, in flight."""
    import epochsync.stages.rollback
    from epochsync.airflow.tasks import rollback_task
    from epochsync.core.config import load_config
    from epochsync.journal.undo import journal_dir, write_json_atomic

    def no_rollback(*a, **k):
        raise AssertionError("rollback_target must not run: this run wrote nothing")

    monkeypatch.setattr(epochsync.stages.rollback, "rollback_target", no_rollback)
    cfg = load_config(with_config)
    task = bag.dags["epochsync__lustre1__scratch"].get_task("rollback")
    assert not task.depends_on_past, "a failed rollback of one run must not hold the next run's for ever"
    from airflow.sdk.exceptions import AirflowFailException

    def rollback(ti):
        # nothing of this run to undo: no rollback, and the run still ends red
        with pytest.raises(AirflowFailException, match="nothing to roll back"):
            rollback_task(str(with_config), "scratch", ti=ti)
        return ti.pushed["rollback"]

    ti = FakeTI("r2", {"first": 2, "through": 2, "dry_run": False, "whole_file": False})
    out = rollback(ti)
    assert out["rolled_back"] == [] and "no undo journal of epoch 2" in out["message"]
    # the journal of epoch 2 is another run's (a run of the same epoch, ahead of this one)
    jdir = journal_dir(cfg.warehouse, "scratch", 2)
    os.makedirs(jdir)
    write_json_atomic(os.path.join(jdir, "meta.json"), {"epoch": 2, "airflow_run": "backfill__e2"})
    with open(os.path.join(jdir, "journal-0001.jsonl"), "w") as f:
        f.write('{"op": "create", "path": "a"}\n')
    from epochsync.journal.undo import journal_exists

    assert journal_exists(jdir)
    out = rollback(FakeTI("scheduled__e2", ti.epochs))
    assert "run backfill__e2's" in out["message"]
    # the run that wrote it rolls it back
    with pytest.raises(AssertionError, match="must not run"):
        rollback_task(str(with_config), "scratch", ti=FakeTI("backfill__e2", ti.epochs))
    # no epochs resolved (wait_epoch_closed failed): nothing of this run to undo
    assert rollback(FakeTI("r9", None))["rolled_back"] == []


def test_apply_refuses_a_catch_up_plan_that_starts_below_the_committed_epoch(with_config, monkeypatch):
    """A catch-up run planned epochs 3..5 from epoch 2; another run committed epoch 4 meanwhile."""
    import epochsync.stages.context as context
    from epochsync.core.config import load_config
    from epochsync.core.errors import EpochError

    cfg = load_config(with_config)
    monkeypatch.setattr(context, "committed_epoch", lambda c, t: 4)
    with pytest.raises(
        EpochError, match=r"at epoch 4, inside this run's epochs 3\.\.5, whose plan starts from epoch 2"
    ):
        context.check_preconditions(cfg, "scratch", 5, 3)
    assert context.check_preconditions(cfg, "scratch", 5, 5)["action"] == "run"
    assert context.check_preconditions(cfg, "scratch", 4, 3)["action"] == "noop"
