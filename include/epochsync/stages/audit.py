"""Audit: a committed epoch of a target compared in full with the source's state at that epoch;
the ``audit`` verb.

Verify checks what an epoch's records name; the audit checks everything the target holds, so
a change made behind epochsync's back (a byte, a mode, an xattr, a removed or a stray file) is
seen. The source's state at E is:

- for an object-store source (sim, jsonl), the committed namespace snapshot at E in the
  warehouse with its pinned source object versions;
- for a Gluster source, the cut of E itself (:func:`gluster_expected_at`): every gfid the cut's
  bricks hold, read as the cut reads them (through the agents when they took it; a replicated
  volume through each set's reader), so the audit does not trust what the cut published. The
  gfids that cut held back (a directory operation it split between bricks, a rename caught
  half-way: they keep their published state until the next cut) are left out and counted.

Metadata only by default (paths, types, sizes, modes, owners, file mtimes, symlink targets,
xattrs and hard links: the paths of one file are one inode on a posix replica, and on an s3
replica every key names, in its metadata, the file the source has there), the bytes too with
``deep`` (each file read from the target and from its source versions at E, or the cut).

The walk is one stream per side: the target's ``walk(hashes=False)`` (``os.lstat`` per entry on
posix, listings and HEADs on s3) against one dict built from one Spark read of the snapshot (or
one walk of the cut and a look-up per gfid), so the cost is a stat per path, never a process
per file.

The audit holds the target's lease (:mod:`epochsync.journal.lease`) for its whole walk, and
refuses a target with an epoch applied but not committed (a run in flight between its apply and
its commit, or one that failed before its rollback): it would compare an epoch half applied
with the committed one and report the run's own writes as differences. Both refusals are
:class:`~epochsync.core.errors.BusyError` (exit status 6): try again after the run. The audit
DAG (``epochsync_audit__<target>``, ``targets[].audit``) runs it on a schedule in the target's
pool, retried while the target is busy.

With ``repair`` it then puts what differs right, as an epoch of its own: fenced, journaled,
verified, undone on a failure (:mod:`epochsync.stages.repair`).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

from epochsync.core.argtypes import epoch_number
from epochsync.core.config import Config, TargetConfig
from epochsync.core.errors import BusyError, EpochError
from epochsync.core.model import SNAPSHOT_FIELDS
from epochsync.journal.lease import target_lease
from epochsync.stages.context import _config, _store_dict, _target_cfg, committed_epoch, unfinished_epochs
from epochsync.targets import open_target
from epochsync.warehouse.paths import Warehouse


@dataclass(frozen=True)
class Difference:
    """One way the target differs from the source at E (``what``: missing, stray, type, size,
    mode, owner, mtime, symlink, xattrs, bytes)."""

    path: str
    what: str
    detail: str

    def __str__(self) -> str:
        return f"{self.path}: {self.what}: {self.detail}"


def expected_at(cfg: Config, tcfg: TargetConfig, epoch: int, spark, *, deep: bool) -> dict[str, dict]:
    """path -> attributes of every path the target should hold at ``epoch``; with ``deep`` a file's
    entry also has ``source``: where its bytes live at E (pinned object versions)."""
    from epochsync.stages.translate.entries import attrs_of, source_objects
    from epochsync.warehouse.snapshots import read_snapshot, resolve_links, visible

    src = cfg.source_of(tcfg)
    snap = read_snapshot(spark, Warehouse(cfg.warehouse), tcfg.name, epoch, src.root_fid)
    links = visible(resolve_links(snap, src.root_fid), tcfg.fileset).select("fid", "path")
    store = _store_dict(cfg, tcfg) if deep else None
    out = {}
    for r in links.join(snap, "fid").collect():
        row = r.asDict(recursive=True)
        attrs = attrs_of(r["fid"], row)
        if store is not None and attrs["type"] == "file":
            attrs["source"] = source_objects(r["fid"], row, store)
        attrs["row"] = {k: row.get(k) for k in SNAPSHOT_FIELDS}  # what a repair writes
        out[r["path"]] = attrs
    return out


def gluster_expected_at(cfg: Config, tcfg: TargetConfig, epoch: int, *, deep: bool) -> tuple[dict[str, dict], set[str]]:
    """For a Gluster source: path -> attributes of every path of the cut of ``epoch`` inside the
    target's fileset (the :func:`expected_at` shape), and the paths the cut held back (see the
    module docstring: a difference there, or under one, is not the target's).

    The cut is read as the cut stage reads it: each server's brick (a set's reader) at its
    snapshot, here or through its agent; every gfid a brick holds, looked up where it is. With
    ``deep`` a file's ``source`` is its gfid in the cut (the reader of
    :func:`epochsync.stages.context.source_access` of that epoch)."""
    from epochsync.core.gluster import INTERNAL_GFIDS, ROOT_GFID
    from epochsync.sources.gluster.reader import data_bricks
    from epochsync.sources.gluster.resolve import SHARD_DIRS, Resolver
    from epochsync.stages.cut import _side, mechanism, read_cut
    from epochsync.stages.translate.entries import in_fileset
    from epochsync.warehouse.snapshots import directory_paths

    src = cfg.source_of(tcfg)
    rec = read_cut(cfg, src.name, epoch)
    if rec is None or not rec.get("resolved"):
        raise EpochError(
            f"source {src.name} has no published cut {epoch}: the audit compares target {tcfg.name} with it"
        )
    mech = mechanism(src)
    readers = data_bricks(rec)
    views = [_side(mech, readers[b], rec["bricks"][readers[b]], name=b) for b in src.servers]
    gone = [v.name for v in views if not v.exists()]
    if gone:
        raise EpochError(
            f"the cut of epoch {epoch} of source {src.name} was purged (no snapshot of {', '.join(gone)}): a target is "
            "audited against the cut of its committed epoch, and the purge keeps only the latest cut once every "
            f"target committed it; audit target {tcfg.name} after its next epoch commits"
        )
    where: dict[str, str] = {}  # gfid -> the brick its walk found it on (a directory: the first)
    for v in views:
        for g in v.gfids():
            where.setdefault(g, v.name)
    where[ROOT_GFID] = views[0].name
    gfids = sorted(g for g in where if g not in INTERNAL_GFIDS or g == ROOT_GFID)
    resolver = Resolver(None, views, None, epoch, int(rec["time_ns"]))  # type: ignore[arg-type]
    nodes = {}
    split: set[str] = set()
    first_asked: dict = {g: _Where(b) for g, b in where.items()}  # what look_all reads of a Known
    for g, a in zip(gfids, resolver.look_all(gfids, first_asked)):
        if a.node is None:
            if a.split:
                split.add(g)
            continue
        if a.node.type != "dir" and a.node.names and all(p in SHARD_DIRS for p, _ in a.node.names):
            continue  # a block of a sharded file: its base file is the file
        nodes[g] = a.node
    dirs = directory_paths(
        [(g, p, n) for g, node in nodes.items() if node.type == "dir" for p, n in node.names], ROOT_GFID
    )
    held_gfids = set(rec.get("held") or ()) | split
    out: dict[str, dict] = {}
    held: set[str] = set()
    for g, node in nodes.items():
        for p, n in node.names:
            parent = dirs.get(p)
            if parent is None:
                continue
            path = n if parent == "" else f"{parent}/{n}"
            if not in_fileset(path, tcfg.fileset):
                continue
            if g in held_gfids:
                held.add(path)
                continue
            attrs = {
                "fid": g,
                "type": node.type,
                "mode": node.mode,
                "uid": node.uid,
                "gid": node.gid,
                "mtime_ns": node.mtime_ns,
                "size": node.size if node.type == "file" else 0,
                "symlink": node.symlink,
                "xattrs": {k: v.hex() for k, v in node.xattrs.items()},
            }
            if deep and node.type == "file":
                attrs["source"] = {"layout": None, "objects": [{"key": g, "version": epoch}]}
            attrs["row"] = _node_row(node, epoch)  # what a repair writes: the cut's, its bytes read from it
            out[path] = attrs
    held |= _published_paths(cfg, tcfg, epoch, held_gfids)
    return out, held


def _node_row(node, epoch: int) -> dict:
    """A snapshot-shaped row of a gfid as the cut holds it (its bytes pinned to that cut)."""
    return {
        "fid": node.gfid,
        "type": node.type,
        "mode": node.mode,
        "uid": node.uid,
        "gid": node.gid,
        "atime_ns": node.atime_ns,
        "mtime_ns": node.mtime_ns,
        "ctime_ns": node.ctime_ns,
        "size": node.size if node.type == "file" else 0,
        "symlink": node.symlink,
        "layout": None,
        "objects": [{"ost": None, "oid": node.gfid, "version": str(epoch), "size": node.size}]
        if node.type == "file"
        else [],
        "xattrs": [{"name": k, "value": v} for k, v in sorted(node.xattrs.items())],
        "links": [{"pfid": p, "name": n} for p, n in node.names],
    }


class _Where:
    """What :meth:`Resolver.look_all` reads of a gfid it knows: the brick to ask first."""

    def __init__(self, brick: str):
        self.brick = brick


def _published_paths(cfg: Config, tcfg: TargetConfig, epoch: int, fids: set[str]) -> set[str]:
    """The paths ``fids`` have in the target's snapshot of ``epoch`` (where a held-back gfid still is)."""
    if not fids:
        return set()
    from epochsync.warehouse.snapshot_files import snapshot_view
    from epochsync.warehouse.snapshots import directory_paths, snapshot_files

    src = cfg.source_of(tcfg)
    view = snapshot_view(snapshot_files(Warehouse(cfg.warehouse), tcfg.name, epoch, src.root_fid), src.root_fid)
    dirs = directory_paths(
        [(r["fid"], lk["pfid"], lk["name"]) for r in view.directories().to_pylist() for lk in r["links"] or []],
        src.root_fid,
    )
    out = set()
    for r in view.rows(fids).to_pylist():
        for lk in r["links"] or []:
            parent = dirs.get(lk["pfid"])
            if parent is not None:
                out.add(lk["name"] if parent == "" else f"{parent}/{lk['name']}")
    return out


