"""The merge benchmark's breakdown of a Spark event log by job group and stage."""

from __future__ import annotations

import json

from epochsync_dev.bench.merge import stage_timings


def _task(stage, run_ms, cpu_ns, rec=0, shuffle=0):
    return {
        "Event": "SparkListenerTaskEnd",
        "Stage ID": stage,
        "Task Metrics": {
            "Executor Run Time": run_ms,
            "Executor CPU Time": cpu_ns,
            "JVM GC Time": 10,
            "Input Metrics": {"Records Read": rec},
            "Shuffle Read Metrics": {"Total Records Read": shuffle},
        },
    }


def _stage(stage, *names):
    rdds = [{"Name": n, "Scope": json.dumps({"id": str(i), "name": n})} for i, n in enumerate(names)]
    return {"Event": "SparkListenerStageCompleted", "Stage Info": {"Stage ID": stage, "RDD Info": rdds}}


def test_stages_are_grouped_by_job_group_and_ranked_by_run_time(tmp_path):
    app = tmp_path / "run-1" / "eventlog_v2_local-1"
    app.mkdir(parents=True)
    events = [
        {"Event": "SparkListenerJobStart", "Stage IDs": [0], "Properties": {"spark.job.tags": "m:prepare"}},
        {
            "Event": "SparkListenerJobStart",
            "Stage IDs": [1, 2],
            "Properties": {"spark.job.tags": "SparkConnect_OperationTag_x,m:merge"},
        },
        _stage(0, "Scan json", "WholeStageCodegen (1)"),
        _task(0, 5000, 4_000_000_000, rec=100),
        _stage(1, "Scan parquet", "Exchange"),
        _task(1, 1000, 500_000_000, rec=10),
        _task(1, 1000, 500_000_000, rec=5),
        _stage(2, "Window", "AQEShuffleRead"),
        _task(2, 3000, 2_500_000_000, shuffle=15),
    ]
    (app / "events_1_local-1").write_text("".join(json.dumps(e) + "\n" for e in events))
    (app / "appstatus_local-1").write_text("")
    out = stage_timings(tmp_path)
    assert set(out) == {"m:prepare", "m:merge"}
    merge = out["m:merge"]
    assert (merge["jobs"], merge["stages"], merge["task_run_seconds"], merge["task_cpu_seconds"]) == (1, 2, 5.0, 3.5)
    assert [s["stage"] for s in merge["top"]] == [2, 1]
    assert merge["top"][0]["operators"] == ["Window"] and merge["top"][0]["shuffle_read_records"] == 15
    assert merge["top"][1]["tasks"] == 2 and merge["top"][1]["input_records"] == 15
    assert out["m:prepare"]["top"][0]["operators"] == ["Scan json"]
