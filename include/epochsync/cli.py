"""The ``epochsync`` command line: the same functions the DAG tasks call.

The development tools (the simulator, the benchmarks) are not among them: they are the
project's own, ``python -m epochsync_dev VERB`` (:mod:`epochsync_dev.cli`, the same machinery),
and never ship in the package.

Each verb lives in the module that owns it, which provides
``configure_<verb>(parser)`` and ``run_<verb>(args) -> int``; only the module of the
verb being run is imported, so ``epochsync parse`` never loads Spark or Airflow.
An error prints one line on stderr saying what and where, and exits with its class's
status (:data:`epochsync.core.errors.EXIT_CODES`: the CLI reference's table); 2 is a usage
error, 130/143 stopped by SIGINT/SIGTERM (one line saying where the target was left).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys

from epochsync.core.errors import EpochsyncError
from epochsync.core.shutdown import Interrupted, signals_raise

#: set to 1 to see the traceback of a file system error instead of its one-line summary
DEBUG_ENV = "EPOCHSYNC_DEBUG"

#: verb -> (owning module, one-line help)
VERBS: dict[str, tuple[str, str]] = {
    "parse": ("epochsync.formats.cli", "convert changelogs (lustre, gluster, jsonl) to canonical JSON Lines"),
    "cut": (
        "epochsync.stages.cut",
        "cut a live source (kind: gluster) now, as its next epoch, and publish its records",
    ),
    "purge": (
        "epochsync.stages.purge",
        "drop a source's changelogs, records and cuts every consumer has applied (the purge DAG's task)",
    ),
    "replicate": ("epochsync.stages.replicate", "run ingest, merge, translate, apply, verify, commit for a target"),
    "rollback": ("epochsync.stages.rollback", "roll a target back to its last committed epoch"),
    "relocate": ("epochsync.stages.replicate", "move a target's control directory to its configured control_dir"),
    "audit": (
        "epochsync.stages.audit",
        "compare a target's committed epoch in full with the source at that epoch (--deep: bytes too)",
    ),
    "changes": (
        "epochsync.report.changes",
        "list what differs between two committed epochs of a target (NEW, MODIFY, ...)",
    ),
    "feed": (
        "epochsync.stages.publish",
        "feed consumers: register (from a dump), ack an epoch, status, hydrate, unregister",
    ),
    "check": ("epochsync.report.check", "check a setup: the warehouse, each source and target reached as a run would"),
    "status": ("epochsync.report.status", "per target: committed epoch, lag, last run's figures"),
    "report": ("epochsync.report.status", "write an HTML report of lag and bytes over epochs"),
    "agent": ("epochsync.agent.cli", "the agent on a Gluster server: serve, check its config, info of a running one"),
    "spark": ("epochsync.spark_server", "the local Spark server commands share: start, stop, status"),
}


def _available(verbs: dict[str, tuple[str, str]]) -> dict[str, tuple[str, str]]:
    out = {}
    for verb, (module, help_) in verbs.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if found:
            out[verb] = (module, help_)
    return out


def _version() -> str:
    """The installed distribution's version (:func:`epochsync.core.version.package_version`)."""
    from epochsync.core.version import package_version

    return package_version()


DESCRIPTION = "Keep replicas of a parallel file system in sync from its changelogs, one epoch at a time."


def build_parser(
    verb: str | None = None,
    *,
    verbs: dict[str, tuple[str, str]] | None = None,
    prog: str = "epochsync",
    description: str = DESCRIPTION,
) -> argparse.ArgumentParser:
    """Returns the ``epochsync`` parser (or ``prog``'s, of ``verbs``); the options of ``verb`` are added
    only when it is named (its module is imported then)."""
    verbs = _available(VERBS if verbs is None else verbs)
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=f"Run '{prog} VERB --help' for a verb's options.",
    )
    parser.add_argument("--version", action="version", version=f"epochsync {_version()}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for name, (module, help_) in verbs.items():
        p = sub.add_parser(name, help=help_, description=help_)
        if name == verb:
            getattr(importlib.import_module(module), f"configure_{name}")(p)
    return parser


def main(
    argv: list[str] | None = None,
    *,
    verbs: dict[str, tuple[str, str]] | None = None,
    prog: str = "epochsync",
    description: str = DESCRIPTION,
) -> int:
    """Run one verb (of ``verbs``, default :data:`VERBS`); returns the exit status: 0, the error class's
    (:data:`epochsync.core.errors.EXIT_CODES`) with one ``error:`` line, 2 for a usage error, or 128 +
    the signal."""
    verbs = VERBS if verbs is None else verbs
    argv = list(sys.argv[1:] if argv is None else argv)
    verb = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(verb if verb in verbs else None, verbs=verbs, prog=prog, description=description)
    args = parser.parse_args(argv)
    name = prog.split()[-1]
    try:
        # SIGTERM and SIGINT raise Interrupted: leases are released, replicate rolls back
        with signals_raise():
            module = importlib.import_module(_available(verbs)[args.verb][0])
            return int(getattr(module, f"run_{args.verb}")(args) or 0)
    except EpochsyncError as exc:
        # each class of error its own status (core.errors.EXIT_CODES; the CLI reference's table)
        print(f"{name} {args.verb}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        sig = Interrupted.of(exc)
        print(
            f"{name} {args.verb}: interrupted by {sig.name}" + (f": {sig.outcome}" if sig.outcome else ""),
            file=sys.stderr,
        )
        return sig.exit_code
    except OSError as exc:
        # a file system or network failure outside the checks above: one line, not a traceback
        if os.environ.get(DEBUG_ENV):
            raise
        print(f"{name} {args.verb}: error: {_os_error(exc)} (set {DEBUG_ENV}=1 for the traceback)", file=sys.stderr)
        return 1


def _os_error(exc: OSError) -> str:
    if exc.filename is not None:
        where = f"{exc.filename}" + (f" -> {exc.filename2}" if exc.filename2 is not None else "")
        return f"{where}: {exc.strerror or exc}"
    return f"{type(exc).__name__}: {exc}"


if __name__ == "__main__":
    sys.exit(main())
