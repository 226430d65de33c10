"""The embedded server's warm-up (``epochsync_dev.warmup``): the stages' queries once, on a tiny source."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from epochsync_dev.warmup import main

pytestmark = pytest.mark.integration


def test_the_session_server_was_warmed_up_and_kept_nothing(spark_connect_server):
    """The session's server, as `make demo` and `make airflow` start theirs: the warm-up ran
    ingest, both merges, both translations and one executor job, and removed its folder."""
    if not spark_connect_server.warm_up:  # EPOCHSYNC_SPARK_WARM_UP=0: the test starts it itself
        spark_connect_server.begin_warm_up()
    line = spark_connect_server.wait_warm_up(600)
    assert line and line.startswith("warm-up: done in"), line
    for step in ("'ingest'", "'merge-1'", "'translate-1'", "'merge-2'", "'translate-2'", "'tasks'"):
        assert step in line, line
    assert not (spark_connect_server.work_dir / "warm-up").exists()


def test_a_warm_up_that_cannot_reach_its_server_says_so_in_one_line(capsys):
    """A failed warm-up only costs the first epoch's time: one line, status 1, no traceback,
    and its temporary folder removed."""
    from epochsync_dev.embedded import free_port

    status = main(["--remote", f"sc://127.0.0.1:{free_port()}"])
    err = capsys.readouterr().err
    assert status == 1
    assert err.startswith("warm-up: failed, the first epoch will run on a cold server: cannot reach"), err
    assert "Traceback" not in err
    assert not list(Path(tempfile.gettempdir()).glob("epochsync-warm-up-*"))
