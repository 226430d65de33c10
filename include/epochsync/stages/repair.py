"""Repair: what an audit found different on a target, put right as an epoch of its own.

``epochsync audit --target T --repair`` (:func:`epochsync.stages.audit.audit_target` with
``repair``) audits the committed epoch E, then writes the differences right with the epoch
machinery, under the same lease:

1. **The plan** (:func:`repair_entries`, then :func:`epochsync.stages.translate.build_plan`):
   the audit's walk of the target is the "before" side and the source at E the "after" side of
   one plan entry per source file a difference touches. A path whose only differences are
   attributes (mode, owner, mtime, xattrs) keeps its file and gets them set; one whose size or
   bytes differ is rewritten whole in place (every name of a hard-linked file sees it); any
   other (missing, stray, another type, a symlink's target, a name that is not a hard link of
   its file's other names, or a key holding another file) is removed and made again, the
   file's bytes pulled whole from the source at E (a Gluster source: from the cut of E). The
   planner orders them as an epoch's: removals aside first, creations parents first, links and
   attributes last.
2. **The fence**: every path the plan touches must still be as the audit's walk found it, at
   an instant taken just before that walk (the target's clock). Something changed since, and
   nothing is written.
3. **Apply** with its undo journal (``undo/target=T/repair``), then **verify** of every
   repaired path (bytes read back). A failure anywhere undoes the journal: the target is as it
   was before the repair, differences included, and the failure is recorded.
4. **Commit**: the repair's scratch is dropped, the manifest rewritten at the same epoch with
   the repair noted (its time is the new fence instant, so the next epoch's fence accepts the
   repair's writes), the committed view published again, a ``repaired`` event recorded, and
   the target audited again: the result's ``after`` differences must be none.

A repair that died half way leaves its journal: the next repair, ``epochsync rollback``, and
the next epoch's apply undo it first; an audit refuses the target until then.
"""

from __future__ import annotations

import os
import time
from typing import Any

from epochsync.core.config import Config, TargetConfig
from epochsync.core.errors import EpochError, FenceError, VerifyError
from epochsync.journal.undo import remove_journal, repair_journal_dir, write_json_atomic
from epochsync.warehouse.events import FAILED, record_event
from epochsync.warehouse.paths import Warehouse, local_path

REPAIRED = "repaired"

#: differences a path keeps its file through: its attributes are set again
ATTRIBUTES = frozenset({"mode", "owner", "mtime", "xattrs"})
#: and through a rewrite of its bytes in place
DATA = frozenset({"size", "bytes"})


# --------------------------------------------------------------------------- the plan


def _parent(path: str) -> tuple[str, str]:
    head, _, name = path.rpartition("/")
    return head, name


def _observed_row(e, fid: str) -> dict:
    """A snapshot-shaped row of what the target holds at a path (the plan's "before")."""
    return {
        "fid": fid,
        "type": e.type,
        "size": e.size if e.type == "file" else 0,
        "mode": e.mode,
        "uid": e.uid,
        "gid": e.gid,
        "atime_ns": None,
        "mtime_ns": e.mtime_ns,
        "ctime_ns": None,
        "symlink": e.symlink,
        "xattrs": [{"name": k, "value": v} for k, v in sorted(e.xattrs.items())],
        "layout": None,
        "objects": [],
        "links": [],
    }


