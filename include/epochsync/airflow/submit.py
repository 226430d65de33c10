"""Spark stages as ``SparkSubmitOperator`` tasks: the application path, the package zip, the environment.

The zip shipped with ``--py-files`` is built when a task renders its templates
(``{{ epochsync_package_zip() }}``), never at DAG parse time, from the package
sources on disk: a clean checkout needs no build step, and a changed source gives a
new file name (content hash), so a running Spark job never sees a half-written zip.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import zipfile
from pathlib import Path

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

import epochsync
from epochsync.paths import build_dir, project_dir

#: stages that run as Spark applications (``spark_apps/<stage>.py``)
SPARK_STAGES = ("ingest", "merge", "translate", "apply", "verify")


def spark_app(stage: str) -> str:
    """Absolute path of ``spark_apps/<stage>.py``: spark-submit resolves relative paths from its cwd."""
    return str(project_dir() / "spark_apps" / f"{stage}.py")


def package_sources() -> list[tuple[str, Path]]:
    """(name in zip, file) for every source file of the package, in a stable order."""
    root = Path(epochsync.__file__).resolve().parent
    out = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".pyo"):
            out.append(("epochsync/" + path.relative_to(root).as_posix(), path))
    return out


def package_zip() -> str:
    """Path of ``epochsync-<hash>.zip`` holding the package; built once per distinct source tree."""
    sources = package_sources()
    digest = hashlib.sha256()
    for name, path in sources:
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    target = build_dir() / f"epochsync-{digest.hexdigest()[:16]}.zip"
    if target.exists():
        return str(target)
    fd, tmp = tempfile.mkstemp(prefix=".epochsync-", suffix=".zip", dir=target.parent)
    os.close(fd)
    try:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, path in sources:
                # fixed timestamps: the same sources give the same bytes
                info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = 0o644 << 16
                zf.writestr(info, path.read_bytes())
        os.replace(tmp, target)  # atomic: concurrent tasks build the same bytes
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return str(target)


def connection_env(conn_ids: list[str]) -> dict[str, str]:
    """``AIRFLOW_CONN_<ID>`` JSON for each connection the Spark job needs and the environment lacks.

    The Spark driver is a separate process that cannot ask Airflow for connections,
    so the task hands them over in the child's environment (never on the command line).
    """
    out: dict[str, str] = {}
    for conn_id in dict.fromkeys(c for c in conn_ids if c):
        var = "AIRFLOW_CONN_" + conn_id.upper()
        if os.environ.get(var):
            continue
        from airflow.sdk import BaseHook

        conn = BaseHook.get_connection(conn_id)
        out[var] = json.dumps(
            {
                "conn_type": conn.conn_type,
                "host": conn.host,
                "login": conn.login,
                "password": conn.password,
                "port": conn.port,
                "extra": conn.extra_dejson,
            }
        )
    return out


class EpochSparkSubmitOperator(SparkSubmitOperator):
    """``SparkSubmitOperator`` for one epochsync stage.

    Adds what every stage needs at run time: the connections of the stores it reads
    and writes (in the child's environment), the venv's interpreter for PySpark and
    its ``spark-submit`` on ``PATH``; drops empty arguments left by optional flags
    (``{{ '--dry-run' if params.dry_run }}``); and skips the stage in a dry run when
    ``skip_in_dry_run`` (apply and verify: a dry run stops after translate).
    """

    def __init__(self, *, stage: str, conn_ids: list[str] | None = None, skip_in_dry_run: bool = False, **kwargs):
        kwargs.setdefault("application", spark_app(stage))
        kwargs.setdefault("conn_id", "spark_default")
        kwargs.setdefault("name", f"epochsync-{stage}")
        super().__init__(**kwargs)
        self.stage = stage
        self.conn_ids = list(conn_ids or [])
        self.skip_in_dry_run = skip_in_dry_run

    def prepare(self, context) -> None:
        """Finish the rendered arguments and environment (separate from execute, to test the command)."""
        self.application_args = [str(a) for a in (self.application_args or []) if a is not None and str(a) != ""]
        env = {
            # the driver and local executors run the interpreter that has epochsync and pyspark
            "PYSPARK_PYTHON": os.environ.get("EPOCHSYNC_PYSPARK_PYTHON", sys.executable),
            "PYSPARK_DRIVER_PYTHON": os.environ.get("EPOCHSYNC_PYSPARK_PYTHON", sys.executable),
            # the provider only accepts the bare name 'spark-submit': put the venv's first on PATH
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        }
        env.update(self.env_vars or {})
        env.update(connection_env(self.conn_ids))
        self.env_vars = env

    def execute(self, context):
        if self.skip_in_dry_run and context["params"].get("dry_run"):
            from airflow.sdk.exceptions import AirflowSkipException

            raise AirflowSkipException(f"dry run: {self.stage} skipped (a dry run stops after translate)")
        self.prepare(context)
        if self.stage == "ingest" and not context["params"].get("reingest"):
            reason = self.ingest_current()
            if reason:
                # a second target (or a retry) of an epoch whose records are in the warehouse
                self.log.info("ingest: %s; spark-submit skipped (param reingest=true forces it)", reason)
                return None
        return super().execute(context)

    def ingest_current(self) -> str | None:
        """:func:`epochsync.ingest.ingest_is_current` for this task's rendered arguments."""
        args = self.application_args or []

        def opt(name: str) -> str | None:
            return args[args.index(name) + 1] if name in args and args.index(name) + 1 < len(args) else None

        config, source, epoch = opt("--config"), opt("--source"), opt("--epoch")
        if not (config and source and epoch):
            return None
        from epochsync.config import load_config
        from epochsync.ingest import ingest_is_current

        first = int(epoch)
        last = int(opt("--through") or first)
        return ingest_is_current(load_config(config), source, first, last, opt("--target"))

    def spark_submit_command(self) -> list[str]:
        """The exact spark-submit command this task runs (after templates were rendered and prepare())."""
        return self._get_hook()._build_spark_submit_command(self.application)
