"""The data plane's stages, the ``replicate`` and ``rollback`` verbs, and what the DAGs call.

Stage functions (``cfg`` is a :class:`~epochsync.core.config.Config` or a config file path,
``target`` a target name; ``epoch`` is the last epoch of the run and ``first_epoch``
the first one when a run merges a window of several closed epochs, default ``epoch``):

``check_preconditions(cfg, target, epoch, first_epoch=None) -> dict``
    DESIGN section 5 invariants before anything is written: ``{"action": "run" |
    "noop" | "rollback_first", "committed": M, ...}``. A gap (the manifest is below
    ``first_epoch - 1``) raises :class:`EpochError` naming the missing epochs and the
    command that backfills them.
``run_translate(cfg, target, epoch, spark, whole_file=False, first_epoch=None) -> dict``
    Reads snapshots ``first-1`` and ``epoch`` and the change set (written by the merge),
    writes ``plans/target=T/epoch=E/plan.json``; returns the plan summary.
``run_apply(cfg, target, epoch, spark=None, inject=None, first_epoch=None) -> dict``
    Checks the preconditions (an unfinished epoch is rolled back first), the write
    fence, then applies the plan (namespace on the driver, data on executors when
    ``spark`` is given, post operations on the driver), journaling before each mutation.
``run_verify(cfg, target, epoch, spark=None, first_epoch=None) -> dict``
    Checks every touched path against the source at E; raises if anything differs.
``run_commit(cfg, target, epoch, first_epoch=None) -> dict``
    Requires a passed verify; writes the stats row, then the manifest (the commit
    point, atomically; the last write that changes what readers see), then drops the
    posix scratch area, advances the consumer cursor and removes the undo journal;
    returns the stats row.
``run_rollback(cfg, target, spark=None) -> dict``
    Replays the undo journal of the unfinished epoch in reverse (idempotent, resumable),
    then checks the target against the snapshot of its committed epoch. A no-op when
    nothing is unfinished. (Called with an argparse namespace it is the CLI verb.)
``replicate(cfg, target, through_epoch, *, epoch=None, spark=None, inject=None, whole_file=False, progress=print)``
    For every closed epoch after the committed one up to ``through_epoch`` (or just
    ``epoch``): ingest → merge → translate → apply → verify → commit, one progress line
    per stage; a failure in apply, verify or commit is rolled back and re-raised.
``committed_epoch(cfg, target)``, ``commit_epoch(cfg, target, first, through)``: the names the
Airflow tasks use.

Fault injection (tests, the demo, the DAG param): ``inject="after=K,epoch=E"`` or the
environment variable ``EPOCHSYNC_INJECT_FAILURE``; see :mod:`epochsync.journal.faults`.
"""

from __future__ import annotations

import os
import re
import sys
import time
from typing import Any

from epochsync.core.config import Config, TargetConfig, load_config
from epochsync.core.errors import EpochError, EpochsyncError
from epochsync.core.jsonable import jsonable, scalars
from epochsync.core.shutdown import Interrupted, raise_on_signals, rollback_on_interrupt
from epochsync.journal.lease import check_lease, holds_target_lease, target_lease
from epochsync.journal.undo import (
    UndoneLog,
    advance_cursor,
    fault_counter,
    fault_point,
    journal_dir,
    journal_exists,
    manifest_doc,
    manifest_epoch,
    mark_aborted,
    plan_dir,
    read_journal,
    read_json,
    read_stage_stats,
    remove_journal,
    wait_for_writers,
    write_json_atomic,
    write_stage_stats,
)
from epochsync.targets import open_target
from epochsync.warehouse.events import COMMITTED, FAILED, ROLLED_BACK, record_event
from epochsync.warehouse.paths import Warehouse, local_path


def _config(cfg: Config | str | os.PathLike) -> Config:
    return cfg if isinstance(cfg, Config) else load_config(cfg)


def _target_cfg(cfg: Config, target: str | TargetConfig) -> TargetConfig:
    return target if isinstance(target, TargetConfig) else cfg.target(target)