def repair_entries(
    differences: list, expected: dict[str, dict], observed: dict[str, Any], root_fid: str
) -> tuple[list[dict], dict[str, str]]:
    """The plan entries that take the target from ``observed`` (the audit's walk: path -> Entry)
    to ``expected`` (path -> attributes with the source's ``fid`` and ``row``) for the paths of
    ``differences``; and how each path is repaired (``attrs``, ``data``, ``replace``). See the
    module docstring."""
    from epochsync.stages.translate.entries import finish_entry

    whats: dict[str, set[str]] = {}
    for d in differences:
        whats.setdefault(d.path, set()).add(d.what)
    how: dict[str, str] = {}
    for p, w in whats.items():
        exp, obs = expected.get(p), observed.get(p)
        same = exp is not None and obs is not None and obs.type == exp["type"]
        if same and w <= ATTRIBUTES:
            how[p] = "attrs"
        elif same and exp is not None and exp["type"] == "file" and w <= ATTRIBUTES | DATA:
            how[p] = "data"
        else:
            how[p] = "replace"
    paths_of: dict[str, list[str]] = {}
    for p, a in expected.items():
        paths_of.setdefault(a["fid"], []).append(p)

    def parent_fid(path: str, side: str) -> str:
        head, _ = _parent(path)
        if head == "":
            return root_fid
        exp = expected.get(head)
        if exp is not None and (side == "new" or (observed.get(head) is not None and how.get(head) != "replace")):
            return exp["fid"]
        return f"repair:{head}"

    def link(path: str, side: str) -> dict:
        return {"path": path, "pfid": parent_fid(path, side), "name": _parent(path)[1]}

    entries: list[dict] = []
    # what the target holds at a replaced path goes, unless it goes with a replaced directory above it
    gone = sorted(p for p, h in how.items() if h == "replace" and p in observed)
    for p in gone:
        head = p
        inside = False
        while "/" in head:
            head = head.rsplit("/", 1)[0]
            if head in how and how[head] == "replace" and head in observed and observed[head].type == "dir":
                inside = True
                break
        if inside:
            continue
        fid = f"repair:{p}"
        d = {
            "fid": fid,
            "old_links": [link(p, "old")],
            "new_links": [],
            "change": None,
            "old": _observed_row(observed[p], fid),
            "new": None,
        }
        if finish_entry(d):
            entries.append(d)
    fids = sorted({expected[p]["fid"] for p in how if p in expected})
    for fid in fids:
        paths = sorted(paths_of[fid])
        row = expected[paths[0]]["row"]
        kept = [p for p in paths if p in observed and how.get(p) != "replace" and not _replaced_above(p, how, observed)]
        data = any(how.get(p) == "data" for p in paths)
        old = None
        if kept:
            old = _observed_row(observed[kept[0]], fid)
            old["links"] = [{"pfid": lk["pfid"], "name": lk["name"]} for lk in (link(p, "old") for p in kept)]
        change = {
            "fid": fid,
            "type": row.get("type"),
            "created": not kept,
            "deleted": False,
            "links_changed": len(kept) != len(paths),
            "attrs_changed": True,
            "xattrs_changed": True,
            "data_changed": data or not kept,
            "whole_file": True,
            "ranges": [],
            "old_size": old.get("size") if old else None,
            "new_size": row.get("size"),
        }
        d = {
            "fid": fid,
            "old_links": [link(p, "old") for p in kept],
            "new_links": [link(p, "new") for p in paths],
            "change": change,
            "old": old,
            "new": dict(row, fid=fid),
        }
        if finish_entry(d):
            entries.append(d)
    return entries, how


def _replaced_above(path: str, how: dict[str, str], observed: dict) -> bool:
    head = path
    while "/" in head:
        head = head.rsplit("/", 1)[0]
        if how.get(head) == "replace" and head in observed:
            return True
    return False


# --------------------------------------------------------------------------- the run


def _faults(cfg: Config, tcfg: TargetConfig, epoch: int, inject, jdir: str):
    """The injected failure of a repair (tests; ``after=K`` only), counted in the repair's own folders."""
    from epochsync.journal.faults import FaultCounter, resolve

    spec = resolve(inject) if inject else None
    if spec is None or not spec.applies(tcfg.name, epoch):
        return None
    pdir = local_path(Warehouse(cfg.warehouse).repair_plan(tcfg.name))
    fired = os.path.join(pdir, "fault.fired")
    if os.path.exists(fired):
        os.remove(fired)  # every repair run is a fresh one
    return FaultCounter(spec, os.path.join(jdir, "faults.count"), fired)


