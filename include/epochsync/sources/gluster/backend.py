"""What a brick (live, or a read-only snapshot of it) says about a gfid: Gluster's backend layout.

Every file of a brick is reachable by gfid at ``.glusterfs/<g0g1>/<g2g3>/<gfid>``: a hard link
for files and symlinks, a symlink ``../../<p0p1>/<p2p3>/<pgfid>/<name>`` for directories (which
also gives the directory's parent and name; the root is ``00000000-...-0001``). What a client
of the volume sees, and so what a replica holds:

- names: a non-directory's names are its ``trusted.gfid2path.*`` xattrs (``<pgfid>/<name>``,
  one per hard link) on the brick that holds its data, each checked against the entry itself
  (a rename over one name of a file with several leaves that name's xattr behind); a
  directory's name is its handle's;
- DHT linkto files (mode ``---------T``, empty, xattr ``trusted.glusterfs.dht.linkto``) stand
  for a file whose name hashes to this brick while its data lives on another: never data;
- times: the ``trusted.glusterfs.mdata`` xattr (``features.ctime``, on by default: the times
  every client sees) when present, else the backend's; a directory's are the latest over the
  bricks (as DHT merges them);
- size: a sharded file's (``features.shard``) is its ``trusted.glusterfs.shard.file-size``;
  its blocks past the first are files ``.shard/<base gfid>.<N>`` on the bricks their names hash to;
- xattrs: the ``user.*`` namespace (Gluster keeps its own in ``trusted.*``).
"""

from __future__ import annotations

import errno
import os
import re
import stat as st
import struct
from dataclasses import dataclass, field

from epochsync.core.gluster import ANON_INODE_PREFIX, ROOT_GFID, is_internal_root_name
from epochsync.sources.gluster.btrfs import changed_ranges, drop_unchanged_fd, fiemap_fd

GFID_XATTR = "trusted.gfid"
LINKTO_XATTR = "trusted.glusterfs.dht.linkto"
MDATA_XATTR = "trusted.glusterfs.mdata"
GFID2PATH_PREFIX = "trusted.gfid2path."
SHARD_BLOCK_XATTR = "trusted.glusterfs.shard.block-size"
SHARD_SIZE_XATTR = "trusted.glusterfs.shard.file-size"
USER_PREFIX = "user."
LINKTO_MODE = st.S_IFREG | st.S_ISVTX
_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_HANDLE_TARGET = re.compile(rf"^\.\./\.\./[0-9a-f]{{2}}/[0-9a-f]{{2}}/({_UUID})/(.+)$")
_MDATA = struct.Struct(">BQQQQQQQ")


def gfid_text(raw: bytes) -> str:
    """The 16 bytes of a ``trusted.gfid`` xattr as the UUID text Gluster prints."""
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


@dataclass
class Node:
    """One gfid as one brick shows it."""

    gfid: str
    type: str  # file, dir, symlink, other
    mode: int
    uid: int
    gid: int
    size: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int
    names: list[tuple[str, str]] = field(default_factory=list)  # (pgfid, name)
    xattrs: dict[str, bytes] = field(default_factory=dict)
    symlink: str | None = None
    shard_block: int | None = None  # a sharded file's block size
    path: str = ""  # the brick path it was read from


