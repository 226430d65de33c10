"""A target's state as the stages see it: config lookups, the committed epoch, unfinished epochs,
preconditions, the plan's location."""

from __future__ import annotations

import os
import re

from epochsync.core.config import Config, TargetConfig, load_config
from epochsync.core.errors import EpochError, NotClosedError, SourceError
from epochsync.journal.undo import (
    journal_exists,
    manifest_epoch,
    plan_dir,
    read_json,
    unfinished_repair,
)
from epochsync.targets import open_target
from epochsync.warehouse.paths import Warehouse, local_path


def _config(cfg: Config | str | os.PathLike) -> Config:
    return cfg if isinstance(cfg, Config) else load_config(cfg)


def _target_cfg(cfg: Config, target: str | TargetConfig) -> TargetConfig:
    return target if isinstance(target, TargetConfig) else cfg.target(target)


def source_access(cfg: Config, tcfg: TargetConfig, epoch: int | None = None):
    """Returns ``(reader, bucket)`` of the bytes of ``tcfg``'s source: an ``S3Access`` of its store (with
    the target's retry bound), or for a live source (gluster) the reader of cut ``epoch`` (the
    epoch the plan brings the target to; its bucket is the source's name)."""
    src = cfg.source_of(tcfg)
    if src.kind == "gluster":
        from epochsync.sources.gluster.reader import cut_reader

        if epoch is None:
            raise EpochError(f"source {src.name} is read from its cuts: say which epoch's")
        agents = None
        if src.agents:
            from epochsync.stores.connections import resolve_agent

            assert src.agent_conn_id is not None
            agents = resolve_agent(src.agent_conn_id)
        return cut_reader(cfg.warehouse, src.name, epoch, agents=agents, config=cfg.file), src.name
    from epochsync.stores.connections import resolve_s3
    from epochsync.stores.s3_access import S3Access

    assert src.store is not None
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
        return {
            "action": "noop",
            "committed": committed,
            "unfinished": unfinished,
            "message": f"target {tcfg.name} is already at epoch {committed}: epoch {epoch} is a no-op",
        }
    if committed < first - 1:
        missing = list(range(committed + 1, first))
        span = f"{missing[0]}" if len(missing) == 1 else f"{missing[0]}..{missing[-1]}"
        gap = f"target {tcfg.name} is at epoch {committed}, so epoch {first} would leave a gap: epoch(s) {span} are missing"
        closed = _latest_closed(cfg, tcfg.source)
        if closed is not None and closed <= committed:
            # nothing the source has closed can fill the gap: no backfill command to give
            raise NotClosedError(
                f"{gap}, and source {tcfg.source} has closed none of them yet (it is closed through "
                f"{closed if closed else 'no epoch'}): run epoch {committed + 1} once it is closed"
            )
        through = first - 1 if closed is None else min(first - 1, closed)
        later = f" (epochs {through + 1}.. are not closed yet)" if through < first - 1 else ""
        raise EpochError(
            f"{gap}. Backfill them first: epochsync replicate --config {cfg.file} --target {tcfg.name} "
            f"--through {through}{later} (or in Airflow: airflow backfill create --dag-id "
            f"epochsync__{tcfg.source}__{tcfg.name} ...)"
        )
    if committed > first - 1:
        # a catch-up run planned epochs first..epoch from first-1, and another run committed some
        # of them meanwhile: its plan no longer starts where the target is
        raise EpochError(
            f"target {tcfg.name} is at epoch {committed}, inside this run's epochs {first}..{epoch}, whose plan "
            f"starts from epoch {first - 1}: nothing was applied. Run epochs {committed + 1}..{epoch} again "
            "(in Airflow: clear the whole run, so that it plans from the committed epoch)"
        )
    if unfinished or unfinished_repair(cfg.warehouse, tcfg.name):
        return {
            "action": "rollback_first",
            "committed": committed,
            "unfinished": unfinished,
            "message": f"epoch(s) {unfinished} of target {tcfg.name} did not commit: rolling back first"
            if unfinished
            else f"a repair of target {tcfg.name} did not finish: undoing it first",
        }
    return {"action": "run", "committed": committed, "unfinished": [], "message": "ok"}


