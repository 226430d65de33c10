"""Verify: every path an epoch touched is, in the target, what the source holds at E.

Files: size and sha256 of the target's bytes against the source's bytes at E, read
from the pinned versions of the source objects (the frozen state of the epoch) and
reassembled through the source layout. Every path: type, permission bits, symlink
target, xattrs (the ones the target can hold) and, as root on posix, ownership.
Paths the epoch removed must be gone. A sampling ratio (``verify.sample``) checks a
deterministic subset of the files' contents (attributes are always checked).
"""

from __future__ import annotations

import hashlib
import os
import time

from epochsync.core.errors import EpochError
from epochsync.core.layout import assemble_file, object_size
from epochsync.core.schema import Layout
from epochsync.journal.lease import holds_target_lease
from epochsync.journal.undo import (
    plan_dir,
    read_json,
    write_json_atomic,
    write_stage_stats,
)
from epochsync.stages.context import APPLIED_FACTS, _config, _target_cfg, load_plan, source_access
from epochsync.targets import open_target
from epochsync.targets.posix import XATTR_NAMESPACE


def sampled(path: str, ratio: float) -> bool:
    """A stable choice of paths (the same on every run) for a ratio in [0, 1]."""
    if ratio >= 1.0:
        return True
    if ratio <= 0.0:
        return False
    h = int.from_bytes(hashlib.sha256(path.encode("utf-8", "surrogateescape")).digest()[:4], "big")
    return h < ratio * 2**32


def source_bytes(src: dict, size: int, source_io, bucket: str) -> bytes:
    """A file's bytes at E from its source objects (pinned versions)."""
    if src["layout"] is None:
        obj = src["objects"][0]
        if obj is None:  # never written by E: zeros
            return bytes(size)
        return source_io.get_range(bucket, obj["key"], obj["version"], 0, size) if size else b""
    ss, sc = src["layout"]
    objs = []
    for i, obj in enumerate(src["objects"]):
        n = object_size(ss, sc, i, size)
        objs.append(source_io.get_range(bucket, obj["key"], obj["version"], 0, n) if obj and n else None)
    return assemble_file(Layout(ss, sc), size, objs)


#: target stats (HEADs on s3) in flight while verifying a plan of many paths
VERIFY_THREADS = 8


