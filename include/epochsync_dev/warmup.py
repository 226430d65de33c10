"""Warm a fresh Spark Connect server: the stages' queries once, on a tiny source, before the first epoch.

A fresh server's first epoch pays the JVM's first execution of every query shape the stages
use (class loading, the first code paths through Catalyst, the Parquet writers, the Arrow
Python runner), on top of its work: ``docs/INTERNALS.md`` has the figures. The embedded
server's users (``make demo``, ``make airflow``, the test session) start this right after the
server, in its own process, while they start Airflow or simulate their source, so the first
epoch they replicate runs on a warm JVM; docker-compose runs it as the one-shot
``spark-warm-up`` service once ``spark-connect`` is healthy.

What it runs: ``python -m epochsync_dev simulate --no-data`` of a 24-file source (records only, no object
store), then ingest, merge (on Spark, though the local path would take epochs this small) and
translate of its two epochs into a scratch posix target, and
one ``mapInArrow`` job (apply's and verify's kind), all on one Connect session that is
released at the end. Its folder (``--scratch``, or a temporary one) is removed at the end;
nothing is written outside it, and the server keeps nothing of it but a warmer JVM. The
folder must be at the same place for this process, the server and its executors (the
warehouse is a ``file://`` path), as the project's embedded servers have it.

``python -m epochsync_dev.warmup --remote sc://HOST:PORT [--scratch DIR]``
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = "warm-up"


def _on_spark(run_merge, *args):
    """``run_merge(*args)`` on the Spark small path: a window this small would be merged in this
    process (no job), and the point is to warm the JVM for the windows Spark still merges."""
    import os

    old = os.environ.get("EPOCHSYNC_MERGE_LOCAL_MAX_ROWS")
    os.environ["EPOCHSYNC_MERGE_LOCAL_MAX_ROWS"] = "0"
    try:
        return run_merge(*args)
    finally:
        if old is None:
            os.environ.pop("EPOCHSYNC_MERGE_LOCAL_MAX_ROWS", None)
        else:
            os.environ["EPOCHSYNC_MERGE_LOCAL_MAX_ROWS"] = old


def _simulate(out: Path) -> Path:
    from epochsync_dev.cli import main as cli

    argv = ["simulate", "--out", str(out), "--epochs", "2", "--files", "24", "--seed", "7", "--osts", "2"]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        status = cli([*argv, "--no-data"])
    if status:
        raise RuntimeError(f"warm-up: python -m epochsync_dev simulate failed: {err.getvalue().strip()[-500:]}")
    config = out / "epochsync.yaml"
    import yaml

    doc = yaml.safe_load(config.read_text())
    doc["targets"] = [{"name": TARGET, "source": "sim", "kind": "posix", "path": str(out / "replica")}]
    config.write_text(yaml.safe_dump(doc, sort_keys=False))
    return config


def warm_up(remote: str, scratch: Path | None = None) -> dict:
    """Run the warm-up against the Connect server at ``remote``; returns seconds per step."""
    from epochsync.core.config import load_config
    from epochsync.spark import run_report_tasks, spark_session
    from epochsync.stages.ingest import run_ingest
    from epochsync.stages.merge import run_merge
    from epochsync.stages.translate import run_translate

    if scratch is None:
        work = Path(tempfile.mkdtemp(prefix="epochsync-warm-up-"))
    else:
        work = Path(scratch)
        shutil.rmtree(work, ignore_errors=True)  # what a killed warm-up left
        work.mkdir(parents=True)
    seconds: dict[str, float] = {}
    t0 = time.monotonic()
    try:
        cfg = load_config(_simulate(work / "sim"))
        tcfg = cfg.target(TARGET)
        seconds["simulate"] = round(time.monotonic() - t0, 2)
        spark = spark_session("epochsync-warm-up", remote=remote, cfg=cfg)
        try:
            for name, step in (
                ("ingest", lambda: run_ingest(cfg, "sim", 1, 2, spark)),
                ("merge-1", lambda: _on_spark(run_merge, cfg, TARGET, 1, 1, spark)),
                ("translate-1", lambda: run_translate(cfg, tcfg, 1, spark)),
                ("merge-2", lambda: _on_spark(run_merge, cfg, TARGET, 2, 2, spark)),
                ("translate-2", lambda: run_translate(cfg, tcfg, 2, spark, first_epoch=2)),
                # a lambda travels by value: the executors need nothing of epochsync_dev
                (
                    "tasks",
                    lambda: run_report_tasks(spark, 2, lambda i: {"task": i}, tag="epochsync-warm-up", what="warm-up"),
                ),
            ):
                t = time.monotonic()
                with contextlib.redirect_stdout(io.StringIO()):
                    step()
                seconds[name] = round(time.monotonic() - t, 2)
        finally:
            with contextlib.suppress(Exception):
                spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    seconds["total"] = round(time.monotonic() - t0, 2)
    return seconds


def start_warm_up(remote: str, log: Path, scratch: Path) -> subprocess.Popen:
    """The warm-up in its own process (its Connect session stays out of the caller's), in
    ``scratch``, output to ``log``."""
    out = open(log, "w")  # noqa: SIM115 - the child owns it
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "epochsync_dev.warmup", "--remote", remote, "--scratch", str(scratch)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    finally:
        out.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m epochsync_dev.warmup", description=__doc__.split("\n\n")[0])
    p.add_argument("--remote", required=True, help="the Spark Connect server, sc://HOST:PORT")
    p.add_argument("--scratch", help="work folder, removed afterwards (default: a temporary one)")
    args = p.parse_args(argv)
    try:
        seconds = warm_up(args.remote, Path(args.scratch) if args.scratch else None)
    except Exception as exc:  # a failed warm-up costs only time: say what, do not stop the caller
        print(f"warm-up: failed, the first epoch will run on a cold server: {exc}", file=sys.stderr)
        return 1
    print(f"warm-up: done in {seconds['total']}s {seconds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