def repair_differences(
    cfg: Config,
    tcfg: TargetConfig,
    epoch: int,
    differences: list,
    expected: dict[str, dict],
    observed: dict[str, Any],
    *,
    since_ns: int | None,
    inject=None,
) -> dict:
    """Repair ``differences`` (the caller holds the target's lease; see the module docstring);
    returns ``{"paths", "how": {attrs, data, replace}, "plan": {...}, "fence", "bytes_pulled",
    "seconds"}`` (the caller audits again: ``after``). Raises :class:`FenceError` when the target changed since the audit's walk and
    :class:`EpochError` (after undoing it) when the repair failed."""
    from epochsync.journal.undo import manifest_epoch
    from epochsync.stages.apply import apply_plan, write_fence
    from epochsync.stages.context import _store_dict, _target_dict, source_access
    from epochsync.stages.rollback import roll_back_repair
    from epochsync.stages.translate import build_plan
    from epochsync.stages.verify import verify_plan
    from epochsync.targets import open_target

    t0 = time.monotonic()
    if not differences:
        return {"paths": 0, "how": {}, "bytes_pulled": 0, "seconds": 0.0}
    src = cfg.source_of(tcfg)
    entries, how = repair_entries(differences, expected, observed, src.root_fid)
    plan = build_plan(entries, target=_target_dict(tcfg), store=_store_dict(cfg, tcfg), epoch=epoch, first_epoch=epoch)
    plan.update(source=src.name, snapshot=Warehouse(cfg.warehouse).snapshot(tcfg.name, epoch), repair=True)
    write_json_atomic(os.path.join(local_path(Warehouse(cfg.warehouse).repair_plan(tcfg.name)), "plan.json"), plan)
    tgt = open_target(tcfg)
    if hasattr(tgt, "ensure_bucket"):
        tgt.ensure_bucket()
    source_io, bucket = source_access(cfg, tcfg, epoch)
    probe = local_path(Warehouse(cfg.warehouse).store_probe(tcfg.name))
    problems, state, fence = write_fence(plan, tgt, source_io, probe, since=since_ns)
    if problems:
        shown = "; ".join(problems[:10]) + (f"; and {len(problems) - 10} more" if len(problems) > 10 else "")
        raise FenceError(
            f"repair of target {tcfg.name}: the target changed since the audit walked it: {shown}. Nothing was "
            f"written; audit again ('epochsync audit --config {cfg.file} --target {tcfg.name} --repair')"
        )
    jdir = repair_journal_dir(cfg.warehouse, tcfg.name)
    os.makedirs(jdir, exist_ok=True)
    write_json_atomic(os.path.join(jdir, "meta.json"), {"epoch": epoch, "repair": True})
    faults = _faults(cfg, tcfg, epoch, inject, jdir)
    try:
        figures = apply_plan(plan, tgt, source_io, bucket, jdir, state, spark=None, faults=faults)
        checked = verify_plan(
            plan, tgt, source_io, bucket, sample=1.0, facts=figures.pop("facts", {}), contents="changed"
        )
        if not checked["ok"]:
            raise VerifyError(
                f"verify of the repair: {checked['problem_count']} difference(s): "
                + "; ".join(checked["problems"][:10])
            )
    except BaseException as exc:
        why = str(exc) or type(exc).__name__
        record_event(cfg.warehouse, tcfg.name, FAILED, epoch, stage="repair", message=why, repair=True)
        roll_back_repair(cfg, tcfg, reason=f"it failed: {why}")
        if isinstance(exc, Exception):
            raise EpochError(
                f"repair of target {tcfg.name} at epoch {epoch} failed and was undone (the target is as it was "
                f"before it): {why}"
            ) from exc
        raise
    tgt.finish_commit(epoch)  # the scratch of its removals
    manifest = tgt.read_manifest() or {}
    assert manifest_epoch(manifest) == epoch
    repaired = {"at": time.time(), "paths": len(how), "differences": len(differences)}
    tgt.write_manifest(dict(manifest, repaired=repaired))  # its time: the fence instant moves past the repair
    if hasattr(tgt, "publish_view"):
        tgt.publish_view()
    remove_journal(jdir)
    counts = {h: sum(1 for v in how.values() if v == h) for h in ("attrs", "data", "replace")}
    record_event(
        cfg.warehouse,
        tcfg.name,
        REPAIRED,
        epoch,
        message=f"repaired {len(how)} paths at epoch {epoch} ({', '.join(f'{n} {h}' for h, n in counts.items() if n)})",
        paths=len(how),
        how=counts,
    )
    return {
        "paths": len(how),
        "how": counts,
        "plan": plan["summary"],
        "fence": fence,
        "bytes_pulled": figures.get("bytes_pulled", 0),
        "seconds": round(time.monotonic() - t0, 3),
    }