def verify_plan(plan: dict, target, source_io, bucket: str, *, sample: float = 1.0, facts: dict | None = None) -> dict:
    """Check the target against the plan's ``verify`` items; returns figures and problems.

    Paths are checked in ``VERIFY_THREADS`` threads when there are many; problems are
    reported in the plan's order. On s3 the entries come from ``target.stat_many``: one
    version listing per directory, and for a key whose current version is the one the
    apply wrote (``facts``, the apply's ``facts`` figure: version ids from its PUT
    and copy responses) the metadata that write sent; any other key costs a HEAD. A key
    rewritten by someone else after the apply has another version and is checked by its
    HEAD, as before.
    """
    posix = target.kind == "posix"
    owners = not posix or getattr(target, "as_root", False)
    present, gone = plan["verify"]["present"], plan["verify"]["absent"]
    stats: dict = {}
    heads: dict = {}
    exists: dict = {}
    if hasattr(target, "stat_many"):
        wanted = [(i["path"], i["attrs"]["type"]) for i in present]
        got = target.stat_many(wanted, facts)
        stats = {w: e for w, (e, _) in zip(wanted, got)}
        heads = {p: h for (p, _), (_, h) in zip(wanted, got) if h}
        exists = dict(zip(gone, target.exists_many(gone)))

    def stat(path: str, hint: str | None):
        if (path, hint) in stats:
            return stats[(path, hint)]
        return target.stat(path, hint)

    def check(item) -> tuple[list[str], int, int, int]:
        path, want = item["path"], item["attrs"]
        have = stat(path, want["type"] if target.kind == "s3" else None)
        if have is None:
            return [f"{path}: missing (expected a {want['type']})"], 0, 0, 0
        if have.type != want["type"]:
            return [f"{path}: is a {have.type}, expected a {want['type']}"], 0, 0, 0
        problems: list[str] = []
        if want["type"] != "symlink" and want.get("mode") is not None and have.mode != int(want["mode"]) & 0o7777:
            problems.append(f"{path}: mode {oct(have.mode or 0)}, expected {oct(int(want['mode']) & 0o7777)}")
        if owners and want.get("uid") is not None and (have.uid, have.gid) != (want["uid"], want["gid"]):
            problems.append(f"{path}: owner {have.uid}:{have.gid}, expected {want['uid']}:{want['gid']}")
        if want["type"] == "symlink" and have.symlink != want.get("symlink"):
            problems.append(f"{path}: symlink to {have.symlink!r}, expected {want.get('symlink')!r}")
        if want["type"] != "symlink":
            wx = {k: bytes.fromhex(v) for k, v in (want.get("xattrs") or {}).items()}
            if posix:
                wx = {k: v for k, v in wx.items() if k.startswith(XATTR_NAMESPACE)}
            if have.xattrs != wx:
                problems.append(f"{path}: xattrs {sorted(have.xattrs)} differ from the source's {sorted(wx)}")
        if want["type"] != "file":
            return problems, 1, 0, 0
        size = int(want.get("size") or 0)
        if have.size != size:
            return [*problems, f"{path}: size {have.size}, expected {size}"], 1, 0, 0
        if not sampled(path, sample):
            return problems, 1, 0, 0
        expected = hashlib.sha256(source_bytes(item["source"], size, source_io, bucket)).hexdigest()
        head = heads.get(path)
        # the bytes of the version whose attributes were just checked (no second HEAD)
        data = target.read_file(path, head=head) if head else target.read_file(path)
        if hashlib.sha256(data).hexdigest() != expected:
            problems.append(f"{path}: content differs from the source at epoch {plan['epoch']} (sha256)")
        return problems, 1, 1, len(data)

    def absent(path: str) -> list[str]:
        there = exists[path] if path in exists else target.stat(path) is not None
        return [f"{path}: still present, but the source removed it"] if there else []

    if len(present) + len(gone) >= 16:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(VERIFY_THREADS, thread_name_prefix="epochsync-verify") as pool:
            results = list(pool.map(check, present))
            missing = list(pool.map(absent, gone))
    else:
        results = [check(i) for i in present]
        missing = [absent(p) for p in gone]
    problems = [p for r in results for p in r[0]] + [p for m in missing for p in m]
    return {
        "ok": not problems,
        "paths_checked": sum(r[1] for r in results),
        "files_hashed": sum(r[2] for r in results),
        "bytes_read_target": sum(r[3] for r in results),
        "problems": problems[:200],
        "problem_count": len(problems),
    }


def compare_with_snapshot(target, expected: dict[str, dict], *, posix_xattrs: bool = True) -> list[str]:
    """Returns the problems of a namespace check (no contents): the target holds exactly ``expected`` (path → attrs)."""
    problems = []
    seen = set()
    owners = target.kind != "posix" or getattr(target, "as_root", False)
    for e in target.walk(hashes=False):
        seen.add(e.path)
        want = expected.get(e.path)
        if want is None:
            problems.append(f"{e.path}: present, but not in the snapshot")
            continue
        if e.type != want["type"]:
            problems.append(f"{e.path}: is a {e.type}, snapshot says {want['type']}")
            continue
        if e.type == "file" and e.size != int(want.get("size") or 0):
            problems.append(f"{e.path}: size {e.size}, snapshot says {want.get('size')}")
        if e.type != "symlink" and want.get("mode") is not None and e.mode != int(want["mode"]) & 0o7777:
            problems.append(f"{e.path}: mode {oct(e.mode or 0)}, snapshot says {oct(int(want['mode']) & 0o7777)}")
        if owners and want.get("uid") is not None and (e.uid, e.gid) != (want["uid"], want["gid"]):
            problems.append(f"{e.path}: owner {e.uid}:{e.gid}, snapshot says {want['uid']}:{want['gid']}")
        if e.type == "symlink" and e.symlink != want.get("symlink"):
            problems.append(f"{e.path}: symlink {e.symlink!r}, snapshot says {want.get('symlink')!r}")
        if e.type != "symlink":
            wx = {k: bytes.fromhex(v) for k, v in (want.get("xattrs") or {}).items()}
            if target.kind == "posix":
                wx = {k: v for k, v in wx.items() if k.startswith(XATTR_NAMESPACE)}
            if e.xattrs != wx:
                problems.append(f"{e.path}: xattrs differ from the snapshot")
    for p in sorted(expected.keys() - seen):
        problems.append(f"{p}: missing")
    return problems


# --------------------------------------------------------------------------- the stage function


@holds_target_lease
def run_verify(cfg, target, epoch: int, spark=None, first_epoch: int | None = None) -> dict:
    """Verify the applied epoch against the source; returns the figures (also written to
    ``verify.json``), raises EpochError on any difference."""
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
