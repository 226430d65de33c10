"""What a benchmark's result files say about the host: the commit, stolen CPU and a speed gauge."""

from __future__ import annotations

import json
import re

from epochsync_dev import bench
from epochsync_dev.docs.benchmarks import _run_line


def test_the_sidecar_records_the_commit_the_steal_and_the_python_loop(tmp_path, monkeypatch):
    monkeypatch.setenv("EPOCHSYNC_BENCH_RESULTS", str(tmp_path))
    monkeypatch.setattr(bench, "GAUGE_ADDITIONS", 3_000_000)
    # the machine's ticks at start: 1,000 fewer in all, 250 of them stolen
    now = bench._cpu_ticks()
    assert now is not None, "/proc/stat has no cpu line"
    monkeypatch.setattr(bench, "_TICKS_AT_START", (now[0] - 1000, now[1] - 250))
    bench.write_results("probe", [{"name": "x"}])
    meta = json.loads((tmp_path / "probe.meta.json").read_text())
    assert re.fullmatch(r"[0-9a-f]{12}(\+changes)?", meta["commit"]), meta["commit"]
    assert 0 < meta["steal_percent"] <= 25.0  # 250 of at least 1,000 ticks
    assert 0 < meta["python_loop_seconds"] < 10
    assert json.loads((tmp_path / "probe.json").read_text()) == [{"name": "x"}]


def test_outside_a_checkout_there_is_no_commit(tmp_path):
    assert bench.code_commit(tmp_path) is None


def test_a_test_that_fakes_subprocess_run_does_not_see_the_git_calls(tmp_path, monkeypatch):
    # make bench's runner tests replace subprocess.run to record the parts it starts
    import subprocess

    calls = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, *a, **kw: calls.append(cmd))
    bench.code_commit()
    assert calls == []


def test_the_run_line_says_how_fast_the_host_was():
    meta = {
        "written_at": "2026-11-29T12:00:00Z",
        "machine": "x86_64",
        "cpus": 2,
        "python": "3.11.7",
        "steal_percent": 4.25,
        "python_loop_seconds": 1.15,
        "commit": "509fb99abcde",
    }
    line = _run_line(meta)
    assert "4.2 % of CPU time stolen by the hypervisor during the run" in line or "4.3 %" in line
    assert f"a Python loop of {bench.GAUGE_ADDITIONS:,} additions took 1.15 s" in line
    assert line.endswith("code at `509fb99abcde`.")
    # an older sidecar without them says nothing about them
    assert "stolen" not in _run_line({k: meta[k] for k in ("written_at", "machine", "cpus", "python")})
