"""Scheduled epochs, live: the scheduler itself creates one run per epoch as the source closes it.

The scenario (``tests/support/live.py``): ``epochsync simulate --live`` produces 4 epochs of
30 s in real time, Airflow runs with the production schedule (as ``docker-compose.yaml`` runs it:
PostgreSQL, the LocalExecutor, a process per component; ``airflow standalone`` on SQLite where
PostgreSQL's server is not installed, which CI refuses: ``EPOCHSYNC_REQUIRE_POSTGRES``), and the posix
replica is compared with the ground truth as each commit lands. Every run must be of type
``scheduled`` and succeed. The replication delay per epoch (commit time minus the moment
the simulator closed the epoch) is written to ``tests/output/live.json``: a figure to
read, not a timed assertion.

A one-process ``make test`` starts the scenario with the session, beside the other tests
(its three minutes are mostly waiting for epochs to close), and runs this test late: it
reads what the scenario recorded. Alone, or under pytest-xdist, it runs the scenario
itself.
"""

from __future__ import annotations

import os

import pytest
from support.live import EPOCHS

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1800)]


def test_the_scheduler_replicates_each_live_epoch_as_it_closes(live_epochs):
    facts = live_epochs.wait()
    runs = facts["runs"]
    assert facts["simulator_exit"] == 0
    assert [r["run_type"] for r in runs] == ["scheduled"] * EPOCHS, runs
    assert [r["state"] for r in runs] == ["success"] * EPOCHS, runs
    # most epochs are seen as they land (an epoch overtaken within a second is the exception)
    seen = facts["seen"]
    assert sum(seen.values()) >= EPOCHS - 1, seen
    if os.environ.get("EPOCHSYNC_REQUIRE_POSTGRES"):
        assert facts["database"].startswith("postgresql"), facts["database"]
    print(
        f"live epochs on {facts['database']}: replication delay (commit - close) per epoch: {facts['delays']}; "
        f"run seconds {facts['run_seconds']}; beside other tests: {facts.get('beside_other_tests')}"
    )
