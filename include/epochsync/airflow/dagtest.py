"""Run one epoch of an epoch DAG with ``dag.test()`` (no scheduler) and report the outcome as JSON.

    python -m epochsync.airflow.dagtest --dag-id epochsync__sim__local --epoch 2

Parses the project's ``dags/`` folder (``$EPOCHSYNC_CONFIG`` decides the DAGs), makes
sure the metadata database exists (``$AIRFLOW_HOME``), runs the DAG for the epoch
(``params.epoch`` = E, logical date = the end of E's window, so the inferred data
interval is E's window) and prints ``{"state": ..., "tasks": {task_id: state}, "assets": [the asset
events the run emitted]}``.
Exit code 0 when the run succeeded, 1 when it failed. Used by the end-to-end tests
and the demo.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import TextIO


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

    logical_date: datetime
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
        from airflow.models.asset import AssetEvent, AssetModel

        events = session.execute(
            select(AssetModel.uri, AssetEvent.source_task_id, AssetEvent.extra)
            .join(AssetModel, AssetModel.id == AssetEvent.asset_id)
            .where(AssetEvent.source_dag_id == dag_id, AssetEvent.source_run_id == dr.run_id)
        ).all()
        assets = [{"uri": uri, "task": task, "extra": dict(extra or {})} for uri, task, extra in events]
    state = dr.state.value if hasattr(dr.state, "value") else str(dr.state)
    return {
        "dag_id": dag_id,
        "epoch": epoch,
        "run_id": dr.run_id,
        "state": state,
        "tasks": tasks,
        "tries": tries,
        "assets": assets,
    }


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


#: what ``--serve`` prints on its protocol channel when a run has ended
SERVED = "DAGTEST_SERVED "


def serve(requests: Iterable[str], reply: TextIO) -> int:
    """Run DAG runs one after another in this process, one per JSON request line; returns 0.

    A request is ``{"dag_id", "epoch", "conf", "log", "env"}``. Each run's output (the task
    logs, then ``DAGTEST_RESULT {...}``) goes to the file ``log``, as a fresh
    ``python -m epochsync.airflow.dagtest`` would print it; ``env`` replaces the environment
    for that run (a fault to inject, another config), but not ``AIRFLOW_HOME`` or the
    metadata database, which the process took at its start. The result, with the run's
    seconds, goes to ``reply`` as ``DAGTEST_SERVED {...}``.

    What a kept process saves is Airflow's own start-up, paid by the first run only: the
    imports, the execution API that ``dag.test()`` builds in-process (about 4 s here), the
    database check and the first Spark Connect session with its Python workers.
    """
    import os

    home = os.environ.get("AIRFLOW_HOME")
    # Python's streams on descriptors 1 and 2 for the process's life (loggers keep the stream they
    # were configured with): each run points the descriptors at its log, so writes through the
    # streams and straight to the descriptors alike land there
    streams = sys.stdout, sys.stderr
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 (restored below)
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    try:
        return _serve(requests, reply, home)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = streams


def _serve(requests: Iterable[str], reply: TextIO, home: str | None) -> int:
    import os
    import time
    import traceback

    for line in requests:
        if not line.strip():
            continue
        req = json.loads(line)
        env = req.get("env")
        if env is not None and env.get("AIRFLOW_HOME") != home:
            raise SystemExit(f"dagtest --serve: this process runs AIRFLOW_HOME={home}, not {env.get('AIRFLOW_HOME')}")
        t0 = time.monotonic()
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        with open(req["log"], "ab", buffering=0) as out:
            os.dup2(out.fileno(), 1)
            os.dup2(out.fileno(), 2)
        try:
            if env is not None:
                os.environ.clear()
                os.environ.update(env)
            try:
                result = run_epoch(req["dag_id"], int(req["epoch"]), conf=req.get("conf") or {})
            except Exception as exc:  # reported as a failed run, with the reason in its log
                traceback.print_exc()
                result = {
                    "dag_id": req["dag_id"],
                    "epoch": req["epoch"],
                    "state": "failed",
                    "tasks": {},
                    "error": str(exc),
                }
            print("DAGTEST_RESULT " + json.dumps(result), flush=True)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
        result["seconds"] = round(time.monotonic() - t0, 2)
        reply.write(SERVED + json.dumps(result) + "\n")
        reply.flush()
    return 0


class DagTestProcess:
    """A kept ``python -m epochsync.airflow.dagtest --serve`` for one Airflow home: DAG runs one
    after another, each as ``dag.test()`` would run it in a fresh process, without paying
    Airflow's start-up again.

    ``run`` returns the same result as the one-shot command (``state``, ``tasks``, ``tries``)
    plus ``seconds`` and ``returncode`` (0 or 1 like the command; None if the process died,
    which is then started again for the next run).
    """

    def __init__(self, env: dict[str, str], *, cwd: str | Path | None = None):
        self.env = dict(env)
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None

    def _start(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "epochsync.airflow.dagtest", "--serve"],
                env=self.env,
                cwd=self.cwd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        return self.proc

    def run(
        self,
        dag_id: str,
        epoch: int,
        log: str | Path,
        *,
        conf: dict | None = None,
        env: dict[str, str] | None = None,
    ) -> dict:
        """One DAG run; its output goes to ``log`` (truncated first)."""
        Path(log).write_bytes(b"")
        run_env = dict(env if env is not None else self.env)
        if run_env.get("AIRFLOW_HOME") != self.env.get("AIRFLOW_HOME"):
            raise ValueError(f"this process runs AIRFLOW_HOME={self.env.get('AIRFLOW_HOME')}")
        proc = self._start()
        assert proc.stdin is not None and proc.stdout is not None  # _start opens both as pipes
        request = {"dag_id": dag_id, "epoch": epoch, "conf": conf or {}, "log": str(log), "env": run_env}
        try:
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
        except OSError:  # a broken pipe: the process is gone
            line = ""
        if not line.startswith(SERVED):  # the process died during the run (a fault of mode kill, a crash)
            code = proc.wait()
            with open(log, "a") as out:
                out.write(f"dagtest --serve: the process ended (exit {code}) during the run\n")
            return {"dag_id": dag_id, "epoch": epoch, "state": "failed", "tasks": {}, "returncode": None}
        result = json.loads(line[len(SERVED) :])
        result["returncode"] = 0 if result.get("state") == "success" else 1
        return result

    def close(self, timeout: float = 60) -> None:
        """End the process (it finishes the run in progress first)."""
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        assert proc.stdin is not None  # _start opens it as a pipe
        try:
            proc.stdin.close()
            proc.wait(timeout=timeout)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()

    def __enter__(self) -> DagTestProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_KEPT: dict[str, DagTestProcess] = {}
_KEPT_LOCK = threading.Lock()


def kept_process(env: dict[str, str], *, cwd: str | Path | None = None) -> DagTestProcess:
    """The kept ``dag.test()`` process of ``env``'s Airflow home, started on its first run (the
    demo's chains and the tests share them by home); a fault to inject stays the run's own."""
    with _KEPT_LOCK:
        home = env["AIRFLOW_HOME"]
        if home not in _KEPT:
            _KEPT[home] = DagTestProcess({k: v for k, v in env.items() if k != "EPOCHSYNC_INJECT_FAILURE"}, cwd=cwd)
        return _KEPT[home]


def close_kept_processes() -> None:
    """End every process :func:`kept_process` started."""
    with _KEPT_LOCK:
        procs = list(_KEPT.values())
        _KEPT.clear()
    for p in procs:
        p.close()


def main(argv: list[str] | None = None) -> int:
    """Run one epoch of a DAG with ``dag.test()`` and print ``DAGTEST_RESULT {...}``; returns 0 if the
    run succeeded, else 1. ``--serve``: run requests from stdin in this process (:func:`serve`)."""
    p = argparse.ArgumentParser(prog="python -m epochsync.airflow.dagtest", description=__doc__.split("\n\n")[0])
    p.add_argument("--serve", action="store_true", help="run DAG runs requested as JSON lines on stdin")
    p.add_argument("--dag-id")
    p.add_argument("--epoch", type=int)
    p.add_argument("--conf", default="{}", help="extra run conf as JSON (params), e.g. '{\"dry_run\": true}'")
    p.add_argument("--dags-folder")
    args = p.parse_args(argv)
    if args.serve:
        import os

        # the protocol channel is a copy of stdout; stdout itself goes nowhere between runs, so
        # nothing printed outside a run (an import's warning) can corrupt a reply
        reply = os.fdopen(os.dup(1), "w")
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.close(null)
        return serve(sys.stdin, reply)
    if args.dag_id is None or args.epoch is None:
        p.error("--dag-id and --epoch are required (or --serve)")
    result = run_epoch(args.dag_id, args.epoch, dags_folder=args.dags_folder, conf=json.loads(args.conf))
    print("DAGTEST_RESULT " + json.dumps(result), flush=True)
    return 0 if result["state"] == "success" else 1


if __name__ == "__main__":
    sys.exit(main())
