"""The byte ranges a gluster cut publishes for a file: FIEMAP's changed ranges, then, when they are
small, the parts whose bytes are the same in both cuts dropped (an inline extent has no address,
so FIEMAP calls it changed after a chmod, a rename or a new name)."""

from __future__ import annotations

from epochsync.sources.gluster.btrfs import COMPARE_BYTES_UP_TO, drop_unchanged


def files(tmp_path, old: bytes, new: bytes):
    a, b = tmp_path / "old", tmp_path / "new"
    a.write_bytes(old)
    b.write_bytes(new)
    return str(a), str(b)


def test_the_same_bytes_are_not_a_change(tmp_path):
    a, b = files(tmp_path, b"hello\n", b"hello\n")
    assert drop_unchanged(a, b, [(0, 6)], 6) == []


def test_changed_parts_stay_and_growth_always_does(tmp_path):
    old = b"a" * 8192
    new = b"a" * 4096 + b"b" * 4096 + b"c" * 100
    a, b = files(tmp_path, old, new)
    # FIEMAP said all of it changed: the first 4 KiB is the same, the next differs, the growth is new
    assert drop_unchanged(a, b, [(0, 8292)], 8192) == [(4096, 4196)]
    assert drop_unchanged(a, b, [(0, 4096), (8192, 100)], 8192) == [(8192, 100)]


def test_large_ranges_are_left_to_fiemap(tmp_path):
    size = COMPARE_BYTES_UP_TO + 1
    a, b = files(tmp_path, b"x" * size, b"x" * size)
    assert drop_unchanged(a, b, [(0, size)], size) == [(0, size)]
