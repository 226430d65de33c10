"""``epochsync status`` and ``epochsync report``: where each replica is, and how it got there.

The vocabulary follows GlusterFS geo-replication status, which operators know: last
synced, pending entry/data/meta operations, failures, checkpoint. Everything is read
from the target's manifest, the warehouse (stats rows, cursors, events, ingested
records) and the source's changelogs; nothing is written and no Spark is started.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import UTC, datetime
from typing import Any

from epochsync.core.config import Config, TargetConfig, load_config
from epochsync.core.config_values import parse_datetime
from epochsync.core.errors import EpochsyncError
from epochsync.report.charts import fmt_bytes
from epochsync.warehouse.events import COMMITTED, FAILED, ROLLED_BACK, read_events
from epochsync.warehouse.paths import Warehouse, local_path

#: Record types counted as pending entry, data and metadata operations (Gluster's E, D, M).
ENTRY_TYPES = ("CREAT", "MKDIR", "HLINK", "SLINK", "MKNOD", "UNLNK", "RMDIR", "RENME")
DATA_TYPES = ("WRITE", "TRUNC", "LYOUT", "CLOSE", "MTIME")
META_TYPES = ("SATTR", "XATTR", "CTIME", "ATIME")


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def read_stats_rows(cfg: Config, target: str) -> list[dict]:
    """Every committed epoch's stats row of ``target``, by epoch."""
    d = local_path(Warehouse(cfg.warehouse).stats_dir(target))
    rows = []
    if os.path.isdir(d):
        for name in os.listdir(d):
            if name.startswith("epoch=") and name.endswith(".json"):
                with open(os.path.join(d, name), encoding="utf-8") as f:
                    rows.append(json.load(f))
    return sorted(rows, key=lambda r: r.get("epoch", 0))


def latest_closed_epoch(cfg: Config, source: str) -> int | None:
    """The highest epoch every server of ``source`` has closed, or None if unknown."""
    try:
        from epochsync.stages.ingest.closure import latest_closed_epoch as closed
    except ImportError:
        return None
    return closed(cfg, source)


def pending_operations(cfg: Config, source: str, after_epoch: int, through_epoch: int | None) -> dict | None:
    """Ingested records above the committed epoch, as entry/data/meta counts (None if none ingested)."""
    base = local_path(Warehouse(cfg.warehouse).records(source))
    if not os.path.isdir(base):
        return None
    from epochsync.core.arrow import dataset_module

    ds = dataset_module()

    dataset = ds.dataset(base, format="parquet", partitioning="hive")
    if "epoch" not in dataset.schema.names:
        return {"entry": 0, "data": 0, "meta": 0}
    cond = ds.field("epoch") > after_epoch
    if through_epoch is not None:
        cond = cond & (ds.field("epoch") <= through_epoch)
    counts = {"entry": 0, "data": 0, "meta": 0}
    table = dataset.to_table(columns=["type"], filter=cond)
    for t, n in zip(*_value_counts(table.column("type"))):
        if t in ENTRY_TYPES:
            counts["entry"] += n
        elif t in DATA_TYPES:
            counts["data"] += n
        elif t in META_TYPES:
            counts["meta"] += n
    return counts


def _value_counts(column):
    vc = column.value_counts()
    return vc.field("values").to_pylist(), vc.field("counts").to_pylist()


