"""The plan of a posix target: namespace operations in HDFS DistCp ``-diff`` order (sources of
deletes and moves into ``@tmp/E/n`` children-first, then into place parents-first with created
directories interleaved), data operations, hard links and attributes, and the write fence."""

from __future__ import annotations

import os

from epochsync.core.model import DIR, FILE, SYMLINK
from epochsync.core.probes import took
from epochsync.stages.translate.entries import (
    attrs_changed,
    attrs_of,
    data_common,
    dedupe_fence,
    depth,
    limit_error,
    needs_data,
    visible_links,
)

#: Linux PATH_MAX: the longest path a system call takes, terminating NUL included
POSIX_PATH_MAX = 4096


def check_posix_paths(entries: list[dict], target: dict) -> None:
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
        raise limit_error(target, p, needs, len(too_long) - 1, "path")


def plan_posix(entries: list[dict], target: dict, store: dict, epoch: int) -> dict:
    """The plan of a posix target for ``entries`` (see the module docstring): namespace, data, post, fence and scratch area."""
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
        old_links = {(lk["pfid"], lk["name"]): lk["path"] for lk in visible_links(e, "old")}
        new_links = {(lk["pfid"], lk["name"]): lk["path"] for lk in visible_links(e, "new")}
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
            op = data_common(e, target, store)
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
        "fence": _implied_absent_dropped(dedupe_fence(fence, "path")),
        "scratch": f"@tmp/{epoch}",
    }


def _nearest_ancestor(path: str, candidates: set[str]) -> str | None:
    p = path
    while "/" in p:
        p = p.rsplit("/", 1)[0]
        if p in candidates:
            return p
    return None


def _implied_absent_dropped(fence: list[dict]) -> list[dict]:
    """A posix fence without the absent paths under an absent path: when ``d`` is not in the
    replica, nothing under it is (a directory renamed onto a new name fences every descendant's
    new path; one check of the new name says as much)."""
    absent = {it["path"] for it in fence if it.get("type") is None}
    return [it for it in fence if it.get("type") is not None or _nearest_ancestor(it["path"], absent) is None]
