"""A PostgreSQL server of the project's own on loopback, for Airflow as ``docker-compose.yaml`` runs it.

Debian's server binaries (package ``postgresql``: ``/usr/lib/postgresql/<major>/bin``) run on a
data directory of this process's own, on a free port of 127.0.0.1, with trust authentication
for loopback only, and a database for Airflow. Run as root, the server runs as the ``postgres``
system user (PostgreSQL refuses root); its data directory lives under ``/tmp`` so that user
can reach it. :meth:`EmbeddedPostgres.stop` ends the server by the PID this process started,
and removes the data directory.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path


class PostgresUnavailable(RuntimeError):
    """The server binaries are not installed here (Debian: ``apt-get install postgresql``)."""


def server_bin() -> Path | None:
    """The directory of the newest installed PostgreSQL server's binaries, None when there is none."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(p.split("/")[4]))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EmbeddedPostgres:
    """One server and one database (see the module docstring)."""

    def __init__(self, database: str = "airflow"):
        self.database = database
        self.port: int | None = None
        self.dir: Path | None = None
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """The SQLAlchemy URL of the database (psycopg2)."""
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{self.database}"

    def _as_server_user(self) -> dict:
        return {"user": "postgres", "group": "postgres"} if os.geteuid() == 0 else {}

    def start(self, timeout: float = 60) -> EmbeddedPostgres:
        """initdb, start, create the database; raises PostgresUnavailable without the binaries."""
        bindir = server_bin()
        if bindir is None:
            raise PostgresUnavailable("PostgreSQL's server is not installed here (Debian: apt-get install postgresql)")
        self.dir = Path(tempfile.mkdtemp(prefix="epochsync-pg-"))
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        data = self.dir / "data"
        as_user = self._as_server_user()
        subprocess.run(
            [str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"],
            check=True,
            capture_output=True,
            timeout=120,
            **as_user,
        )
        self.port = _free_port()
        log = open(self.dir / "postgres.log", "ab")
        self.proc = subprocess.Popen(
            [str(bindir / "postgres"), "-D", str(data), "-h", "127.0.0.1", "-p", str(self.port), "-k", str(self.dir)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **as_user,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited with {self.proc.returncode}:\n{self.tail()}")
            ready = subprocess.run(
                [str(bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)], capture_output=True
            )
            if ready.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"postgres not ready within {timeout:.0f} s:\n{self.tail()}")
            time.sleep(0.3)
        subprocess.run(
            [str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", self.database],
            check=True,
            capture_output=True,
            timeout=60,
        )
        return self

    def tail(self, n: int = 30) -> str:
        try:
            return "\n".join((self.dir / "postgres.log").read_text(errors="replace").splitlines()[-n:])  # type: ignore[operator]
        except OSError:
            return ""

    def stop(self) -> None:
        """Fast shutdown (SIGINT) of the server this process started, then its data removed."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGINT)
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
            except ProcessLookupError:
                pass
        self.proc = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> EmbeddedPostgres:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