def _under(path: str, held: set[str] | frozenset[str]) -> bool:
    """Is ``path`` one of ``held`` or below one?"""
    if not held:
        return False
    parts = path.split("/")
    return any("/".join(parts[:i]) in held for i in range(1, len(parts) + 1))


def compare(
    target,
    expected: dict[str, dict],
    *,
    owners: bool,
    posix: bool,
    held: set[str] | frozenset[str] = frozenset(),
    observed: dict | None = None,
) -> list[Difference]:
    """The metadata differences between what ``target`` holds and ``expected`` (no bytes read);
    nothing at or under a path of ``held`` (what the source's state at E held back) is compared.
    ``observed``, when given, gets every entry the walk found, by path (what a repair starts from)."""
    from epochsync.stages.verify import XATTR_NAMESPACE

    diffs: list[Difference] = []
    seen = set()
    inodes: dict[str, dict[int, list[str]]] = {}  # fid -> inode -> its paths (posix files)
    for e in target.walk(hashes=False):
        seen.add(e.path)
        if observed is not None:
            observed[e.path] = e
        if _under(e.path, held):
            continue
        want = expected.get(e.path)
        if want is None:
            diffs.append(Difference(e.path, "stray", f"a {e.type} the source does not hold at this epoch"))
            continue
        if e.type != want["type"]:
            diffs.append(Difference(e.path, "type", f"is a {e.type}, the source has a {want['type']}"))
            continue
        if e.type == "file" and e.size != int(want.get("size") or 0):
            diffs.append(Difference(e.path, "size", f"{e.size} bytes, the source has {want.get('size')}"))
        if e.type != "symlink" and want.get("mode") is not None and e.mode != int(want["mode"]) & 0o7777:
            diffs.append(
                Difference(e.path, "mode", f"{oct(e.mode or 0)}, the source has {oct(int(want['mode']) & 0o7777)}")
            )
        if owners and want.get("uid") is not None and (e.uid, e.gid) != (want["uid"], want["gid"]):
            diffs.append(Difference(e.path, "owner", f"{e.uid}:{e.gid}, the source has {want['uid']}:{want['gid']}"))
        if e.type in ("file", "dir") and posix and want.get("mtime_ns") is not None and e.mtime_ns is not None:
            if e.mtime_ns != int(want["mtime_ns"]):
                diffs.append(Difference(e.path, "mtime", f"{e.mtime_ns} ns, the source has {want['mtime_ns']}"))
        if e.type == "symlink" and e.symlink != want.get("symlink"):
            diffs.append(Difference(e.path, "symlink", f"-> {e.symlink!r}, the source has {want.get('symlink')!r}"))
        if e.type != "symlink":
            wx = {k: bytes.fromhex(v) for k, v in (want.get("xattrs") or {}).items()}
            if posix:
                wx = {k: v for k, v in wx.items() if k.startswith(XATTR_NAMESPACE)}
            if e.xattrs != wx:
                names = sorted(k for k in wx.keys() | e.xattrs.keys() if wx.get(k) != e.xattrs.get(k))
                diffs.append(Difference(e.path, "xattrs", "differ from the source: " + ", ".join(names)))
        if e.type == "file":
            diffs += _identity(e, want, posix, inodes)
    for p in sorted(expected.keys() - seen):
        if not _under(p, held):
            diffs.append(Difference(p, "missing", f"the source has a {expected[p]['type']}"))
    diffs += _links_apart(inodes, expected)
    return diffs


