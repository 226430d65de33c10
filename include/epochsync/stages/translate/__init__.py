"""Translate: the net change set and snapshots E-1/E → a plan for one target.

Two halves:

- :func:`plan_entries` (the warehouse read here with pyarrow, in proportion to the
  change: no Spark job): resolves the paths of the changed fids in both snapshots from
  the directories' links, keeps the paths inside the target's fileset, and returns one
  entry per fid whose visible paths, attributes or data changed (descendants of a
  renamed directory included: their paths differ between the snapshots). A move into or out of the fileset is
  thereby a create or a delete. The root directory has no link; when the fileset holds
  it (no fileset, or ``/``) it is an entry of path ``""`` on both sides, so a change of
  its attributes or xattrs reaches the replica's root.
- :func:`build_plan` (pure Python over those entries, unit-testable without Spark):
  namespace operations in HDFS DistCp ``-diff`` order for posix (sources of deletes
  and moves into ``@tmp/E/n`` children-first, then into place parents-first with
  created directories interleaved, deletes finished by dropping the scratch area at
  commit), version-pinned server-side copies for s3 (a directory move copies every
  object under it, no bytes pulled), data operations with their source pulls
  (object key, version, object ranges coalesced below ``coalesce_gap``) and, for s3,
  the part plan (``UploadPartCopy`` of unchanged ranges, ``UploadPart`` of pulled
  ones, every part but the last >= 5 MiB; objects up to ``small_object`` patched in
  memory and put whole), post operations (hard links, attributes, deletes) and the
  write fence (what each touched path must look like at E-1).

The plan is JSON (``plans/target=T/epoch=E/plan.json``); data operations are also
written one per line (``data.jsonl``) for the executors.

This module holds the stage (:func:`run_translate`), :func:`build_plan` and the checks
common to both kinds of target; :mod:`~epochsync.stages.translate.entries` the entries and
the facts of one, :mod:`~epochsync.stages.translate.posix` and
:mod:`~epochsync.stages.translate.s3` the planner of each kind.
"""

from __future__ import annotations

import time

from epochsync.core.config import Config, TargetConfig
from epochsync.core.errors import EpochError, RecordError
from epochsync.core.model import DIR, FILE
from epochsync.core.names import check_basename
from epochsync.core.probes import PATHS, mutant
from epochsync.journal.lease import holds_target_lease
from epochsync.journal.undo import (
    write_json_atomic,
    write_stage_stats,
)
from epochsync.stages.context import _config, _records_in, _store_dict, _target_cfg, _target_dict, plan_path
from epochsync.stages.translate.entries import (
    attrs_changed,
    attrs_of,
    control_dir_of,
    data_ranges,
    needs_data,
    plan_entries,
    source_objects,
    visible_links,
)
from epochsync.stages.translate.posix import check_posix_paths, plan_posix
from epochsync.stages.translate.s3 import check_s3_keys, plan_s3
from epochsync.targets.base import UnsafePathError, safe_relpath
from epochsync.warehouse.paths import Warehouse

PLAN_VERSION = 1


# --------------------------------------------------------------------------- the planner


def build_plan(
    entries: list[dict],
    *,
    target: dict,
    store: dict,
    epoch: int,
    first_epoch: int | None = None,
) -> dict:
    """The plan for one target. ``target``/``store`` are plain dicts of the configs.

    The root directory's entry (path ``""``, see :func:`plan_entries`) changes only the
    attributes of the replica's root: the posix replica directory itself, the s3 root
    directory's object (``targets.s3.dir_key("")``).
    """
    roots = [e for e in entries if is_root_entry(e)]
    entries = [e for e in entries if not is_root_entry(e)]
    cd = control_dir_of(target)
    checked: set[str] = set()  # paths found safe: a path under one needs only its last name checked
    for e in entries:
        for p in e["old_paths"] + e["new_paths"]:
            if p.split("/", 1)[0] == cd:
                raise ReservedNameError(
                    f"target {target['name']}: the source holds {p!r} at its root, where this target keeps its "
                    f"control directory {cd!r}. Nothing was applied. Give the target another control_dir (a name "
                    f"the source does not use), move the current one there with 'epochsync relocate --config FILE "
                    f"--target {target['name']}', and run the epoch again"
                )
            _check_path(p, cd, checked)
    checked_after = entries
    if target["kind"] == "posix":
        plan = plan_posix(entries, target, store, epoch)
        check_posix_paths(entries, target)
        # a posix replica moves a directory's descendants with it (one rename, nothing of theirs
        # to do): the fence checks them where they were, verify checks the directory where it is
        checked_after = [e for e in entries if not carried(e)]
        PATHS["plan.carried"] += len(entries) - len(checked_after)
    else:
        plan = plan_s3(entries, target, store, epoch)
        check_s3_keys(plan, target)
    for e in roots:
        _plan_root(e, target, plan)
    touched_roots = [e for e in roots if attrs_changed(e)]
    plan.update(
        version=PLAN_VERSION,
        target=target["name"],
        kind=target["kind"],
        epoch=epoch,
        first_epoch=first_epoch if first_epoch is not None else epoch,
    )
    plan["verify"] = _verify_items(checked_after + touched_roots, store)
    plan["summary"] = _summary(entries + touched_roots, plan)
    plan["summary"]["carried"] = len(entries) - len(checked_after)
    return plan


