"""``dagtest`` migrates the metadata database once per Airflow version, not in every DAG run's process."""

from __future__ import annotations

from pathlib import Path

from epochsync.airflow import dagtest


def test_initdb_runs_once_then_again_only_when_airflow_or_the_database_changed(monkeypatch):
    import airflow
    from airflow.configuration import AIRFLOW_HOME
    from airflow.utils import db

    stamp = Path(AIRFLOW_HOME) / dagtest.DB_STAMP
    stamp.unlink(missing_ok=True)
    calls = []
    real = db.initdb
    monkeypatch.setattr(db, "initdb", lambda *a, **kw: (calls.append(1), real(*a, **kw))[1])

    assert dagtest.ensure_db() is True  # no stamp: initdb, then the stamp
    revision = dagtest._db_revision()
    assert revision and stamp.read_text().split() == [airflow.__version__, revision]
    assert dagtest.ensure_db() is False  # same Airflow, same revision: nothing to do
    assert len(calls) == 1

    stamp.write_text(f"0.0.1 {revision}\n")  # another Airflow version did the last initdb
    assert dagtest.ensure_db() is True
    stamp.write_text(f"{airflow.__version__} not-this-revision\n")  # the database moved since
    assert dagtest.ensure_db() is True
    assert len(calls) == 3 and stamp.read_text().split() == [airflow.__version__, revision]
