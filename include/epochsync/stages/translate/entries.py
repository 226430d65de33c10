"""The entries of a plan and the facts of one: which fids the target must act on
(:func:`plan_entries`, from the snapshots E-1/E and the net change set), and for one entry its
paths and links, attributes, data ranges, source objects and pulls, and the part plan of a
multipart write. Both planners (:mod:`~epochsync.stages.translate.posix`,
:mod:`~epochsync.stages.translate.s3`) and the stages that compare a replica with its source
(audit, rollback, repair) read entries through these."""

from __future__ import annotations

import math

from epochsync.core.config_values import MIN_PART_SIZE
from epochsync.core.layout import file_range_to_objects, merge_ranges
from epochsync.core.model import FILE
from epochsync.core.probes import mutant, took
from epochsync.targets.base import CONTROL_DIR, TargetLimitError
from epochsync.warehouse.snapshots import directory_paths

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


def control_dir_of(target: dict) -> str:
    """Returns the control directory's name of a plan's target (default ``.epochsync``)."""
    return target.get("control_dir") or CONTROL_DIR


def limit_error(target: dict, path: str, needs: str, more: int, shorter: str) -> TargetLimitError:
    """A path of the plan past a limit of the target: which, what it needs, and the ways out."""
    others = f" ({more} more path(s) of this epoch too)" if more else ""
    return TargetLimitError(
        f"target {target['name']}: {path!r} {needs}{others}. Nothing was applied. Shorten the path at the "
        f"source, give the target a shorter {shorter}, or leave that subtree out of the target's fileset"
    )


def data_common(e: dict, target: dict, store: dict) -> dict:
    """The fields every data operation of ``e`` has: its ranges, pulls, source layout and attributes."""
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


def visible_links(entry: dict, side: str) -> list[dict]:
    """Visible links of one side; entries built without links fall back to paths."""
    links = entry.get(f"{side}_links")
    if links is not None:
        return links
    return [
        {"pfid": p.rsplit("/", 1)[0] if "/" in p else "", "name": p.rsplit("/", 1)[-1], "path": p}
        for p in entry[f"{side}_paths"]
    ]


def dedupe_fence(items: list[dict], key: str) -> list[dict]:
    """The fence ``items`` with one per ``key`` (sorted), an item that names a state kept over one that does not."""
    seen: dict[str, dict] = {}
    for it in items:
        if it[key] in seen and seen[it[key]].get("type", seen[it[key]].get("present")):
            continue
        seen[it[key]] = it
    return [seen[k] for k in sorted(seen)]


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
