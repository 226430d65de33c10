"""Spark app of a feed target's publish stage (in place of translate, apply, verify and commit).

    spark-submit spark_apps/publish.py --config FILE --target NAME --epoch E [--through E2]

Publishes the merged window's net change as one feed file and commits ``_feed.json``;
prints the stats row as one JSON line; on failure one line on stderr and exit 1.
The work is :func:`epochsync.stages.publish.publish_epoch`.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from epochsync.stages.entry import stage_main

    return stage_main("publish", argv)


if __name__ == "__main__":
    sys.exit(main())
