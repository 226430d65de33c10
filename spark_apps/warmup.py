"""Runs the kinds of queries the stages run; ``epochsync.spark.ensure_cds_archive`` submits it
with ``-XX:ArchiveClassesAtExit`` so later spark-submits start from a class-data archive.

    spark-submit spark_apps/warmup.py
"""

from __future__ import annotations

import sys


def main() -> int:
    from epochsync.spark import warmup_main

    return warmup_main()


if __name__ == "__main__":
    sys.exit(main())
