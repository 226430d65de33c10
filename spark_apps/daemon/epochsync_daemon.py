"""PySpark's Python daemon with epochsync's executor imports done once, before it forks workers.

The embedded Connect server and docker-compose's cluster run it as
``spark.python.daemon.module`` (this folder on the executors' ``PYTHONPATH``).

Spark starts one Python daemon per session environment and forks a worker from it for each
task slot; a worker left idle for a minute is killed (``PythonWorkerFactory``, not
configurable), so every run after a pause (a schedule of 5-minute epochs, the first run of
a session) forks new workers, and each imported boto3, built botocore's S3 model and
imported the epochsync modules its task runs again: about 0.7-0.9 CPU-s per worker,
measured (docs/INTERNALS.md). Done here once, a forked worker inherits them.

Only what starts no thread is imported: a process must not fork while other threads hold
locks (pyspark's own daemon imports nothing for that reason; pyarrow starts threads, so
workers still import it themselves). The epochsync modules come from the package zip the
session shipped, found in the daemon's working directory (the session's artifact folder):
the same file the worker puts on its path for the task. Without exactly one such zip
(another client's session), only the libraries are loaded. A preload that fails leaves
the daemon as pyspark's: the worker then imports what it needs itself.
``tests/unit/test_spark_daemon.py`` checks that the preload starts no thread.
"""

from __future__ import annotations

import contextlib
import glob
import os
import sys

#: the modules the executor tasks run (ingest's parse, apply's data writes, verify's reads)
EXECUTOR_MODULES = (
    "epochsync.spark",
    "epochsync.stages.ingest.executor",
    "epochsync.stages.apply",
    "epochsync.stages.verify",
    "epochsync.targets.posix",
    "epochsync.targets.s3",
    "epochsync.journal.undo",
)


def preload() -> list[str]:
    """Import boto3 and, from the session's package zip, the executor modules; returns what was
    loaded: ``["boto3", <zip name>]``, shorter when one is missing or fails to import."""
    import importlib

    loaded: list[str] = []
    # the daemon's stdout carries its port to the JVM: nothing imported may write there
    with contextlib.redirect_stdout(sys.stderr):
        try:
            import boto3

            # botocore's S3 model and endpoint rules, cached in the default session's loader
            # that epochsync.stores.s3.make_client's boto3.client() uses
            boto3.client(
                "s3",
                region_name="us-east-1",
                endpoint_url="http://127.0.0.1:9",
                aws_access_key_id="preload",
                aws_secret_access_key="preload",
            )
            loaded.append("boto3")
        except Exception:  # no boto3 on this Python: the tasks will say so themselves
            return loaded
        zips = glob.glob("epochsync-*.zip")
        if len(zips) != 1:
            return loaded
        path = os.path.abspath(zips[0])
        sys.path.insert(0, path)
        try:
            for name in EXECUTOR_MODULES:
                module = importlib.import_module(name)
                # from the zip only: an unreadable zip falls through to an installed copy
                if not (module.__file__ or "").startswith(path + os.sep):
                    raise ImportError(f"{name} is not the session's ({module.__file__})")
            loaded.append(os.path.basename(path))
        except Exception:  # leave no half-imported package behind: the worker imports it anew
            for name in [m for m in sys.modules if m == "epochsync" or m.startswith("epochsync.")]:
                del sys.modules[name]
            sys.path.remove(path)
    return loaded


def main() -> None:
    """Preload, then run pyspark's daemon (``sys.argv[1]`` names the worker module, as for pyspark's)."""
    try:
        preload()
    except Exception as exc:  # never keep Spark from starting its workers
        print(f"epochsync_daemon: preload skipped: {type(exc).__name__}: {exc}", file=sys.stderr)
    from pyspark import daemon

    daemon.manager()


if __name__ == "__main__":
    main()
