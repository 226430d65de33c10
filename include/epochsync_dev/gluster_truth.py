"""Ground truth of a Gluster cut, and replicas compared with it (tests, ``make demo SOURCE=gluster``).

Written apart from the source's resolver on purpose: it walks each brick snapshot's directory
tree (not the gfid handles, not the changelogs), merges the bricks as a client sees them
(directories on every brick, a file's data on the one brick that is not a DHT linkto, a
sharded file's blocks joined), and reads every file whole. :func:`mount_truth` reads a FUSE
mount the same way, so a quiet volume's cut can be checked against what clients see.

Rows are the simulator's ground-truth rows (:mod:`epochsync_dev.truth`: path, type, size,
sha256, mode, uid, gid, symlink, xattrs) plus ``mtime_ns`` and ``fid`` (the gfid), so
:func:`compare` checks bytes, modes, owners, xattrs, symlink targets, mtimes and hard links.
"""

from __future__ import annotations

import base64
import hashlib
import os
import stat as st
import struct

from epochsync.core.gluster import is_internal_root_name

_MDATA = struct.Struct(">BQQQQQQQ")


def _x(path: str, name: str, follow: bool = False) -> bytes | None:
    try:
        return os.getxattr(path, name, follow_symlinks=follow)
    except OSError:
        return None


def _gfid(path: str) -> str | None:
    raw = _x(path, "trusted.gfid")
    if raw is None or len(raw) != 16:
        return None
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _user_xattrs(path: str, follow: bool = False) -> dict[str, str]:
    try:
        names = os.listxattr(path, follow_symlinks=follow)
    except OSError:
        return {}
    out = {}
    for n in names:
        if n.startswith("user."):
            v = _x(path, n, follow)
            if v is not None:
                out[n] = base64.b64encode(v).decode()
    return out


def _mtime(path: str, s: os.stat_result, follow: bool = False) -> int:
    md = _x(path, "trusted.glusterfs.mdata", follow)
    if md is not None and len(md) >= _MDATA.size and md[0] == 1:
        _v, _f, _cs, _cn, ms, mn, _as, _an = _MDATA.unpack_from(md)
        return ms * 10**9 + mn
    return s.st_mtime_ns


def _is_linkto(path: str, s: os.stat_result) -> bool:
    return (
        st.S_ISREG(s.st_mode)
        and (s.st_mode & 0o7777) == st.S_ISVTX
        and s.st_size == 0
        and _x(path, "trusted.glusterfs.dht.linkto") is not None
    )


def _sha_of_sharded(roots: list[str], base_path: str, gfid: str, size: int, block: int) -> str:
    h = hashlib.sha256()
    left = size
    index = 0
    while left > 0:
        n = min(block, left)
        path = base_path
        if index:
            path = None
            for r in roots:
                p = os.path.join(r, ".shard", f"{gfid}.{index}")
                try:
                    ps = os.lstat(p)
                except OSError:
                    continue
                if not _is_linkto(p, ps):
                    path = p
                    break
        data = b""
        if path:
            with open(path, "rb") as f:
                data = f.read(n)
        h.update(data + bytes(n - len(data)))
        left -= n
        index += 1
    return h.hexdigest()