def source_access(cfg: Config, tcfg: TargetConfig):
    from epochsync.stores.connections import resolve_s3
    from epochsync.targets.s3 import S3Access

    src = cfg.source_of(tcfg)
    return S3Access(resolve_s3(src.store.conn_id), max_attempts=tcfg.max_attempts), src.store.bucket


def committed_epoch(cfg, target) -> int:
    """The epoch in the target's manifest (0 for an empty target)."""
    cfg = _config(cfg)
    return manifest_epoch(open_target(_target_cfg(cfg, target)).read_manifest())


def unfinished_epochs(cfg: Config, tcfg: TargetConfig, committed: int) -> list[int]:
    """Epochs above the committed one that have an undo journal (an apply that did not commit)."""
    base = local_path(Warehouse(cfg.warehouse).uri + f"/undo/target={tcfg.name}")
    out = []
    if os.path.isdir(base):
        for name in os.listdir(base):
            m = re.fullmatch(r"epoch=(\d+)", name)
            if m and int(m.group(1)) > committed and journal_exists(os.path.join(base, name)):
                out.append(int(m.group(1)))
    return sorted(out)


def check_preconditions(cfg, target, epoch: int, first_epoch: int | None = None) -> dict:
    """DESIGN section 5 invariants; raises EpochError on a gap. See the module docstring."""
    cfg = _config(cfg)
    tcfg = _target_cfg(cfg, target)
    first = first_epoch or epoch
    committed = committed_epoch(cfg, tcfg)
    unfinished = unfinished_epochs(cfg, tcfg, committed)
    if committed >= epoch:
        return {"action": "noop", "committed": committed, "unfinished": unfinished,
                "message": f"target {tcfg.name} is already at epoch {committed}: epoch {epoch} is a no-op"}  # fmt: skip
    if committed < first - 1:
        missing = list(range(committed + 1, first))
        span = f"{missing[0]}" if len(missing) == 1 else f"{missing[0]}..{missing[-1]}"
        raise EpochError(
            f"target {tcfg.name} is at epoch {committed}, so epoch {first} would leave a gap: epoch(s) {span} "
            f"are missing. Backfill them first: epochsync replicate --config {cfg.file} --target {tcfg.name} "
            f"--through {first - 1} (or in Airflow: airflow backfill create --dag-id "
            f"epochsync__{tcfg.source}__{tcfg.name} ...)"
        )
    if unfinished:
        return {"action": "rollback_first", "committed": committed, "unfinished": unfinished,
                "message": f"epoch(s) {unfinished} of target {tcfg.name} did not commit: rolling back first"}  # fmt: skip
    return {"action": "run", "committed": committed, "unfinished": [], "message": "ok"}


# --------------------------------------------------------------------------- translate


def _target_dict(tcfg: TargetConfig) -> dict:
    return {
        "name": tcfg.name, "kind": tcfg.kind, "fileset": list(tcfg.fileset), "coalesce_gap": tcfg.coalesce_gap,
        "part_size": tcfg.part_size, "small_object": tcfg.small_object,
        "stripe_size": tcfg.stripe_size, "stripe_count": tcfg.stripe_count,
        "prefix": tcfg.prefix, "path": tcfg.path, "control_dir": tcfg.control_dir,
    }  # fmt: skip


def _store_dict(cfg: Config, tcfg: TargetConfig) -> dict:
    src = cfg.source_of(tcfg)
    store = src.store
    # JSON Lines WRITE records pin object versions: an object with no version at E was
    # never written by E and reads as zeros, never as a later epoch's "latest" bytes
    return {"key": store.key, "unstriped_key": store.unstriped_key, "bucket": store.bucket,
            "versioned": src.changelogs.format == "jsonl"}  # fmt: skip


def plan_path(cfg: Config, target: str, epoch: int) -> str:
    return os.path.join(plan_dir(cfg.warehouse, target, epoch), "plan.json")


