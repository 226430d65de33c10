"""Shared fixtures: one Spark Connect server (and a client session), one SeaweedFS and one moto server per run."""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from pathlib import Path

import pytest
from support.machine import cannot_run_here
from support.signals import teardown_on_signal

FIXTURES = Path(__file__).parent / "fixtures"

os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
# a command without a configured server runs Spark in process here, as before: the local
# server the CLI would otherwise start (and leave running until idle) has its own tests
os.environ.setdefault("EPOCHSYNC_SPARK_AUTOSTART", "0")


#: the longest files (about 200 s each in one process), started first so they run on different workers
LONGEST_FIRST = ("integration/test_demo.py", "integration/test_airflow_live.py")


def pytest_configure(config):
    teardown_on_signal()  # a run stopped by SIGTERM or SIGHUP stops what its fixtures started


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist workers: the longest files first, then the other files with a ``slow``
    test, then the rest (a stable sort: each file keeps its order). ``make test
    TEST_WORKERS=2`` runs two workers with ``--dist loadfile --no-loadscope-reorder`` (xdist would otherwise put the files with the
    most tests first, and these one-test files last): a worker takes the next file when it
    is done, so starting the long ones first keeps one worker from ending the run alone on
    a 200 s file."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        # one process: the files' own order, but the live-schedule test late (its scenario runs
        # from the session's start, beside the other tests: see live_epochs) and the tests of
        # the session's `airflow standalone` (backfill, UI) last: its scheduler, DAG processor
        # and API server, started by the first of them, then run for minutes instead of
        # through the whole suite, taking CPU from it
        def late(item) -> int:
            names = getattr(item, "fixturenames", ())
            return 2 if "scheduler_stack" in names else 1 if "live_epochs" in names else 0

        items.sort(key=late)
        return
    slow = {item.path for item in items if item.get_closest_marker("slow")}

    def rank(item) -> int:
        path = item.path.as_posix()
        for i, name in enumerate(LONGEST_FIRST):
            if path.endswith("/tests/" + name):
                return i
        return len(LONGEST_FIRST) + (0 if item.path in slow else 1)

    items.sort(key=rank)


@pytest.fixture(scope="module")
def data_on_executors():
    """Every apply's data phase of the module on the Spark executors, however few its operations
    (a plan this small would otherwise run in the driver's threads): for the tests whose faults
    and kills come from executors (``pytest.mark.usefixtures("data_on_executors")``)."""
    with pytest.MonkeyPatch.context() as m:
        m.setenv("EPOCHSYNC_APPLY_EXECUTOR_MIN_OPS", "0")
        yield


@pytest.fixture(scope="session")
def spark_connect_server():
    """One Spark Connect server (local[2]) for the whole run, as `make demo` starts one, warmed up
    in the background (``epochsync_dev.warmup``) as `make demo` does; yields the server.

    ``EPOCHSYNC_SPARK_REMOTE`` points at it for the run, so stage functions, the CLI and
    the subprocesses the tests start are all clients of this one warm application.
    """
    from epochsync.spark import REMOTE_ENV
    from epochsync_dev.embedded import SparkConnectServer, warm_up_wanted

    server = SparkConnectServer("local[2]", conf={"spark.sql.shuffle.partitions": "2"}, warm_up=warm_up_wanted())
    url = server.start()
    old = os.environ.get(REMOTE_ENV)
    os.environ[REMOTE_ENV] = url
    yield server
    if old is None:
        os.environ.pop(REMOTE_ENV, None)
    else:
        os.environ[REMOTE_ENV] = old
    server.stop()


@pytest.fixture(scope="session")
def spark_connect(spark_connect_server):
    """The URL of the session's Spark Connect server (``spark_connect_server``)."""
    return spark_connect_server.url


@pytest.fixture(scope="session")
def live_epochs(seaweed, spark_connect, tmp_path_factory):
    """The live-schedule scenario (``support/live.py``), started in a background thread."""
    from support.live import LiveEpochs

    live = LiveEpochs(seaweed, tmp_path_factory.mktemp("live")).start()
    yield live
    live.stop()


@pytest.fixture(scope="session", autouse=True)
def _live_epochs_beside_the_others(request):
    """Start the live scenario with the session when its test is selected, in one process: its
    three minutes of 30 s epochs then pass while the other tests run (the test reads the
    result late). Under pytest-xdist the test starts it itself."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    items = request.session.items
    if any("live_epochs" in getattr(item, "fixturenames", ()) for item in items):
        live = request.getfixturevalue("live_epochs")
        live.facts["beside_other_tests"] = len(items) > 1


@pytest.fixture(scope="session")
def gluster_stack(tmp_path_factory):
    """A live GlusterFS volume for the run (``epochsync_dev.gluster.GlusterStack``: 2 btrfs bricks,
    changelog on, sharding on with 4 MB blocks, FUSE-mounted); yields the stack, its volume in
    ``stack.volume``. Skipped where Gluster cannot run (not root, no FUSE, no packages), but
    failed instead when ``EPOCHSYNC_REQUIRE_GLUSTER`` is set (CI sets it: the packages are
    installed there)."""
    from epochsync_dev.gluster import REQUIRE_ENV, GlusterStack, GlusterUnavailable

    stack = GlusterStack(tmp_path_factory.mktemp("gluster"), shard_block="4MB", rollover=5)
    try:
        stack.start(install=bool(os.environ.get(REQUIRE_ENV)))
    except GlusterUnavailable as exc:
        cannot_run_here(REQUIRE_ENV, "Gluster", exc)
    yield stack
    stack.stop()


@pytest.fixture(scope="session", autouse=True)
def _kept_dag_processes():
    """Ends the kept ``dag.test()`` processes (``epochsync.airflow.dagtest.kept_process``) when the run
    ends, also when it is interrupted: one in the middle of a DAG run does not read the end of its
    input, ignores SIGTERM (Airflow's handler) and outlived an interrupted run by minutes."""
    yield
    from epochsync.airflow.dagtest import close_kept_processes

    close_kept_processes()


@pytest.fixture(scope="session")
def btrfs_dir(tmp_path_factory):
    """A btrfs file system for the run (``epochsync_dev.btrfs.BtrfsLoop``: a sparse 1 GiB loop
    image, mounted); yields its mount point. Skipped where it cannot be made (not root, no loop
    devices, no btrfs-progs), but failed instead when ``EPOCHSYNC_REQUIRE_BTRFS`` is set (CI sets
    it where those are there), as the gluster stack is."""
    from epochsync_dev.btrfs import REQUIRE_ENV, BtrfsLoop, BtrfsUnavailable

    loop = BtrfsLoop(tmp_path_factory.mktemp("btrfs"))
    try:
        mount = loop.start()
    except BtrfsUnavailable as exc:
        cannot_run_here(REQUIRE_ENV, "a btrfs loop image", exc)
    yield mount
    loop.stop()


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture(scope="session")
def spark(spark_connect):
    """A client session of the run's Spark Connect server, prepared as every stage prepares its own."""
    from epochsync.spark import spark_session

    session = spark_session("epochsync-tests", remote=spark_connect, shuffle_partitions=2)
    # the server drops a session idle for 10 minutes (spark_server.SESSION_IDLE_TIMEOUT), and a
    # run can go longer than that between two tests of this one (the demo's and the live
    # volumes' minutes): a request every two minutes keeps it
    done = threading.Event()

    def keep_alive():
        while not done.wait(120):
            with contextlib.suppress(Exception):
                session.conf.get("spark.sql.session.timeZone")

    threading.Thread(target=keep_alive, name="spark-session-keep-alive", daemon=True).start()
    yield session
    done.set()
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