def _identity(e, want: dict, posix: bool, inodes: dict[str, dict[int, list[str]]]) -> list[Difference]:
    """Hard links, per path: on s3 the key's metadata names the file the source has there; on posix
    the path's inode is noted under the source's file (:func:`_links_apart` compares them)."""
    fid = want.get("fid")
    if not fid:
        return []
    if posix:
        if e.ino is not None:
            inodes.setdefault(fid, {}).setdefault(e.ino, []).append(e.path)
        return []
    if e.fid is not None and e.fid != fid:
        return [Difference(e.path, "links", f"holds file {e.fid}, the source has file {fid} at this path")]
    return []


def _links_apart(inodes: dict[str, dict[int, list[str]]], expected: dict[str, dict]) -> list[Difference]:
    """Posix: the paths of one source file on more than one inode, or one inode shared by the paths
    of two source files."""
    diffs = []
    owner: dict[int, str] = {}
    for fid, by_ino in sorted(inodes.items()):
        if len(by_ino) > 1:
            groups = sorted(sorted(ps) for ps in by_ino.values())
            for ps in groups[1:]:
                diffs.append(
                    Difference(
                        ps[0], "links", f"is not a hard link of {groups[0][0]!r}: the source has one file at both paths"
                    )
                )
        for ino, ps in by_ino.items():
            other = owner.setdefault(ino, fid)
            if other != fid:
                diffs.append(
                    Difference(
                        sorted(ps)[0],
                        "links",
                        f"is a hard link of {sorted(inodes[other][ino])[0]!r}, which the source has as another file",
                    )
                )
    return diffs