@holds_target_lease
def run_translate(
    cfg, target, epoch: int, spark=None, whole_file: bool = False, first_epoch: int | None = None
) -> dict:
    """Build and store the plan of ``first_epoch..epoch`` for ``target`` (on Spark); returns its summary."""
    from epochsync.stages.translate import build_plan

    t0 = time.monotonic()
    cfg = _config(cfg)
    tcfg = _target_cfg(cfg, target)
    src = cfg.source_of(tcfg)
    first = first_epoch or epoch
    if spark is None:
        from epochsync.spark import spark_session

        spark = spark_session(f"epochsync-translate-{tcfg.name}", cfg=cfg)
    entries, records_in = _translate_entries_spark(cfg, tcfg, first, epoch, spark, whole_file)
    plan = build_plan(entries, target=_target_dict(tcfg), store=_store_dict(cfg, tcfg), epoch=epoch, first_epoch=first)
    plan["source"] = src.name
    plan["snapshot"] = Warehouse(cfg.warehouse).snapshot(tcfg.name, epoch)
    plan["summary"]["records_in"] = records_in
    write_json_atomic(plan_path(cfg, tcfg.name, epoch), plan)
    summary = dict(plan["summary"], seconds=round(time.monotonic() - t0, 3))
    write_stage_stats(cfg.warehouse, tcfg.name, epoch, "translate", summary)
    return summary


def _translate_entries_spark(cfg: Config, tcfg: TargetConfig, first: int, epoch: int, spark, whole_file: bool):
    from pyspark.sql import functions as F

    from epochsync.stages.translate import plan_entries
    from epochsync.warehouse.snapshots import path_exists, read_snapshot

    src = cfg.source_of(tcfg)
    wh = Warehouse(cfg.warehouse)
    old = read_snapshot(spark, wh, tcfg.name, first - 1, src.root_fid)
    new = read_snapshot(spark, wh, tcfg.name, epoch, src.root_fid)
    if not path_exists(spark, wh.changes(tcfg.name, epoch)):
        raise EpochError(f"no change set for target {tcfg.name} epoch {epoch}: run the merge stage first")
    changes = spark.read.parquet(wh.changes(tcfg.name, epoch))
    if whole_file:
        changes = changes.withColumn("whole_file", F.col("data_changed"))
    entries = plan_entries(old, new, changes, root_fid=src.root_fid, fileset=tcfg.fileset)
    return entries, _records_in(wh, src.name, first, epoch)


