"""``make bench`` and ``make bench-full``: every benchmark in one run, timed, one after the other.

Each part runs as ``python -m epochsync_dev.bench NAME`` in its own process (so one part's
JVM and memory cannot slow the next), in the order ingest, merge, warm, e2e. The wall time
of each part and of the whole run, with the load average before and after each part, go
to ``bench/results/bench.json``: what "``make bench`` runs in N minutes" refers to.

Two sets (``--set``): ``quick`` (``make bench``, within 20 minutes on the 2-core machine:
the 1M-record merge, e2e's ``QUICK_SET``: its small writes and churn in 10,000 files) and
``full`` (``make bench-full``: the 10M-record merge, e2e's 30,000-file tree, large appends,
10,000-file directory rename and 100,000-file scenario too). Both write the
same result files; ``bench.json`` and every part's ``NAME.meta.json`` say which set ran
(``bench_set``), and e2e's meta which scenarios.

A part that fails does not stop the others (its row says so and the run exits 1), so one
broken benchmark does not cost the measurements of the rest.

    python -m epochsync_dev.bench all [--set quick|full] [--only ingest,merge] [--PART-ARGS "..."]
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time

#: the parts of ``make bench``, in order, with the arguments the Makefile gives each
PARTS = {
    "ingest": [],
    "merge": ["--event-log", "bench/scratch/merge/eventlog"],
    "warm": [],
    "e2e": [],
}
#: what each set adds to a part's arguments
SET_ARGS = {
    "quick": {"merge": ["--sizes", "merge_1m"], "e2e": ["--set", "quick"]},
    "full": {"e2e": ["--set", "full"]},
}


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _mark_set(name: str, which: str) -> None:
    """Say in the part's own ``NAME.meta.json`` which set of ``make bench`` wrote its rows."""
    import json

    from epochsync_dev.bench import results_dir

    path = results_dir() / f"{name}.meta.json"
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return  # the part wrote no results (it failed early)
    meta["bench_set"] = which
    meta["make_target"] = "bench" if which == "quick" else "bench-full"
    path.write_text(json.dumps(meta, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    from epochsync_dev.bench import write_results

    p = argparse.ArgumentParser(prog="python -m epochsync_dev.bench all", description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default=",".join(PARTS), help=f"which parts, in this order (default {','.join(PARTS)})")
    p.add_argument(
        "--set",
        choices=list(SET_ARGS),
        default="quick",
        help="quick (make bench, default): what fits in 20 minutes; full (make bench-full): every row",
    )
    for name in PARTS:
        p.add_argument(f"--{name}-args", default="", metavar="ARGS", help=f"more arguments for the {name} part")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in PARTS]
    if unknown:
        p.error(f"--only: no benchmark part named {', '.join(unknown)} (parts: {', '.join(PARTS)})")
    rows: list[dict] = []
    started = time.monotonic()
    for name in names:
        cmd = [sys.executable, "-m", "epochsync_dev.bench", name, *PARTS[name], *SET_ARGS[args.set].get(name, [])]
        cmd += shlex.split(getattr(args, f"{name}_args"))
        print(f"bench: {name}: {shlex.join(cmd[1:])}", file=sys.stderr, flush=True)
        before, t0 = _load(), time.monotonic()
        code = subprocess.run(cmd).returncode
        seconds = time.monotonic() - t0
        rows.append(
            {
                "name": name,
                "set": args.set,
                "command": shlex.join(cmd[1:]),
                "seconds": round(seconds, 1),
                "exit_code": code,
                "load_average_before": before,
                "load_average_after": _load(),
            }
        )
        _mark_set(name, args.set)
        status = "ok" if code == 0 else f"FAILED (exit {code})"
        print(f"bench: {name}: {status} in {seconds / 60:.1f} min", file=sys.stderr, flush=True)
    total = time.monotonic() - started
    rows.append({"name": "total", "set": args.set, "seconds": round(total, 1), "parts": names})
    path = write_results("bench", rows)
    failed = [r["name"] for r in rows[:-1] if r["exit_code"]]
    print(
        f"bench: {len(names)} part(s) in {total / 60:.1f} min"
        + (f"; FAILED: {', '.join(failed)}" if failed else "")
        + f"; timings in {path}",
        file=sys.stderr,
        flush=True,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
