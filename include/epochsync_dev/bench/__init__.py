"""Benchmarks (``make bench``): each writes ``bench/results/<name>.json``.

Sub-modules register one benchmark each: ``ingest``, ``merge``, ``e2e``, ``warm``,
``rollback``, ``gluster``, ``gluster-pool``, ``gluster-audit``; ``all`` runs the parts of ``make bench`` in turn and times them. Every result
row is measured in the run that writes it; nothing here is an estimate.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

BENCHMARKS = {
    "ingest": "epochsync_dev.bench.ingest",
    "merge": "epochsync_dev.bench.merge",
    "e2e": "epochsync_dev.bench.e2e",
    "warm": "epochsync_dev.bench.warm",
    "rollback": "epochsync_dev.bench.rollback",
    "gluster": "epochsync_dev.bench.gluster",
    "gluster-pool": "epochsync_dev.bench.gluster_pool",
    "gluster-audit": "epochsync_dev.bench.gluster_audit",
    "all": "epochsync_dev.bench.all",
}


def results_dir() -> Path:
    d = Path(os.environ.get("EPOCHSYNC_BENCH_RESULTS", "bench/results"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def _cpu_ticks() -> tuple[int, int] | None:
    """``(all, steal)`` CPU ticks of the machine so far, from ``/proc/stat``; None off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return (sum(fields), fields[7]) if len(fields) == 8 else None


#: the machine's CPU ticks when this benchmark's process started (each part of ``all`` is one)
_TICKS_AT_START = _cpu_ticks()

#: additions in :func:`python_loop_seconds`' loop
GAUGE_ADDITIONS = 20_000_000


def python_loop_seconds() -> float:
    """Seconds a plain Python loop of :data:`GAUGE_ADDITIONS` additions takes: how fast the host
    was when a result was written. The same loop took 1.15 s on one machine of this kind and
    2.15-3.26 s on others (2026-11-27 to 11-29), and the bench's times moved with it."""
    t0 = time.perf_counter()
    total = 0
    for i in range(GAUGE_ADDITIONS):
        total += i
    return round(time.perf_counter() - t0, 2)


def _git(repo: Path, *args: str) -> tuple[int, str]:
    """``git -C repo ARGS``: its exit status and output (127 when git cannot run)."""
    import subprocess

    try:
        with subprocess.Popen(
            ["git", "-C", str(repo), *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        ) as proc:
            out, _ = proc.communicate(timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 127, ""
    return proc.returncode, out or ""


def code_commit(repo: Path | None = None) -> str | None:
    """The commit of the code that ran (``+changes`` when files outside ``bench/`` differ from
    it); None outside a git checkout. ``repo``: this package's checkout by default."""
    repo = repo or Path(__file__).resolve().parents[3]
    code, head = _git(repo, "rev-parse", "--short=12", "HEAD")
    if code != 0 or not head.strip():
        return None
    dirty, _ = _git(repo, "diff", "--quiet", "HEAD", "--", ".", ":!bench")
    return head.strip() + ("+changes" if dirty == 1 else "")


def host_record() -> dict:
    """What says how fast the host was while the rows were measured: the share of CPU time the
    hypervisor stole since this process started (``steal_percent``, from ``/proc/stat``), the
    Python loop's seconds (:func:`python_loop_seconds`), and the commit that ran."""
    out: dict = {"commit": code_commit()}
    now = _cpu_ticks()
    if _TICKS_AT_START and now and now[0] > _TICKS_AT_START[0]:
        out["steal_percent"] = round(100 * (now[1] - _TICKS_AT_START[1]) / (now[0] - _TICKS_AT_START[0]), 1)
    out["python_loop_seconds"] = python_loop_seconds()
    return out


def write_results(name: str, rows: list[dict]) -> Path:
    """Write the rows of one benchmark (a JSON list) plus a sidecar with the machine and how
    fast it was (:func:`host_record`)."""
    path = results_dir() / f"{name}.json"
    path.write_text(json.dumps(rows, indent=2) + "\n")
    meta = {
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        **host_record(),
    }
    (results_dir() / f"{name}.meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return path


def peak_rss_bytes(pids: list[int] | None = None) -> int:
    """Peak resident set of this process and its children so far (JVM included)."""
    import resource

    self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    child_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(self_kb, child_kb) * 1024


def configure_bench(p) -> None:
    """``python -m epochsync_dev bench NAME [options]``: the benchmark's own options follow its name."""
    import argparse

    p.add_argument("name", choices=list(BENCHMARKS), help="which benchmark (its results: bench/results/NAME.json)")
    p.add_argument(
        "options",
        nargs=argparse.REMAINDER,
        help="the benchmark's options ('python -m epochsync_dev bench NAME --help')",
    )


def run_bench(args) -> int:
    """Run one benchmark as ``python -m epochsync_dev.bench NAME ...`` would; returns its exit code."""
    from epochsync_dev.bench.__main__ import main

    return main([args.name, *args.options])