def _records_in(wh: Warehouse, source: str, first: int, last: int) -> int:
    """Records of the window but the EPOCH marks, read from the ingested Parquet here (no Spark job)."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    total = 0
    for e in range(first, last + 1):
        path = local_path(wh.records(source, e))
        if not os.path.isdir(path):
            return 0
        types = ds.dataset(path, format="parquet", partitioning="hive").to_table(columns=["type"])["type"]
        total += len(types) - int(pc.sum(pc.cast(pc.equal(types.cast("string"), "EPOCH"), "int64")).as_py() or 0)
    return total


def load_plan(cfg: Config, target: str, epoch: int) -> dict:
    plan = read_json(plan_path(cfg, target, epoch))
    if plan is None:
        raise EpochError(f"no plan for target {target} epoch {epoch}: run the translate stage first")
    return plan


# --------------------------------------------------------------------------- apply

#: in the plan directory: the facts the apply's responses gave (s3: versions written), for verify
APPLIED_FACTS = "applied.json"


@holds_target_lease
def run_apply(cfg, target, epoch: int, spark=None, inject=None, first_epoch: int | None = None) -> dict:
    """Apply the stored plan (see the module docstring); returns the apply figures."""
    from epochsync.journal.faults import resolve
    from epochsync.stages.apply import apply_plan

    t0 = time.monotonic()
    cfg = _config(cfg)
    tcfg = _target_cfg(cfg, target)
    pre = check_preconditions(cfg, tcfg, epoch, first_epoch)
    if pre["action"] == "noop":
        return {"noop": True, "message": pre["message"]}
    if pre["action"] == "rollback_first":
        run_rollback(cfg, tcfg, spark=spark)
    plan = load_plan(cfg, tcfg.name, epoch)
    tgt = open_target(tcfg)
    if tgt.kind == "s3":
        tgt.ensure_bucket()
    problems, state = tgt.fence_check(plan["fence"], tgt.fence_time_ns())
    if problems:
        shown = "; ".join(problems[:20]) + (f"; and {len(problems) - 20} more" if len(problems) > 20 else "")
        raise EpochError(
            f"write fence: target {tcfg.name} ({tgt.describe()}) was changed by someone else since epoch "
            f"{pre['committed']}: {shown}. Nothing was written. Restore those paths or re-hydrate the target."
        )
    source_io, bucket = source_access(cfg, tcfg)
    jdir = journal_dir(cfg.warehouse, tcfg.name, epoch)
    os.makedirs(jdir, exist_ok=True)
    write_json_atomic(os.path.join(jdir, "meta.json"), {"epoch": epoch, "first_epoch": plan.get("first_epoch")})
    faults = fault_counter(cfg.warehouse, tcfg.name, epoch, resolve(inject))
    facts_path = os.path.join(plan_dir(cfg.warehouse, tcfg.name, epoch), APPLIED_FACTS)
    if os.path.exists(facts_path):  # an earlier attempt's: never verify against it
        os.remove(facts_path)
    figures = apply_plan(plan, tgt, source_io, bucket, jdir, state, spark=spark, faults=faults)
    # verify's facts (s3: the versions the apply wrote, from its responses), beside the plan
    write_json_atomic(facts_path, {"epoch": epoch, "facts": figures.pop("facts", {})})
    figures["seconds"] = round(time.monotonic() - t0, 3)
    write_stage_stats(cfg.warehouse, tcfg.name, epoch, "apply", figures)
    return figures


# --------------------------------------------------------------------------- verify


@holds_target_lease
def run_verify(cfg, target, epoch: int, spark=None, first_epoch: int | None = None) -> dict:
    """Verify the applied epoch against the source; raises EpochError on any difference."""
    from epochsync.stages.verify import verify_plan

    t0 = time.monotonic()
    cfg = _config(cfg)
    tcfg = _target_cfg(cfg, target)
    plan = load_plan(cfg, tcfg.name, epoch)
    tgt = open_target(tcfg)
    source_io, bucket = source_access(cfg, tcfg)
    applied = read_json(os.path.join(plan_dir(cfg.warehouse, tcfg.name, epoch), APPLIED_FACTS)) or {}
    result = verify_plan(plan, tgt, source_io, bucket, sample=tcfg.verify.sample, facts=applied.get("facts"))
    result["seconds"] = round(time.monotonic() - t0, 3)
    result["source_requests"] = source_io.counters.as_dict()
    write_json_atomic(os.path.join(plan_dir(cfg.warehouse, tcfg.name, epoch), "verify.json"), result)
    write_stage_stats(cfg.warehouse, tcfg.name, epoch, "verify", result)
    if not result["ok"]:
        raise EpochError(
            f"verify of target {tcfg.name} epoch {epoch}: {result['problem_count']} difference(s) with the source: "
            + "; ".join(result["problems"][:10])
        )
    return result


# --------------------------------------------------------------------------- commit


def _last_indexes(cfg: Config, source: str, first: int, last: int) -> dict[str, int]:
    """Per server, the last record index of the window (from the ingested Parquet)."""
    import pyarrow.dataset as ds

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
        # a commit that died after its manifest: finish its garbage collection
        tgt.finish_commit(epoch)
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
        "committed_at": time.time(),
    }


def commit_epoch(cfg, target, first: int, through: int) -> dict:
    """Airflow's ``commit`` task: :func:`run_commit` of the window ``first..through``."""
    return run_commit(cfg, target, through, first_epoch=first)


# --------------------------------------------------------------------------- rollback


def _expected_namespace(cfg: Config, tcfg: TargetConfig, epoch: int, spark) -> dict[str, dict]:
    """path → attributes of every path the target should hold at ``epoch`` (snapshot)."""
    from epochsync.stages.translate import attrs_of, resolve_links, visible
    from epochsync.warehouse.snapshots import read_snapshot

    src = cfg.source_of(tcfg)
    snap = read_snapshot(spark, Warehouse(cfg.warehouse), tcfg.name, epoch, src.root_fid)
    links = visible(resolve_links(snap, src.root_fid), tcfg.fileset).select("fid", "path")
    rows = links.join(snap, "fid").collect()
    return {r["path"]: attrs_of(r["fid"], r.asDict(recursive=True)) for r in rows}


