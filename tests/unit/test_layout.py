"""RAID-0 math of epochsync.core.layout against a byte-by-byte reading of DESIGN section 4."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from epochsync.core.layout import (
    assemble_file,
    clip_ranges,
    file_offset_to_object,
    file_range_to_objects,
    gather_object,
    layout_file_range_to_objects,
    layout_object_range_to_file,
    merge_ranges,
    object_offset_to_file,
    object_range_to_file,
    object_size,
)
from epochsync.core.schema import Layout, LayoutObject


def design_map(ss: int, sc: int, x: int) -> tuple[int, int]:
    """DESIGN section 4, literally."""
    s = x // ss
    return s % sc, (s // sc) * ss + x % ss


def layout(ss: int, sc: int) -> Layout:
    return Layout(ss, sc, tuple(LayoutObject(f"OST{i:04d}", f"0x{i + 1:x}") for i in range(sc)))


geometry = st.tuples(st.integers(1, 9), st.integers(1, 5))


def test_worked_example():
    # stripe 4, 3 objects: file bytes 0-3 obj0, 4-7 obj1, 8-11 obj2, 12-15 obj0 @4, ...
    assert file_offset_to_object(4, 3, 13) == (0, 5)
    assert object_offset_to_file(4, 3, 0, 5) == 13
    assert file_range_to_objects(4, 3, 2, 12) == {0: (2, 4), 1: (0, 4), 2: (0, 4)}
    assert object_range_to_file(4, 3, 1, 2, 5) == [(6, 2), (16, 3)]
    assert [object_size(4, 3, i, 14) for i in range(3)] == [6, 4, 4]


@given(geometry, st.integers(0, 200))
def test_offset_maps_are_the_design_formula_and_inverse(geo, x):
    ss, sc = geo
    assert file_offset_to_object(ss, sc, x) == design_map(ss, sc, x)
    assert object_offset_to_file(ss, sc, *design_map(ss, sc, x)) == x


@given(geometry, st.integers(0, 120), st.integers(0, 80))
def test_file_range_to_objects_is_exactly_the_bytes_touched(geo, offset, length):
    ss, sc = geo
    touched: dict[int, set[int]] = {}
    for x in range(offset, offset + length):
        i, o = design_map(ss, sc, x)
        touched.setdefault(i, set()).add(o)
    got = file_range_to_objects(ss, sc, offset, length)
    assert set(got) == set(touched)
    for i, (o, n) in got.items():
        assert set(range(o, o + n)) == touched[i]  # contiguous, one range per object


@given(geometry, st.integers(0, 4), st.integers(0, 60), st.integers(0, 40))
def test_object_range_to_file_inverts_byte_by_byte(geo, index, offset, length):
    ss, sc = geo
    index %= sc
    got = object_range_to_file(ss, sc, index, offset, length)
    expect = sorted(object_offset_to_file(ss, sc, index, o) for o in range(offset, offset + length))
    assert [x for fo, n in got for x in range(fo, fo + n)] == expect
    assert got == merge_ranges(got)  # sorted, disjoint, non-adjacent


@given(geometry, st.integers(0, 150))
def test_object_size_counts_the_object_bytes_below_the_size(geo, size):
    ss, sc = geo
    for i in range(sc):
        offsets = [o for x in range(size) for j, o in [design_map(ss, sc, x)] if j == i]
        assert object_size(ss, sc, i, size) == (max(offsets) + 1 if offsets else 0)


@given(geometry, st.binary(max_size=100))
def test_gather_then_assemble_round_trips(geo, content):
    lay = layout(*geo)
    objects = [gather_object(lay, i, content) for i in range(lay.stripe_count)]
    assert sum(map(len, objects)) == len(content)
    assert assemble_file(lay, len(content), objects) == content


def test_assemble_reads_missing_and_short_objects_as_zeros():
    lay = layout(4, 2)
    # object 1 never written, object 0 holds file bytes 0-3 and 8-9
    assert assemble_file(lay, 12, [b"abcdEF", None]) == b"abcd\0\0\0\0EF\0\0"
    # bytes an object holds past the file size are ignored
    assert assemble_file(lay, 3, [b"abcdEF", b"zz"]) == b"abc"
    with pytest.raises(ValueError, match="expected 2 objects"):
        assemble_file(lay, 3, [b"abc"])


def test_unstriped_is_the_identity():
    assert layout_file_range_to_objects(None, 10, 5) == {0: (10, 5)}
    assert layout_object_range_to_file(None, 0, 10, 5) == [(10, 5)]
    assert gather_object(None, 0, b"hello") == b"hello"
    assert assemble_file(None, 7, [b"hello"]) == b"hello\0\0"


def test_merge_and_clip_ranges():
    assert merge_ranges([(10, 5), (0, 3), (3, 2), (14, 4), (30, 0)]) == [(0, 5), (10, 8)]
    assert clip_ranges([(0, 5), (10, 8), (20, 1)], 12) == [(0, 5), (10, 2)]


def test_bad_geometry_is_refused():
    with pytest.raises(ValueError, match="bad RAID-0 geometry"):
        file_range_to_objects(0, 1, 0, 1)
