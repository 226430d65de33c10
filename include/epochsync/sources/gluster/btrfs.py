"""btrfs, as a cut uses it: a brick's subvolume, read-only snapshots (:mod:`epochsync.core.btrfs`),
and which byte ranges two snapshots of a file do not share (FIEMAP).

A btrfs snapshot is atomic for its subvolume and shares every extent with it until one side
writes: a range of a file whose physical extent is the same in two snapshots holds the same
bytes in both. So the bytes a file changed between two cuts are the ranges whose extents
differ (plus the ranges where one side has a hole and the other data). Inline extents (small
files kept in the metadata) have no address to compare: such ranges, when small, are read and
compared byte for byte (:func:`drop_unchanged`).
"""

from __future__ import annotations

import bisect
import fcntl
import os
import struct

from epochsync.core.btrfs import BTRFS_SUBVOLUME_INO, is_subvolume, mount_of, snapshot
from epochsync.core.btrfs import delete_subvolume as delete_snapshot
from epochsync.core.gluster import GlusterError

#: the cut's btrfs calls, from here (the snapshot functions are :mod:`epochsync.core.btrfs`'s)
__all__ = [
    "changed_ranges",
    "delete_snapshot",
    "drop_unchanged",
    "drop_unchanged_fd",
    "fiemap",
    "fiemap_fd",
    "is_subvolume",
    "mount_of",
    "snapshot",
    "subvolume_of",
]

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
_FIRST_BATCH = 8


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


# --------------------------------------------------------------------------- extents


def fiemap(path: str) -> list[tuple[int, int, int, int]]:
    """The extents of a file as ``(logical, physical, length, flags)``; [] for a file of holes.

    An OSError (EOPNOTSUPP on a file system without FIEMAP) is the caller's to handle.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        return fiemap_fd(fd)
    finally:
        os.close(fd)


def fiemap_fd(fd: int) -> list[tuple[int, int, int, int]]:
    """:func:`fiemap` of an open file. The first call asks for a few extents (most files of a cut
    have one or two: no 28 KiB buffer to fill per file), the next ones for :data:`_BATCH`."""
    out: list[tuple[int, int, int, int]] = []
    start = 0
    batch = _FIRST_BATCH
    while True:
        buf = bytearray(_HEADER.size + _EXTENT.size * batch)
        _HEADER.pack_into(buf, 0, start, (1 << 64) - 1 - start, 0, 0, batch, 0)
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
        batch = _BATCH


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


#: ranges FIEMAP calls changed are read and compared when, within the old size, they add up to at
#: most this many bytes: a small file's extent is often inline (in btrfs's metadata, no address),
#: so an attribute change, a new name or a rename would otherwise publish its bytes as changed
COMPARE_BYTES_UP_TO = 64 * 1024
#: what is compared at once: a block that differs is published whole
COMPARE_BLOCK = 4096


def drop_unchanged(
    old_path: str, new_path: str, ranges: list[tuple[int, int]], old_size: int, limit: int = COMPARE_BYTES_UP_TO
) -> list[tuple[int, int]]:
    """``ranges`` (of :func:`changed_ranges`) without the blocks (:data:`COMPARE_BLOCK`) whose bytes
    are the same in both files, when the parts within ``old_size`` add up to at most ``limit`` bytes (else ``ranges`` as
    they are). Bytes past ``old_size`` always stay changed (the replica has none there)."""
    inside = [(o, min(o + n, old_size) - o) for o, n in ranges if o < old_size]
    if not inside or sum(n for _, n in inside) > limit:
        return ranges
    a = os.open(old_path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        b = os.open(new_path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            return drop_unchanged_fd(a, b, ranges, old_size, limit)
        finally:
            os.close(b)
    finally:
        os.close(a)


def drop_unchanged_fd(
    old_fd: int, new_fd: int, ranges: list[tuple[int, int]], old_size: int, limit: int = COMPARE_BYTES_UP_TO
) -> list[tuple[int, int]]:
    """:func:`drop_unchanged` of two open files."""
    inside = [(o, min(o + n, old_size) - o) for o, n in ranges if o < old_size]
    if not inside or sum(n for _, n in inside) > limit:
        return ranges
    out: list[tuple[int, int]] = []

    def keep(o: int, n: int) -> None:
        if out and out[-1][0] + out[-1][1] == o:
            out[-1] = (out[-1][0], out[-1][1] + n)
        elif n > 0:
            out.append((o, n))

    for o, n in ranges:
        end = min(o + n, old_size)
        for x in range(o, end, COMPARE_BLOCK):
            m = min(COMPARE_BLOCK, end - x)
            if os.pread(old_fd, m, x) != os.pread(new_fd, m, x):
                keep(x, m)
        if o + n > old_size:
            keep(max(o, old_size), o + n - max(o, old_size))
    return out
