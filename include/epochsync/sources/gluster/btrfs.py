"""btrfs, as a cut uses it: a brick's subvolume, read-only snapshots, and which byte ranges two
snapshots of a file do not share (FIEMAP).

A btrfs snapshot is atomic for its subvolume and shares every extent with it until one side
writes: a range of a file whose physical extent is the same in two snapshots holds the same
bytes in both. So the bytes a file changed between two cuts are the ranges whose extents
differ (plus the ranges where one side has a hole and the other data). Inline extents (small
files kept in the metadata) have no address to compare and count as changed.
"""

from __future__ import annotations

import bisect
import fcntl
import os
import struct

from epochsync.core.gluster import GlusterError, run_tool

#: subvolume roots (and the file system's top level) have this inode number on btrfs
BTRFS_SUBVOLUME_INO = 256

FS_IOC_FIEMAP = 0xC020660B
FIEMAP_FLAG_SYNC = 0x1
FIEMAP_EXTENT_LAST = 0x1
FIEMAP_EXTENT_UNKNOWN = 0x2
FIEMAP_EXTENT_DELALLOC = 0x4
FIEMAP_EXTENT_ENCODED = 0x8
FIEMAP_EXTENT_DATA_INLINE = 0x200
FIEMAP_EXTENT_UNWRITTEN = 0x800
#: extents whose address says nothing about the bytes: always "changed"
_NO_ADDRESS = FIEMAP_EXTENT_UNKNOWN | FIEMAP_EXTENT_DELALLOC | FIEMAP_EXTENT_DATA_INLINE
_HEADER = struct.Struct("=QQIIII")
_EXTENT = struct.Struct("=QQQQQI12x")
_BATCH = 512


def mount_of(path: str) -> tuple[str, str]:
    """Returns ``(mount point, file system type)`` of the mount holding ``path``."""
    best = ("/", "")
    real = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            point = left.split()[4].encode().decode("unicode_escape")
            fstype = right.split()[0]
            if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) >= len(best[0]):
                best = (point, fstype)
    return best


def subvolume_of(path: str) -> str:
    """The btrfs subvolume holding ``path`` (the nearest directory at or above it with inode 256);
    a GlusterError when ``path`` is not on btrfs."""
    point, fstype = mount_of(path)
    if fstype != "btrfs":
        raise GlusterError(
            f"brick {path} is on {fstype or 'an unknown file system'}, not btrfs: the btrfs cut needs every brick "
            "in a btrfs subvolume (docs: GlusterFS source)"
        )
    cur = os.path.realpath(path)
    dev = os.stat(cur).st_dev
    while True:
        st = os.stat(cur)
        if st.st_dev != dev:
            break
        if st.st_ino == BTRFS_SUBVOLUME_INO:
            return cur
        if cur == point or cur == "/":
            break
        cur = os.path.dirname(cur)
    return point


def _btrfs(args: list[str], what: str, timeout: float = 120.0) -> str:
    return run_tool(
        ["btrfs", *args],
        what,
        timeout=timeout,
        missing="the btrfs command is not installed here (Debian: apt-get install btrfs-progs)",
    )


def snapshot(subvolume: str, dest: str) -> None:
    """A read-only snapshot of ``subvolume`` at ``dest`` (its parent must exist, on the same file system)."""
    _btrfs(["subvolume", "snapshot", "-r", subvolume, dest], f"btrfs snapshot of {subvolume} to {dest}")


def delete_snapshot(dest: str) -> None:
    """Deletes the snapshot at ``dest`` (nothing when it is gone already)."""
    if os.path.lexists(dest):
        _btrfs(["subvolume", "delete", dest], f"btrfs subvolume delete {dest}")


def is_subvolume(path: str) -> bool:
    """Is ``path`` the root of a btrfs subvolume (a snapshot, say)?"""
    try:
        return os.lstat(path).st_ino == BTRFS_SUBVOLUME_INO
    except OSError:
        return False


# --------------------------------------------------------------------------- extents


def fiemap(path: str) -> list[tuple[int, int, int, int]]:
    """The extents of a file as ``(logical, physical, length, flags)``; [] for a file of holes.

    An OSError (EOPNOTSUPP on a file system without FIEMAP) is the caller's to handle.
    """
    out: list[tuple[int, int, int, int]] = []
    start = 0
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        while True:
            buf = bytearray(_HEADER.pack(start, (1 << 64) - 1 - start, 0, 0, _BATCH, 0) + bytes(_EXTENT.size * _BATCH))
            fcntl.ioctl(fd, FS_IOC_FIEMAP, buf)
            mapped = _HEADER.unpack_from(buf)[3]
            last = False
            for i in range(mapped):
                lo, ph, ln, _r1, _r2, fl = _EXTENT.unpack_from(buf, _HEADER.size + i * _EXTENT.size)
                out.append((lo, ph, ln, fl))
                last = bool(fl & FIEMAP_EXTENT_LAST)
            if mapped == 0 or last:
                return out
            start = out[-1][0] + out[-1][2]
    finally:
        os.close(fd)


def _segments(extents, size: int):
    """The file's extents clipped to ``[0, size)`` as sorted ``(start, end, physical at start | None, flags)``."""
    out = []
    for lo, ph, ln, fl in extents:
        a, b = lo, min(lo + ln, size)
        if a >= b:
            continue
        out.append((a, b, ph, fl))
    out.sort()
    return out


def changed_ranges(old, new, old_size: int, new_size: int) -> list[tuple[int, int]]:
    """File ranges ``[(offset, length)]`` of ``[0, new_size)`` whose bytes may differ between a file
    with extents ``old`` (``None``: no earlier copy) and ``new``; sorted, disjoint, merged.

    Same bytes: both sides a hole (reads zeros) or both the same physical address for the same
    logical offset, neither side without an address (inline, delayed, unknown) and, for
    encoded (compressed) extents, the same extent on both sides. Bytes past ``old_size`` are
    changed wherever the new file has data (the replica has none there).
    """
    if new_size <= 0:
        return []
    if old is None:
        return [(0, new_size)]
    a_segs = _segments(old, min(old_size, new_size))
    b_segs = _segments(new, new_size)
    cuts = {0, new_size, min(old_size, new_size)}
    for s in (*a_segs, *b_segs):
        cuts.update((s[0], s[1]))
    points = sorted(c for c in cuts if 0 <= c <= new_size)

    def finder(segs):
        starts = [s[0] for s in segs]

        def at(x):
            i = bisect.bisect_right(starts, x) - 1
            return segs[i] if i >= 0 and segs[i][0] <= x < segs[i][1] else None

        return at

    at_a, at_b = finder(a_segs), finder(b_segs)

    changed: list[list[int]] = []
    for x, y in zip(points, points[1:], strict=False):
        if x >= y:
            continue
        sa, sb = at_a(x), at_b(x)
        if x >= old_size:
            same = sb is None  # past the old end: the replica has zeros there, the same as a hole
        elif sa is None and sb is None:
            same = True
        elif sa is None or sb is None:
            same = False
        elif (sa[3] | sb[3]) & _NO_ADDRESS:
            same = False
        elif (sa[3] | sb[3]) & FIEMAP_EXTENT_ENCODED:
            same = sa == sb
        elif (sa[3] ^ sb[3]) & FIEMAP_EXTENT_UNWRITTEN:
            same = False
        else:
            same = sa[2] + (x - sa[0]) == sb[2] + (x - sb[0])
        if not same:
            if changed and changed[-1][1] == x:
                changed[-1][1] = y
            else:
                changed.append([x, y])
    return [(a, b - a) for a, b in changed]
