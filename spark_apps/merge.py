"""Spark app of the merge stage: snapshot E-1 + records of E (or E..E2) → snapshot, change set.

    spark-submit spark_apps/merge.py --config FILE --target NAME --epoch E [--through E2]

Prints the stats as one JSON line; on failure one line on stderr and exit 1.
The work is :func:`epochsync.stages.merge.run_merge`.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from epochsync.stages.entry import stage_main

    return stage_main("merge", argv)


if __name__ == "__main__":
    sys.exit(main())
