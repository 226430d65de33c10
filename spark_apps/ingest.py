"""Spark app of the ingest stage: a source's closed epochs → canonical records in the warehouse.

    spark-submit spark_apps/ingest.py --config FILE --source NAME --epoch E [--through E2] [--target T]

Prints one line per server, then a summary; on failure one line on stderr and exit 1.
The work is :func:`epochsync.stages.ingest.run_ingest`.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from epochsync.stages.entry import stage_main

    return stage_main("ingest", argv)


if __name__ == "__main__":
    sys.exit(main())
