"""``dagtest --serve``: runs one after another in one process, each with its own log and environment."""

from __future__ import annotations

import io
import json
import os
import sys

import pytest

from epochsync.airflow import dagtest


def _fake_run_epoch(dag_id, epoch, *, dags_folder=None, conf=None):
    print(f"stdout of {dag_id} {epoch} {conf}", flush=True)
    os.write(2, f"fd 2 of {dag_id} {epoch}\n".encode())  # what a task's native code or a subprocess writes
    if os.environ.get("EPOCHSYNC_INJECT_FAILURE"):
        print("failing as injected", file=sys.stderr, flush=True)
        return {"dag_id": dag_id, "epoch": epoch, "state": "failed", "tasks": {"apply": "failed"}}
    if epoch == 3:
        raise RuntimeError("no DAG here")
    return {"dag_id": dag_id, "epoch": epoch, "state": "success", "tasks": {"commit": "success"}}


def test_each_run_gets_its_own_log_environment_and_reply(tmp_path, monkeypatch):
    monkeypatch.setattr(dagtest, "run_epoch", _fake_run_epoch)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    base = dict(os.environ)
    failing = dict(base, EPOCHSYNC_INJECT_FAILURE="after=1")
    requests = [
        {"dag_id": "d", "epoch": 1, "conf": {"x": 1}, "log": str(tmp_path / "1.log"), "env": base},
        {"dag_id": "d", "epoch": 2, "log": str(tmp_path / "2.log"), "env": failing},
        {"dag_id": "d", "epoch": 2, "log": str(tmp_path / "2b.log"), "env": base},
        {"dag_id": "d", "epoch": 3, "log": str(tmp_path / "3.log"), "env": base},
    ]
    reply = io.StringIO()
    try:
        assert dagtest.serve((json.dumps(r) + "\n" for r in requests), reply) == 0
    finally:
        os.environ.clear()
        os.environ.update(base)
    replies = [json.loads(x[len(dagtest.SERVED) :]) for x in reply.getvalue().splitlines()]
    assert [r["state"] for r in replies] == ["success", "failed", "success", "failed"]
    assert all(r["seconds"] >= 0 for r in replies)
    assert "no DAG here" in replies[3]["error"]

    one = (tmp_path / "1.log").read_text()
    assert "stdout of d 1 {'x': 1}" in one and "fd 2 of d 1" in one
    assert one.rstrip().splitlines()[-1].startswith("DAGTEST_RESULT ")
    # the injected fault was that run's only: the retry's environment has none
    assert "failing as injected" in (tmp_path / "2.log").read_text()
    assert "failing as injected" not in (tmp_path / "2b.log").read_text()
    assert "RuntimeError: no DAG here" in (tmp_path / "3.log").read_text()
    # nothing of a run leaks into another's log
    assert "of d 2" not in one and "of d 1" not in (tmp_path / "2b.log").read_text()


def test_a_run_for_another_airflow_home_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(dagtest, "run_epoch", _fake_run_epoch)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "a"))
    req = {"dag_id": "d", "epoch": 1, "log": str(tmp_path / "1.log"), "env": {"AIRFLOW_HOME": str(tmp_path / "b")}}
    with pytest.raises(SystemExit, match="runs AIRFLOW_HOME=.*/a, not .*/b"):
        dagtest.serve([json.dumps(req)], io.StringIO())


def test_a_process_that_dies_during_a_run_is_a_failed_run_and_the_next_run_starts_a_new_one(tmp_path):
    """A fault of mode kill ends the process: the run is reported failed, with a line in its log."""
    fake = tmp_path / "fake"
    fake.mkdir()
    # a stand-in for the serve process: it dies on the first request, answers the next ones
    (fake / "sitecustomize.py").write_text(
        "import os, sys, json\n"
        "if os.environ.get('FAKE_SERVE') and sys.argv[-1:] == ['--serve']:\n"
        "    flag = os.path.join(os.environ['FAKE_SERVE'], 'died')\n"
        "    for line in sys.stdin:\n"
        "        if not os.path.exists(flag):\n"
        "            open(flag, 'w').close()\n"
        "            os._exit(9)\n"
        "        req = json.loads(line)\n"
        "        print('DAGTEST_SERVED ' + json.dumps({'state': 'success', 'tasks': {}}), flush=True)\n"
        "    os._exit(0)\n"
    )
    env = dict(os.environ, PYTHONPATH=f"{fake}:{os.environ.get('PYTHONPATH', '')}", FAKE_SERVE=str(tmp_path))
    with dagtest.DagTestProcess(env) as proc:
        first = proc.run("d", 1, tmp_path / "1.log")
        assert first["state"] == "failed" and first["returncode"] is None
        assert "the process ended (exit 9) during the run" in (tmp_path / "1.log").read_text()
        second = proc.run("d", 2, tmp_path / "2.log")
        assert second["state"] == "success" and second["returncode"] == 0
