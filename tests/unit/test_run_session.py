"""Kept Spark Connect sessions: the epoch DAG's (shared by its tasks and runs) and ``epochsync replicate``'s."""

from __future__ import annotations

import subprocess
import sys
import uuid

ROOT_INCLUDE = str(__import__("pathlib").Path(__file__).resolve().parents[2] / "include")


def test_the_run_session_is_a_stable_uuid_per_run():
    from epochsync.spark import run_session_remote

    a = run_session_remote("sc://127.0.0.1:15002/", "epochsync__sim__dag/manual__2026-11-23")
    assert a == run_session_remote("sc://127.0.0.1:15002", "epochsync__sim__dag/manual__2026-11-23")
    assert a != run_session_remote("sc://127.0.0.1:15002/", "epochsync__sim__dag/manual__2026-11-24")
    base, sid = a.split(";session_id=")
    assert base == "sc://127.0.0.1:15002/"
    assert uuid.UUID(sid).version == 4
    # the provider's URL may carry parameters already (user_id, token)
    b = run_session_remote("sc://h:1/;user_id=ops", "r")
    assert b.startswith("sc://h:1/;user_id=ops;session_id=")


_TASK = """
import sys
from pyspark.sql import SparkSession
from epochsync.spark import SHIPPED_CONF, prepare_session
spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
before = spark.conf.get(SHIPPED_CONF, None)
spark.release_session_on_close = False   # what run_stage_task does
prepare_session(spark)
# executors import the shipped package
row = spark.range(1).mapInArrow(lambda it: ((__import__('epochsync'), b)[1] for b in it), "id long").collect()
print(before or "-", spark.conf.get(SHIPPED_CONF))
spark.stop()
"""


def test_two_task_processes_share_the_session_and_ship_the_package_once(spark_connect):
    """The second task of a run finds the package in the session: no second upload."""
    from epochsync.spark import run_session_remote

    remote = run_session_remote(spark_connect, f"test-run-{uuid.uuid4()}")
    outs = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", _TASK, remote],
            capture_output=True,
            text=True,
            env={**__import__("os").environ, "PYTHONPATH": ROOT_INCLUDE},
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        outs.append(done.stdout.split()[-2:])
    first, second = outs
    assert first[0] == "-" and first[1].startswith("epochsync-")
    # stop() in the first process closed its client only: the session (and its package) lived on
    assert second == [first[1], first[1]]


def test_replicate_runs_of_one_target_reopen_one_session(spark_connect):
    """``spark_session(session_key=...)``: the session survives the client's stop() and is found again."""
    from epochsync.spark import SHIPPED_CONF, spark_session

    key = f"replicate/test/{uuid.uuid4()}"
    first = spark_session("a", remote=spark_connect, session_key=key)
    sid, shipped = first.session_id, first.conf.get(SHIPPED_CONF)
    first.stop()
    again = spark_session("b", remote=spark_connect, session_key=key)
    try:
        assert again.session_id == sid
        assert again.conf.get(SHIPPED_CONF) == shipped
        assert again.range(3).count() == 3
    finally:
        again.release_session_on_close = True  # released: the next client gets a fresh one
        again.stop()
    # the server closed that session (released here; an idle timeout does the same): the
    # key moves to a new session instead of failing with SESSION_CLOSED
    renewed = spark_session("b2", remote=spark_connect, session_key=key)
    assert renewed.session_id != sid and renewed.range(2).count() == 2
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    # the client of the closed session is not left as the process's default session (every
    # later getOrCreate() would return it, and fail); another test's live session may be
    default = ConnectSession._get_default_session()
    assert default is None or default.session_id != sid
    renewed.release_session_on_close = True
    renewed.stop()
    other = spark_session("c", remote=spark_connect, session_key=key + "-other")
    other.release_session_on_close = True
    other.stop()
    assert other.session_id != sid


def test_a_closed_kept_session_is_renewed_before_the_provider_opens_it(spark_connect):
    """The epoch DAG's session is kept across runs; a run after the server closed it (idle
    timeout) must not fail: the provider's ``getOrCreate`` sets options on the session, which
    fails on a closed one, so ``open_keyed_remote`` checks it and moves the key first."""
    import pytest
    from pyspark import SparkConf
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    from epochsync.spark import forget_default_session, open_keyed_remote

    def provider_session(remote: str):
        """What EpochStageOperator.execute then PySparkOperator.execute_callable do."""
        forget_default_session()  # (a test before may hold a default session: the fixture's)
        conf = SparkConf().set("spark.app.name", "epochsync__sim__dag-merge").set("spark.remote", remote)
        return SparkSession.builder.config(conf=conf).getOrCreate()

    saved = ConnectSession._default_session, getattr(ConnectSession._active_session, "session", None)
    key = f"epochsync__sim__dag/{uuid.uuid4()}/epochsync-test.zip"
    try:
        first = open_keyed_remote(spark_connect, key)
        assert open_keyed_remote(spark_connect, key) == first  # open: the same session, run after run
        s = provider_session(first)
        assert s.session_id == first.split("session_id=")[1]
        assert s.range(3).count() == 3
        s.release_session_on_close = True  # the server closes it (as its idle timeout does)
        s.stop()
        with pytest.raises(Exception, match="SESSION_CLOSED|SESSION_NOT_FOUND"):
            provider_session(first)  # what the provider did on a closed session: the task failed
        # the failed getOrCreate's client (left as the default session): close it
        for leftover in {ConnectSession.getActiveSession(), ConnectSession._default_session} - {None}:
            leftover.release_session_on_close = False
            leftover.stop()
        renewed = open_keyed_remote(spark_connect, key)
        assert renewed != first
        s = provider_session(renewed)
        try:
            assert s.session_id == renewed.split("session_id=")[1]
            assert s.range(2).count() == 2
            assert open_keyed_remote(spark_connect, key) == renewed  # the next runs use the new one
        finally:
            s.release_session_on_close = True
            s.stop()
    finally:  # the session another test holds stays the process's default
        ConnectSession._default_session, ConnectSession._active_session.session = saved


def test_a_server_that_is_not_running_is_reported_at_once():
    """No Spark Connect server at the URL: one clear error within seconds, not the client's
    10 minutes of retries."""
    import time

    import pytest

    from epochsync.core.errors import EpochsyncError
    from epochsync.spark import spark_session
    from epochsync_dev.embedded import free_port

    url = f"sc://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(
        EpochsyncError, match=r"cannot reach the Spark Connect server sc://127\.0\.0\.1:\d+: .*is it running"
    ):
        spark_session("unreachable", remote=url, session_key="unreachable-test")
    assert time.monotonic() - t0 < 30


_GONE = """
import sys, threading
from pyspark.sql import SparkSession
from epochsync.spark import exit_without_retries
# a client whose server has gone: every request fails and is retried (about 10 minutes)
spark = SparkSession.builder.remote(sys.argv[1]).create()
exit_without_retries(spark)
threading.Thread(target=lambda: spark.range(1).count(), name="query").start()
print("exiting", flush=True)
"""


def test_a_process_whose_server_has_gone_exits_without_waiting_for_retries():
    """The client's retries (a query in a thread, the clean-up at exit) stop at interpreter exit:
    the process ends in seconds. Without ``exit_without_retries`` it ran into the timeout."""
    import time

    from epochsync_dev.embedded import free_port

    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", _GONE, f"sc://127.0.0.1:{free_port()}"],
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "PYTHONPATH": ROOT_INCLUDE},
        timeout=120,
    )
    assert "exiting" in done.stdout, done.stderr[-2000:]
    assert time.monotonic() - t0 < 60, done.stderr[-2000:]