def compare_bytes(target, expected: dict[str, dict], skip: set[str], source_io, bucket: str) -> list[Difference]:
    """The files whose bytes differ from their source versions at E (each read whole on both sides)."""
    from epochsync.stages.verify import _first_difference, source_bytes

    diffs = []
    for path in sorted(expected):
        want = expected[path]
        if want["type"] != "file" or path in skip:
            continue
        size = int(want.get("size") or 0)
        data = target.read_file(path)
        wanted = source_bytes(want["source"], size, source_io, bucket)
        if data != wanted:
            diffs.append(Difference(path, "bytes", _first_difference(data, wanted)))
    return diffs


def audit_target(
    cfg, target, epoch: int | None = None, *, deep: bool = False, spark=None, repair: bool = False, inject=None
) -> dict:
    """Compare ``target``'s committed epoch with the source at that epoch; returns ``{"target",
    "epoch", "deep", "paths", "held", "differences": [Difference], "seconds"}``, and with
    ``repair`` also ``"repair"``: what :func:`epochsync.stages.repair.repair_differences` did
    (the differences stay the ones found before it). Raises :class:`EpochError` when ``epoch``
    is not the committed one (a target holds only its committed epoch)."""
    cfg = _config(cfg)
    tcfg = _target_cfg(cfg, target)
    committed = committed_epoch(cfg, tcfg)
    if epoch is None:
        epoch = committed
    if committed == 0:
        raise EpochError(f"target {tcfg.name} has no committed epoch: nothing to audit")
    if epoch != committed:
        raise EpochError(
            f"target {tcfg.name} holds epoch {committed}, not {epoch}: a target can be audited only at its "
            f"committed epoch (run 'epochsync audit --config {cfg.file} --target {tcfg.name}' without --epoch)"
        )
    if repair and tcfg.kind == "feed":
        raise EpochError(f"target {tcfg.name} is a feed: there is no replica to repair")
    t0 = time.monotonic()
    # no writer while the target is walked; and none half way (see the module docstring)
    with target_lease(cfg, tcfg):
        from epochsync.journal.undo import unfinished_repair
        from epochsync.stages.repair import repair_differences
        from epochsync.stages.rollback import roll_back_repair

        in_flight = unfinished_epochs(cfg, tcfg, committed)
        if in_flight or committed_epoch(cfg, tcfg) != committed:
            raise BusyError(
                f"target {tcfg.name} has epoch {in_flight[-1] if in_flight else committed + 1} applied but not "
                "committed (a run between its apply and its commit, or one that failed before its rollback): the "
                "audit would count that run's writes as differences; audit after its commit, or after "
                f"'epochsync rollback --config {cfg.file} --target {tcfg.name}'"
            )
        if unfinished_repair(cfg.warehouse, tcfg.name):
            if not repair:
                raise BusyError(
                    f"target {tcfg.name} has a repair that did not finish: its writes would count as differences; "
                    f"'epochsync rollback --config {cfg.file} --target {tcfg.name}' undoes it, 'epochsync audit "
                    f"--config {cfg.file} --target {tcfg.name} --repair' undoes it and repairs again"
                )
            roll_back_repair(cfg, tcfg, reason="a repair that did not finish, undone before a new one")
        since = open_target(tcfg).now_ns() if repair else None  # the repair's fence instant: before the walk
        result, expected, observed = _audit(cfg, tcfg, epoch, spark, deep=deep, t0=t0)
        if repair:
            result["repair"] = repair_differences(
                cfg,
                tcfg,
                epoch,
                result["differences"],
                expected,
                observed,
                since_ns=since,
                inject=inject,
            )
            if result["differences"]:
                after, _, _ = _audit(cfg, tcfg, epoch, spark, deep=deep, t0=time.monotonic())
            result["repair"]["after"] = after["differences"] if result["differences"] else []  # must be none
            result["seconds"] = round(time.monotonic() - t0, 3)
        return result