def carried(entry: dict) -> bool:
    """Does ``entry`` only move with a renamed ancestor directory: no change of its own, the same
    row at E-1 and E, and the same links (parent fid and name), only their paths differ?

    On a posix replica the ancestor's one rename moves it and the apply does nothing else to it.
    The write fence still checks it where it was (type, size, ctime: as the last commit left
    it), verify checks the ancestor where it is now, and a rename moves a directory with what is
    in it, so verify leaves it out, as it leaves out every entry the epoch did not touch (a
    renamed directory of 12,000 files cost 12,000 verify lookups and as many identities taken by
    the apply: 2.5-3 s of a 6-12 s epoch). An s3 target copies each descendant's keys, so there
    it is verified as before.
    """
    if mutant("verify-carried-any"):  # test-only: every entry that was and is there is left out of verify
        return bool(entry["old_paths"] and entry["new_paths"])
    if entry.get("change") is not None or not entry["old_paths"] or not entry["new_paths"]:
        return False
    old, new = entry.get("old"), entry.get("new")
    if old is None or old != new:
        return False
    return {(lk["pfid"], lk["name"]) for lk in visible_links(entry, "old")} == {
        (lk["pfid"], lk["name"]) for lk in visible_links(entry, "new")
    }


def _check_path(path: str, control_dir: str, checked: set[str]) -> None:
    """:func:`~epochsync.targets.base.safe_relpath` of ``path``, remembered in ``checked``: a path
    whose parent was found safe needs only its own name checked (the paths of a renamed
    directory's 10,000 descendants share their parents)."""
    parent, _, name = path.rpartition("/")
    if parent and parent in checked:
        try:
            check_basename(name)
        except RecordError:
            safe_relpath(path, control_dir=control_dir)  # raises, naming the whole path
    else:
        safe_relpath(path, control_dir=control_dir)
        if parent:
            checked.add(parent)
    checked.add(path)


class ReservedNameError(UnsafePathError):
    """A source entry at the root has the name of the target's control directory."""


def is_root_entry(entry: dict) -> bool:
    """The root directory's entry: its only path is ``""`` on both sides (no name can be empty,
    so nothing else has that path); anything else naming ``""`` is refused."""
    paths = entry["old_paths"] + entry["new_paths"]
    if "" not in paths:
        return False
    types = [(entry.get(side) or {}).get("type") for side in ("old", "new")]
    names = {lk.get("name") for side in ("old", "new") for lk in entry.get(f"{side}_links") or []}
    if entry["old_paths"] != [""] or entry["new_paths"] != [""] or types != [DIR, DIR] or names - {""}:
        raise UnsafePathError(f"refusing the empty path for fid {entry.get('fid')!r}: only the root directory has it")
    return True


def _plan_root(e: dict, target: dict, plan: dict) -> None:
    """Attributes of the source root → the replica's root, after everything else."""
    if not attrs_changed(e):
        return
    a = attrs_of(e["fid"], e["new"])
    if target["kind"] == "posix":
        # no fence item: the replica directory is the target's own (made by the first apply)
        plan["post"].append({"op": "attrs", "path": "", "attrs": a})
    else:
        from epochsync.targets.s3 import key_for

        root = key_for("", "dir", control_dir_of(target))
        plan["post"].append({"op": "put_empty", "key": root, "attrs": a})
        # the object exists once the root's attributes were first replicated: either state is ours
        plan["fence"].append({"key": root, "present": None})


def _verify_items(entries: list[dict], store: dict) -> dict:
    """What verify checks: every path the epoch touched, as it must be at E."""
    present: list[dict] = []
    gone: set[str] = set()
    new_all = {p for e in entries for p in e["new_paths"]}
    for e in entries:
        new = e.get("new")
        for p in e["new_paths"]:
            assert new is not None  # a fid with names at E has its row at E
            item = {"path": p, "attrs": attrs_of(e["fid"], new)}
            if new.get("type") == FILE:
                item["source"] = source_objects(e["fid"], new, store)
                if _same_bytes(e, store):
                    # the replica's E-1 version of the file holds these bytes (verify: a copy of it is covered)
                    item["unchanged"] = True
            present.append(item)
        gone.update(p for p in e["old_paths"] if p not in new_all)
    return {"present": sorted(present, key=lambda i: i["path"]), "absent": sorted(gone)}


