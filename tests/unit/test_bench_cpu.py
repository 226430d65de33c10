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
        # the meter alone: set_aside_heap's collection of this (large) test process could outlast the burn
        meter = CpuMeter({"store": shell.pid, "gone": 0}, set_aside_heap=False)
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


def test_a_child_that_exits_during_the_run_counts_and_nothing_goes_negative():
    # the shell's child burns 0.3 CPU-s and exits; the shell reaps it (its children's time):
    # counted once, from the child's own samples
    shell = subprocess.Popen(
        [
            "/bin/sh",
            "-c",
            f"{sys.executable} -c 'import time\nt = time.process_time()\n"
            "while time.process_time() - t < 0.3: pass'; sleep 30",
        ]
    )
    try:
        time.sleep(0.05)
        meter = CpuMeter({"store": shell.pid}, every=0.05, set_aside_heap=False)
        meter.start()
        deadline = time.monotonic() + 30
        while _pythons(shell.pid) and time.monotonic() < deadline:  # until the burner exits
            time.sleep(0.05)
        time.sleep(0.2)
        spent = meter.seconds()
        assert 0.15 <= spent["store"] <= 1.0, spent
    finally:
        subprocess.run(["pkill", "-P", str(shell.pid)], check=False)
        shell.kill()
        shell.wait()


def _pythons(pid):
    from epochsync_dev.bench.e2e import _proc_table, _tree

    names = []
    for p in _tree(_proc_table(), pid):
        try:
            with open(f"/proc/{p}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            pass
    return [n for n in names if n.startswith("python")]


def test_a_process_that_is_gone_has_no_cpu():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert process_tree_cpu(p.pid) == 0.0


def test_the_100000_file_rows_reach_the_readme_and_the_cpu_column_the_results_page(tmp_path):
    import json

    from epochsync_dev.docs.benchmarks import _e2e, headline_rows

    def row(scenario, tool, files, seconds, **extra):
        return {"scenario": scenario, "tool": tool, "files": files, "seconds": seconds, **extra}

    rows = [
        row("small-writes-1000-10k", "epochsync", 10_000, 13.9),
        row("small-writes-1000-10k", "rclone-sync", 10_000, 9.3),
        row("small-writes-1pct", "epochsync", 100_000, 14.1, cpu_seconds={"store": 9.0, "tool": 6.0, "spark": 0.5}),
        row("small-writes-1pct", "rclone-sync", 100_000, 16.5),
        {"scenario": "small-writes-1pct", "tool": "aws-s3-sync", "skipped": "not installed"},
    ]
    (tmp_path / "e2e.json").write_text(json.dumps(rows))
    got = {r[0]: r[1] for r in headline_rows(tmp_path)}
    assert got["1% of 100,000 files get a small write, to S3"] == "epochsync 14.1 s, rclone-sync 16.5 s"
    assert got["the same 1,000 changed files in 10,000 and 100,000 files, to S3 (epochsync)"] == "13.9 s and 14.1 s"
    page = "\n".join(_e2e(rows))
    assert "CPU s: store / tool" in page and "| 9.0 / 6.5 |" in page


def test_a_reading_lower_than_the_last_never_takes_cpu_away(monkeypatch):
    # a worker alive at start with 10 CPU-s, then 12, then read as 0 on its way out, then gone:
    # it counts 2 CPU-s, where the meter once counted -10 (a peer's spark share in bench-full)
    from epochsync_dev.bench import e2e

    tables = iter(
        [
            {1: (0, 5, 1.0), 2: (1, 7, 10.0)},  # start
            {1: (0, 5, 1.5), 2: (1, 7, 12.0)},
            {1: (0, 5, 1.5), 2: (1, 7, 0.0)},  # the worker exiting
            {1: (0, 5, 2.0)},  # gone; the final sample
        ]
    )
    monkeypatch.setattr(e2e, "_proc_table", lambda: next(tables))
    meter = CpuMeter({"spark": 1}, every=3600)
    meter.start()
    meter._sample()
    meter._sample()
    assert meter.seconds()["spark"] == 3.0  # the root's 1.0 and the worker's 2.0


def test_the_harness_heap_is_set_aside_in_a_measured_window_and_its_pauses_counted(monkeypatch):
    import gc

    from epochsync_dev.bench.e2e import HarnessHeap

    harness = [[i] for i in range(50_000)]  # the harness's objects, made before the window
    heap = HarnessHeap()
    monkeypatch.delenv("EPOCHSYNC_BENCH_GC_FREEZE", raising=False)
    heap.set_aside()
    try:
        assert gc.get_freeze_count() >= len(harness)  # out of the collector's walks
        gc.collect()  # a full collection inside the window: counted
    finally:
        got = heap.restore()
    assert got["full_collections"] == 1 and heap.seconds > 0, (got, heap.seconds)
    assert got["frozen"] >= len(harness)
    assert gc.get_freeze_count() == 0  # the heap is back where it was
    assert heap._callback not in gc.callbacks
    gc.collect()
    assert heap.full == 1  # a collection after the window is not counted

    monkeypatch.setenv("EPOCHSYNC_BENCH_GC_FREEZE", "0")  # the heap kept in: pauses counted all the same
    heap.set_aside()
    gc.collect()
    got = heap.restore()
    assert got["frozen"] == 0 and got["full_collections"] == 1, got