@holds_target_lease
def rollback_target(cfg, target, spark=None, *, check: bool = True, progress=None) -> dict:
    """Undo every unfinished epoch of ``target`` (see :func:`run_rollback`)."""
    from epochsync.stages.verify import compare_with_snapshot

    cfg = _config(cfg)
    tcfg = _target_cfg(cfg, target)
    tgt = open_target(tcfg)
    committed = manifest_epoch(tgt.read_manifest())
    epochs = unfinished_epochs(cfg, tcfg, committed)
    if not epochs:
        return {"rolled_back": [], "committed": committed, "undone": 0, "message": "nothing to roll back"}
    t0 = time.monotonic()
    undone = 0
    for e in sorted(epochs, reverse=True):
        jdir = journal_dir(cfg.warehouse, tcfg.name, e)
        fault = fault_point(cfg.warehouse, tcfg.name, e, "rollback")  # tests: stage=rollback
        mark_aborted(jdir)
        wait_for_writers(jdir)
        # replay until the journal stops growing: a writer that was mid-entry when the
        # marker appeared has at most one more durable entry, and undo is idempotent;
        # entries a killed rollback already undid are skipped (UndoneLog)
        done = UndoneLog(jdir)
        entries: list[dict] = []
        try:
            while True:
                fresh = [x for x in read_journal(jdir) if x not in done]
                if not fresh:
                    break
                for entry in reversed(fresh):
                    fault(f"undo {entry.get('op')}")
                    tgt.undo(entry, jdir)
                    done.add(entry)
                    undone += 1
                entries += fresh
                time.sleep(0.2)
        finally:
            done.close()
        fault("scratch area")
        tgt.finish_rollback(e)
        if progress:
            progress(f"rollback: epoch {e}: {len(entries)} journal entries undone")
    problems: list[str] = []
    if check:
        if spark is None:
            from epochsync.spark import spark_session

            spark = spark_session("epochsync-rollback", cfg=cfg)
        expected = _expected_namespace(cfg, tcfg, committed, spark)
        scaffold = _fileset_ancestors(tcfg)
        problems = [p for p in compare_with_snapshot(tgt, expected) if p.split(":", 1)[0] not in scaffold]
        if problems:
            raise EpochError(
                f"rollback of target {tcfg.name}: the undo journal was replayed but the target does not match "
                f"snapshot {committed}: " + "; ".join(problems[:10]) + " (the journal is kept; run rollback again "
                "after fixing the cause, or re-hydrate the target)"
            )
    tgt.mark_rollback(max(epochs))
    record_event(cfg.warehouse, tcfg.name, ROLLED_BACK, max(epochs), message=f"back at epoch {committed}",
                 epochs=epochs, undone=undone)  # fmt: skip
    for e in epochs:
        remove_journal(journal_dir(cfg.warehouse, tcfg.name, e))
    return {
        "rolled_back": epochs,
        "committed": committed,
        "undone": undone,
        "checked": check,
        "seconds": round(time.monotonic() - t0, 3),
        "message": f"target {tcfg.name} is back at epoch {committed}",
    }


def _fileset_ancestors(tcfg: TargetConfig) -> set[str]:
    out = set()
    for sub in tcfg.fileset:
        parts = sub.strip("/").split("/")
        for i in range(1, len(parts)):
            out.add("/".join(parts[:i]))
    return out


# --------------------------------------------------------------------------- replicate


def _missing_servers(cfg: Config, source: str, epoch: int) -> list[str]:
    """The servers of ``source`` whose changelogs have not closed ``epoch`` yet (sorted)."""
    from epochsync.stages.ingest import missing_epoch_servers

    return sorted(missing_epoch_servers(cfg, source, epoch))


def _ingest(cfg: Config, source: str, first: int, last: int, spark, consumer: str | None = None) -> dict:
    from epochsync.stages.ingest import run_ingest

    # continuity is checked from this target's own cursor (it is the consumer)
    return run_ingest(cfg, source, first, last, spark, consumer=consumer)


