"""Stopping a process tree: children in sessions of their own, and ones that ignore SIGTERM."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from epochsync.core.shutdown import descendants, stop_processes

TREE = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # deaf to SIGTERM: needs the SIGKILL after the grace period
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
print(grandchild.pid, flush=True)
time.sleep(300)
"""


def test_the_whole_tree_is_stopped_and_the_kept_process_survives():
    keep = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    child = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    grandchild = int(child.stdout.readline())
    try:
        tree = {p.pid for p in descendants()}
        assert {keep.pid, child.pid, grandchild} <= tree
        # only this test's processes: the run's own servers (Spark Connect, SeaweedFS) are descendants too
        ours = [p for p in descendants() if p.pid in {keep.pid, child.pid, grandchild}]
        t0 = time.monotonic()
        assert stop_processes(ours, grace=1.0, keep={keep.pid}) >= 2
        assert time.monotonic() - t0 < 10
        child.wait(timeout=5)
        assert not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE
        assert keep.poll() is None
    finally:
        keep.kill()
        keep.wait()
