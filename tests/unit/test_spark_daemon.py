"""PySpark's daemon with the executor imports done once (``spark_apps/daemon/epochsync_daemon.py``)."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from epochsync.spark_server import DAEMON_CONF
from epochsync_dev.embedded import DAEMON_DIR

PROBE = """
import json, os, sys
import epochsync_daemon
loaded = epochsync_daemon.preload()
mods = sorted(m for m in sys.modules if m.startswith("epochsync."))
print(json.dumps({
    "loaded": loaded,
    "threads": len(os.listdir("/proc/self/task")),
    "pyarrow": "pyarrow" in sys.modules,
    "apply_from": getattr(sys.modules.get("epochsync.stages.apply"), "__file__", None),
    "modules": mods,
}))
"""


def _probe(cwd) -> dict:
    env = dict(os.environ, PYTHONPATH=str(DAEMON_DIR))
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=cwd, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_daemon_preloads_the_shipped_package_without_starting_a_thread(tmp_path):
    """A daemon forks its workers: what it imports must start no thread (native ones
    counted) and must be the session's zip, the file the worker's task path names."""
    from epochsync.spark import package_zip

    zipped = shutil.copy(package_zip(), tmp_path)
    got = _probe(tmp_path)
    assert got["loaded"] == ["boto3", os.path.basename(zipped)]
    assert got["threads"] == 1
    assert not got["pyarrow"]
    assert got["apply_from"].startswith(os.path.join(str(tmp_path), os.path.basename(zipped)) + os.sep)


def test_without_one_package_zip_only_the_libraries_are_preloaded(tmp_path):
    """Another client's session (no zip), or two zips (which one?): epochsync is left to the worker."""
    got = _probe(tmp_path)
    assert got["loaded"] == ["boto3"] and got["modules"] == []
    (tmp_path / "epochsync-a.zip").write_bytes(b"")
    (tmp_path / "epochsync-b.zip").write_bytes(b"")
    assert _probe(tmp_path)["modules"] == []


def test_a_broken_package_zip_leaves_no_half_imported_package(tmp_path):
    (tmp_path / "epochsync-broken.zip").write_bytes(b"not a zip")
    got = _probe(tmp_path)
    assert got["loaded"] == ["boto3"] and got["modules"] == []


@pytest.mark.integration
def test_the_embedded_servers_workers_fork_from_the_preloading_daemon(spark_connect):
    """The session-wide server runs with DAEMON_CONF: a task's parent process is epochsync_daemon."""
    from epochsync.spark import spark_session

    spark = spark_session("daemon-probe")
    assert spark.conf.get("spark.python.daemon.module") == DAEMON_CONF["spark.python.daemon.module"]

    def parent(batches):
        import pyarrow as pa

        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode()
        for _ in batches:
            yield pa.RecordBatch.from_pydict({"cmd": [cmd]})

    rows = spark.range(1).mapInArrow(parent, "cmd string").collect()
    assert "-m epochsync_daemon" in rows[0]["cmd"]
