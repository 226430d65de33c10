"""Benchmarks (``make bench``): each writes ``bench/results/<name>.json``.

Sub-modules register one benchmark each: ``ingest``, ``merge``, ``e2e``, ``warm``. Every result
row is measured in the run that writes it; nothing here is an estimate.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

BENCHMARKS = {
    "ingest": "epochsync.bench.ingest",
    "merge": "epochsync.bench.merge",
    "e2e": "epochsync.bench.e2e",
    "warm": "epochsync.bench.warm",
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
