"""Benchmarks (``make bench``): each writes ``bench/results/<name>.json``.

Sub-modules register one benchmark each: ``ingest``, ``merge``, ``e2e``, ``warm``,
``rollback``, ``gluster``; ``all`` runs the parts of ``make bench`` in turn and times them. Every result
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
    "all": "epochsync_dev.bench.all",
}


def results_dir() -> Path:
    d = Path(os.environ.get("EPOCHSYNC_BENCH_RESULTS", "bench/results"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def write_results(name: str, rows: list[dict]) -> Path:
    """Write the rows of one benchmark (a JSON list) plus a sidecar with the machine."""
    path = results_dir() / f"{name}.json"
    path.write_text(json.dumps(rows, indent=2) + "\n")
    meta = {
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
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
    """``epochsync bench NAME [options]``: the benchmark's own options follow its name."""
    import argparse

    p.add_argument("name", choices=list(BENCHMARKS), help="which benchmark (its results: bench/results/NAME.json)")
    p.add_argument("options", nargs=argparse.REMAINDER, help="the benchmark's options ('epochsync bench NAME --help')")


def run_bench(args) -> int:
    """Run one benchmark as ``python -m epochsync_dev.bench NAME ...`` would; returns its exit code."""
    from epochsync_dev.bench.__main__ import main

    return main([args.name, *args.options])