def target_status(cfg: Config, tcfg: TargetConfig, *, checkpoint: datetime | None = None) -> dict:
    """One target's status as a plain dict (the JSON form of ``epochsync status``)."""
    from epochsync.journal.undo import read_json
    from epochsync.stages.context import committed_epoch, unfinished_epochs

    src = cfg.source_of(tcfg)
    wh = Warehouse(cfg.warehouse)
    out: dict = {"target": tcfg.name, "kind": tcfg.kind, "source": src.name}
    try:
        committed = committed_epoch(cfg, tcfg)
        out["committed_epoch"] = committed
    except EpochsyncError as exc:
        out.update(status="Unreachable", error=str(exc))
        return out
    except Exception as exc:  # an S3 endpoint that does not answer raises botocore's own types
        out.update(status="Unreachable", error=f"{type(exc).__name__}: {exc}")
        return out
    closed = latest_closed_epoch(cfg, src.name)
    out["latest_closed_epoch"] = closed
    out["lag_epochs"] = None if closed is None else max(0, closed - committed)
    synced_until = src.epoch.window(committed)[1] if committed > 0 else None
    out["last_synced"] = synced_until.isoformat().replace("+00:00", "Z") if synced_until else None
    if closed is not None and closed > committed:
        out["lag_seconds"] = (src.epoch.window(closed)[1] - src.epoch.window(max(committed, 0))[1]).total_seconds()
    else:
        out["lag_seconds"] = 0.0
    stats = read_json(local_path(wh.stats(tcfg.name, committed))) if committed else None
    out["last_run"] = stats
    events = read_events(cfg.warehouse, tcfg.name)
    out["failures"] = sum(1 for e in events if e.get("event") == FAILED)
    out["rollbacks"] = sum(1 for e in events if e.get("event") == ROLLED_BACK)
    last_bad = next((e for e in reversed(events) if e.get("event") in (FAILED, ROLLED_BACK)), None)
    out["last_failure"] = last_bad
    pending = unfinished_epochs(cfg, tcfg, committed)
    out["unfinished_epochs"] = pending
    out["pending"] = pending_operations(cfg, src.name, committed, closed)
    cursor = read_json(local_path(wh.cursor(src.name, tcfg.name)), None)
    out["cursors"] = (cursor or {}).get("servers", {})
    out["view"] = _view_status(tcfg)
    if src.kind == "gluster":
        out["source_cut"] = source_cut_status(cfg, src.name)
    if checkpoint is not None:
        out["checkpoint"] = checkpoint.isoformat().replace("+00:00", "Z")
        out["checkpoint_completed"] = bool(synced_until and synced_until >= checkpoint)
    if pending:
        out["status"] = "Faulty"
    elif last_bad and (not events or events[-1] is last_bad):
        out["status"] = "Faulty"
    elif out["lag_epochs"] in (None, 0, 1):
        out["status"] = "Active"
    else:
        out["status"] = "Lagging"
    return out


def source_cut_status(cfg: Config, source: str) -> dict | None:
    """A live source's last cut: its epoch and, for a replicated volume, which brick read each set,
    why the others did not (down at the cut, owed heals...), and the bricks owed heals."""
    from epochsync.stages.cut import cut_epochs, read_cut

    epochs = cut_epochs(cfg, source)
    rec = read_cut(cfg, source, epochs[-1]) if epochs else None
    if rec is None:
        return None
    out: dict = {"epoch": rec.get("epoch"), "walked": bool((rec.get("publish") or {}).get("walk"))}
    if rec.get("sets"):
        out["sets"] = {
            s: {"reader": v["reader"], "not_reader": v.get("not_reader") or {}} for s, v in rec["sets"].items()
        }
        out["owed_heals"] = rec.get("owed") or {}
        out["down"] = sorted(b for b, up in (rec.get("status") or {}).items() if up is False)
    return out


def source_cut_lines(cut: dict) -> list[str]:
    """The human lines of :func:`source_cut_status`."""
    head = f"  source's last cut: epoch {cut['epoch']}" + (" (walked whole)" if cut.get("walked") else "")
    if not cut.get("sets"):
        return [head]
    if cut.get("down"):
        head += f"; bricks down at the cut: {', '.join(cut['down'])}"
    owed = {b: n for b, n in sorted((cut.get("owed_heals") or {}).items()) if n}
    if owed:
        head += "; heals owed to " + ", ".join(f"{b} ({n} gfids)" for b, n in owed.items())
    lines = [head]
    for name, v in sorted(cut["sets"].items()):
        others = "; ".join(f"{b}: {w}" for b, w in sorted(v["not_reader"].items()))
        lines.append(f"    {name} read by {v['reader']}" + (f" (not {others})" if others else ""))
    return lines


def _view_status(tcfg: TargetConfig) -> dict | None:
    """The target's committed view (:meth:`epochsync.targets.base.Target.view_status`), or the error
    that stopped reading it."""
    from epochsync.targets import open_target

    try:
        return open_target(tcfg).view_status()
    except (EpochsyncError, OSError) as exc:
        return {"available": False, "reason": f"cannot tell: {exc}"}


