"""A test run stopped by SIGTERM stops what its fixtures started (``support.signals``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

CONFTEST = f"""
import subprocess, sys
from pathlib import Path
import pytest
sys.path.insert(0, {str(TESTS)!r})
from support.signals import teardown_on_signal

def pytest_configure(config):
    teardown_on_signal()

@pytest.fixture(scope="session")
def server(tmp_path_factory):
    here = Path(__file__).parent
    proc = subprocess.Popen(["sleep", "300"])
    (here / "server.pid").write_text(str(proc.pid))
    yield proc
    proc.kill()
    proc.wait()
    (here / "torn-down").write_text("yes")
"""

TEST = """
import time
from pathlib import Path

def test_runs_long(server):
    (Path(__file__).parent / "started").write_text("yes")
    time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_sigterm_tears_the_session_fixtures_down(tmp_path):
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (tmp_path / "test_long.py").write_text(textwrap.dedent(TEST))
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", str(tmp_path)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    pid = None
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (tmp_path / "started").exists(), run.stdout.read() if run.poll() is not None else "not started"
        pid = int((tmp_path / "server.pid").read_text())
        assert _alive(pid)
        run.send_signal(signal.SIGTERM)
        out, _ = run.communicate(timeout=60)
        alive_after = _alive(pid)
    finally:
        if run.poll() is None:
            run.kill()
        if pid is not None and _alive(pid):  # leave nothing behind when the teardown did not run
            os.kill(pid, signal.SIGKILL)
    assert (tmp_path / "torn-down").exists(), out
    assert not alive_after, out
    assert "KeyboardInterrupt" in out and "SIGTERM" in out, out
    assert run.returncode != 0