class BrickView:
    """A brick's directory (live, or inside a snapshot), read by gfid."""

    def __init__(self, name: str, root: str):
        self.name = name
        self.root = root
        self._handles = os.path.join(root, ".glusterfs")
        self._internal: frozenset[str] | None = None

    def internal_dirs(self) -> frozenset[str]:
        """The gfids of AFR's anonymous-inode directories in the brick's root: they and every name in them
        are outside the volume's namespace (``.shard`` and ``.trashcan`` are known by their fixed gfids)."""
        if self._internal is None:
            found = set()
            try:
                with os.scandir(self.root) as it:
                    for e in it:
                        if e.name.startswith(ANON_INODE_PREFIX):
                            raw = _xattr(e.path, GFID_XATTR, follow=False)
                            if raw is not None and len(raw) == 16:
                                found.add(gfid_text(raw))
            except OSError:
                pass
            self._internal = frozenset(found)
        return self._internal

    def _public(self, names: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """``names`` without those in or of AFR's anonymous-inode directories."""
        internal = self.internal_dirs()
        return [
            (p, n) for p, n in names if p not in internal and not (p == ROOT_GFID and n.startswith(ANON_INODE_PREFIX))
        ]

    def handle(self, gfid: str) -> str:
        """Returns the path of ``gfid``'s handle under ``.glusterfs`` (the root: the brick itself)."""
        if gfid == ROOT_GFID:
            return self.root
        return f"{self._handles}/{gfid[0:2]}/{gfid[2:4]}/{gfid}"

    def path_of(self, gfid: str) -> str | None:
        """Returns a path that opens ``gfid``'s data on this brick (its handle), or None if absent
        or only a linkto file."""
        node = self.lookup(gfid, full=False)
        return None if node is None or node.type == "dir" else node.path

    def lookup(self, gfid: str, *, full: bool = True) -> Node | None:
        """Returns ``gfid`` as this brick holds it, or None when absent here (a linkto file is absent).
        ``full=False`` skips names, xattrs and times (type, mode, size only)."""
        path = self.handle(gfid)
        try:
            s = os.lstat(path)
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            return None
        if gfid != ROOT_GFID and st.S_ISLNK(s.st_mode) and not _own_gfid(path, gfid):
            # a directory's handle: a symlink to the directory, which carries the gfid
            target = os.readlink(path)
            m = _HANDLE_TARGET.match(target)
            try:
                ds = os.stat(path)
            except FileNotFoundError:
                return None  # a dangling handle: the directory is gone (being removed)
            if m is None or not st.S_ISDIR(ds.st_mode):
                return None
            names = [(m.group(1), m.group(2))]
            if not self._public(names):
                return None  # one of Gluster's own directories
            node = self._node(gfid, path, ds, "dir", full, _listxattr(path, follow=True) if full else None)
            node.names = names
            return node
        if is_linkto(path, s):
            return None  # a DHT linkto file: the data lives on another brick
        kind = (
            "dir"
            if st.S_ISDIR(s.st_mode)
            else "file"
            if st.S_ISREG(s.st_mode)
            else "symlink"
            if st.S_ISLNK(s.st_mode)
            else "other"
        )
        listed = _listxattr(path, follow=kind == "dir") if full else None
        node = self._node(gfid, path, s, kind, full, listed)
        if kind == "symlink":
            node.symlink = os.readlink(path)
        if full and kind != "dir":
            # a name's gfid2path xattr outlives a rename over that name when the file has other
            # links (seen on Gluster 10.3): a name counts only while its entry is this gfid's.
            # The brick's link count is the names plus the handle, so when it matches, no name is
            # stale (a stale one always adds an xattr without a link) and none is looked up.
            names = gfid2path(path, listed)
            if s.st_nlink != len(names) + 1:
                names = [(p, n) for p, n in names if self.lookup_name(p, n) == gfid]
            public = self._public(names)
            if names and not public:
                return None  # an inode a heal parked in AFR's anonymous-inode directory: no longer a file of the volume
            node.names = public
        return node

    def _node(
        self, gfid: str, path: str, s: os.stat_result, kind: str, full: bool, listed: list[str] | None = None
    ) -> Node:
        """``listed``: the xattr names of ``path`` (with ``full``, read only the ones there; most files
        have no shard or user xattr); None: ask for each."""
        node = Node(
            gfid=gfid,
            type=kind,
            mode=s.st_mode,
            uid=s.st_uid,
            gid=s.st_gid,
            size=s.st_size if kind == "file" else 0,
            atime_ns=s.st_atime_ns,
            mtime_ns=s.st_mtime_ns,
            ctime_ns=s.st_ctime_ns,
            path=path,
        )
        follow = kind == "dir"

        def has(name: str) -> bool:
            return listed is None or name in listed

        if kind == "file" and has(SHARD_BLOCK_XATTR):
            block = _xattr(path, SHARD_BLOCK_XATTR, follow=False)
            if block is not None and len(block) >= 8:
                node.shard_block = int.from_bytes(block[:8], "big")
                size = _xattr(path, SHARD_SIZE_XATTR, follow=False)
                if size is not None and len(size) >= 8:
                    node.size = int.from_bytes(size[:8], "big")
        if full:
            md = _xattr(path, MDATA_XATTR, follow=follow) if has(MDATA_XATTR) else None
            if md is not None and len(md) >= _MDATA.size and md[0] == 1:
                _v, _f, cs, cn, ms, mn, as_, an = _MDATA.unpack_from(md)
                node.ctime_ns, node.mtime_ns, node.atime_ns = cs * 10**9 + cn, ms * 10**9 + mn, as_ * 10**9 + an
            node.xattrs = user_xattrs(path, follow=follow, listed=listed)
        return node

    def lookup_name(self, pgfid: str, name: str) -> str | None:
        """The gfid of entry ``name`` of directory ``pgfid`` on this brick (a linkto file's too), or None."""
        parent = self.handle(pgfid)
        entry = os.path.join(parent, name)
        try:
            raw = os.getxattr(entry, GFID_XATTR, follow_symlinks=False)
        except OSError:
            return None
        return gfid_text(raw) if len(raw) == 16 else None

    def shard_path(self, base: str, index: int) -> str | None:
        """Path of block ``index`` (≥ 1) of sharded file ``base`` on this brick (not a linkto), or None."""
        path = os.path.join(self.root, ".shard", f"{base}.{index}")
        try:
            s = os.lstat(path)
        except OSError:
            return None
        return None if is_linkto(path, s) else path

    def shard_indexes(self, base: str) -> list[int]:
        """The blocks of ``base`` stored on this brick (not linkto files), by number."""
        d = os.path.join(self.root, ".shard")
        prefix = base + "."
        out = []
        try:
            with os.scandir(d) as it:
                for e in it:
                    if e.name.startswith(prefix) and e.name[len(prefix) :].isdigit():
                        if self.shard_path(base, int(e.name[len(prefix) :])):
                            out.append(int(e.name[len(prefix) :]))
        except FileNotFoundError:
            return []
        return sorted(out)


def is_linkto(path: str, s: os.stat_result) -> bool:
    """Is the file at ``path`` (``s`` its lstat) a DHT linkto file: mode ``---------T``, empty, and the
    linkto xattr naming the brick that holds the data?"""
    return st.S_ISREG(s.st_mode) and (s.st_mode & 0o7777) == st.S_ISVTX and s.st_size == 0 and _has(path, LINKTO_XATTR)


def is_linkto_fd(fd: int, s: os.stat_result) -> bool:
    """:func:`is_linkto` of an open file (``s`` its fstat)."""
    if not (st.S_ISREG(s.st_mode) and (s.st_mode & 0o7777) == st.S_ISVTX and s.st_size == 0):
        return False
    try:
        os.getxattr(fd, LINKTO_XATTR)
    except OSError as exc:
        if exc.errno in (errno.ENODATA, errno.ENOENT, errno.ENOTSUP, errno.EPERM):
            return False
        raise
    return True


def shard_block_fd(fd: int) -> int:
    """The shard block size an open file carries (the first block of a sharded file), as
    :meth:`BrickView.lookup` reads it; 0 when it carries none."""
    try:
        raw = os.getxattr(fd, SHARD_BLOCK_XATTR)
    except OSError as exc:
        if exc.errno in (errno.ENODATA, errno.ENOENT, errno.ENOTSUP, errno.EPERM):
            return 0
        raise
    return int.from_bytes(raw[:8], "big") if len(raw) >= 8 else 0


def _own_gfid(path: str, gfid: str) -> bool:
    """Does the symlink at ``path`` carry ``gfid`` itself (a user's symlink, not a directory handle)?"""
    raw = _xattr(path, GFID_XATTR, follow=False)
    return raw is not None and len(raw) == 16 and gfid_text(raw) == gfid


def _xattr(path: str, name: str, *, follow: bool) -> bytes | None:
    try:
        return os.getxattr(path, name, follow_symlinks=follow)
    except OSError as exc:
        if exc.errno in (errno.ENODATA, errno.ENOENT, errno.ENOTSUP, errno.EPERM):
            return None
        raise


def _has(path: str, name: str) -> bool:
    return _xattr(path, name, follow=False) is not None


def _listxattr(path: str, *, follow: bool) -> list[str] | None:
    """The xattr names of ``path``; None when they cannot be listed (then each is asked for)."""
    try:
        return os.listxattr(path, follow_symlinks=follow)
    except OSError:
        return None


def user_xattrs(path: str, *, follow: bool = False, listed: list[str] | None = None) -> dict[str, bytes]:
    """The ``user.*`` xattrs of ``path`` (what a client lists); ``listed``: its xattr names, if known."""
    out = {}
    names = listed if listed is not None else _listxattr(path, follow=follow)
    for n in names or ():
        if n.startswith(USER_PREFIX):
            v = _xattr(path, n, follow=follow)
            if v is not None:
                out[n] = v
    return out


def gfid2path(path: str, listed: list[str] | None = None) -> list[tuple[str, str]]:
    """A non-directory's names on its brick, from its ``trusted.gfid2path.*`` xattrs, sorted;
    ``listed``: its xattr names, if known."""
    out = []
    names = listed if listed is not None else _listxattr(path, follow=False)
    for n in names or ():
        if n.startswith(GFID2PATH_PREFIX):
            v = _xattr(path, n, follow=False)
            if not v:
                continue
            text = v.rstrip(b"\0").decode("utf-8", "surrogateescape")
            pgfid, sep, name = text.partition("/")
            if sep and name:
                out.append((pgfid, name))
    return sorted(set(out))


def shard_base(name: str) -> tuple[str, int] | None:
    """``<base gfid>.<N>`` → ``(base gfid, N)``; None for any other name."""
    base, dot, n = name.rpartition(".")
    if dot and n.isdigit() and re.fullmatch(_UUID, base):
        return base, int(n)
    return None


def changed_file(old_handle: str, new_path: str, size: int) -> list[tuple[int, int]] | None:
    """The ranges of a file that is not sharded whose bytes may differ between the last cut
    (``old_handle``: the gfid's handle in that cut's snapshot of the same brick) and this one
    (``new_path``, ``size`` bytes now): the extents the two do not share (FIEMAP), the small ones
    compared byte for byte. None when they cannot be compared (absent then, a linkto file, sharded,
    unreadable): the caller takes the file whole. Each side is opened once."""
    try:
        # a gfid is one inode: its handle in the last cut is this file, a linkto file or absent
        old_fd = os.open(old_handle, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        s = os.fstat(old_fd)
        if not st.S_ISREG(s.st_mode) or is_linkto_fd(old_fd, s) or shard_block_fd(old_fd):
            return None
        try:
            new_fd = os.open(new_path, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                ranges = changed_ranges(fiemap_fd(old_fd), fiemap_fd(new_fd), s.st_size, size)
                return drop_unchanged_fd(old_fd, new_fd, ranges, s.st_size)
            finally:
                os.close(new_fd)
        except OSError:
            return None
    finally:
        os.close(old_fd)


def walk_brick(view: BrickView):
    """Yields ``(gfid, pgfid, name, is_dir)`` for every entry of a brick's tree (Gluster's own root
    entries and linkto files left out), parents before children."""
    stack = [(view.root, ROOT_GFID)]
    while stack:
        d, dgfid = stack.pop()
        with os.scandir(d) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            if dgfid == ROOT_GFID and is_internal_root_name(e.name):
                continue
            raw = _xattr(e.path, GFID_XATTR, follow=False)
            if raw is None or len(raw) != 16:
                continue  # not yet a Gluster entry (being created): the next cut sees it
            gfid = gfid_text(raw)
            is_dir = e.is_dir(follow_symlinks=False)
            if not is_dir and is_linkto(e.path, e.stat(follow_symlinks=False)):
                continue
            yield gfid, dgfid, e.name, is_dir
            if is_dir:
                stack.append((e.path, gfid))