def _same_bytes(e: dict, store: dict) -> bool:
    """Are a file's bytes at E those of E-1: a file then and now, no data change, the same size and
    the same pinned source object versions?"""
    old, new = e.get("old") or {}, e.get("new") or {}
    if not e["old_paths"] or old.get("type") != FILE or new.get("type") != FILE or needs_data(e):
        return False
    if old == new:  # the same row at E-1 and E (a file that only moved with its directory)
        return True
    return int(old.get("size") or 0) == int(new.get("size") or 0) and source_objects(
        e["fid"], old, store
    ) == source_objects(e["fid"], new, store)


def _summary(entries: list[dict], plan: dict) -> dict:
    s = {"created": 0, "deleted": 0, "moved": 0, "linked": 0, "unlinked": 0, "attrs": 0, "data": 0}
    changed_bytes = 0
    for e in entries:
        old, new = set(e["old_paths"]), set(e["new_paths"])
        if not old and new:
            s["created"] += 1
        elif old and not new:
            s["deleted"] += 1
        elif old != new:
            removed, added = old - new, new - old
            moves = min(len(removed), len(added))
            s["moved"] += 1 if moves else 0
            s["linked"] += max(0, len(added) - len(removed))
            s["unlinked"] += max(0, len(removed) - len(added))
        if old and new and attrs_changed(e):
            s["attrs"] += 1
        if needs_data(e):
            s["data"] += 1
            _, rs, _, _ = data_ranges(e)
            changed_bytes += sum(n for _, n in rs)
    pulled = sum(n for op in plan["data"] for p in op["pulls"] for _, n in p["ranges"])
    s.update(
        entries=len(entries),
        changed_bytes=changed_bytes,
        planned_pull_bytes=pulled,
        namespace_ops=len(plan["namespace"]),
        data_ops=len(plan["data"]),
        post_ops=len(plan["post"]),
    )
    return s


# --------------------------------------------------------------------------- the stage function


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
    # the entries are read here with pyarrow (a lookup of the changed fids: no Spark job);
    # ``spark`` is accepted for the stage's common signature
    entries, records_in = _translate_entries(cfg, tcfg, first, epoch, whole_file)
    plan = build_plan(entries, target=_target_dict(tcfg), store=_store_dict(cfg, tcfg), epoch=epoch, first_epoch=first)
    plan["source"] = src.name
    plan["snapshot"] = Warehouse(cfg.warehouse).snapshot(tcfg.name, epoch)
    plan["summary"]["records_in"] = records_in
    write_json_atomic(plan_path(cfg, tcfg.name, epoch), plan)
    summary = dict(plan["summary"], seconds=round(time.monotonic() - t0, 3))
    write_stage_stats(cfg.warehouse, tcfg.name, epoch, "translate", summary)
    return summary


def _translate_entries(cfg: Config, tcfg: TargetConfig, first: int, epoch: int, whole_file: bool):
    """The plan entries of ``first..epoch`` and the window's record count, read from the warehouse here."""
    from epochsync.core.arrow import dataset_module
    from epochsync.core.model import change_arrow_schema
    from epochsync.warehouse import fs as warehouse_fs
    from epochsync.warehouse.paths import local_path
    from epochsync.warehouse.snapshots import snapshot_files

    ds = dataset_module()

    src = cfg.source_of(tcfg)
    wh = Warehouse(cfg.warehouse)
    old = snapshot_files(wh, tcfg.name, first - 1, src.root_fid)
    new = snapshot_files(wh, tcfg.name, epoch, src.root_fid)
    uri = wh.changes(tcfg.name, epoch)
    if not warehouse_fs.exists(uri):
        raise EpochError(f"no change set for target {tcfg.name} epoch {epoch}: run the merge stage first")
    schema = change_arrow_schema()
    changes = ds.dataset(local_path(uri), format="parquet").to_table(columns=schema.names).cast(schema)
    if whole_file:
        changes = changes.set_column(changes.column_names.index("whole_file"), "whole_file", changes["data_changed"])
    entries = plan_entries(old, new, changes, root_fid=src.root_fid, fileset=tcfg.fileset)
    return entries, _records_in(wh, src.name, first, epoch)
