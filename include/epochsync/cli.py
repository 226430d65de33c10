"""The ``epochsync`` command line: the same functions the DAG tasks call.

Each verb lives in the module that owns it, which provides
``configure_<verb>(parser)`` and ``run_<verb>(args) -> int``; only the module of the
verb being run is imported, so ``epochsync parse`` never loads Spark or Airflow.
Exit codes: 0 done, 1 failed (one line on stderr saying what and where), 2 usage.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

from epochsync.errors import EpochsyncError

#: verb -> (owning module, one-line help)
VERBS: dict[str, tuple[str, str]] = {
    "parse": ("epochsync.formats.cli", "convert changelogs (lustre, gluster, jsonl) to canonical JSON Lines"),
    "simulate": ("epochsync.simulate", "generate a seeded source workload: changelogs, data objects, ground truth"),
    "replicate": ("epochsync.pipeline", "run ingest, merge, translate, apply, verify, commit for a target"),
    "rollback": ("epochsync.pipeline", "roll a target back to its last committed epoch"),
    "relocate": ("epochsync.pipeline", "move a target's control directory to its configured control_dir"),
    "changes": ("epochsync.changes", "list what differs between two committed epochs of a target (NEW, MODIFY, ...)"),
    "feed": ("epochsync.feed", "feed consumers: register (from a dump), ack an epoch, status, hydrate, unregister"),
    "status": ("epochsync.status", "per target: committed epoch, lag, last run's figures"),
    "report": ("epochsync.status", "write an HTML report of lag and bytes over epochs"),
    "bench": ("epochsync.bench", "run a benchmark and write bench/results/*.json"),
}


def _available() -> dict[str, tuple[str, str]]:
    out = {}
    for verb, (module, help_) in VERBS.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if found:
            out[verb] = (module, help_)
    return out


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    verbs = _available()
    parser = argparse.ArgumentParser(
        prog="epochsync",
        description="Keep replicas of a parallel file system in sync from its changelogs, one epoch at a time.",
        epilog="Run 'epochsync VERB --help' for a verb's options.",
    )
    sub = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for name, (module, help_) in verbs.items():
        p = sub.add_parser(name, help=help_, description=help_)
        if name == verb:
            getattr(importlib.import_module(module), f"configure_{name}")(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    verb = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(verb if verb in VERBS else None)
    args = parser.parse_args(argv)
    module = importlib.import_module(_available()[args.verb][0])
    try:
        return int(getattr(module, f"run_{args.verb}")(args) or 0)
    except EpochsyncError as exc:
        print(f"epochsync {args.verb}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"epochsync {args.verb}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