class _Session:
    """The Spark session of a replicate run, started the first time a stage needs it."""

    def __init__(self, name: str, cfg: Config, spark=None, target: str = ""):
        self.name, self.cfg, self.existing, self.target = name, cfg, spark, target

    def get(self):
        if self.existing is None:
            from epochsync.spark import spark_session

            # one server-side session per target, kept between runs (its package and
            # Python workers stay warm for the next epoch; the server drops it when idle)
            self.existing = spark_session(
                self.name, cfg=self.cfg, session_key=f"replicate/{self.cfg.file}/{self.target}"
            )
        return self.existing


def replicate(
    cfg,
    target,
    through_epoch: int | None = None,
    *,
    epoch: int | None = None,
    spark=None,
    inject=None,
    whole_file: bool = False,
    progress=print,
) -> list[dict]:
    """Replicate every closed epoch up to ``through_epoch`` (or only ``epoch``); returns stats rows.

    Every stage runs on one Spark session (:func:`epochsync.spark.spark_session`: the
    configured Spark Connect server, or an in-process local session), opened at the first
    epoch that has work to do.
    """
    cfg = _config(cfg)
    tcfg = _target_cfg(cfg, target)
    session = _Session(f"epochsync-replicate-{tcfg.name}", cfg, spark, tcfg.name)
    committed = committed_epoch(cfg, tcfg)
    if epoch is not None:
        epochs = [epoch]
    else:
        epochs = list(range(committed + 1, (through_epoch or 0) + 1))
    rows = []
    if not epochs:
        progress(f"{tcfg.name}: at epoch {committed}, nothing to do up to epoch {through_epoch}")
    # one writer per target for the whole run; a signal rolls the unfinished epoch back
    with target_lease(cfg, tcfg), rollback_on_interrupt(cfg, tcfg, lambda: session.existing, progress):
        for e in epochs:
            row = _replicate_epoch(cfg, tcfg, e, session, inject, whole_file, progress)
            if row is not None:
                rows.append(row)
    return rows


