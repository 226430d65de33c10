"""Run one epoch of an epoch DAG with ``dag.test()`` (no scheduler) and report the outcome as JSON.

    python -m epochsync.airflow.dagtest --dag-id epochsync__sim__local --epoch 2

Parses the project's ``dags/`` folder (``$EPOCHSYNC_CONFIG`` decides the DAGs), makes
sure the metadata database exists (``$AIRFLOW_HOME``), runs the DAG for the epoch
(``params.epoch`` = E, logical date = the end of E's window, so the inferred data
interval is E's window) and prints ``{"state": ..., "tasks": {task_id: state}}``.
Exit code 0 when the run succeeded, 1 when it failed. Used by the end-to-end tests
and the demo.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def run_epoch(dag_id: str, epoch: int, *, dags_folder: str | None = None, conf: dict | None = None) -> dict:
    """Run ``dag_id`` for ``epoch`` with dag.test(); returns the run state and every task's state."""
    from airflow.dag_processing.dagbag import DagBag

    ensure_db()
    ensure_pools()
    folder = dags_folder or str(Path(__file__).resolve().parents[3] / "dags")
    bag = DagBag(dag_folder=folder)
    if bag.import_errors:
        raise RuntimeError(f"DAG import errors: {bag.import_errors}")
    if dag_id not in bag.dags:
        raise RuntimeError(f"no DAG {dag_id!r} in {folder} (have: {', '.join(sorted(bag.dags))})")
    dag = bag.dags[dag_id]
    from epochsync.airflow.timetable import EpochTimetable

    if isinstance(dag.timetable, EpochTimetable):
        # the end of E's window: the inferred data interval is E's window
        logical_date = dag.timetable.window(epoch).end
    else:  # hydrate, purge: any date; the params carry the epoch
        from airflow.sdk import timezone

        logical_date = timezone.utcnow()
    dr = dag.test(logical_date=logical_date, run_conf={"epoch": epoch, **(conf or {})})
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        tis = session.scalars(
            select(TaskInstance).where(TaskInstance.dag_id == dag_id, TaskInstance.run_id == dr.run_id)
        ).all()
        tasks = {ti.task_id: (str(getattr(ti.state, "value", ti.state)) if ti.state else None) for ti in tis}
        tries = {ti.task_id: ti.try_number for ti in tis}
    state = dr.state.value if hasattr(dr.state, "value") else str(dr.state)
    return {"dag_id": dag_id, "epoch": epoch, "run_id": dr.run_id, "state": state, "tasks": tasks, "tries": tries}


#: beside the metadata database's settings: ``<airflow version> <alembic revision>`` after an initdb
DB_STAMP = ".epochsync-initdb"


def _db_revision() -> str | None:
    """The metadata database's alembic revision, or None (no database, or no table yet)."""
    from airflow.utils.session import create_session
    from sqlalchemy import text

    try:
        with create_session() as session:
            return session.execute(text("SELECT version_num FROM alembic_version")).scalar()
    except Exception:  # no database or no alembic_version table: initdb creates them
        return None


def ensure_db() -> bool:
    """Create or migrate the metadata database unless this Airflow version already did; returns
    True when it ran ``initdb``.

    ``initdb`` costs about 2 s per process (alembic loads every migration script to find
    the head), paid by every DAG run of the demo and the benchmarks. After a successful one,
    ``$AIRFLOW_HOME/.epochsync-initdb`` records the Airflow version and the revision it left
    the database at; a later process whose database is at that revision, under the same
    Airflow version, skips it. Any other state (a new database, another Airflow, a
    migration since) runs ``initdb`` as before.
    """
    import airflow
    from airflow.configuration import AIRFLOW_HOME
    from airflow.utils import db

    stamp = Path(AIRFLOW_HOME) / DB_STAMP
    revision = _db_revision()
    if revision and stamp.exists() and stamp.read_text().split() == [airflow.__version__, revision]:
        return False
    db.initdb()
    revision = _db_revision()
    if revision:
        stamp.write_text(f"{airflow.__version__} {revision}\n")
    return True


def ensure_pools(config_path: str | None = None) -> list[str]:
    """Create the one-slot pool of every target of ``$EPOCHSYNC_CONFIG`` in this Airflow database;
    returns their names, sorted.

    ``dag.test()`` itself ignores pools (it runs one task at a time and never looks at pool
    slots, even for a pool that does not exist); a scheduler started on the same database
    would not schedule a task whose pool is missing, so the stack gets them here too.
    """
    import os

    from airflow.models.pool import Pool

    from epochsync.core.config import load_config
    from epochsync.journal.lease import airflow_pools

    path = config_path or os.environ.get("EPOCHSYNC_CONFIG")
    if not path:
        return []
    pools = airflow_pools(load_config(path))
    for name, p in pools.items():
        Pool.create_or_update_pool(name, p["slots"], p["description"], p["include_deferred"])
    return sorted(pools)


def main(argv: list[str] | None = None) -> int:
    """Run one epoch of a DAG with ``dag.test()`` and print ``DAGTEST_RESULT {...}``; returns 0 if the
    run succeeded, else 1."""
    p = argparse.ArgumentParser(prog="python -m epochsync.airflow.dagtest", description=__doc__.split("\n\n")[0])
    p.add_argument("--dag-id", required=True)
    p.add_argument("--epoch", type=int, required=True)
    p.add_argument("--conf", default="{}", help="extra run conf as JSON (params), e.g. '{\"dry_run\": true}'")
    p.add_argument("--dags-folder")
    args = p.parse_args(argv)
    result = run_epoch(args.dag_id, args.epoch, dags_folder=args.dags_folder, conf=json.loads(args.conf))
    print("DAGTEST_RESULT " + json.dumps(result), flush=True)
    return 0 if result["state"] == "success" else 1


if __name__ == "__main__":
    sys.exit(main())
