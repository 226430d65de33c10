"""Spark app of the translate stage: net change set + snapshots E-1/E → the target's plan (namespace ops, pulls, writes, part plans).

    spark-submit spark_apps/translate.py --config FILE --target NAME --epoch E [--through E2] [--whole-file] [--dry-run]

Prints the stage's figures as one JSON line; on failure one line on stderr and exit 1.
The work is :func:`epochsync.stages.translate.run_translate`.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from epochsync.stages.entry import stage_main

    return stage_main("translate", argv)


if __name__ == "__main__":
    sys.exit(main())
