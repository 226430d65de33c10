"""The commit stage: the stats row, then the manifest (the commit point), then the committed view
(posix on btrfs) and the journal's end."""

from __future__ import annotations

import os
import time

from epochsync.core.config import Config, TargetConfig
from epochsync.core.errors import EpochError
from epochsync.journal.lease import check_lease, holds_target_lease
from epochsync.journal.undo import (
    advance_cursor,
    fault_point,
    journal_dir,
    manifest_doc,
    manifest_epoch,
    plan_dir,
    read_json,
    read_stage_stats,
    remove_journal,
    write_json_atomic,
)
from epochsync.stages.context import _config, _target_cfg, load_plan, unfinished_epochs
from epochsync.targets import open_target
from epochsync.warehouse.events import COMMITTED, record_event
from epochsync.warehouse.paths import Warehouse, local_path


def _last_indexes(cfg: Config, source: str, first: int, last: int) -> dict[str, int]:
    """Per server, the last record index of the window (from the ingested Parquet)."""
    from epochsync.core.arrow import dataset_module

    ds = dataset_module()

    out: dict[str, int] = {}
    wh = Warehouse(cfg.warehouse)
    for e in range(first, last + 1):
        path = local_path(wh.records(source, e))
        if not os.path.isdir(path):
            continue
        table = ds.dataset(path, format="parquet", partitioning="hive").to_table(columns=["server", "index"])
        servers = table.column("server").to_pylist()
        for server, index in zip(servers, table.column("index").to_pylist()):
            if index is not None and (server not in out or index > out[server]):
                out[server] = index
    return out


@holds_target_lease
def run_commit(cfg, target, epoch: int, first_epoch: int | None = None) -> dict:
    """Commit a verified epoch; returns the stats row (see the module docstring)."""
    t0 = time.monotonic()
    cfg = _config(cfg)
    tcfg = _target_cfg(cfg, target)
    tgt = open_target(tcfg)
    committed = manifest_epoch(tgt.read_manifest())
    if committed >= epoch:
        # a commit that died after its manifest: finish its garbage collection, and publish the
        # view of the committed epoch unless a later epoch is half applied (its apply publishes it)
        tgt.finish_commit(epoch)
        if not unfinished_epochs(cfg, tcfg, committed):
            tgt.publish_view()
        remove_journal(journal_dir(cfg.warehouse, tcfg.name, epoch))
        return {"noop": True, "message": f"target {tcfg.name} is already at epoch {committed}"}
    pdir = plan_dir(cfg.warehouse, tcfg.name, epoch)
    verify = read_json(os.path.join(pdir, "verify.json"))
    if not verify or not verify.get("ok"):
        raise EpochError(f"target {tcfg.name} epoch {epoch} has not passed verify: run the verify stage first")
    plan = load_plan(cfg, tcfg.name, epoch)
    first = first_epoch or plan.get("first_epoch") or epoch
    if committed != first - 1:
        raise EpochError(f"target {tcfg.name} is at epoch {committed}; cannot commit epochs {first}..{epoch}")
    src = cfg.source_of(tcfg)
    stages = read_stage_stats(cfg.warehouse, tcfg.name, epoch)
    row = stats_row(tcfg, src.name, first, epoch, stages, plan)
    row["durations"]["commit"] = round(time.monotonic() - t0, 3)
    fault = fault_point(cfg.warehouse, tcfg.name, epoch, "commit")  # tests: stage=commit
    fault("stats row")
    write_json_atomic(local_path(Warehouse(cfg.warehouse).stats(tcfg.name, epoch)), row)
    check_lease(tcfg)  # an s3 lease lost while verifying: never commit behind the new writer's back
    fault("manifest")
    # the commit point: from here on the target is at E
    tgt.write_manifest(manifest_doc(tcfg.name, src.name, epoch, plan.get("snapshot") or ""))
    record_event(cfg.warehouse, tcfg.name, COMMITTED, epoch, first_epoch=first)
    fault("scratch area")
    # after the manifest, garbage only: the moved-aside originals of the epoch's deletes
    # (under .epochsync/, never seen by readers); a crash here is finished by a rerun
    tgt.finish_commit(epoch)
    fault("committed view")
    # readers of the view's current link move to epoch E (posix on btrfs); a crash before is
    # finished by a rerun, or by the next apply before it changes anything
    tgt.publish_view()
    fault("consumer cursor")
    # a cursor ahead of the manifest could let records be purged too early
    advance_cursor(cfg.warehouse, src.name, tcfg.name, epoch, _last_indexes(cfg, src.name, first, epoch))
    fault("undo journal")
    remove_journal(journal_dir(cfg.warehouse, tcfg.name, epoch))
    return row


def stats_row(tcfg: TargetConfig, source: str, first: int, epoch: int, stages: dict, plan: dict) -> dict:
    """The per-epoch stats row (DESIGN section 5 commit)."""
    s = plan.get("summary", {})
    apply = stages.get("apply", {})
    tr = apply.get("target_requests", {})
    sr = apply.get("source_requests", {})
    return {
        "target": tcfg.name,
        "source": source,
        "first_epoch": first,
        "epoch": epoch,
        "status": "committed",
        "records_in": s.get("records_in", 0),
        "net_operations": {
            k: s.get(k, 0) for k in ("created", "deleted", "moved", "linked", "unlinked", "attrs", "data")
        },
        "bytes_changed": s.get("changed_bytes", 0),
        "bytes_pulled": apply.get("bytes_pulled", 0),
        "bytes_written": apply.get("bytes_written", 0),
        "bytes_copied": apply.get("bytes_copied", 0),
        "requests": {
            "source": sr.get("total_requests", 0),
            "target": tr.get("total_requests", 0),
            "source_by_op": sr.get("requests", {}),
            "target_by_op": tr.get("requests", {}),
            "retries": sr.get("retries", 0) + tr.get("retries", 0),
        },
        "durations": {k: v.get("seconds") for k, v in stages.items() if isinstance(v, dict) and "seconds" in v},
        # when the pipeline first saw the epoch closed: the report's delay counts from here
        "closed_seen_at": (stages.get("closed") or {}).get("seen_at"),
        "committed_at": time.time(),
    }


def commit_epoch(cfg, target, first: int, through: int) -> dict:
    """Airflow's ``commit`` task: :func:`run_commit` of the window ``first..through``."""
    return run_commit(cfg, target, through, first_epoch=first)