def _replicate_epoch(cfg: Config, tcfg: TargetConfig, e: int, session: _Session, inject, whole_file: bool, progress):
    """One epoch through every stage; a failure after apply started is rolled back."""
    from epochsync.stages.merge import run_merge

    src = cfg.source_of(tcfg)
    pre = check_preconditions(cfg, tcfg, e)
    if pre["action"] == "noop":
        progress(f"{tcfg.name} epoch {e}: {pre['message']}")
        return None
    if pre["action"] == "rollback_first":
        progress(f"{tcfg.name} epoch {e}: {pre['message']}")
        r = rollback_target(cfg, tcfg, session.existing, progress=progress)
        progress(f"{tcfg.name}: {r['message']}")
    missing = _missing_servers(cfg, src.name, e)
    if missing:
        raise EpochError(f"epoch {e} of source {src.name} is not closed: no EPOCH record yet from {', '.join(missing)}")

    def step(name, fn, detail):
        t = time.monotonic()
        progress(f"{tcfg.name} epoch {e}: {name} ...")
        tag = f"epochsync-{name}-{tcfg.name}-e{e}"  # the stage's jobs in the Spark UI and event log
        spark.addTag(tag)
        try:
            out = fn()
        finally:
            spark.removeTag(tag)
        took = time.monotonic() - t
        progress(f"{tcfg.name} epoch {e}: {name} done in {took:.1f}s{detail(out)}")
        if name in ("ingest", "merge"):
            write_stage_stats(cfg.warehouse, tcfg.name, e, name, {**scalars(out), "seconds": round(took, 3)})
        return out

    spark = session.get()
    step("ingest", lambda: _ingest(cfg, src.name, e, e, spark, tcfg.name), lambda o: _fmt(o, "records"))
    step("merge", lambda: run_merge(cfg, tcfg.name, e, e, spark), lambda o: _fmt(o, "changes"))
    if tcfg.kind == "feed":
        # a feed publishes the net change in place of translate, apply, verify and commit
        from epochsync.stages.publish import publish_epoch

        try:
            return step("publish", lambda: publish_epoch(cfg, tcfg, e, e, spark, inject=inject),
                        lambda o: f": {o['records_published']} records in {o['file']}")  # fmt: skip
        except EpochsyncError as exc:  # nothing to roll back: _feed.json still names the previous epoch
            record_event(cfg.warehouse, tcfg.name, FAILED, e, message=str(exc)[:500])
            raise EpochError(f"epoch {e} of feed {tcfg.name} was not published: {exc}") from exc
    step("translate", lambda: run_translate(cfg, tcfg, e, spark, whole_file=whole_file),
         lambda o: f": {o['namespace_ops']} namespace, {o['data_ops']} data, {o['post_ops']} post operations")  # fmt: skip
    try:
        step("apply", lambda: run_apply(cfg, tcfg, e, spark, inject=inject),
             lambda o: f": {o.get('bytes_pulled', 0)} bytes pulled, {o.get('bytes_written', 0)} written, "
                       f"{o.get('bytes_copied', 0)} copied server-side")  # fmt: skip
        step("verify", lambda: run_verify(cfg, tcfg, e, spark),
             lambda o: f": {o['paths_checked']} paths, {o['files_hashed']} files hashed")  # fmt: skip
        return step("commit", lambda: run_commit(cfg, tcfg, e), lambda o: f": manifest at epoch {e}")
    except Exception as exc:
        progress(f"{tcfg.name} epoch {e}: FAILED: {exc}")
        record_event(cfg.warehouse, tcfg.name, FAILED, e, message=str(exc)[:500])
        try:
            r = rollback_target(cfg, tcfg, session.existing, progress=progress)
            progress(f"{tcfg.name} epoch {e}: rolled back: {r['message']}")
        except Exception as rexc:
            raise EpochsyncError(
                f"epoch {e} failed ({exc}) and its rollback failed too ({rexc}); run "
                f"'epochsync rollback --config {cfg.file} --target {tcfg.name}' again"
            ) from rexc
        if isinstance(exc, EpochsyncError):
            raise EpochError(f"epoch {e} of target {tcfg.name} failed and was rolled back: {exc}") from exc
        raise




def _fmt(o, key) -> str:
    return f": {o[key]} {key}" if isinstance(o, dict) and key in o else ""


# --------------------------------------------------------------------------- CLI verbs


def configure_replicate(parser) -> None:
    parser.add_argument("--config", required=True, metavar="FILE", help="epochsync YAML config")
    parser.add_argument("--target", required=True, metavar="NAME", help="target to replicate into")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--epoch", type=int, metavar="E", help="replicate exactly this epoch (the next one)")
    which.add_argument("--through", type=int, metavar="E", help="replicate every closed epoch up to E")
    parser.add_argument("--whole-file", action="store_true", help="pull changed files whole, not only their extents")
    parser.add_argument(
        "--inject-failure", metavar="SPEC", help="fault injection, e.g. after=3,epoch=2 (see epochsync.journal.faults)"
    )


def run_replicate(args) -> int:
    cfg = load_config(args.config)

    def progress(line: str) -> None:
        print(line, flush=True)

    rows = replicate(
        cfg, args.target, args.through, epoch=args.epoch, inject=args.inject_failure,
        whole_file=args.whole_file, progress=progress,
    )  # fmt: skip
    for r in rows:
        if "epoch" not in r:  # a no-op (the epoch was committed in between)
            print(r.get("message", "nothing to do"))
            continue
        if r.get("kind") == "feed":
            print(f"epoch {r['epoch']}: published; {r['records_in']} records, {r['records_published']} changes "
                  f"{r['events']} in {r['file']} ({r['bytes_written']} bytes)")  # fmt: skip
            continue
        print(
            f"epoch {r['epoch']}: committed; {r['records_in']} records, ops {r['net_operations']}, "
            f"{r['bytes_changed']} bytes changed, {r['bytes_pulled']} pulled, {r['bytes_written']} written, "
            f"{r['bytes_copied']} copied server-side"
        )
    return 0


