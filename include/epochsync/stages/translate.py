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
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

from epochsync.core.config import Config, TargetConfig
from epochsync.core.config_values import MIN_PART_SIZE
from epochsync.core.errors import EpochError, RecordError
from epochsync.core.layout import file_range_to_objects, merge_ranges, object_size
from epochsync.core.model import DIR, FILE, SYMLINK
from epochsync.core.names import check_basename
from epochsync.core.probes import PATHS, mutant, took
from epochsync.journal.lease import holds_target_lease
from epochsync.journal.undo import (
    write_json_atomic,
    write_stage_stats,
)
from epochsync.stages.context import _config, _records_in, _store_dict, _target_cfg, _target_dict, plan_path
from epochsync.targets.base import CONTROL_DIR, TargetLimitError, UnsafePathError, safe_relpath
from epochsync.warehouse.paths import Warehouse
from epochsync.warehouse.snapshots import directory_paths

PLAN_VERSION = 1


# --------------------------------------------------------------------------- small helpers


def depth(path: str) -> int:
    """Returns the number of components of a plan path."""
    return path.count("/") + 1


def in_fileset(path: str, fileset: tuple[str, ...] | list[str]) -> bool:
    """Is replica path ``a/b`` inside one of the configured subtrees (``/a``)?"""
    if not fileset:
        return True
    for sub in fileset:
        s = sub.strip("/")
        if not s or path == s or path.startswith(s + "/"):
            return True
    return False


def coalesce(ranges: list[tuple[int, int]], gap: int) -> list[tuple[int, int]]:
    """Merge ranges whose gap is below ``gap``: fewer, larger GETs for a little slack."""
    out: list[list[int]] = []
    for o, n in sorted(r for r in ranges if r[1] > 0):
        if out and o - (out[-1][0] + out[-1][1]) < gap:
            out[-1][1] = max(out[-1][0] + out[-1][1], o + n) - out[-1][0]
        else:
            out.append([o, n])
    return [(o, n) for o, n in out]


def attrs_of(fid: str, row: dict) -> dict:
    """The attributes a target stores for a snapshot row (xattr values hex-encoded)."""
    return {
        "fid": fid,
        "type": row.get("type"),
        "mode": row.get("mode"),
        "uid": row.get("uid"),
        "gid": row.get("gid"),
        "atime_ns": row.get("atime_ns"),
        "mtime_ns": row.get("mtime_ns"),
        "size": row.get("size") if row.get("type") == FILE else 0,
        "symlink": row.get("symlink"),
        "xattrs": {
            x["name"]: bytes(x["value"] or b"").hex() for x in (row.get("xattrs") or []) if x["value"] is not None
        },
    }


