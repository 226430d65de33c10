"""RAID-0 striping math (DESIGN section 4), both directions, plus range helpers.

Byte ``x`` of a file with stripe size ``S`` and ``C`` objects is in stripe
``s = x // S``, object ``s % C``, at object offset ``(s // C) * S + x % S``.

Every function takes the geometry as plain ints (``stripe_size``, ``stripe_count``)
so the merge, the data plane and the simulator share one implementation; the
``*_layout`` helpers accept a :class:`epochsync.core.schema.Layout` or ``None``. A file
with no layout (``None``) is *unstriped*: one object (``store.unstriped_key``) whose
offsets are the file's offsets, i.e. the identity mapping.

Reads beyond the stored length of an object are zeros (a sparse hole, or bytes a
truncate removed), and an object of the layout that was never written holds only zeros.
"""

from __future__ import annotations

from collections.abc import Iterable

from epochsync.core.schema import Layout


def _check_geometry(stripe_size: int, stripe_count: int) -> None:
    if stripe_size <= 0 or stripe_count <= 0:
        raise ValueError(f"bad RAID-0 geometry: stripe_size={stripe_size}, stripe_count={stripe_count}")


def file_offset_to_object(stripe_size: int, stripe_count: int, offset: int) -> tuple[int, int]:
    """File byte ``offset`` → (object index in the layout, offset in that object)."""
    _check_geometry(stripe_size, stripe_count)
    stripe, within = divmod(offset, stripe_size)
    return stripe % stripe_count, (stripe // stripe_count) * stripe_size + within


def object_offset_to_file(stripe_size: int, stripe_count: int, index: int, offset: int) -> int:
    """Offset ``offset`` of object ``index`` → the file byte stored there."""
    _check_geometry(stripe_size, stripe_count)
    row, within = divmod(offset, stripe_size)
    return (row * stripe_count + index) * stripe_size + within


def file_range_to_objects(stripe_size: int, stripe_count: int, offset: int, length: int) -> dict[int, tuple[int, int]]:
    """The object bytes a file range ``[offset, offset+length)`` touches.

    Returns ``{object index: (object offset, length)}``. The part of one object a
    contiguous file range touches is itself contiguous in that object, so each object
    gets exactly one range.
    """
    _check_geometry(stripe_size, stripe_count)
    out: dict[int, tuple[int, int]] = {}
    if length <= 0:
        return out
    end = offset + length
    first_stripe = offset // stripe_size
    last_stripe = (end - 1) // stripe_size
    # Only the first stripe_count stripes of the range start a new object range;
    # later stripes continue them, so the work is O(stripe_count), not O(stripes).
    for stripe in range(first_stripe, min(last_stripe, first_stripe + stripe_count - 1) + 1):
        idx = stripe % stripe_count
        start_in_stripe = offset - stripe * stripe_size if stripe == first_stripe else 0
        obj_start = (stripe // stripe_count) * stripe_size + start_in_stripe
        # the last stripe of this object inside the range
        last_own = last_stripe - ((last_stripe - idx) % stripe_count)
        if last_own == last_stripe:
            end_in_stripe = end - last_stripe * stripe_size
        else:
            end_in_stripe = stripe_size
        obj_end = (last_own // stripe_count) * stripe_size + end_in_stripe
        out[idx] = (obj_start, obj_end - obj_start)
    return out


def object_range_to_file(
    stripe_size: int, stripe_count: int, index: int, offset: int, length: int
) -> list[tuple[int, int]]:
    """The file ranges ``(offset, length)`` that bytes ``[offset, offset+length)`` of object ``index`` hold.

    Sorted by file offset and merged where adjacent (with one object, the identity).
    """
    _check_geometry(stripe_size, stripe_count)
    if length <= 0:
        return []
    if stripe_count == 1:
        return [(offset, length)]
    out: list[tuple[int, int]] = []
    pos, end = offset, offset + length
    while pos < end:
        row, within = divmod(pos, stripe_size)
        n = min(stripe_size - within, end - pos)
        out.append(((row * stripe_count + index) * stripe_size + within, n))
        pos += n
    return out


def object_size(stripe_size: int, stripe_count: int, index: int, file_size: int) -> int:
    """How many bytes of object ``index`` lie below ``file_size`` (its length in a dense file)."""
    _check_geometry(stripe_size, stripe_count)
    if file_size <= 0:
        return 0
    last = file_size - 1
    stripe = last // stripe_size
    # the last stripe of object ``index`` at or before ``stripe``
    own = stripe - ((stripe - index) % stripe_count)
    if own < 0:
        return 0
    if own == stripe:
        return (own // stripe_count) * stripe_size + (last % stripe_size) + 1
    return (own // stripe_count + 1) * stripe_size


# --------------------------------------------------------------------------- Layout-aware helpers


def layout_file_range_to_objects(layout: Layout | None, offset: int, length: int) -> dict[int, tuple[int, int]]:
    """:func:`file_range_to_objects` for a schema ``Layout``; ``None`` (unstriped) is object 0, identity."""
    if layout is None:
        return {0: (offset, length)} if length > 0 else {}
    return file_range_to_objects(layout.stripe_size, layout.stripe_count, offset, length)


def layout_object_range_to_file(layout: Layout | None, index: int, offset: int, length: int) -> list[tuple[int, int]]:
    """:func:`object_range_to_file` for a schema ``Layout``; ``None`` (unstriped) is the identity."""
    if layout is None:
        return [(offset, length)] if length > 0 else []
    return object_range_to_file(layout.stripe_size, layout.stripe_count, index, offset, length)


def gather_object(layout: Layout | None, index: int, content: bytes | bytearray) -> bytes:
    """The bytes object ``index`` holds for a file whose bytes are ``content`` (dense)."""
    if layout is None:
        return bytes(content)
    ss, sc = layout.stripe_size, layout.stripe_count
    if sc == 1:
        return bytes(content)
    n = object_size(ss, sc, index, len(content))
    parts = []
    pos = 0
    while pos < n:
        fo = object_offset_to_file(ss, sc, index, pos)
        take = min(ss, n - pos)
        parts.append(content[fo : fo + take])
        pos += take
    return b"".join(parts)


def assemble_file(layout: Layout | None, size: int, objects: list[bytes | None]) -> bytes:
    """Returns the ``size`` bytes of a file, rebuilt from its objects' bytes (``None`` = never written).

    ``objects[i]`` is object ``i`` of the layout (one object when unstriped). Bytes past
    an object's end are zeros.
    """
    out = bytearray(size)
    count = 1 if layout is None else layout.stripe_count
    if len(objects) != count:
        raise ValueError(f"expected {count} objects, got {len(objects)}")
    for idx, data in enumerate(objects):
        if not data:
            continue
        pos = 0  # object offset of the current piece: pieces come in object order
        for fo, n in layout_object_range_to_file(layout, idx, 0, len(data)):
            if fo < size:
                take = min(n, size - fo)
                out[fo : fo + take] = data[pos : pos + take]
            pos += n
    return bytes(out)


def merge_ranges(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """``(offset, length)`` ranges → disjoint, sorted, non-adjacent ranges (empty ones dropped)."""
    spans = sorted((o, o + n) for o, n in ranges if n > 0)
    out: list[list[int]] = []
    for s, e in spans:
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e - s) for s, e in out]


def clip_ranges(ranges: Iterable[tuple[int, int]], size: int) -> list[tuple[int, int]]:
    """Ranges cut at ``size`` (bytes at or past it dropped)."""
    out = []
    for o, n in ranges:
        if o < size:
            out.append((o, min(n, size - o)))
    return out
