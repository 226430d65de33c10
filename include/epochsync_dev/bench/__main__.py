"""``python -m epochsync_dev.bench NAME [args]``: run one benchmark."""

from __future__ import annotations

import importlib
import os
import sys

from epochsync_dev.bench import BENCHMARKS


def compile_sources() -> None:
    """Bytecode for epochsync's own modules, as an installed package has (pip compiles a wheel's).

    The project's ``.venv`` installs ``include/`` in place, and an environment with
    ``PYTHONDONTWRITEBYTECODE=1`` (this team's sandboxes) never writes it: every process the
    benchmarks start then compiled the 54 modules of an empty epoch again, 0.33 CPU-s a call
    (helper-16, 2026-11-28). Python reads bytecode even where it may not write it."""
    import compileall

    import epochsync
    import epochsync_dev

    for pkg in (epochsync, epochsync_dev):
        compileall.compile_dir(os.path.dirname(pkg.__file__), quiet=1)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in BENCHMARKS:
        print(f"usage: python -m epochsync_dev.bench {{{','.join(BENCHMARKS)}}} [options]", file=sys.stderr)
        return 2
    if argv[0] in ("ingest", "merge"):
        # large single jobs: Spark's own defaults (generated code, C2 JIT), not the small-epoch profile
        os.environ.setdefault("EPOCHSYNC_SPARK_PROFILE", "default")
    compile_sources()
    module = importlib.import_module(BENCHMARKS[argv[0]])
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