def _sha(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _walk(root: str):
    """Every entry below ``root`` but the volume's internal ones: ``(path, absolute path, lstat)``,
    each directory's entries in name order, a directory before its entries."""
    stack = [""]
    while stack:
        rel = stack.pop()
        base = os.path.join(root, rel) if rel else root
        for name in sorted(os.listdir(base)):
            if not rel and is_internal_root_name(name):
                continue
            p = f"{rel}/{name}" if rel else name
            s = os.lstat(os.path.join(base, name))
            yield p, os.path.join(base, name), s
            if st.S_ISDIR(s.st_mode):
                stack.append(p)


def cut_truth(roots: list[str]) -> dict[str, dict]:
    """The volume as the brick directories ``roots`` (of one cut) hold it, keyed by path."""
    dirs: dict[str, list[dict]] = {}
    files: dict[str, dict] = {}
    for root in roots:
        for p, path, s in _walk(root):
            if st.S_ISDIR(s.st_mode):
                dirs.setdefault(p, []).append(
                    {
                        "path": p,
                        "type": "dir",
                        "mode": s.st_mode,
                        "uid": s.st_uid,
                        "gid": s.st_gid,
                        "xattrs": _user_xattrs(path),
                        "mtime_ns": _mtime(path, s),
                        "fid": _gfid(path),
                    }
                )
                continue
            if _is_linkto(path, s):
                continue
            row = {
                "path": p,
                "mode": s.st_mode,
                "uid": s.st_uid,
                "gid": s.st_gid,
                "mtime_ns": _mtime(path, s),
                "fid": _gfid(path),
                "xattrs": {},
            }
            if st.S_ISLNK(s.st_mode):
                row.update(type="symlink", symlink=os.readlink(path))
            elif st.S_ISREG(s.st_mode):
                row.update(type="file", xattrs=_user_xattrs(path))
                block = _x(path, "trusted.glusterfs.shard.block-size")
                if block:
                    size = int.from_bytes((_x(path, "trusted.glusterfs.shard.file-size") or bytes(8))[:8], "big")
                    row.update(
                        size=size,
                        sha256=_sha_of_sharded(roots, path, row["fid"], size, int.from_bytes(block[:8], "big")),
                    )
                else:
                    row.update(size=s.st_size, sha256=_sha(path))
            else:
                row.update(type="other", xattrs=_user_xattrs(path))
            files[p] = row
    out = dict(files)
    for p, copies in dirs.items():
        newest = max(copies, key=lambda c: c["mtime_ns"])
        out[p] = dict(newest, mtime_ns=max(c["mtime_ns"] for c in copies))
    return out


def mount_truth(mount: str) -> dict[str, dict]:
    """The volume as a FUSE client at ``mount`` sees it, keyed by path (fid: the gfid a client reads)."""
    out = {}
    for p, path, s in _walk(mount):
        row = {"path": p, "mode": s.st_mode, "uid": s.st_uid, "gid": s.st_gid, "mtime_ns": s.st_mtime_ns, "xattrs": {}}
        gfid = _x(path, "glusterfs.gfid.string")
        row["fid"] = gfid.decode().strip("\0") if gfid else None
        if st.S_ISDIR(s.st_mode):
            row.update(type="dir", xattrs=_user_xattrs(path))
        elif st.S_ISLNK(s.st_mode):
            row.update(type="symlink", symlink=os.readlink(path))
        elif st.S_ISREG(s.st_mode):
            row.update(type="file", size=s.st_size, sha256=_sha(path), xattrs=_user_xattrs(path))
        else:
            row.update(type="other", xattrs=_user_xattrs(path))
        out[p] = row
    return out


def compare(
    target,
    truth: dict[str, dict],
    *,
    times: bool = True,
    links: bool = True,
    contents: set[str] | None = None,
    limit: int = 20,
) -> list[str]:
    """Differences between a replica (:class:`epochsync.targets.base.Target`) and ``truth``: what
    :func:`epochsync_dev.truth.compare_with_truth` checks, plus mtimes (files, directories) and hard
    links (paths of one fid are one file on the replica). Empty: equal.

    ``contents``: read back only these files' bytes (every other path is compared on everything
    but its bytes); None: every file's."""
    from epochsync_dev.truth import compare_with_truth

    if contents is None:
        problems = compare_with_truth(target, truth, limit=0)
        entries = {e.path: e for e in target.walk(hashes=False)}
    else:
        unhashed = {p: dict(row, sha256=None) if row["type"] == "file" else row for p, row in truth.items()}
        problems = compare_with_truth(_Unhashed(target), unhashed, limit=0)
        entries = {e.path: e for e in target.walk(hashes=False)}
        for p in sorted(contents):
            row = truth.get(p)
            if row is None or row["type"] != "file" or p not in entries:
                continue
            got = hashlib.sha256(target.read_file(p)).hexdigest()
            if got != row["sha256"]:
                problems.append(f"{p}: sha256 is {got!r}, source has {row['sha256']!r}")
    if times:
        for p, row in sorted(truth.items()):
            e = entries.get(p)
            if e is None or row["type"] == "symlink" or e.mtime_ns is None:
                continue
            if e.mtime_ns != row["mtime_ns"]:
                problems.append(f"{p}: mtime is {e.mtime_ns}, source has {row['mtime_ns']}")
    if links:
        by_fid: dict[str, list[str]] = {}
        for p, row in truth.items():
            if row["type"] in ("file", "other") and row.get("fid"):
                by_fid.setdefault(row["fid"], []).append(p)
        if getattr(target, "kind", None) == "posix":
            same = posix_same_file(target.root)
        else:

            def same(a: str, b: str) -> bool:
                return entries[a].fid is not None and entries[a].fid == entries[b].fid

        for fid, paths in sorted(by_fid.items()):
            if len(paths) < 2:
                continue
            first = sorted(paths)[0]
            for p in sorted(paths)[1:]:
                if p in entries and first in entries and not same(first, p):
                    problems.append(f"{p}: not a hard link of {first} (one file at the source, fid {fid})")
    return problems[:limit] if limit else problems


class _Unhashed:
    """A target whose walk reads no file's bytes (the caller reads back the ones it must)."""

    def __init__(self, target):
        self.target = target

    def walk(self, *, hashes: bool = True):
        return self.target.walk(hashes=False)


def changed_files(before: dict[str, dict], after: dict[str, dict]) -> set[str]:
    """The paths of ``after``'s files whose bytes are new: a file (a fid) that was not in ``before``
    or held other bytes there, wherever it was (a file only moved keeps its bytes)."""
    was = {row.get("fid"): row.get("sha256") for row in before.values() if row["type"] == "file"}
    return {
        p
        for p, row in after.items()
        if row["type"] == "file" and (row.get("fid") not in was or was[row.get("fid")] != row["sha256"])
    }


def posix_same_file(root: str):
    """``same_file(a, b)`` for a posix replica at ``root``: are the two paths one inode?"""

    def same(a: str, b: str) -> bool:
        sa, sb = os.lstat(os.path.join(root, a)), os.lstat(os.path.join(root, b))
        return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)

    return same
