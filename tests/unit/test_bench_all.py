"""``make bench``'s runner: each part timed in its own process, a failed part reported, not hiding the rest."""

from __future__ import annotations

import json
import subprocess

import pytest

from epochsync_dev.bench import all as bench_all


def test_runs_each_part_in_order_and_writes_the_timings(tmp_path, monkeypatch):
    monkeypatch.setenv("EPOCHSYNC_BENCH_RESULTS", str(tmp_path))
    ran = []

    def fake_run(cmd, *a, **kw):
        ran.append(cmd[3:])
        return subprocess.CompletedProcess(cmd, 3 if cmd[3] == "merge" else 0)

    monkeypatch.setattr(bench_all.subprocess, "run", fake_run)
    code = bench_all.main(["--only", "ingest,merge,warm", "--warm-args", "--catchup-epochs 10"])
    assert code == 1  # merge failed: the run fails, after running warm anyway
    assert ran == [
        ["ingest"],
        ["merge", "--event-log", "bench/scratch/merge/eventlog", "--sizes", "merge_1m"],  # make bench: quick
        ["warm", "--catchup-epochs", "10"],
    ]
    rows = json.loads((tmp_path / "bench.json").read_text())
    assert [r["name"] for r in rows] == ["ingest", "merge", "warm", "total"]
    assert {r["set"] for r in rows} == {"quick"}
    assert [r.get("exit_code") for r in rows[:3]] == [0, 3, 0]
    assert rows[-1]["parts"] == ["ingest", "merge", "warm"]
    assert all(len(r["load_average_before"]) == 3 for r in rows[:3])
    assert (tmp_path / "bench.meta.json").exists()


def test_an_unknown_part_is_refused_naming_it(capsys):
    with pytest.raises(SystemExit) as exc:
        bench_all.main(["--only", "ingest,nope"])
    assert exc.value.code == 2
    assert "no benchmark part named nope" in capsys.readouterr().err


def test_the_full_set_runs_every_row_and_each_part_says_which_set_wrote_it(tmp_path, monkeypatch):
    monkeypatch.setenv("EPOCHSYNC_BENCH_RESULTS", str(tmp_path))
    ran = []

    def fake_run(cmd, *a, **kw):
        ran.append(cmd[3:])
        if cmd[3] == "e2e":  # a part writes its own results and meta
            (tmp_path / "e2e.meta.json").write_text(json.dumps({"scenarios_measured": ["x"]}))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(bench_all.subprocess, "run", fake_run)
    assert bench_all.main(["--set", "full", "--only", "merge,e2e"]) == 0
    assert ran == [["merge", "--event-log", "bench/scratch/merge/eventlog"], ["e2e", "--set", "full"]]
    meta = json.loads((tmp_path / "e2e.meta.json").read_text())
    assert meta == {"scenarios_measured": ["x"], "bench_set": "full", "make_target": "bench-full"}
    assert [r["set"] for r in json.loads((tmp_path / "bench.json").read_text())] == ["full", "full", "full"]
