"""The e2e benchmark's CPU by process: a process tree's CPU seconds from /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from epochsync_dev.bench.e2e import CpuMeter, process_tree_cpu

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="Linux /proc only")

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\ntime.sleep(30)\n"


def test_a_grandchild_burning_cpu_counts_in_its_ancestors_tree():
    # a shell whose child burns 0.5 CPU-s, then sleeps: the shell's tree holds that CPU
    shell = subprocess.Popen(["/bin/sh", "-c", f"{sys.executable} -c '{BURN.format(s=0.5)}'; :"])
    try:
        meter = CpuMeter({"store": shell.pid, "gone": 0})
        meter.start()
        deadline = time.monotonic() + 30
        while process_tree_cpu(shell.pid) < 0.5 and time.monotonic() < deadline:
            time.sleep(0.05)
        spent = meter.seconds()
        assert 0.4 <= spent["store"] <= 5.0, spent
        assert "gone" not in spent  # no pid, no row
        assert spent["tool"] < spent["store"]  # this process only waited
    finally:
        subprocess.run(["pkill", "-P", str(shell.pid)], check=False)
        shell.kill()
        shell.wait()


def test_a_process_that_is_gone_has_no_cpu():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert process_tree_cpu(p.pid) == 0.0
