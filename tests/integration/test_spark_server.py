"""The local Spark server commands without a configured one share (``epochsync spark``).

One test, one sequence, real processes (each server start is a JVM): two first commands at
once start one server; a second command finds it and runs a query on it; a command using it
keeps it past its idle time, and it stops once idle after that; ``stop`` stops it; a server
whose supervisor was killed is stale, its orphaned JVM is stopped and a new one started.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ENSURE = "from epochsync.spark_server import ensure_server; print(ensure_server())"
QUERY = """
from epochsync.spark import spark_session
spark = spark_session("probe")
print(spark.range(5).count(), spark.client._builder.url.netloc)
"""
HOLD = """
import sys, time
from epochsync.spark_server import ensure_server
ensure_server()
print("holding", flush=True)
time.sleep(float(sys.argv[1]))
"""


def _env(home: Path, idle: str) -> dict:
    env = dict(os.environ, EPOCHSYNC_SPARK_HOME=str(home), EPOCHSYNC_SPARK_IDLE=idle, EPOCHSYNC_SPARK_AUTOSTART="1")
    for k in ("EPOCHSYNC_SPARK_REMOTE", "SPARK_REMOTE"):
        env.pop(k, None)
    env["EPOCHSYNC_DRIVER_MEMORY"] = "1g"
    return env


def _py(code: str, env: dict, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=timeout)


def _cli(env: dict, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "epochsync.cli", "spark", *args], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _info(home: Path) -> dict | None:
    try:
        return json.loads((home / "server.json").read_text())
    except FileNotFoundError:
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"


def _wait(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def test_the_local_server_is_started_once_found_kept_while_used_and_stopped(tmp_path):
    home = tmp_path / "spark-home"
    env = _env(home, "6s")
    started: list[dict] = []
    try:
        # two first commands at once: one server, both get its URL
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", ENSURE], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            for _ in range(2)
        ]
        outs = [p.communicate(timeout=240) for p in procs]
        assert all(p.returncode == 0 for p in procs), [o[1][-1500:] for o in outs]
        urls = {o[0].strip().splitlines()[-1] for o in outs}
        info = _info(home)
        started.append(info)
        assert urls == {info["url"]}
        supervisors = subprocess.run(
            ["pgrep", "-f", f"spark_server serve --state {home}"], capture_output=True, text=True
        )
        assert len(supervisors.stdout.split()) == 1

        # a second command finds it and runs on it (no JVM of its own)
        done = _py(QUERY, env)
        assert done.returncode == 0, done.stderr[-2000:]
        count, netloc = done.stdout.split()[-2:]
        assert count == "5" and netloc == f"127.0.0.1:{info['port']}"
        assert "starting a local Spark server" not in done.stderr
        assert "running:" in _cli(env, "status")

        # a command using it keeps it past its idle time; once it ends, the server stops when idle
        holder = subprocess.Popen([sys.executable, "-c", HOLD, "15"], env=env, stdout=subprocess.PIPE, text=True)
        assert holder.stdout.readline().strip() == "holding"
        time.sleep(10)
        assert _info(home) is not None and _alive(info["pid"]), "stopped while a command held it"
        assert "a command is using it" in _cli(env, "status")
        holder.wait(timeout=60)
        _wait(
            lambda: _info(home) is None and not _alive(info["pid"]) and not _alive(info["jvm_pid"]), 60, "the idle stop"
        )
        assert "no local Spark server" in _cli(env, "status")

        # started by hand, then the supervisor killed: stale; the next command stops the JVM left behind
        env = _env(home, "10m")
        _cli(env, "start")
        info = _info(home)
        started.append(info)
        os.kill(info["pid"], signal.SIGKILL)
        _wait(lambda: not _alive(info["pid"]), 20, "the supervisor to die")
        assert _alive(info["jvm_pid"])
        assert "stale" in _cli(env, "status")
        done = _py(QUERY, env)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "is gone" in done.stderr and "starting a local Spark server" in done.stderr
        new = _info(home)
        started.append(new)
        assert new["pid"] != info["pid"]
        _wait(lambda: not _alive(info["jvm_pid"]), 20, "the orphaned JVM to stop")

        # stop when asked
        assert "stopped the local Spark server" in _cli(env, "stop")
        assert _info(home) is None
        _wait(lambda: not _alive(new["pid"]) and not _alive(new["jvm_pid"]), 30, "the stop")
    finally:
        for info in started:
            for pid in (info["pid"], info["jvm_pid"]):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
