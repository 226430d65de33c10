"""How the harness runs glusterfind: a command that does not end is killed with every process it
started, and says what those processes were doing and what the session's logs said last; a
``pre`` that hung once is run once more, and a second hang is an error.

CI once saw a ``glusterfind pre`` that had not ended after 300 s (``test_glusterfind.py``), and
the harness had kept nothing that said why. No glusterfind is needed here: the commands are shell.
"""

from __future__ import annotations

import os
import time

import pytest

import epochsync_dev.glusterfind as gf
from epochsync_dev.glusterfind import GlusterfindHung, Session, run_bounded


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purpose: it holds nothing
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ", 1)[1][0] != "Z"


def test_a_command_past_its_time_is_killed_with_its_children_and_says_what_they_did(tmp_path):
    logs = tmp_path / "session" / "vol"
    logs.mkdir(parents=True)
    (logs / "changelog.abc.log").write_text("".join(f"line {i}\n" for i in range(40)))
    pidfile = tmp_path / "child.pid"
    t0 = time.monotonic()
    with pytest.raises(GlusterfindHung) as caught:
        run_bounded(["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"], timeout=1.5, logs=tmp_path / "session")
    assert time.monotonic() - t0 < 20
    said = str(caught.value)
    assert "did not end in 2 s; killed" in said and "sleep 60" in said  # the processes that were left
    assert "changelog.abc.log (last 12 lines)" in said and "line 39" in said and "line 27" not in said
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child), "the child glusterfind started outlived the kill"


def test_a_command_that_fails_says_its_last_line():
    with pytest.raises(RuntimeError, match=r"sh -c .*: second"):
        run_bounded(["sh", "-c", "echo first >&2; echo second >&2; exit 3"], timeout=10)
    assert run_bounded(["sh", "-c", "echo ok"], timeout=10).stdout == "ok\n"


def _fake_pre(monkeypatch, tmp_path, outcomes):
    calls = []

    def fake(cmd, *, timeout, logs=None):
        calls.append(cmd)
        what = outcomes[len(calls) - 1]
        if what == "hang":
            raise GlusterfindHung(f"{' '.join(cmd)}: did not end")
        (tmp_path / "out.txt").write_text("NEW a\nMODIFY b\n")

    monkeypatch.setattr(gf, "run_bounded", fake)
    return calls


def test_a_pre_that_hung_once_is_run_again_regenerating_its_listing(monkeypatch, tmp_path):
    calls = _fake_pre(monkeypatch, tmp_path, ["hang", "ok"])
    session = Session("s", "v")
    lines, took = session.pre(tmp_path / "out.txt", no_encode=True)
    assert lines == ["NEW a", "MODIFY b"] and took >= 0
    assert "--regenerate-outfile" not in calls[0] and calls[1][-1] == "--regenerate-outfile"
    assert "--no-encode" in calls[1]
    assert len(session.hangs) == 1 and "did not end" in session.hangs[0]


def test_a_pre_that_hangs_twice_is_an_error_keeping_both(monkeypatch, tmp_path):
    _fake_pre(monkeypatch, tmp_path, ["hang", "hang"])
    session = Session("s", "v")
    with pytest.raises(GlusterfindHung):
        session.pre(tmp_path / "out.txt")
    assert len(session.hangs) == 2
