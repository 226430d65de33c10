"""The development tools' command line: ``python -m epochsync_dev VERB`` (the simulator, the
benchmarks). The same machinery as ``epochsync``'s (:func:`epochsync.cli.main`: one error line,
the error class's exit status), with the verbs that never ship in the package.
"""

from __future__ import annotations

import sys

from epochsync.cli import main as _main

PROG = "python -m epochsync_dev"
DESCRIPTION = "epochsync's development tools: a seeded source workload, the benchmarks (never shipped)."

#: verb -> (owning module, one-line help)
DEV_VERBS: dict[str, tuple[str, str]] = {
    "simulate": (
        "epochsync_dev.simulate.verb",
        "generate a seeded source workload: changelogs, data objects, ground truth",
    ),
    "bench": ("epochsync_dev.bench", "run a benchmark and write bench/results/*.json"),
}


def main(argv: list[str] | None = None) -> int:
    """Run one development verb; returns its exit status (see :func:`epochsync.cli.main`)."""
    return _main(argv, verbs=DEV_VERBS, prog=PROG, description=DESCRIPTION)


def build_parser(verb: str | None = None):
    """The development tools' parser (the CLI reference draws it)."""
    from epochsync.cli import build_parser as _build

    return _build(verb, verbs=DEV_VERBS, prog=PROG, description=DESCRIPTION)


if __name__ == "__main__":
    sys.exit(main())
