"""Rollback: the undo journal of an unfinished epoch replayed in reverse, then the target checked
against its committed epoch; the ``rollback`` verb."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from epochsync.core.config import Config, TargetConfig
from epochsync.core.errors import EpochError, EpochsyncError
from epochsync.core.shutdown import Interrupted
from epochsync.journal.lease import holds_target_lease
from epochsync.journal.undo import (
    UndoneLog,
    fault_point,
    journal_dir,
    manifest_epoch,
    mark_aborted,
    read_journal,
    remove_journal,
    repair_journal_dir,
    unfinished_repair,
    wait_for_writers,
)
from epochsync.stages.context import _config, _target_cfg, unfinished_epochs
from epochsync.targets import open_target
from epochsync.warehouse.events import FAILED, ROLLED_BACK, read_events, record_event
from epochsync.warehouse.paths import Warehouse


def _expected_namespace(cfg: Config, tcfg: TargetConfig, epoch: int, spark) -> dict[str, dict]:
    """path → attributes of every path the target should hold at ``epoch`` (snapshot)."""
    from epochsync.stages.translate.entries import attrs_of
    from epochsync.warehouse.snapshots import read_snapshot, resolve_links, visible

    src = cfg.source_of(tcfg)
    snap = read_snapshot(spark, Warehouse(cfg.warehouse), tcfg.name, epoch, src.root_fid)
    links = visible(resolve_links(snap, src.root_fid), tcfg.fileset).select("fid", "path")
    rows = links.join(snap, "fid").collect()
    return {r["path"]: attrs_of(r["fid"], r.asDict(recursive=True)) for r in rows}


def failure_reason(warehouse: str, target: str, epochs) -> str | None:
    """Why the epochs were rolled back: the newest FAILED event of one of them (its stage and
    message, as the stage recorded it), or None when none was recorded."""
    wanted = set(epochs)
    for ev in reversed(read_events(warehouse, target)):
        if ev.get("event") == FAILED and ev.get("epoch") in wanted:
            stage = ev.get("stage")
            return f"{stage} failed: {ev.get('message', '')}" if stage else str(ev.get("message", ""))
    return None


@holds_target_lease
def rollback_target(cfg, target, spark=None, *, check: bool = True, progress=None) -> dict:
    """Undo every unfinished epoch of ``target`` (see :func:`run_rollback`)."""
    from epochsync.stages.verify import compare_with_snapshot

    cfg = _config(cfg)
    tcfg = _target_cfg(cfg, target)
    tgt = open_target(tcfg)
    committed = manifest_epoch(tgt.read_manifest())
    epochs = unfinished_epochs(cfg, tcfg, committed)
    repair_undone = None
    if unfinished_repair(cfg.warehouse, tcfg.name):
        # a repair of the committed epoch that did not finish: undone first (it wrote over that epoch)
        repair_undone = roll_back_repair(cfg, tcfg, reason="it did not finish", progress=progress)
    if not epochs:
        if repair_undone is None:
            return {"rolled_back": [], "committed": committed, "undone": 0, "message": "nothing to roll back"}
        return {
            "rolled_back": [],
            "committed": committed,
            "undone": repair_undone,
            "message": f"an unfinished repair undone: target {tcfg.name} is as it was before it, at epoch {committed}",
        }
    t0 = time.monotonic()
    undone = 0
    for e in sorted(epochs, reverse=True):
        jdir = journal_dir(cfg.warehouse, tcfg.name, e)
        fault = fault_point(cfg.warehouse, tcfg.name, e, "rollback")  # tests: stage=rollback
        n = undo_journal(tgt, jdir, fault, _epoch_progress(progress, e))
        undone += n
        fault("scratch area")
        tgt.finish_rollback(e)
        if progress:
            progress(f"rollback: epoch {e}: {n} journal entries undone")
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
    reason = failure_reason(cfg.warehouse, tcfg.name, epochs)
    record_event(
        cfg.warehouse,
        tcfg.name,
        ROLLED_BACK,
        max(epochs),
        message=f"rolled back to epoch {committed}" + (f" after {reason}" if reason else ""),
        back_at=committed,
        reason=reason,
        epochs=epochs,
        undone=undone,
    )
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


def undo_journal(tgt, jdir: str, fault: Callable[[str], None], progress=None) -> int:
    """Replay the undo journal in ``jdir`` on ``tgt``, newest entry first; returns the entries undone.

    Writers are stopped first (the ``ABORTED`` marker, then their locks). It replays until the
    journal stops growing: a writer that was mid-entry when the marker appeared has at most one
    more durable entry, and undo is idempotent; entries a killed rollback already undid are
    skipped (UndoneLog); an entry is logged only once its undo finished, also when the target
    replays keys in threads."""
    mark_aborted(jdir)
    wait_for_writers(jdir)
    done = UndoneLog(jdir)
    undone = 0
    try:
        while True:
            fresh = [x for x in read_journal(jdir) if x not in done]
            if not fresh:
                break
            undone += tgt.undo_all(list(reversed(fresh)), jdir, done.add, before=_fault_hook(fault), progress=progress)
            time.sleep(0.2)
    finally:
        done.close()
    return undone


def roll_back_repair(cfg: Config, tcfg: TargetConfig, *, reason: str, progress=None) -> int:
    """Undo an unfinished repair of the committed epoch (:mod:`epochsync.stages.repair`; the caller
    holds the target's lease): the target is as it was before it. Returns the entries undone."""
    tgt = open_target(tcfg)
    epoch = manifest_epoch(tgt.read_manifest())
    jdir = repair_journal_dir(cfg.warehouse, tcfg.name)
    fault = fault_point(cfg.warehouse, tcfg.name, epoch, "rollback")
    n = undo_journal(tgt, jdir, fault, progress)
    tgt.finish_rollback(epoch)
    tgt.mark_rollback(epoch)  # its undo changed what it touched: the fence instant moves past that
    remove_journal(jdir)
    record_event(
        cfg.warehouse,
        tcfg.name,
        ROLLED_BACK,
        epoch,
        message=f"repair of epoch {epoch} undone ({reason}): the target is as it was before it",
        back_at=epoch,
        reason=f"repair: {reason}",
        undone=n,
        repair=True,
    )
    if progress:
        progress(f"rollback: the repair of epoch {epoch}: {n} journal entries undone")
    return n


def _fault_hook(fault: Callable[[str], None]) -> Callable[[dict], None]:
    def before(entry: dict) -> None:
        fault(f"undo {entry.get('op')}")  # one rollback step per undo entry (stage=rollback)

    return before


def _epoch_progress(progress: Callable[[str], None] | None, epoch: int) -> Callable[[str], None] | None:
    if progress is None:
        return None
    return lambda line: progress(f"rollback: epoch {epoch}: {line}")


def _fileset_ancestors(tcfg: TargetConfig) -> set[str]:
    out = set()
    for sub in tcfg.fileset:
        parts = sub.strip("/").split("/")
        for i in range(1, len(parts)):
            out.add("/".join(parts[:i]))
    return out


def configure_rollback(parser) -> None:
    """Add the ``rollback`` verb's options to ``parser``."""
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


def settle_targets(cfg: Config, targets: Iterable[str]) -> list[str]:
    """Roll back every target left mid-epoch (undo journal replayed, no Spark check); returns one
    phrase per target."""
    out = []
    for name in targets:
        try:
            r = rollback_target(cfg, name, check=False)
        except (EpochsyncError, OSError) as exc:
            out.append(
                f"target {name}: rollback failed ({exc}); run 'epochsync rollback --config {cfg.file} --target {name}'"
            )
            continue
        if r["rolled_back"]:
            out.append(f"target {name} rolled back to epoch {r['committed']}")
        else:
            out.append(f"target {name} at committed epoch {r['committed']}")
    return out


@contextlib.contextmanager
def rollback_on_interrupt(cfg: Config, tcfg: TargetConfig, spark_of: Callable[[], Any], progress=None):
    """On SIGTERM/SIGINT in the block: roll back the unfinished epoch, then re-raise with the outcome.

    The check against the snapshot runs only if Spark is already up (``spark_of()``): a
    signal usually comes with a deadline. A second signal during the rollback stops it;
    the next run resumes it (undo is idempotent).
    """
    try:
        yield
    except KeyboardInterrupt as exc:
        sig = Interrupted.of(exc)
        t0 = time.monotonic()
        try:
            spark = spark_of()
            r = rollback_target(cfg, tcfg, spark, check=spark is not None, progress=progress)
            if r["rolled_back"]:
                epochs = ", ".join(map(str, r["rolled_back"]))
                sig.outcome = (
                    f"epoch {epochs} rolled back in {time.monotonic() - t0:.1f}s; target {tcfg.name} is "
                    f"at epoch {r['committed']}"
                )
            else:
                sig.outcome = f"target {tcfg.name} is at committed epoch {r['committed']}"
        except KeyboardInterrupt:
            sig.outcome = (
                f"the rollback of target {tcfg.name} was interrupted too; run 'epochsync rollback "
                f"--config {cfg.file} --target {tcfg.name}'"
            )
        except Exception as rexc:
            sig.outcome = (
                f"the rollback of target {tcfg.name} failed ({rexc}); run 'epochsync rollback "
                f"--config {cfg.file} --target {tcfg.name}'"
            )
        raise sig from None
