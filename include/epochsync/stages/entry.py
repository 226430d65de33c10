"""The one entry point of a stage run as its own process (``spark_apps/<stage>.py``): common arguments, one session, one JSON line or one error line."""

from __future__ import annotations

import sys

from epochsync.core.config import load_config
from epochsync.core.errors import EpochsyncError
from epochsync.core.jsonable import jsonable
from epochsync.core.shutdown import Interrupted, raise_on_signals
from epochsync.stages.apply import run_apply
from epochsync.stages.translate import run_translate
from epochsync.stages.verify import run_verify


def stage_main(stage: str, argv: list[str] | None = None) -> int:
    """``spark_apps/<stage>.py``: common arguments, one session, one JSON line or one error line."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog=f"spark_apps/{stage}.py")
    parser.add_argument("--config", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--epoch", type=int, required=True, help="first epoch of the run")
    parser.add_argument("--through", type=int, help="last epoch of the run (default: --epoch)")
    parser.add_argument("--whole-file", action="store_true")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--inject-failure", default=None)
    parser.add_argument("--source", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    first, last = args.epoch, args.through or args.epoch
    raise_on_signals()  # Airflow stops a task with SIGTERM: leases released, one line
    try:
        from epochsync.spark import spark_session

        cfg = load_config(args.config)
        spark = spark_session(f"epochsync-{stage}-{args.target}-{last}", cfg=cfg)
        if stage == "translate":
            out = run_translate(cfg, args.target, last, spark, whole_file=args.whole_file, first_epoch=first)
            if args.dry_run:
                print(f"dry run: plan of {args.target} epochs {first}..{last}: {json.dumps(out, sort_keys=True)}")
        elif stage == "apply":
            out = run_apply(cfg, args.target, last, spark, inject=args.inject_failure, first_epoch=first)
        elif stage == "verify":
            out = run_verify(cfg, args.target, last, spark, first_epoch=first)
        else:
            raise EpochsyncError(f"unknown stage {stage!r}")
    except EpochsyncError as exc:
        print(f"{stage}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        sig = Interrupted.of(exc)
        print(f"{stage}: stopped by {sig.name}; the target keeps its last committed epoch (the DAG's rollback "
              "task undoes a partial apply)", file=sys.stderr)  # fmt: skip
        return sig.exit_code
    print(json.dumps(jsonable(out), sort_keys=True, default=str))
    return 0