def _audit(cfg: Config, tcfg: TargetConfig, epoch: int, spark, *, deep: bool, t0: float) -> tuple[dict, dict, dict]:
    """The audit's result, and what it compared: the expected paths and the entries the walk found."""
    held: set[str] = set()
    if cfg.source_of(tcfg).kind == "gluster":
        expected, held = gluster_expected_at(cfg, tcfg, epoch, deep=deep)
    else:
        if spark is None:
            from epochsync.spark import spark_session

            spark = spark_session(f"epochsync-audit-{tcfg.name}-{epoch}", cfg=cfg)
        expected = expected_at(cfg, tcfg, epoch, spark, deep=deep)
    tgt = open_target(tcfg)
    posix = tgt.kind == "posix"
    owners = not posix or getattr(tgt, "as_root", False)
    observed: dict = {}
    diffs = compare(tgt, expected, owners=owners, posix=posix, held=held, observed=observed)
    if deep:
        from epochsync.stages.context import source_access

        source_io, bucket = source_access(cfg, tcfg, epoch)
        # a file already found missing, stray, of another type or size is not read again
        skip = {d.path for d in diffs if d.what in ("missing", "stray", "type", "size")}
        diffs += compare_bytes(tgt, expected, skip, source_io, bucket)
    diffs.sort(key=lambda d: (d.path, d.what))
    result = {
        "target": tcfg.name,
        "epoch": epoch,
        "deep": deep,
        "paths": len(expected),
        "held": len(held),
        "differences": diffs,
        "seconds": round(time.monotonic() - t0, 3),
    }
    return result, expected, observed


def configure_audit(parser) -> None:
    """Add the ``audit`` verb's options to ``parser``."""
    parser.add_argument("--config", required=True, metavar="FILE", help="epochsync YAML config")
    parser.add_argument("--target", required=True, metavar="NAME", help="target to audit")
    parser.add_argument(
        "--epoch", type=epoch_number, metavar="E", help="epoch to audit (default and only choice: the committed one)"
    )
    parser.add_argument("--deep", action="store_true", help="compare every file's bytes too (reads the whole replica)")
    parser.add_argument(
        "--repair",
        action="store_true",
        help="put what differs right, as an epoch of its own (fenced, journaled, verified; undone on a failure)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as one JSON document")


def run_audit(args) -> int:
    """CLI: prints one line per difference and a summary; exit 0 when clean (or repaired clean), 1
    when anything differs (or still differs after the repair)."""
    r = audit_target(args.config, args.target, args.epoch, deep=args.deep, repair=args.repair)
    diffs = r["differences"]
    fixed = r.get("repair")
    left = fixed["after"] if fixed is not None else diffs
    if args.json:
        doc = {**r, "differences": [asdict(d) for d in diffs]}
        if fixed is not None:
            doc["repair"] = {**fixed, "after": [asdict(d) for d in fixed["after"]]}
        print(json.dumps(doc, sort_keys=True, default=str))
    else:
        for d in diffs:
            print(d)
        what = "metadata and bytes" if r["deep"] else "metadata"
        held = f", {r['held']} held back by the cut until the next one" if r.get("held") else ""
        print(
            f"audit of target {r['target']} at epoch {r['epoch']} ({what}, {r['paths']} paths{held}, {r['seconds']} s): "
            + (f"{len(diffs)} differences" if diffs else "clean")
        )
        if fixed is not None and fixed["paths"]:
            how = ", ".join(f"{n} {h}" for h, n in fixed["how"].items() if n)
            for d in fixed["after"]:
                print(f"after the repair: {d}")
            print(
                f"repair of target {r['target']} at epoch {r['epoch']}: {fixed['paths']} paths ({how}), "
                f"{fixed['bytes_pulled']} bytes pulled from the source, {fixed['seconds']} s: "
                + (f"{len(fixed['after'])} differences left" if fixed["after"] else "clean")
            )
    return 1 if left else 0
