"""Where a stage's seconds go on a Spark Connect server, from its event log.

A stage tags its session (``epochsync-<stage>-<target>-e<epoch>``, :mod:`epochsync.stages.replicate`
and the Airflow tasks); every Connect operation it runs (a collect, a write, a checkpoint)
is logged by the server with four instants: started, analyzed, ready for execution,
finished (and closed, once its results are sent). Per tag, :func:`connect_breakdown` sums
over the tag's operations:

- ``analyze``: the server turning the plan it received into an analyzed logical plan;
- ``plan``: from analyzed to ready (optimizer and physical planning that happen before
  the first job is submitted);
- ``execute``: from ready to finished, of which ``jobs`` is the wall time of its Spark jobs
  (``tasks``: their tasks' summed run time, on every core), the rest being physical planning
  done lazily and the driver between jobs;
- ``results``: finished to closed (results streamed to the client);
- ``between``: from one operation's close to the next one's start (the client: building
  the next plan, reading or writing files, schema round trips, which the log does not show).

``span`` is the first start to the last close. A stage's duration minus its span is the
time it spent before its first and after its last Spark operation (in the client only).

    python -m epochsync_dev.eventlog EVENT_LOG_DIR [--tag PREFIX]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

_OP = "org.apache.spark.sql.connect.service.SparkListenerConnectOperation"


def session_tag(job_tags: str) -> str | None:
    """The session tag a Connect client added (``SparkConnect_SessionTag_..._Tag_<tag>``) among a job's tags."""
    for t in job_tags.split(","):
        if "_SessionTag_" in t and "_Tag_" in t:
            return t.split("_Tag_", 1)[1]
    return None


def _events(event_dir: Path):
    for f in sorted(p for p in Path(event_dir).rglob("*") if p.is_file() and not p.name.startswith(".")):
        with open(f, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue  # a line cut by a server still writing
                if isinstance(e, dict):
                    yield e


def connect_breakdown(event_dir: Path, prefix: str = "epochsync-") -> dict[str, dict]:
    """Per session tag starting with ``prefix``: the sums described in the module doc, in
    seconds, plus ``operations`` and ``job_count``. Operations that carry no tag are left out."""
    ops: dict[str, dict] = {}
    op_tag: dict[str, str] = {}
    jobs: dict[int, dict] = {}
    stage_job: dict[int, int] = {}
    for e in _events(event_dir):
        kind = e.get("Event", "")
        if kind.startswith(_OP):
            o = ops.setdefault(e["operationId"], {})
            o[kind[len(_OP) :]] = e["eventTime"]
        elif kind == "SparkListenerJobStart":
            tags = (e.get("Properties") or {}).get("spark.job.tags") or ""
            m = re.search(r"_Operation_([0-9a-f-]+)", tags)
            tag = session_tag(tags)
            if m and tag:
                op_tag[m.group(1)] = tag
            jobs[e["Job ID"]] = {
                "op": m.group(1) if m else None,
                "start": e["Submission Time"],
                "end": None,
                "tasks": 0,
            }
            for sid in e.get("Stage IDs", []):
                stage_job[sid] = e["Job ID"]
        elif kind == "SparkListenerJobEnd" and e["Job ID"] in jobs:
            jobs[e["Job ID"]]["end"] = e["Completion Time"]
        elif kind == "SparkListenerTaskEnd" and e.get("Stage ID") in stage_job:
            ti = e.get("Task Info") or {}
            jobs[stage_job[e["Stage ID"]]]["tasks"] += (ti.get("Finish Time") or 0) - (ti.get("Launch Time") or 0)
        elif kind == "org.apache.spark.sql.execution.ui.SparkListenerSQLExecutionStart":
            m = re.search(r'operation_id: "([0-9a-f-]+)"', e.get("details") or "")
            tag = session_tag(",".join(e.get("jobTags") or []))
            if m and tag:
                op_tag[m.group(1)] = tag
    by_tag: dict[str, list[tuple[str, dict]]] = {}
    for op, times in ops.items():
        tag = op_tag.get(op)
        if tag and tag.startswith(prefix) and "Started" in times:
            by_tag.setdefault(tag, []).append((op, times))
    out: dict[str, dict] = {}
    for tag, items in sorted(by_tag.items()):
        items.sort(key=lambda x: x[1]["Started"])
        row = {k: 0.0 for k in ("analyze", "plan", "execute", "jobs", "tasks", "results", "between")}
        row.update(operations=len(items), job_count=0)
        prev_end = None
        for op, t in items:
            start = t["Started"]
            analyzed = t.get("Analyzed", start)
            ready = t.get("ReadyForExecution", analyzed)
            finished = t.get("Finished", ready)
            closed = t.get("Closed", finished)
            row["analyze"] += analyzed - start
            row["plan"] += ready - analyzed
            row["execute"] += finished - ready
            row["results"] += closed - finished
            if prev_end is not None:
                row["between"] += max(0, start - prev_end)
            prev_end = closed
            mine = [j for j in jobs.values() if j["op"] == op]
            row["job_count"] += len(mine)
            row["jobs"] += sum((j["end"] or j["start"]) - j["start"] for j in mine)
            row["tasks"] += sum(j["tasks"] for j in mine)
        row["span"] = prev_end - items[0][1]["Started"]
        out[tag] = {k: round(v / 1000, 3) if isinstance(v, float) or k == "span" else v for k, v in row.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    """Print :func:`connect_breakdown` of an event log folder, one line per tag."""
    p = argparse.ArgumentParser(prog="python -m epochsync_dev.eventlog", description=__doc__.split("\n\n")[0])
    p.add_argument("event_log", help="the server's spark.eventLog.dir (a folder)")
    p.add_argument("--tag", default="epochsync-", help="only tags starting with this (default epochsync-)")
    args = p.parse_args(argv)
    rows = connect_breakdown(Path(args.event_log), args.tag)
    if not rows:
        print(f"no Connect operation tagged {args.tag}* in {args.event_log}", file=sys.stderr)
        return 1
    for tag, r in rows.items():
        print(json.dumps({"tag": tag, **r}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
