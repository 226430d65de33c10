"""Spark app of the verify stage: every touched path of the target against the source at E (size, sha256, attributes).

    spark-submit spark_apps/verify.py --config FILE --target NAME --epoch E [--through E2]

Prints the stage's figures as one JSON line; on failure one line on stderr and exit 1.
The work is :func:`epochsync.stages.verify.run_verify`.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from epochsync.stages.entry import stage_main

    return stage_main("verify", argv)


if __name__ == "__main__":
    sys.exit(main())
