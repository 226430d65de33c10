"""Audit: a committed epoch of a target compared in full with the source's state at that epoch;
the ``audit`` verb.

Verify checks what an epoch's records name; the audit checks everything the target holds, so
a change made behind epochsync's back (a byte, a mode, an xattr, a removed or a stray file) is
seen. The source's state at E is, for an object-store source (sim, jsonl), the committed
namespace snapshot at E in the warehouse with its pinned source object versions; metadata only
by default (paths, types, sizes, modes, owners, file mtimes, symlink targets, xattrs), the bytes
too with ``deep`` (each file read from the target and from its source versions at E).

The walk is one stream per side: the target's ``walk(hashes=False)`` (``os.lstat`` per entry on
posix, listings and HEADs on s3) against one dict built from one Spark read of the snapshot, so
the cost is a stat per path, never a process per file.

The audit holds the target's lease (:mod:`epochsync.journal.lease`) for its whole walk, and
refuses a target with an epoch applied but not committed (a run in flight between its apply and
its commit, or one that failed before its rollback): it would compare an epoch half applied
with the committed one and report the run's own writes as differences. Both refusals are
:class:`~epochsync.core.errors.BusyError` (exit status 6): try again after the run. The audit
DAG (``epochsync_audit__<target>``, ``targets[].audit``) runs it on a schedule in the target's
pool, retried while the target is busy.

Not done yet (issue 50 deliverable 9): repair as an epoch of its own, the walker of a Gluster
cut (for a Gluster source the snapshot is the replica's own record of the cut, not the cut
itself) and hard-link identity.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

from epochsync.core.argtypes import epoch_number
from epochsync.core.config import Config, TargetConfig
from epochsync.core.errors import BusyError, EpochError
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
    from epochsync.stages.translate import attrs_of, source_objects
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
        out[r["path"]] = attrs
    return out


def compare(target, expected: dict[str, dict], *, owners: bool, posix: bool) -> list[Difference]:
    """The metadata differences between what ``target`` holds and ``expected`` (no bytes read)."""
    from epochsync.stages.verify import XATTR_NAMESPACE

    diffs: list[Difference] = []
    seen = set()
    for e in target.walk(hashes=False):
        seen.add(e.path)
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
        if e.type == "file" and posix and want.get("mtime_ns") is not None and e.mtime_ns is not None:
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
    for p in sorted(expected.keys() - seen):
        diffs.append(Difference(p, "missing", f"the source has a {expected[p]['type']}"))
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


def audit_target(cfg, target, epoch: int | None = None, *, deep: bool = False, spark=None) -> dict:
    """Compare ``target``'s committed epoch with the source at that epoch; returns ``{"target",
    "epoch", "deep", "paths", "differences": [Difference], "seconds"}``. Raises :class:`EpochError`
    when ``epoch`` is not the committed one (a target holds only its committed epoch)."""
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
    if cfg.source_of(tcfg).kind == "gluster":
        raise EpochError(
            f"source {tcfg.source} is a Gluster volume: auditing against its cut is not implemented yet "
            "(issue 50 deliverable 9)"
        )
    t0 = time.monotonic()
    if spark is None:
        from epochsync.spark import spark_session

        spark = spark_session(f"epochsync-audit-{tcfg.name}-{epoch}", cfg=cfg)
    # no writer while the target is walked; and none half way (see the module docstring)
    with target_lease(cfg, tcfg):
        in_flight = unfinished_epochs(cfg, tcfg, committed)
        if in_flight or committed_epoch(cfg, tcfg) != committed:
            raise BusyError(
                f"target {tcfg.name} has epoch {in_flight[-1] if in_flight else committed + 1} applied but not "
                "committed (a run between its apply and its commit, or one that failed before its rollback): the "
                "audit would count that run's writes as differences; audit after its commit, or after "
                f"'epochsync rollback --config {cfg.file} --target {tcfg.name}'"
            )
        return _audit(cfg, tcfg, epoch, spark, deep=deep, t0=t0)


def _audit(cfg: Config, tcfg: TargetConfig, epoch: int, spark, *, deep: bool, t0: float) -> dict:
    expected = expected_at(cfg, tcfg, epoch, spark, deep=deep)
    tgt = open_target(tcfg)
    posix = tgt.kind == "posix"
    owners = not posix or getattr(tgt, "as_root", False)
    diffs = compare(tgt, expected, owners=owners, posix=posix)
    if deep:
        from epochsync.stages.context import source_access

        source_io, bucket = source_access(cfg, tcfg, epoch)
        # a file already found missing, stray, of another type or size is not read again
        skip = {d.path for d in diffs if d.what in ("missing", "stray", "type", "size")}
        diffs += compare_bytes(tgt, expected, skip, source_io, bucket)
    diffs.sort(key=lambda d: (d.path, d.what))
    return {
        "target": tcfg.name,
        "epoch": epoch,
        "deep": deep,
        "paths": len(expected),
        "differences": diffs,
        "seconds": round(time.monotonic() - t0, 3),
    }


def configure_audit(parser) -> None:
    """Add the ``audit`` verb's options to ``parser``."""
    parser.add_argument("--config", required=True, metavar="FILE", help="epochsync YAML config")
    parser.add_argument("--target", required=True, metavar="NAME", help="target to audit")
    parser.add_argument(
        "--epoch", type=epoch_number, metavar="E", help="epoch to audit (default and only choice: the committed one)"
    )
    parser.add_argument("--deep", action="store_true", help="compare every file's bytes too (reads the whole replica)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON document")


def run_audit(args) -> int:
    """CLI: prints one line per difference and a summary; exit 0 when clean, 1 when anything differs."""
    r = audit_target(args.config, args.target, args.epoch, deep=args.deep)
    diffs = r["differences"]
    if args.json:
        print(json.dumps({**r, "differences": [asdict(d) for d in diffs]}, sort_keys=True))
    else:
        for d in diffs:
            print(d)
        what = "metadata and bytes" if r["deep"] else "metadata"
        print(
            f"audit of target {r['target']} at epoch {r['epoch']} ({what}, {r['paths']} paths, {r['seconds']} s): "
            + (f"{len(diffs)} differences" if diffs else "clean")
        )
    return 1 if diffs else 0