def _target_dict(tcfg: TargetConfig) -> dict:
    return {
        "name": tcfg.name,
        "kind": tcfg.kind,
        "fileset": list(tcfg.fileset),
        "coalesce_gap": tcfg.coalesce_gap,
        "part_size": tcfg.part_size,
        "small_object": tcfg.small_object,
        "small_file": tcfg.small_file,
        "stripe_size": tcfg.stripe_size,
        "stripe_count": tcfg.stripe_count,
        "prefix": tcfg.prefix,
        "path": tcfg.path,
        "control_dir": tcfg.control_dir,
    }


def _store_dict(cfg: Config, tcfg: TargetConfig) -> dict:
    src = cfg.source_of(tcfg)
    if src.kind == "gluster":
        # a file's bytes are in the cut by gfid; its WRITE records pin the epoch it was last written
        return {"key": "{fid}", "unstriped_key": "{fid}", "bucket": src.name, "versioned": True}
    store = src.store
    assert store is not None
    # JSON Lines WRITE records pin object versions: an object with no version at E was
    # never written by E and reads as zeros, never as a later epoch's "latest" bytes
    return {
        "key": store.key,
        "unstriped_key": store.unstriped_key,
        "bucket": store.bucket,
        "versioned": src.changelogs.format == "jsonl",
    }


def plan_path(cfg: Config, target: str, epoch: int) -> str:
    """Returns the local path of ``target``'s plan for ``epoch`` (``plan.json``)."""
    return os.path.join(plan_dir(cfg.warehouse, target, epoch), "plan.json")


def _records_in(wh: Warehouse, source: str, first: int, last: int) -> int:
    """Records of the window but the EPOCH marks, read from the ingested Parquet here (no Spark job)."""
    import pyarrow.compute as pc

    from epochsync.core.arrow import dataset_module, scalar

    ds = dataset_module()

    total = 0
    for e in range(first, last + 1):
        path = local_path(wh.records(source, e))
        if not os.path.isdir(path):
            return 0
        types = ds.dataset(path, format="parquet", partitioning="hive").to_table(columns=["type"])["type"]
        total += len(types) - int(
            pc.sum(pc.cast(pc.equal(types.cast("string"), scalar("EPOCH")), "int64")).as_py() or 0
        )
    return total


def load_plan(cfg: Config, target: str, epoch: int) -> dict:
    """Returns the plan translate wrote for ``target``'s ``epoch``; raises :class:`EpochError` if there is none."""
    plan = read_json(plan_path(cfg, target, epoch))
    if plan is None:
        raise EpochError(f"no plan for target {target} epoch {epoch}: run the translate stage first")
    return plan


#: in the plan directory: the facts the apply's responses gave (s3: versions written), for verify
APPLIED_FACTS = "applied.json"


def _latest_closed(cfg: Config, source: str) -> int | None:
    """The last epoch ``source`` has closed (0: none), or None when that cannot be told here (then
    a message names no bound)."""
    try:
        src = cfg.source(source)
        if src.kind == "gluster":
            from epochsync.sources.gluster.state import published_epoch_at

            return published_epoch_at(cfg.warehouse, source)
        from epochsync.stages.ingest.closure import latest_closed_epoch
        from epochsync.stages.ingest.files import missing_changelog_folder

        if (gone := missing_changelog_folder(src)) is not None:
            raise gone
        return latest_closed_epoch(cfg, source) or 0
    except SourceError:
        raise  # the source cannot be read (its changelog folder is not there): that is the error to say
    except Exception:  # the bound is a courtesy of an error message: never a second error
        return None
