"""The plan of an s3 target: version-pinned server-side copies (a directory move copies every
object under it, no bytes pulled), data operations with their source pulls and part plans (or a
whole-file PUT or copy where that costs fewer requests), striped layouts, and the write fence."""

from __future__ import annotations

from typing import Any

from epochsync.core.layout import file_range_to_objects, merge_ranges, object_size
from epochsync.core.model import FILE
from epochsync.core.probes import mutant, took
from epochsync.stages.translate.entries import (
    attrs_changed,
    attrs_of,
    control_dir_of,
    data_common,
    data_ranges,
    dedupe_fence,
    limit_error,
    needs_data,
    part_plan,
    source_objects,
    source_pulls,
)

#: S3's longest key: UTF-8 bytes of prefix + key
S3_KEY_MAX = 1024


def check_s3_keys(plan: dict, target: dict) -> None:
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
        raise limit_error(target, path, needs, len(too_long) - 1, "prefix")


def plan_s3(entries: list[dict], target: dict, store: dict, epoch: int) -> dict:
    """The plan of an s3 target for ``entries`` (see the module docstring): namespace, data, post and fence."""
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
            op = data_common(e, target, store)
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
        "fence": dedupe_fence(fence, "key"),
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
    common = data_common(e, target, store)
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
