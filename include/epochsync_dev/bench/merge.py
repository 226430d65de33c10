"""``make bench-merge``: merge a generated epoch of 1 million and of 10 million records on local[2].

Inputs come from :mod:`epochsync_dev.bench.merge_inputs` (numpy and Arrow, seeded; seconds, where
the simulator took 17 minutes for 10 M records): epoch 1 is a namespace of ``files`` files
(a tenth of the records) and epoch 2 the benchmarked epoch of ``records`` records, 70%
``WRITE`` records (striped layouts of 1-4 objects over 4 OSTs, overwrites and appends) and
30% namespace and attribute operations (creates, renames of files and directories, across
MDTs too, renames over existing files, hard links, unlinks, xattrs, truncates,
chmod/chown/utime, create-and-delete), consistent by construction. They are generated
under ``bench/scratch/merge/<name>/`` and reused while their parameters match.

Before the clock starts, the inputs are turned into what the merge stage reads: the
namespace dump of epoch 1 into snapshot 1 (Parquet); the generated records of epoch 2 are
already ``records/source=sim/epoch=2/server=*/`` Parquet (what ingest writes) and are copied
into the warehouse. Then a Spark
session is started (``startup_seconds``) and :func:`epochsync.stages.merge.run_merge` merges
epoch 2: ``seconds`` is that call, reading snapshot 1 and the records, writing snapshot 2,
the change set and the cookie groups, and counting the stats. Each row of
``bench/results/merge.json``:

    {"name", "records", "seconds", "records_per_s", "peak_rss_bytes", "net_to_raw_ratio",
     "startup_seconds", "changes", "snapshot_fids", "generate_seconds", "prepare_seconds", ...}

``peak_rss_bytes`` is the peak summed resident set of this process and its descendants
(the JVM) during the merge, sampled every 50 ms; ``cpu_seconds`` the CPU time that process
tree used during the merge (on a busy machine ``seconds`` is mostly waiting for a core;
``cpu_seconds / 2`` is what the merge would take with both cores to itself);
``net_to_raw_ratio`` is change rows / merged records. The 2 cores may be shared with other
work: the machine's load average at the start of each merge is recorded as ``loadavg_1m``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from epochsync_dev.bench import results_dir, write_results

SIZES = {"merge_1m": 1_000_000, "merge_10m": 10_000_000}
SEED = 20260101


def _files_for(records: int) -> int:
    # a namespace about a tenth of the epoch's records: most writes hit existing files
    return max(1000, records // 10)


def generate(work: Path, records: int, seed: int = SEED) -> float:
    """Generate the inputs under ``work`` unless they are there with the same parameters."""
    from epochsync_dev.bench.merge_inputs import write_inputs

    params = {"records": records, "seed": seed, "files": _files_for(records), "write_share": 0.7, "v": 2}
    stamp = work / "params.json"
    took = work / "generate_seconds.txt"
    if stamp.exists() and json.loads(stamp.read_text()) == params:
        return float(took.read_text()) if took.exists() else 0.0
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    t0 = time.monotonic()
    meta = write_inputs(work / "sim", records, seed, params["files"])
    seconds = time.monotonic() - t0
    print(
        f"generated {work.name}: {meta.records} records ({meta.writes} WRITE), {meta.files} files in {seconds:.1f} s",
        flush=True,
    )
    stamp.write_text(json.dumps(params))
    took.write_text(f"{seconds:.1f}\n")
    return seconds


def _config(work: Path):
    from epochsync.core.config import config_from_dict
    from epochsync_dev.simulate.workload import ROOT_FID

    servers = sorted(p.name.split("=", 1)[1] for p in (work / "sim" / "records").iterdir())
    return config_from_dict(
        {
            "warehouse": f"file://{work / 'warehouse'}",
            "sources": [
                {
                    "name": "sim",
                    "root_fid": ROOT_FID,
                    "servers": servers,
                    "changelogs": {"uri": str(work / "sim" / "changelogs"), "format": "jsonl"},  # not read
                    "store": {"conn_id": "source_s3", "bucket": "sim-source"},
                    "epoch": {"interval": "5m", "start": "2026-01-01T00:00:00Z"},
                }
            ],
            "targets": [{"name": "bench", "source": "sim", "kind": "posix", "path": str(work / "replica")}],
        },
        file=str(work / "bench.yaml"),
    )


def prepare(spark, work: Path) -> float:
    """Snapshot 1 and the records of epoch 2 as Parquet in the warehouse (not timed)."""
    from epochsync.warehouse.paths import Warehouse, local_path
    from epochsync.warehouse.snapshots import load_namespace_dump, write_snapshot

    t0 = time.monotonic()
    cfg = _config(work)
    src = cfg.sources[0]
    wh = Warehouse(cfg.warehouse)
    shutil.rmtree(work / "warehouse", ignore_errors=True)
    dump = load_namespace_dump(spark, f"file://{work / 'sim' / 'snapshot' / 'epoch=1'}", src.root_fid)
    write_snapshot(spark, wh, "bench", 1, dump)
    spark.catalog.clearCache()
    # the generated records are already what ingest writes: copied into the warehouse
    target = Path(local_path(wh.records(src.name))) / "epoch=2"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(work / "sim" / "records", target)
    return time.monotonic() - t0


def run_one(spark, name: str, work: Path, generate_seconds: float, startup_seconds: float) -> dict:
    from epochsync.spark import session_master
    from epochsync.stages.merge import run_merge
    from epochsync_dev.bench.ingest import TreeSampler

    spark.addTag(f"{name}:prepare")  # inputs to Parquet (not timed)
    prepare_seconds = prepare(spark, work)
    spark.removeTag(f"{name}:prepare")
    spark.addTag(f"{name}:merge")  # the merge (timed)
    cfg = _config(work)
    for sub in ("snapshots/target=bench/epoch=2", "changes", "cookies"):
        shutil.rmtree(work / "warehouse" / sub, ignore_errors=True)
    load = os.getloadavg()[0]
    with TreeSampler() as sampler:
        cpu0 = sampler.cpu()
        t0 = time.monotonic()
        stats = run_merge(cfg, "bench", 2, 2, spark)
        seconds = time.monotonic() - t0
        cpu_seconds = sampler.cpu() - cpu0
    spark.removeTag(f"{name}:merge")
    n = stats["records"]
    return {
        "name": name,
        "records": n,
        "seconds": round(seconds, 2),
        "records_per_s": round(n / seconds),
        "peak_rss_bytes": sampler.peak,
        "net_to_raw_ratio": round(stats["net_to_raw_ratio"], 4),
        "startup_seconds": round(startup_seconds, 2),
        "cpu_seconds": round(cpu_seconds, 1),
        "merged_records": stats["merged_records"],
        "changes": stats["changes"],
        "created": stats["created"],
        "deleted": stats["deleted"],
        "data_changed": stats["data_changed"],
        "range_bytes": stats["range_bytes"],
        "snapshot_fids": stats["snapshot_fids"],
        "cookie_groups": stats["cookie_groups"],
        "generate_seconds": round(generate_seconds, 1),
        "prepare_seconds": round(prepare_seconds, 1),
        "loadavg_1m": round(load, 2),
        "master": session_master(spark),
    }


def job_group(properties: dict) -> str:
    """The benchmark row and phase of a job (``<row>:prepare``/``<row>:merge``) from its session tags."""
    for tag in (properties.get("spark.job.tags") or "").split(","):
        if tag.endswith((":prepare", ":merge")):
            return tag
    return properties.get("spark.jobGroup.id") or "other"


def stage_timings(event_dir: Path, top: int = 8) -> dict:
    """Where the time went, from the Spark event log of the run in ``event_dir``.

    Per job group (``<row>:prepare`` and ``<row>:merge``, set by :func:`run_one`):
    ``{"jobs", "stages", "task_run_seconds", "task_cpu_seconds", "top": [...]}``, ``top``
    being the stages with the most executor run time, each with its operators (the SQL
    scopes of its RDDs), tasks, run, CPU and GC seconds, input and shuffle-read records.
    """
    files = sorted(p for p in event_dir.rglob("*") if p.is_file() and not p.name.startswith(("appstatus", ".")))
    stages: dict[int, dict] = {}
    group_of: dict[int, str] = {}
    jobs: dict[str, int] = {}
    for f in files:
        for line in f.open(encoding="utf-8", errors="replace"):
            e = json.loads(line)
            kind = e.get("Event")
            if kind == "SparkListenerJobStart":
                group = job_group(e.get("Properties") or {})
                jobs[group] = jobs.get(group, 0) + 1
                for sid in e.get("Stage IDs", []):
                    group_of[sid] = group
            elif kind == "SparkListenerStageCompleted":
                si = e["Stage Info"]
                ops = set()
                for r in si.get("RDD Info", []):
                    scope = r.get("Scope")
                    name = json.loads(scope)["name"] if scope else r.get("Name", "")
                    if not name.startswith(("WholeStageCodegen", "mapPartitions", "AQEShuffleRead")):
                        ops.add(name.strip())
                stages.setdefault(si["Stage ID"], {"stage": si["Stage ID"]})["operators"] = sorted(ops)
            elif kind == "SparkListenerTaskEnd":
                m = e.get("Task Metrics") or {}
                st = stages.setdefault(e["Stage ID"], {"stage": e["Stage ID"]})
                st["tasks"] = st.get("tasks", 0) + 1
                st["run_s"] = st.get("run_s", 0) + m.get("Executor Run Time", 0) / 1000
                st["cpu_s"] = st.get("cpu_s", 0) + m.get("Executor CPU Time", 0) / 1e9
                st["gc_s"] = st.get("gc_s", 0) + m.get("JVM GC Time", 0) / 1000
                st["input_records"] = st.get("input_records", 0) + (m.get("Input Metrics") or {}).get("Records Read", 0)
                st["shuffle_read_records"] = st.get("shuffle_read_records", 0) + (
                    m.get("Shuffle Read Metrics") or {}
                ).get("Total Records Read", 0)
    out: dict[str, dict] = {}
    for group in sorted(jobs):
        rows = [
            {k: round(v, 2) if isinstance(v, float) else v for k, v in st.items()}
            for sid, st in stages.items()
            if "tasks" in st and group_of.get(sid, "other") == group
        ]
        rows.sort(key=lambda r: -r["run_s"])
        out[group] = {
            "jobs": jobs[group],
            "stages": len(rows),
            "task_run_seconds": round(sum(r["run_s"] for r in rows), 1),
            "task_cpu_seconds": round(sum(r["cpu_s"] for r in rows), 1),
            "top": rows[:top],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m epochsync_dev.bench merge", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default=",".join(SIZES), help=f"which rows to run (default {','.join(SIZES)})")
    p.add_argument("--scratch", default="bench/scratch/merge", help="where inputs are generated and kept")
    p.add_argument("--shuffle-partitions", type=int, default=8, help="spark.sql.shuffle.partitions (default 8)")
    p.add_argument("--driver-memory", default="12g", help="JVM heap of the local[2] driver (default 12g)")
    p.add_argument("--event-log", metavar="DIR", help="also write the Spark event log here (stage timings)")
    p.add_argument(
        "--no-write",
        action="store_true",
        help="print the rows; write nothing to bench/results (the stage timings go beside the event log)",
    )
    args = p.parse_args(argv)
    names = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [n for n in names if n not in SIZES]
    if unknown:
        p.error(f"unknown size(s) {', '.join(unknown)} (known: {', '.join(SIZES)})")
    scratch = Path(args.scratch).resolve()
    generated = {n: generate(scratch / n, SIZES[n]) for n in names}

    from epochsync.spark import spark_session

    conf = {"spark.driver.memory": args.driver_memory}
    event_dir = None
    if args.event_log:  # a fresh sub-directory per run: the breakdown reads this run's log only
        event_dir = Path(args.event_log).resolve() / time.strftime("run-%Y%m%dT%H%M%S")
        event_dir.mkdir(parents=True, exist_ok=True)
        conf.update(
            {
                "spark.eventLog.enabled": "true",
                "spark.eventLog.dir": event_dir.as_uri(),
                "spark.eventLog.compress": "false",
            }
        )
    t0 = time.monotonic()
    spark = spark_session(
        "epochsync-bench-merge", master="local[2]", shuffle_partitions=args.shuffle_partitions, extra_conf=conf
    )
    spark.range(1).count()  # the session is really up
    startup = time.monotonic() - t0
    rows = []
    for n in names:
        row = run_one(spark, n, scratch / n, generated[n], startup)
        print(json.dumps(row), flush=True)
        rows.append(row)
    spark.stop()
    if event_dir is not None:
        # one application log for all rows (prepare included): the breakdown goes beside the results
        timings = stage_timings(event_dir)
        # with --no-write the breakdown stays beside the event log, out of bench/results
        out = (event_dir if args.no_write else results_dir()) / "merge.stages.json"
        out.write_text(json.dumps({"rows": names, "groups": timings}, indent=2) + "\n")
        print(f"stage timings from the Spark event log: {out}")
    if not args.no_write:
        print(f"wrote {write_results('merge', rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