def view_line(view: dict) -> str:
    """The status line of a committed view: where readers read whole epochs, or why they cannot."""
    if not view.get("available"):
        return f"  committed view: none: {view.get('reason')}; readers of the replica can see an epoch half applied"
    current = view.get("current")
    kept = ", ".join(map(str, view.get("kept") or [])) or "none"
    at = f"epoch {current}" if current is not None else "no epoch committed yet"
    return (
        f"  committed view: {view.get('link')} -> {at} (read-only btrfs snapshots, newest {view.get('keep')} kept: "
        f"{kept})"
    )


def _fmt_secs(s) -> str:
    if s is None:
        return "-"
    s = float(s)
    if s < 120:
        return f"{s:.0f}s"
    if s < 7200:
        return f"{s / 60:.0f}m"
    return f"{s / 3600:.1f}h"


def format_table(rows: list[dict]) -> str:
    """The human table: one line per target, then details of each."""
    head = (
        "TARGET",
        "KIND",
        "STATUS",
        "COMMITTED",
        "CLOSED",
        "LAG",
        "LAG TIME",
        "LAST SYNCED",
        "ENTRY",
        "DATA",
        "META",
        "FAILURES",
        "ROLLBACKS",
    )
    lines = [head]
    for r in rows:
        p = r.get("pending") or {}
        lines.append(
            (
                r["target"],
                r["kind"],
                r.get("status", "?"),
                str(r.get("committed_epoch", "-")),
                str(r.get("latest_closed_epoch") if r.get("latest_closed_epoch") is not None else "?"),
                str(r.get("lag_epochs") if r.get("lag_epochs") is not None else "?"),
                _fmt_secs(r.get("lag_seconds")),
                r.get("last_synced") or "never",
                str(p.get("entry", "-")),
                str(p.get("data", "-")),
                str(p.get("meta", "-")),
                str(r.get("failures", "-")),
                str(r.get("rollbacks", "-")),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines]
    for r in rows:
        out.append("")
        out.append(f"{r['target']}:")
        if r.get("error"):
            out.append(f"  error: {r['error']}")
            continue
        lr = r.get("last_run")
        if lr:
            ops = ", ".join(f"{k} {v}" for k, v in (lr.get("net_operations") or {}).items() if v)
            dur = sum(v for v in (lr.get("durations") or {}).values() if isinstance(v, (int, float)))
            out.append(
                f"  last run: epoch {lr.get('epoch')}: {lr.get('records_in', 0)} records in; {ops or 'no net change'}; "
                f"changed {fmt_bytes(lr.get('bytes_changed'))}, pulled {fmt_bytes(lr.get('bytes_pulled'))}, "
                f"written {fmt_bytes(lr.get('bytes_written'))}, copied server-side {fmt_bytes(lr.get('bytes_copied'))}; "
                f"{dur:.1f}s in stages"
            )
        if r.get("unfinished_epochs"):
            out.append(
                f"  unfinished epochs with an undo journal: {r['unfinished_epochs']} "
                f"(run: epochsync rollback --config FILE --target {r['target']})"
            )
        if r.get("last_failure"):
            out.append("  last failure: " + failure_line(r["last_failure"]))
        if r.get("view"):
            out.append(view_line(r["view"]))
        if r.get("source_cut"):
            out.extend(source_cut_lines(r["source_cut"]))
        if r.get("cursors"):
            out.append("  cursors: " + ", ".join(f"{k}={v}" for k, v in sorted(r["cursors"].items())))
        if "checkpoint" in r:
            out.append(f"  checkpoint {r['checkpoint']}: {'completed' if r['checkpoint_completed'] else 'not yet'}")
    return "\n".join(out)


# --------------------------------------------------------------------------- CLI: status


def configure_status(parser) -> None:
    """Add the ``status`` verb's options to ``parser``."""
    parser.add_argument("--config", help="the YAML config (default: $EPOCHSYNC_CONFIG)")
    parser.add_argument("--target", action="append", help="only this target (repeatable)")
    parser.add_argument("--format", choices=("table", "json"), default="table")
    parser.add_argument("--checkpoint", help="ISO time: say whether every change up to it is replicated")


def failure_line(ev: dict) -> str:
    """One line of a FAILED or ROLLED_BACK event: when, which epoch, which stage failed and why,
    and where a rollback left the target ("epoch 4 failed in verify at ...: 2 difference(s) ...;
    rolled back to epoch 3")."""
    at = _iso(ev.get("at"))
    if ev.get("event") == ROLLED_BACK:
        back = ev.get("back_at")
        why = ev.get("reason")
        if back is None:  # an event written before the reason was kept
            return f"epoch {ev.get('epoch')} rolled back at {at}: {ev.get('message', '')}".rstrip(": ")
        return (
            f"epoch {ev.get('epoch')} " + (f"{why}; " if why else "failed; ") + f"rolled back to epoch {back} at {at}"
        )
    stage = ev.get("stage")
    return f"epoch {ev.get('epoch')} failed" + (f" in {stage}" if stage else "") + f" at {at}: {ev.get('message', '')}"


def run_status(args) -> int:
    """The ``status`` verb; returns 1 if a target is Faulty or Unreachable, else 0."""
    cfg = load_config(args.config)
    targets = [cfg.target(t) for t in args.target] if args.target else list(cfg.targets)
    if not targets:
        raise EpochsyncError(f"{cfg.file}: no targets configured")
    cp = parse_datetime(args.checkpoint) if args.checkpoint else None
    rows = [target_status(cfg, t, checkpoint=cp) for t in targets]
    if args.format == "json":
        json.dump(rows, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        print(format_table(rows))
    return 1 if any(r.get("status") in ("Faulty", "Unreachable") for r in rows) else 0


# --------------------------------------------------------------------------- report


#: stages in the order a run spends time in them (the stacked chart's order)
STAGE_ORDER = ("ingest", "merge", "translate", "apply", "verify", "publish", "commit")
#: one colour per stage on every target's "time per stage" chart (a target without ingest rows
#: keeps merge in merge's colour)
STAGE_COLORS = {
    "ingest": "#1f77b4",
    "merge": "#ff7f0e",
    "translate": "#2ca02c",
    "apply": "#d62728",
    "verify": "#9467bd",
    "publish": "#e377c2",
    "commit": "#8c564b",
}


def replication_delays(rows: list[dict]) -> list[float | None]:
    """Per stats row: seconds from the moment the pipeline saw the epoch closed to its commit.

    ``None`` where the row predates the ``closed_seen_at`` field (or lacks a commit time):
    unknown, never counted from the epoch's window end (a backfill or a simulated source's
    windows end long before anybody could replicate them).
    """
    out: list[float | None] = []
    for r in rows:
        seen, done = r.get("closed_seen_at"), r.get("committed_at")
        out.append(None if seen is None or done is None else round(max(0.0, done - seen), 3))
    return out


def epochs_behind(rows: list[dict]) -> list[int | None]:
    """Per stats row: how many later epochs the pipeline had seen closed when this one committed."""
    out: list[int | None] = []
    for r in rows:
        done = r.get("committed_at")
        if done is None:
            out.append(None)
            continue
        out.append(
            sum(1 for o in rows if o["epoch"] > r["epoch"] and (o.get("closed_seen_at") or float("inf")) <= done)
        )
    return out


def _report_target(cfg: Config, t: TargetConfig) -> dict:
    from epochsync.report.charts import bar_chart

    rows = read_stats_rows(cfg, t.name)
    out: dict[str, Any] = {"name": t.name, "kind": t.kind, "rows": [], "charts": [], "events": []}
    if not rows:
        return out
    epochs = [r["epoch"] for r in rows]
    delays = replication_delays(rows)
    durations = [r.get("durations") or {} for r in rows]
    stages = [s for s in STAGE_ORDER if any(isinstance(d.get(s), (int, float)) for d in durations)]
    stages += sorted({k for d in durations for k, v in d.items() if isinstance(v, (int, float))} - set(stages))
    out["charts"] = [
        bar_chart(
            "replication delay: commit after the pipeline saw the epoch closed",
            "s",
            epochs,
            {"delay": delays},
            y_title="seconds",
        ),
        bar_chart(
            "time per stage",
            "s",
            epochs,
            {s: [d.get(s) if isinstance(d.get(s), (int, float)) else None for d in durations] for s in stages},
            stacked=True,
            y_title="seconds",
            colors=STAGE_COLORS,
        ),
        bar_chart(
            "lag at each commit: later epochs already seen closed",
            "epochs",
            epochs,
            {"epochs behind": epochs_behind(rows)},
            y_title="epochs",
        ),
        bar_chart(
            "bytes per epoch",
            "bytes",
            epochs,
            {
                "changed": [r.get("bytes_changed") for r in rows],
                "pulled from source": [r.get("bytes_pulled") for r in rows],
                "written to target": [r.get("bytes_written") for r in rows],
                "copied server-side": [r.get("bytes_copied") for r in rows],
            },
            y_title="bytes",
        ),
    ]
    for r, delay, d in zip(rows, delays, durations):
        out["rows"].append(
            {
                "epoch": r["epoch"],
                "records_in": r.get("records_in", 0),
                "ops": sum((r.get("net_operations") or {}).values()),
                "changed": fmt_bytes(r.get("bytes_changed")),
                "pulled": fmt_bytes(r.get("bytes_pulled")),
                "written": fmt_bytes(r.get("bytes_written")),
                "copied": fmt_bytes(r.get("bytes_copied")),
                "requests": (r.get("requests") or {}).get("source", 0),
                "seconds": f"{sum(v for v in d.values() if isinstance(v, (int, float))):.1f}",
                "delay": "unknown" if delay is None else f"{delay:.1f} s",
            }
        )
    for e in read_events(cfg.warehouse, t.name):
        if e.get("event") in (FAILED, ROLLED_BACK):
            out["events"].append(failure_line(e))
        elif e.get("event") != COMMITTED:
            out["events"].append(
                f"{_iso(e.get('at'))} epoch {e.get('epoch')}: {e.get('event', '')} {e.get('message', '')}".strip()
            )
    return out


def _status_row(r: dict) -> dict:
    p = r.get("pending") or {}
    cells = [
        r["target"],
        r["kind"],
        r.get("status", "?"),
        r.get("committed_epoch", "-"),
        "?" if r.get("latest_closed_epoch") is None else r["latest_closed_epoch"],
        "?" if r.get("lag_epochs") is None else r["lag_epochs"],
        _fmt_secs(r.get("lag_seconds")),
        r.get("last_synced") or "never",
        p.get("entry", "-"),
        p.get("data", "-"),
        p.get("meta", "-"),
        r.get("failures", "-"),
        r.get("rollbacks", "-"),
    ]
    details = [line.strip() for line in format_table([r]).split("\n\n", 1)[-1].splitlines()[1:] if line.strip()]
    return {"target": r["target"], "cells": cells, "details": details}


def build_report(cfg: Config, targets: list[TargetConfig]) -> str:
    """The HTML page: the status table, then per target its charts (delay, time per stage,
    lag, bytes; axes with units) and its epochs, failures and rollbacks."""
    statuses = [target_status(cfg, t) for t in targets]
    from epochsync.report.charts import template

    return template("report.html.j2").render(
        config_file=cfg.file,
        written=_iso(time.time()),
        status_head=(
            "target",
            "kind",
            "status",
            "committed",
            "closed",
            "lag",
            "lag time",
            "last synced",
            "entry",
            "data",
            "meta",
            "failures",
            "rollbacks",
        ),
        status_rows=[_status_row(r) for r in statuses],
        targets=[_report_target(cfg, t) for t in targets],
    )


def report_path(cfg: Config) -> str:
    """Returns the default place of the HTML report: ``<warehouse>/report/index.html``."""
    return os.path.join(local_path(cfg.warehouse), "report", "index.html")


def configure_report(parser) -> None:
    """Add the ``report`` verb's options to ``parser``."""
    parser.add_argument("--config", help="the YAML config (default: $EPOCHSYNC_CONFIG)")
    parser.add_argument("--target", action="append", help="only this target (repeatable)")
    parser.add_argument("--out", help="HTML file to write (default: <warehouse>/report/index.html)")


def run_report(args) -> int:
    """The ``report`` verb: write the HTML report and print its path; returns 0."""
    cfg = load_config(args.config)
    targets = [cfg.target(t) for t in args.target] if args.target else list(cfg.targets)
    out = args.out or report_path(cfg)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        f.write(build_report(cfg, targets))
    print(out)
    return 0