def configure_rollback(parser) -> None:
    parser.add_argument("--config", required=True, metavar="FILE", help="epochsync YAML config")
    parser.add_argument("--target", required=True, metavar="NAME", help="target to roll back")
    parser.add_argument("--no-check", action="store_true", help="skip the final check against the snapshot")


def run_rollback(cfg_or_args, target=None, spark=None) -> Any:
    """Stage: ``run_rollback(cfg, target, spark=None) -> dict``. CLI: ``run_rollback(args) -> int``."""
    if target is not None or isinstance(cfg_or_args, (Config, str, os.PathLike)):
        return rollback_target(cfg_or_args, target, spark)
    args = cfg_or_args
    r = rollback_target(args.config, args.target, check=not args.no_check, progress=lambda s: print(s, flush=True))
    print(r["message"] + (f" ({r['undone']} journal entries undone)" if r["rolled_back"] else ""))
    return 0


def configure_relocate(parser) -> None:
    parser.add_argument("--config", required=True, metavar="FILE", help="epochsync YAML config")
    parser.add_argument("--target", required=True, metavar="NAME", help="target whose control directory moves")
    parser.add_argument(
        "--from", dest="old", default=".epochsync", metavar="NAME",
        help="where the control directory is now (default .epochsync); it moves to the target's control_dir",
    )  # fmt: skip


def run_relocate(args) -> int:
    """``epochsync relocate``: move a target's control directory to its (new) ``control_dir``.

    The way forward when the source holds an entry named like the control directory at its
    root: translate refuses that epoch, naming it; change ``control_dir``, relocate, rerun.
    """
    import dataclasses

    from epochsync.targets import open_target

    cfg = load_config(args.config)
    tcfg = cfg.target(args.target)
    old = open_target(dataclasses.replace(tcfg, control_dir=args.old))
    committed = manifest_epoch(old.read_manifest())
    unfinished = unfinished_epochs(cfg, tcfg, committed)
    if unfinished:
        raise EpochError(
            f"target {tcfg.name}: epoch(s) {unfinished} did not commit; roll them back first "
            f"(epochsync rollback --config {cfg.file} --target {tcfg.name}), then relocate"
        )
    print(open_target(tcfg).move_control_dir(args.old))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use: epochsync replicate|rollback ...")


# --------------------------------------------------------------------------- Spark apps


def stage_main(stage: str, argv: list[str] | None = None) -> int:
    """``spark_apps/<stage>.py``: common arguments, one session, one JSON line or one error line."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog=f"spark_apps/{stage}.py")
    parser.add_argument("--config", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--epoch", type=int, required=True, help="first epoch of the run")
    parser.add_argument("--through", type=int, help="last epoch of the run (default: --epoch)")
    parser.add_argument("--whole-file", action="store_true")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--inject-failure", default=None)
    parser.add_argument("--source", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    first, last = args.epoch, args.through or args.epoch
    raise_on_signals()  # Airflow stops a task with SIGTERM: leases released, one line
    try:
        from epochsync.spark import spark_session

        cfg = load_config(args.config)
        spark = spark_session(f"epochsync-{stage}-{args.target}-{last}", cfg=cfg)
        if stage == "translate":
            out = run_translate(cfg, args.target, last, spark, whole_file=args.whole_file, first_epoch=first)
            if args.dry_run:
                print(f"dry run: plan of {args.target} epochs {first}..{last}: {json.dumps(out, sort_keys=True)}")
        elif stage == "apply":
            out = run_apply(cfg, args.target, last, spark, inject=args.inject_failure, first_epoch=first)
        elif stage == "verify":
            out = run_verify(cfg, args.target, last, spark, first_epoch=first)
        else:
            raise EpochsyncError(f"unknown stage {stage!r}")
    except EpochsyncError as exc:
        print(f"{stage}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        sig = Interrupted.of(exc)
        print(f"{stage}: stopped by {sig.name}; the target keeps its last committed epoch (the DAG's rollback "
              "task undoes a partial apply)", file=sys.stderr)  # fmt: skip
        return sig.exit_code
    print(json.dumps(jsonable(out), sort_keys=True, default=str))
    return 0