def part_plan(length: int, changed: list[tuple[int, int]], base_len: int, part_size: int) -> list[dict]:
    """Parts building a new ``length``-byte version from its base and changed ranges.

    Changed ranges (and everything past ``base_len``) are uploaded; unchanged runs are
    copied server-side. Upload regions are widened to the 5 MiB minimum and runs
    between them shorter than that are absorbed, so every part but the last is at
    least 5 MiB.
    """
    spans = [(o, min(n, length - o)) for o, n in changed if o < length]
    if mutant("part-copy-past-base"):  # test-only: what lies past E-1's length is copied, not uploaded
        spans, base_len = [(o, n) for o, n in spans if o + n <= base_len], length
    if length > base_len:
        spans.append((base_len, length - base_len))
    regions: list[list[int]] = []
    for o, n in merge_ranges(spans):
        s, e = o, o + n
        if e - s < MIN_PART_SIZE:
            e = min(length, s + MIN_PART_SIZE)
            s = max(0, min(s, e - MIN_PART_SIZE))
        regions.append([s, e])
    regions.sort()
    merged: list[list[int]] = []
    for s, e in regions:
        if merged and s - merged[-1][1] < MIN_PART_SIZE:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    if merged and 0 < merged[0][0] < MIN_PART_SIZE:
        merged[0][0] = 0
    parts: list[dict] = []
    pos = 0
    for s, e in merged:
        if s > pos:
            parts.append({"copy": [pos, s]})
        k = max(1, (e - s) // part_size)
        step = math.ceil((e - s) / k)
        for i in range(k):
            a, b = s + i * step, min(e, s + (i + 1) * step)
            if a < b:
                parts.append({"upload": [a, b]})
        pos = e
    if pos < length:
        parts.append({"copy": [pos, length]})
    for p in parts:
        took("plan.part_copy" if "copy" in p else "plan.part_upload")
    return parts


# --------------------------------------------------------------------------- source pulls


def source_objects(fid: str, row: dict, store: dict) -> dict:
    """Where a file's bytes live at E: ``{"layout": [ss, sc] | None, "objects": [{key, version} | None]}``."""
    layout = row.get("layout")
    objects = row.get("objects") or []
    # a versioned source (its WRITE records pin versions): an object without a version at E
    # was never written by E, so it holds zeros; reading the key's latest version would
    # return a later epoch's bytes (a catch-up run replicating an old epoch)
    versioned = bool(store.get("versioned"))
    if layout is None or not layout.get("stripe_count"):
        # unstriped: one object; the WRITE records name it {ost, oid=fid}
        mine = [o for o in objects if o.get("oid") in (fid, None)] or objects
        version = mine[-1].get("version") if mine else None
        if versioned and version is None:
            return {"layout": None, "objects": [None]}
        return {
            "layout": None,
            "objects": [{"key": store["unstriped_key"].format(fid=fid, ost="", oid=fid), "version": version}],
        }
    versions = {(o.get("ost"), o.get("oid")): o.get("version") for o in objects}
    out: list[dict | None] = []
    for i in range(int(layout["stripe_count"])):
        lo = layout.get("objects") or []
        if i >= len(lo):
            out.append(None)  # an object the layout does not name holds zeros
            continue
        o = lo[i]
        version = versions.get((o["ost"], o["oid"]))
        if versioned and version is None:
            out.append(None)  # never written by E: zeros
            continue
        out.append({"key": store["key"].format(ost=o["ost"], oid=o["oid"], fid=fid), "version": version})
    return {"layout": [int(layout["stripe_size"]), int(layout["stripe_count"])], "objects": out}


def source_pulls(fid: str, row: dict, file_ranges: list[tuple[int, int]], store: dict, gap: int) -> list[dict]:
    """File ranges → per source object: key, pinned version, coalesced object ranges."""
    src = source_objects(fid, row, store)
    per_obj: dict[int, list[tuple[int, int]]] = {}
    if src["layout"] is None:
        per_obj[0] = list(file_ranges)
    else:
        ss, sc = src["layout"]
        for off, n in file_ranges:
            for idx, (oo, on) in file_range_to_objects(ss, sc, off, n).items():
                per_obj.setdefault(idx, []).append((oo, on))
    pulls = []
    for idx in sorted(per_obj):
        obj = src["objects"][idx]
        if obj is None:
            continue
        rs = coalesce(merge_ranges(per_obj[idx]), gap)
        if rs:
            pulls.append({"index": idx, "key": obj["key"], "version": obj["version"], "ranges": [list(r) for r in rs]})
    return pulls


def data_ranges(entry: dict) -> tuple[bool, list[tuple[int, int]], int, int]:
    """(whole, file ranges to write, new size, size of the target's current content)."""
    new, old, ch = entry["new"], entry.get("old"), entry.get("change") or {}
    new_size = int(new.get("size") or 0)
    existed = bool(entry["old_paths"]) and old is not None and old.get("type") == FILE
    if not existed or ch.get("whole_file"):
        old_len = int(old.get("size") or 0) if existed and old is not None else 0
        return True, ([(0, new_size)] if new_size else []), new_size, old_len
    assert old is not None  # existed
    old_size = int(old.get("size") or 0)
    rs = [(int(r["offset"]), int(r["length"])) for r in ch.get("ranges") or []]
    rs = [(o, min(n, new_size - o)) for o, n in rs if o < new_size and n > 0]
    return False, merge_ranges(rs), new_size, old_size


def needs_data(entry: dict) -> bool:
    """Returns whether a plan entry must write file data: a new file, or one whose data or size changed."""
    new = entry.get("new")
    if not entry["new_paths"] or new is None or new.get("type") != FILE:
        return False
    if not entry["old_paths"]:
        return True
    ch = entry.get("change") or {}
    old = entry.get("old") or {}
    return bool(ch.get("data_changed")) or int(old.get("size") or 0) != int(new.get("size") or 0)


def attrs_changed(entry: dict) -> bool:
    """Returns whether a plan entry's attributes or xattrs changed."""
    ch = entry.get("change") or {}
    if ch.get("attrs_changed") or ch.get("xattrs_changed"):
        return True
    old, new = entry.get("old") or {}, entry.get("new") or {}
    if not (old and new) or old == new:  # equal rows (a descendant of a moved directory): equal attributes
        return False
    return attrs_of("", old) != attrs_of("", new)


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
        plan = _plan_posix(entries, target, store, epoch)
        _check_posix_paths(entries, target)
        # a posix replica moves a directory's descendants with it (one rename, nothing of theirs
        # to do): the fence checks them where they were, verify checks the directory where it is
        checked_after = [e for e in entries if not carried(e)]
        PATHS["plan.carried"] += len(entries) - len(checked_after)
    else:
        plan = _plan_s3(entries, target, store, epoch)
        _check_s3_keys(plan, target)
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
    return {(lk["pfid"], lk["name"]) for lk in _links(entry, "old")} == {
        (lk["pfid"], lk["name"]) for lk in _links(entry, "new")
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


#: S3's longest key: UTF-8 bytes of prefix + key
S3_KEY_MAX = 1024
#: Linux PATH_MAX: the longest path a system call takes, terminating NUL included
POSIX_PATH_MAX = 4096


class ReservedNameError(UnsafePathError):
    """A source entry at the root has the name of the target's control directory."""


def control_dir_of(target: dict) -> str:
    """Returns the control directory's name of a plan's target (default ``.epochsync``)."""
    return target.get("control_dir") or CONTROL_DIR


def _limit_error(target: dict, path: str, needs: str, more: int, shorter: str) -> TargetLimitError:
    others = f" ({more} more path(s) of this epoch too)" if more else ""
    return TargetLimitError(
        f"target {target['name']}: {path!r} {needs}{others}. Nothing was applied. Shorten the path at the "
        f"source, give the target a shorter {shorter}, or leave that subtree out of the target's fileset"
    )


def _check_s3_keys(plan: dict, target: dict) -> None:
    """Every key the plan writes fits S3's 1,024 bytes (SeaweedFS and moto take longer ones; AWS
    refuses them at apply, half way through an epoch)."""
    from epochsync.targets.s3 import path_of_key

    prefix = target.get("prefix") or ""
    keys: set[str] = set()
    for op in plan["namespace"] + plan["post"]:
        keys.add(op["key"])
    for op in plan["data"]:
        keys.update([op["key"], *(op.get("extra_keys") or []), *(sp["key"] for sp in op.get("stripes") or [])])
    size = {k: len((prefix + k).encode("utf-8", "surrogateescape")) for k in keys}
    too_long = sorted(k for k in keys if size[k] > S3_KEY_MAX)
    if too_long:
        k = too_long[0]
        path = path_of_key(k, control_dir_of(target))
        needs = f"needs an S3 key of {size[k]} bytes (prefix {prefix!r} included); S3 keys hold at most {S3_KEY_MAX}"
        raise _limit_error(target, path, needs, len(too_long) - 1, "prefix")


def _check_posix_paths(entries: list[dict], target: dict) -> None:
    """Every path the plan creates fits one system call (PATH_MAX), so apply never meets ENAMETOOLONG."""
    root = target.get("path")
    if not root:
        return
    base = len(os.path.abspath(root).encode("utf-8", "surrogateescape")) + 1
    size = {p: base + len(p.encode("utf-8", "surrogateescape")) for e in entries for p in e["new_paths"]}
    too_long = sorted(p for p, n in size.items() if n >= POSIX_PATH_MAX)
    if too_long:
        p = too_long[0]
        needs = f"would be an absolute path of {size[p]} bytes under {root}; Linux takes at most {POSIX_PATH_MAX - 1}"
        raise _limit_error(target, p, needs, len(too_long) - 1, "path")


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


def _data_common(e: dict, target: dict, store: dict) -> dict:
    whole, rs, new_size, base_len = data_ranges(e)
    return {
        "fid": e["fid"],
        "whole": whole,
        "new_size": new_size,
        "base_size": base_len,
        "ranges": [list(r) for r in rs],
        "pulls": source_pulls(e["fid"], e["new"], rs, store, int(target["coalesce_gap"])),
        "src_layout": source_objects(e["fid"], e["new"], store)["layout"],
        "attrs": attrs_of(e["fid"], e["new"]),
    }


def _plan_posix(entries: list[dict], target: dict, store: dict, epoch: int) -> dict:
    to_tmp: list[dict] = []  # (old path, purpose)
    place: list[dict] = []
    data: list[dict] = []
    links: list[dict] = []
    attrs: list[dict] = []
    fence: list[dict] = []
    all_old = {p for e in entries for p in e["old_paths"]}
    deletes: set[str] = set()
    move_src: set[str] = set()

    for e in entries:
        old, new = e.get("old") or {}, e.get("new") or {}
        ntype = new.get("type") or old.get("type")
        # posix places entries by (parent, name): a path string can stay the same while
        # the entry moved (its parent was replaced), and a directory's descendants
        # follow it without operations of their own.
        old_links = {(lk["pfid"], lk["name"]): lk["path"] for lk in _links(e, "old")}
        new_links = {(lk["pfid"], lk["name"]): lk["path"] for lk in _links(e, "new")}
        removed = sorted(old_links[k] for k in old_links.keys() - new_links.keys())
        added = sorted(new_links[k] for k in new_links.keys() - old_links.keys())
        kept = sorted(new_links[k] for k in new_links.keys() & old_links.keys())
        pairs = list(zip(removed, added)) if e["new_paths"] and old.get("type") == ntype else []
        for src, dst in pairs:
            move_src.add(src)
            to_tmp.append({"src": src, "dst": dst, "type": old.get("type")})
        for src in removed[len(pairs) :]:
            deletes.add(src)
            to_tmp.append({"src": src, "dst": None, "type": old.get("type")})
        extra = added[len(pairs) :]
        for p in e["old_paths"]:
            fence.append(
                {"path": p, "type": old.get("type"), "size": old.get("size") if old.get("type") == FILE else None}
            )
        if not e["new_paths"]:
            continue
        primary = e["new_paths"][0] if not pairs else pairs[0][1]
        if kept:
            primary = kept[0]
        created = not e["old_paths"] or old.get("type") != ntype
        if created:
            # nothing of this fid exists in the replica yet: make its first path
            first, extra = extra[0], extra[1:]
            primary = first
            if ntype == DIR:
                place.append({"op": "mkdir", "path": first})
            elif ntype == SYMLINK:
                place.append({"op": "symlink", "path": first, "target": new.get("symlink") or ""})
            elif ntype != FILE:
                place.append({"op": "mknod", "path": first, "mode": new.get("mode")})
        for p in extra:
            links.append({"op": "link", "path": p, "existing": primary})
        for p in e["new_paths"]:
            if p not in all_old:
                fence.append({"path": p, "type": None})
        if needs_data(e):
            op = _data_common(e, target, store)
            op.update(path=primary, create=created)
            took("plan.posix_" + ("whole" if op["whole"] else "ranges"))
            data.append(op)
        elif created or attrs_changed(e):
            attrs.append({"op": "attrs", "path": primary, "attrs": attrs_of(e["fid"], new), "depth": depth(primary)})

    # phase 1: children first; a delete inside a deleted directory travels with it
    ns: list[dict] = []
    n = 0
    tmp_of: dict[str, str] = {}
    for item in sorted(to_tmp, key=lambda t: (-depth(t["src"]), t["src"])):
        src = item["src"]
        anc = _nearest_ancestor(src, move_src | deletes)
        if item["dst"] is None and anc is not None and anc in deletes:
            continue
        n += 1
        tmp = f"@tmp/{epoch}/{n}"
        tmp_of[src] = tmp
        ns.append({"op": "rename", "src": src, "dst": tmp})
        if item["dst"] is not None:
            place.append({"op": "rename", "src": tmp, "path": item["dst"], "dst": item["dst"]})
    # phase 2: parents first; created directories interleave with moves by depth
    for op in sorted(place, key=lambda o: (depth(o["path"]), o["path"])):
        ns.append({k: v for k, v in op.items() if k != "path" or op["op"] != "rename"})
    attrs.sort(key=lambda o: (-o.pop("depth"), o["path"]))
    return {
        "namespace": ns,
        "data": sorted(data, key=lambda o: o["path"]),
        "post": sorted(links, key=lambda o: o["path"]) + attrs,
        "fence": _implied_absent_dropped(_dedupe_fence(fence, "path")),
        "scratch": f"@tmp/{epoch}",
    }


def _links(entry: dict, side: str) -> list[dict]:
    """Visible links of one side; entries built without links fall back to paths."""
    links = entry.get(f"{side}_links")
    if links is not None:
        return links
    return [
        {"pfid": p.rsplit("/", 1)[0] if "/" in p else "", "name": p.rsplit("/", 1)[-1], "path": p}
        for p in entry[f"{side}_paths"]
    ]


def _nearest_ancestor(path: str, candidates: set[str]) -> str | None:
    p = path
    while "/" in p:
        p = p.rsplit("/", 1)[0]
        if p in candidates:
            return p
    return None


def _dedupe_fence(items: list[dict], key: str) -> list[dict]:
    seen: dict[str, dict] = {}
    for it in items:
        if it[key] in seen and seen[it[key]].get("type", seen[it[key]].get("present")):
            continue
        seen[it[key]] = it
    return [seen[k] for k in sorted(seen)]


def _implied_absent_dropped(fence: list[dict]) -> list[dict]:
    """A posix fence without the absent paths under an absent path: when ``d`` is not in the
    replica, nothing under it is (a directory renamed onto a new name fences every descendant's
    new path; one check of the new name says as much)."""
    absent = {it["path"] for it in fence if it.get("type") is None}
    return [it for it in fence if it.get("type") is not None or _nearest_ancestor(it["path"], absent) is None]


def _plan_s3(entries: list[dict], target: dict, store: dict, epoch: int) -> dict:
    from epochsync.targets.s3 import attrs_key, attrs_sidecar, key_for

    striped = bool(target.get("stripe_size") and target.get("stripe_count"))
    cd = control_dir_of(target)
    ns: list[dict] = []
    data: list[dict] = []
    post: list[dict] = []
    fence: list[dict] = []
    old_keys: dict[str, dict] = {}
    new_keys: set[str] = set()

    def _key(path: str, type_: str | None) -> str:
        return key_for(path, type_, cd)

    def stripe_key(fid: str, index: int) -> str:
        from epochsync.targets.s3 import stripe_key

        return stripe_key(fid, index, cd)

    def written_attrs(fid: str, row: dict) -> dict:
        """The attributes the target's objects of ``fid`` carry (striped files: and the geometry)."""
        a = attrs_of(fid, row)
        if striped and row.get("type") == FILE:
            a["stripe"] = f"{target['stripe_size']}:{target['stripe_count']}"
        return a

    for e in entries:
        old, new = e.get("old") or {}, e.get("new") or {}
        otype, ntype = old.get("type"), new.get("type")
        file_obj = (not striped) and otype == FILE
        for p in e["old_paths"]:
            k = _key(p, otype)
            old_keys[k] = {"key": k, "present": True, "size": int(old.get("size") or 0) if file_obj else 0}
        if striped and otype == FILE and e["old_paths"] and not (e["new_paths"] and ntype == FILE):
            ss, sc = int(target["stripe_size"]), int(target["stripe_count"])
            for i in range(sc):
                osz = object_size(ss, sc, i, int(old.get("size") or 0))
                if osz:
                    k = stripe_key(e["fid"], i)
                    old_keys[k] = {"key": k, "present": True, "size": osz}
        # attributes too large for object metadata live in the fid's sidecar (see s3.attrs_sidecar)
        side_key = attrs_key(e["fid"], cd)
        old_side = attrs_sidecar(written_attrs(e["fid"], old)) if e["old_paths"] and old else None
        if old_side is not None:
            old_keys[side_key] = {"key": side_key, "present": None}  # either: written before the sidecars were
        if not e["new_paths"]:
            continue
        keys = [_key(p, ntype) for p in e["new_paths"]]
        new_keys.update(keys)
        a = written_attrs(e["fid"], new)
        new_side = attrs_sidecar(a)
        if new_side is not None:
            new_keys.add(side_key)
            if new_side != old_side:
                ns.append({"op": "put_attrs", "key": side_key, "attrs": a})
        same_type = bool(e["old_paths"]) and otype == ntype
        old_first = _key(e["old_paths"][0], otype) if same_type else None
        has_data = needs_data(e)
        if ntype == FILE and has_data and not striped:
            op = _data_common(e, target, store)
            key0 = keys[0]
            base = None
            if not op["whole"] and same_type:
                base = key0 if key0 in {_key(p, otype) for p in e["old_paths"]} else old_first
            op.update(key=key0, base=base, extra_keys=keys[1:])
            op["write"] = _write_mode(op["new_size"], op["ranges"], base, op["base_size"], target)
            if op["write"]["mode"] == "patch" and op["new_size"] > int(target.get("small_file") or 0):
                took("plan.patch_large")
            _whole_file_write(op, e, target, store)
            _count_path(op)
            data.append(op)
            continue
        if ntype == FILE and striped:
            if has_data:
                data.extend(_striped_data_ops(e, target, store, same_type))
            # head objects: tiny, rewritten whenever anything about the path changed
            if has_data or not same_type or attrs_changed(e) or set(e["old_paths"]) != set(e["new_paths"]):
                for k in keys:
                    ns.append({"op": "put_empty", "key": k, "attrs": a})
            continue
        if ntype == FILE:
            olds = {_key(p, otype) for p in e["old_paths"]} if same_type else set()
            for k in keys:
                if k not in olds or attrs_changed(e):
                    took("plan.rename_copy")
                    ns.append(
                        {
                            "op": "copy",
                            "key": k,
                            "src": k if k in olds else old_first,
                            "attrs": a,
                            "size": int(new.get("size") or 0),
                        }
                    )
            continue
        # directories (markers), symlinks and special files: empty objects with metadata
        olds = {_key(p, otype) for p in e["old_paths"]} if same_type else set()
        for k in keys:
            if k not in olds or attrs_changed(e):
                ns.append({"op": "put_empty", "key": k, "attrs": a})

    # Deletes first, children first: copies read pinned E-1 versions, so nothing needs a
    # scratch area, and a path that changes type (file <-> directory) is free before
    # its new object is written (a filer-backed store cannot hold both at once).
    deletes = [{"op": "delete", "key": k} for k in sorted(old_keys.keys() - new_keys, key=lambda k: (-k.count("/"), k))]
    for k in sorted(new_keys - old_keys.keys()):
        fence.append({"key": k, "present": False})
    fence.extend(old_keys.values())
    # stripe objects a striped write touches
    for op in data:
        for sp in op.get("stripes") or []:
            if sp["key"] not in old_keys:
                fence.append({"key": sp["key"], "present": sp["had"], "size": sp["base_size"] if sp["had"] else None})
    ns.sort(key=lambda o: (o["key"].count("/"), o["key"]))
    return {
        "namespace": deletes + ns,
        "data": sorted(data, key=lambda o: o["key"]),
        "post": post,
        "fence": _dedupe_fence(fence, "key"),
    }


#: CopyObject's largest source (S3): a larger whole file is uploaded in parts
COPY_OBJECT_MAX = 5 * 1024**3


def _objects_with_data(src: dict, size: int) -> list[int]:
    """Indexes of a file's source objects that hold some of its ``size`` bytes (never written: none)."""
    if src["layout"] is None:
        return [0] if size and src["objects"][0] is not None else []
    ss, sc = src["layout"]
    return [i for i, o in enumerate(src["objects"]) if o is not None and object_size(ss, sc, i, size)]


def pinned_length(fid: str, row: dict) -> int | None:
    """The length of the version of the file's first source object pinned at E, as its ``WRITE``
    record gave it (``object.size``; None when the source did not say): the object
    :func:`source_objects` names first, the same version."""
    layout = row.get("layout")
    objects = row.get("objects") or []
    if layout is None or not layout.get("stripe_count"):
        mine = [o for o in objects if o.get("oid") in (fid, None)] or objects
        obj = mine[-1] if mine else None
    else:
        first = (layout.get("objects") or [None])[0]
        if first is None:
            return None
        obj = next((o for o in objects if (o.get("ost"), o.get("oid")) == (first["ost"], first["oid"])), None)
    size = None if obj is None else obj.get("size")
    return None if size is None else int(size)


def _whole_file_write(op: dict, e: dict, target: dict, store: dict) -> None:
    """Make a data operation a whole-file write where that costs fewer requests (issue 32).

    - A file up to ``small_file`` bytes that would be patched (its changed ranges pulled,
      its replica object read, the whole body put) is read whole from its pinned source
      versions instead: one GET per source object holding its bytes, then the PUT, so the
      replica's old version is not read. Only when that is no more GETs than the patch's
      (a file striped over several small objects keeps the patch).
    - A whole write (new file, whole-file change, small file) gets ``source`` (its source
      objects, :func:`source_objects`): apply builds the body with the same function verify
      reads the source with, so the PUT's checksum covers the file (``stages.verify``).
    - A whole write whose bytes are exactly one pinned source object version gets
      ``copy_from``: apply makes it one server-side CopyObject when the source reader is the S3
      store of the same endpoint, else reads and puts it. Exactly: the file's bytes all lie in
      its first object at the same offsets (:func:`_objects_with_data`), and that version holds
      ``[0, size)`` and nothing more, which only the source can say: its ``WRITE`` record gave
      the version's length (:func:`pinned_length`) and it is the file's size. A version of
      another length, or of no stated length, is read and put (zeros past its end): a file
      truncated down and then up within the epoch has a hole at its end that the version does
      not hold, and the change's ranges cover that hole (they run from the smallest size to the
      final one), so "the epoch's ranges cover every byte" is no proof that the version does
      (issue 50: ``make demo`` replicated such files as objects of the version's length).
    """
    new_size = int(op["new_size"])
    src = source_objects(e["fid"], e["new"], store)
    with_data = _objects_with_data(src, new_size)
    if op["write"]["mode"] == "patch" and new_size <= int(target.get("small_file") or 0):
        if len(with_data) > sum(1 for p in op["pulls"] for _ in p["ranges"]) + 1:
            return
        took("plan.small_file_whole")
        op.update(
            base=None,
            whole=True,
            ranges=[[0, new_size]] if new_size else [],
            pulls=source_pulls(e["fid"], e["new"], [(0, new_size)] if new_size else [], store, 2**62),
            write={"mode": "put"},
        )
    elif op.get("base") is not None:
        return
    op["source"] = src
    exact = pinned_length(e["fid"], e["new"]) == new_size
    if mutant("copy-ignores-length") or (
        mutant("copy-when-ranges-cover") and merge_ranges(data_ranges(e)[1]) == [(0, new_size)]
    ):
        exact = True
    if with_data == [0] and new_size <= COPY_OBJECT_MAX and exact:
        obj = src["objects"][0]
        if obj.get("version"):
            # the source's word for the version's length, which the copy's fact carries
            op["copy_from"] = {"key": obj["key"], "version": obj["version"], "size": new_size}


def _count_path(op: dict) -> None:
    """Count the s3 data path ``op`` takes (:data:`epochsync.core.probes.PATHS`)."""
    mode = op["write"]["mode"]
    if op.get("copy_from"):
        took("plan.copy_from")
    elif op.get("source") is not None and mode == "put":
        took("plan.source_put")
    else:
        took("plan." + mode)
    if op["extra_keys"]:
        took("plan.link_copy")


def _write_mode(new_size: int, ranges: list, base: str | None, base_len: int, target: dict) -> dict[str, Any]:
    if base is None:
        if new_size <= int(target["part_size"]):
            return {"mode": "put"}
        parts = part_plan(new_size, [(0, new_size)], 0, int(target["part_size"]))
        return {"mode": "multipart", "parts": parts}
    if new_size <= int(target["small_object"]):
        return {"mode": "patch"}
    return {"mode": "multipart", "parts": part_plan(new_size, ranges, base_len, int(target["part_size"]))}


def _striped_data_ops(e: dict, target: dict, store: dict, same_type: bool) -> list[dict]:
    """Layout translation proper: file ranges → the target's own stripe objects.

    One operation per file: its source pulls are made once (coalesced per source
    object) and feed every target stripe object the changed ranges touch.
    """
    from epochsync.targets.s3 import stripe_key

    cd = control_dir_of(target)
    common = _data_common(e, target, store)
    ss, sc = int(target["stripe_size"]), int(target["stripe_count"])
    old_size = common["base_size"]
    per_obj: dict[int, list[tuple[int, int]]] = {}
    for off, n in common["ranges"]:
        for idx, (oo, on) in file_range_to_objects(ss, sc, off, n).items():
            per_obj.setdefault(idx, []).append((oo, on))
    stripes = []
    for i in range(sc):
        new_len = object_size(ss, sc, i, common["new_size"])
        old_len = object_size(ss, sc, i, old_size) if same_type else 0
        rs = merge_ranges(per_obj.get(i, []))
        if not rs and new_len == old_len:
            continue
        key = stripe_key(e["fid"], i, cd)
        base = key if (same_type and old_len and not common["whole"]) else None
        write = {"mode": "delete"} if new_len == 0 else _write_mode(new_len, rs, base, old_len, target)
        stripes.append(
            {
                "key": key,
                "stripe_index": i,
                "base": base,
                "base_size": old_len,
                "had": old_len > 0,
                "obj_ranges": [list(r) for r in rs],
                "new_len": new_len,
                "write": write,
            }
        )
    if not stripes:
        return []
    return [{**common, "key": stripes[0]["key"], "stripes": stripes, "extra_keys": []}]


# --------------------------------------------------------------------------- the entries


def plan_entries(old_snapshot, new_snapshot, changes, *, root_fid: str, fileset=()) -> list[dict]:
    """One dict per fid the target must act on (see the module docstring).

    ``old_snapshot``/``new_snapshot``: snapshots with the lookups of
    :class:`~epochsync.warehouse.snapshot_files.SnapshotFiles` (or Arrow tables or Spark
    DataFrames of snapshot rows); ``changes``: the change set (Arrow or Spark). Read in
    this process, proportional to the change: the change set, every directory's links (a
    path needs its ancestors), the rows of the fids that changed, and, only when a
    directory's path changed, the fids linked under it (a scan of the ``links`` column).
    """
    from epochsync.warehouse.snapshot_files import snapshot_view

    old = snapshot_view(old_snapshot, root_fid)
    new = snapshot_view(new_snapshot, root_fid)
    import pyarrow as pa

    if not isinstance(changes, pa.Table):  # a Spark DataFrame
        changes = changes.toArrow()
    change_of = {c["fid"]: c for c in changes.to_pylist()}
    dir_paths = {side: directory_paths(_dir_links(snap), root_fid) for side, snap in (("old", old), ("new", new))}
    # a directory whose path changed moves everything under it: its subdirectories are
    # here already (their paths changed too), the other fids are those linked under one
    moved = {d for d in dir_paths["old"].keys() & dir_paths["new"].keys() if dir_paths["old"][d] != dir_paths["new"][d]}
    moved.discard(root_fid)
    candidates = set(change_of) | moved | set(new.linked_under(moved))
    with_root = in_fileset("", fileset)
    old_rows = {r["fid"]: r for r in old.rows(candidates).to_pylist()}
    new_rows = {r["fid"]: r for r in new.rows(candidates).to_pylist()}

    def links(row: dict | None, side: str) -> list[dict]:
        if row is None:
            return []
        out = []
        if row["fid"] == root_fid and with_root:
            out.append({"path": "", "pfid": "", "name": ""})  # the root's attributes are the replica root's
        for lk in row["links"] or []:
            parent = dir_paths[side].get(lk["pfid"])
            if parent is None:
                continue  # under no reachable directory
            path = lk["name"] if parent == "" else f"{parent}/{lk['name']}"
            if in_fileset(path, fileset):
                out.append({"path": path, "pfid": lk["pfid"], "name": lk["name"]})
        return sorted(out, key=lambda x: (x["path"], x["pfid"], x["name"]))

    entries = []
    for fid in sorted(candidates):
        old_row, new_row = old_rows.get(fid), new_rows.get(fid)
        d = {
            "fid": fid,
            "old_links": links(old_row, "old"),
            "new_links": links(new_row, "new"),
            "change": change_of.get(fid),
            "old": old_row,
            "new": new_row,
        }
        if d["change"] is None and d["old_links"] == d["new_links"]:
            continue
        if finish_entry(d):
            entries.append(d)
    return entries


def _dir_links(snapshot) -> list[tuple[str, str, str]]:
    """``(fid, pfid, name)`` of every link of every directory of ``snapshot``."""
    return [(r["fid"], lk["pfid"], lk["name"]) for r in snapshot.directories().to_pylist() for lk in r["links"] or []]


def finish_entry(d: dict) -> bool:
    """Add ``old_paths``, ``new_paths`` and ``type`` to a plan entry (both engines build
    them so); returns False when the fid has no visible path on either side (nothing to do)."""
    d["old_paths"] = sorted({lk["path"] for lk in d["old_links"]})
    d["new_paths"] = sorted({lk["path"] for lk in d["new_links"]})
    d["type"] = (d.get("new") or d.get("old") or {}).get("type")
    return bool(d["old_paths"] or d["new_paths"])


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
