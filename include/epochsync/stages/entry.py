"""One stage run as its own process (``spark_apps/<stage>.py``, or ``python -m epochsync.stages.entry STAGE``).

Every stage takes the same arguments, parsed once here::

    --config FILE --epoch E [--through E2] (--target NAME | --source NAME)
    [--dry-run] [--whole-file] [--inject-failure SPEC]

``ingest`` reads a source (``--source``, or the source of ``--target``, whose cursor then
checks continuity) and prints a line per server and a summary; every other stage works
on a target and prints its figures as one JSON line. A failure is one line on stderr,
``<stage>: error: ...``, and the error class's exit status (the CLI's table); SIGTERM (Airflow stopping a task) exits 143 with a
line saying the target keeps its committed epoch.
"""

from __future__ import annotations

import argparse
import json
import sys

from epochsync.core.argtypes import epoch_number
from epochsync.core.config import load_config
from epochsync.core.errors import EpochsyncError
from epochsync.core.jsonable import jsonable
from epochsync.core.shutdown import Interrupted, raise_on_signals

#: the stages that run as their own process, in the order of a run
STAGES = ("ingest", "merge", "translate", "apply", "verify", "publish")


def build_parser(stage: str) -> argparse.ArgumentParser:
    """The one argument parser of every stage; ``--source`` is ingest's, ``--target`` everyone else's."""
    p = argparse.ArgumentParser(
        prog=f"spark_apps/{stage}.py", description=f"Run the {stage} stage of an epoch (window)."
    )
    p.add_argument("--config", required=True, metavar="FILE", help="epochsync YAML config")
    p.add_argument("--epoch", type=epoch_number, required=True, metavar="E", help="first epoch of the run")
    p.add_argument("--through", type=epoch_number, metavar="E2", help="last epoch of the run (default: --epoch)")
    p.add_argument(
        "--target",
        required=stage != "ingest",
        metavar="NAME",
        help="target of the run" + (" (ingest: check continuity from its cursor)" if stage == "ingest" else ""),
    )
    p.add_argument(
        "--source",
        metavar="NAME",
        help="source to ingest (default: the target's)" if stage == "ingest" else argparse.SUPPRESS,
    )
    p.add_argument("--dry-run", action="store_true", help="translate: print the plan; nothing after it runs")
    p.add_argument("--whole-file", action="store_true", help="translate: copy whole files, not extents")
    p.add_argument(
        "--inject-failure", metavar="SPEC", help="apply, publish: fail on purpose (epochsync.journal.faults)"
    )
    return p


def stage_main(stage: str, argv: list[str] | None = None) -> int:
    """Parse the common arguments, run ``stage`` on one Spark session; returns the exit code."""
    if stage not in STAGES:
        print(f"unknown stage {stage!r} (have: {', '.join(STAGES)})", file=sys.stderr)
        return 2
    args = build_parser(stage).parse_args(argv)
    first, last = args.epoch, args.through or args.epoch
    raise_on_signals()  # Airflow stops a task with SIGTERM: leases released, one line
    try:
        from epochsync.spark import spark_session

        cfg = load_config(args.config)
        if stage == "ingest" and not args.source:
            if not args.target:
                raise EpochsyncError("ingest needs --source NAME or --target NAME")
            args.source = cfg.source_of(cfg.target(args.target)).name
        if stage == "ingest":
            cfg.source(args.source)  # a wrong name fails before Spark starts
        spark = spark_session(f"epochsync-{stage}-{args.target or args.source}-{last}", cfg=cfg)
        out = _run(stage, cfg, args, first, last, spark)
    except EpochsyncError as exc:
        print(f"{stage}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        sig = Interrupted.of(exc)
        print(
            f"{stage}: stopped by {sig.name}; the target keeps its last committed epoch (the DAG's rollback "
            "task undoes a partial apply)",
            file=sys.stderr,
        )
        return sig.exit_code
    if stage == "ingest":
        print(
            f"ingested {out['records']} records of source {out['source']} epochs {out['first_epoch']}..{out['last_epoch']}"
            f" in {out['seconds']} s ({out['quarantined']} quarantined)",
            flush=True,
        )
    else:
        print(json.dumps(jsonable(out), sort_keys=True, default=str))
    return 0


def _run(stage: str, cfg, args, first: int, last: int, spark) -> dict:
    if stage == "ingest":
        from epochsync.stages.ingest import run_ingest

        return run_ingest(
            cfg, args.source, first, last, spark, consumer=args.target, progress=lambda line: print(line, flush=True)
        )
    if stage == "merge":
        from epochsync.stages.merge import run_merge

        return run_merge(cfg, args.target, first, last, spark)
    if stage == "translate":
        from epochsync.stages.translate import run_translate

        out = run_translate(cfg, args.target, last, spark, whole_file=args.whole_file, first_epoch=first)
        if args.dry_run:
            print(f"dry run: plan of {args.target} epochs {first}..{last}: {json.dumps(out, sort_keys=True)}")
        return out
    if stage == "apply":
        from epochsync.stages.apply import run_apply

        return run_apply(cfg, args.target, last, spark, inject=args.inject_failure, first_epoch=first)
    if stage == "verify":
        from epochsync.stages.verify import run_verify

        return run_verify(cfg, args.target, last, spark, first_epoch=first)
    from epochsync.stages.publish import publish_epoch

    return publish_epoch(cfg, args.target, first, last, spark, inject=args.inject_failure)


if __name__ == "__main__":
    sys.exit(stage_main(sys.argv[1] if len(sys.argv) > 1 else "", sys.argv[2:]))
