"""Shared fixtures: one Spark Connect server (and a client session), one SeaweedFS and one moto server per run."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"

os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")


#: the longest files (about 200 s each in one process), started first so they run on different workers
LONGEST_FIRST = ("integration/test_demo.py", "integration/test_airflow_live.py")


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist workers: the longest files first, then the other files with a ``slow``
    test, then the rest (a stable sort: each file keeps its order). ``make test
    TEST_WORKERS=2`` runs two workers with ``--dist loadfile --no-loadscope-reorder`` (xdist would otherwise put the files with the
    most tests first, and these one-test files last): a worker takes the next file when it
    is done, so starting the long ones first keeps one worker from ending the run alone on
    a 200 s file."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        # one process: the files' own order, but the tests of the session's `airflow standalone`
        # (backfill, UI) last: its scheduler, DAG processor and API server, started by the first
        # of them, then run for minutes instead of through the whole suite, taking CPU from it
        items.sort(key=lambda item: "scheduler_stack" in getattr(item, "fixturenames", ()))
        return
    slow = {item.path for item in items if item.get_closest_marker("slow")}

    def rank(item) -> int:
        path = item.path.as_posix()
        for i, name in enumerate(LONGEST_FIRST):
            if path.endswith("/tests/" + name):
                return i
        return len(LONGEST_FIRST) + (0 if item.path in slow else 1)

    items.sort(key=rank)


@pytest.fixture(scope="session")
def spark_connect():
    """One Spark Connect server (local[2]) for the whole run, as `make demo` starts one; yields its URL.

    ``EPOCHSYNC_SPARK_REMOTE`` points at it for the run, so stage functions, the CLI and
    the subprocesses the tests start are all clients of this one warm application.
    """
    from epochsync.spark import REMOTE_ENV
    from epochsync_dev.embedded import SparkConnectServer

    server = SparkConnectServer("local[2]", conf={"spark.sql.shuffle.partitions": "2"})
    url = server.start()
    old = os.environ.get(REMOTE_ENV)
    os.environ[REMOTE_ENV] = url
    yield url
    if old is None:
        os.environ.pop(REMOTE_ENV, None)
    else:
        os.environ[REMOTE_ENV] = old
    server.stop()


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture(scope="session")
def spark(spark_connect):
    """A client session of the run's Spark Connect server, prepared as every stage prepares its own."""
    from epochsync.spark import spark_session

    session = spark_session("epochsync-tests", remote=spark_connect, shuffle_partitions=2)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def seaweed():
    """A real S3 server (SeaweedFS ``weed mini``) on loopback; yields an S3Endpoint."""
    from epochsync_dev.embedded import SeaweedFS

    server = SeaweedFS()
    endpoint = server.start()
    yield endpoint
    server.stop()


@pytest.fixture(scope="session")
def moto_server():
    from epochsync_dev.embedded import MotoS3

    server = MotoS3()
    server.start()
    yield server
    server.stop()


@pytest.fixture()
def moto_s3(moto_server):
    """moto's S3 double, emptied before each test."""
    moto_server.reset()
    return moto_server.endpoint


@pytest.fixture()
def bucket_name() -> str:
    return "t-" + uuid.uuid4().hex[:12]
