"""Spark app of the apply stage: the plan → the target, undo journal first (namespace on the driver, data on executors).

    spark-submit spark_apps/apply.py --config FILE --target NAME --epoch E [--through E2] [--inject-failure SPEC]

Prints the stage's figures as one JSON line; on failure one line on stderr and exit 1.
The work is :func:`epochsync.stages.apply.run_apply`.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from epochsync.stages.entry import stage_main

    return stage_main("apply", argv)


if __name__ == "__main__":
    sys.exit(main())
