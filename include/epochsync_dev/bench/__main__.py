"""``python -m epochsync_dev.bench NAME [args]``: run one benchmark."""

from __future__ import annotations

import importlib
import os
import sys

from epochsync_dev.bench import BENCHMARKS


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in BENCHMARKS:
        print(f"usage: python -m epochsync_dev.bench {{{','.join(BENCHMARKS)}}} [options]", file=sys.stderr)
        return 2
    if argv[0] in ("ingest", "merge"):
        # large single jobs: Spark's own defaults (generated code, C2 JIT), not the small-epoch profile
        os.environ.setdefault("EPOCHSYNC_SPARK_PROFILE", "default")
    module = importlib.import_module(BENCHMARKS[argv[0]])
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
