"""Arrow arrays and scalars from Python values, built without pyarrow's pandas check.

``pa.array``, ``pa.scalar``, ``pa.Table.from_pylist`` and every compute function given a
Python value (``pc.equal(col, "EPOCH")``, ``pc.field("x") == True``) first ask whether the
value is a pandas object, and the first time anything asks, pyarrow imports pandas: 0.3-0.5 s
on a 2-core machine, a third of a warm ``epochsync replicate`` of an empty epoch. What the
stages build from Python values is a few flat types (integers, booleans, strings), so
:func:`array` and :func:`scalar` make those from buffers (``pa.Array.from_buffers``, which
asks nothing) and pass any other type to ``pa.array``. ``Schema.empty_table`` and
``ChunkedArray.combine_chunks`` of no chunk call ``pa.array([])``: :func:`empty_table` and
:func:`combine` do not. ``import pyarrow.dataset`` makes a scalar of ``True`` at import:
:func:`dataset_module` imports it without pandas, and the package imports it only so
(``tests/unit/test_arrow_values.py`` holds all of this to pyarrow's results).
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

#: numpy dtypes of the integer types built from buffers
_INTEGERS = {"int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64"}


def array(values: Iterable[Any], type: pa.DataType) -> pa.Array:
    """``pa.array(values, type)`` for an integer, boolean, string or binary ``type``, or a list or
    struct of those (None is null; a struct's missing key too), without importing pandas; any other
    ``type`` goes to ``pa.array``."""
    import pyarrow as pa

    values = list(values)
    if not _buildable(type):
        return pa.array(values, type)
    return _build(values, type)


def table_from_pylist(rows: list[dict], schema: pa.Schema) -> pa.Table:
    """``pa.Table.from_pylist(rows, schema=schema)`` without importing pandas, for the types of
    :func:`array` (any other column goes to ``pa.array``)."""
    import pyarrow as pa

    columns = [array([r.get(f.name) for r in rows], f.type) for f in schema]
    return pa.Table.from_arrays(columns, schema=schema)


def _buildable(type: pa.DataType) -> bool:
    import pyarrow as pa

    if pa.types.is_list(type):
        return _buildable(type.value_type)
    if pa.types.is_struct(type):
        return all(_buildable(f.type) for f in type)
    return str(type) in _INTEGERS or str(type) in ("bool", "string", "binary")


def _build(values: list, type: pa.DataType) -> pa.Array:
    """The array of ``values`` (a list) of a :func:`_buildable` ``type``, from buffers."""
    import numpy as np
    import pyarrow as pa

    n = len(values)
    present = [v is not None for v in values]
    nulls = n - sum(present)
    validity = None
    if nulls:
        validity = pa.py_buffer(np.packbits(np.array(present, dtype=bool), bitorder="little"))
    kind = str(type)
    if pa.types.is_list(type):
        items = [x for v in values if v is not None for x in v]
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum([len(v) if v is not None else 0 for v in values], out=offsets[1:])
        if offsets[-1] > np.iinfo(np.int32).max:
            return pa.array(values, type)  # pyarrow splits or refuses: as it does
        child = _build(items, type.value_type)
        return pa.Array.from_buffers(
            type, n, [validity, pa.py_buffer(offsets.astype(np.int32))], null_count=nulls, children=[child]
        )
    if pa.types.is_struct(type):
        children = [_build([v.get(f.name) if v is not None else None for v in values], f.type) for f in type]
        return pa.Array.from_buffers(type, n, [validity], null_count=nulls, children=children)
    if kind in ("string", "binary"):
        data = [(v.encode("utf-8") if kind == "string" else bytes(v)) if v is not None else b"" for v in values]
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum([len(b) for b in data], out=offsets[1:])
        if offsets[-1] > np.iinfo(np.int32).max:
            return pa.array(values, type)
        buffers = [validity, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(data))]
    elif kind == "bool":
        bits = np.array([bool(v) for v in values], dtype=bool)
        buffers = [validity, pa.py_buffer(np.packbits(bits, bitorder="little"))]
    else:
        # numpy refuses a value outside the type (OverflowError), as pa.array does
        ints = np.array([0 if v is None else v for v in values], dtype=_INTEGERS[kind])
        buffers = [validity, pa.py_buffer(ints)]
    return pa.Array.from_buffers(type, n, buffers, null_count=nulls)


@functools.lru_cache(maxsize=256)
def _cached_scalar(value: Any, kind: str) -> pa.Scalar:
    import pyarrow as pa

    return array([value], pa.type_for_alias(kind))[0]


def scalar(value: Any, type: pa.DataType | None = None) -> pa.Scalar:
    """``pa.scalar(value, type)`` without importing pandas for the types of :func:`array`;
    ``type`` default: bool, int64 or string, as ``value`` is (another Python value needs a ``type``)."""
    if type is not None:
        kind = str(type)
        if kind not in _INTEGERS and kind not in ("bool", "string"):
            return array([value], type)[0]
    elif isinstance(value, bool):
        kind = "bool"
    elif isinstance(value, int):
        kind = "int64"
    elif isinstance(value, str):
        kind = "string"
    else:
        raise TypeError(f"no default Arrow type for a {value.__class__.__name__}: give one")
    return _cached_scalar(value, kind)


def empty_table(schema: pa.Schema) -> pa.Table:
    """``schema.empty_table()`` without importing pandas."""
    import pyarrow as pa

    return pa.Table.from_arrays([pa.nulls(0, f.type) for f in schema], schema=schema)


def combine(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """``column.combine_chunks()`` (an array as it is) without importing pandas when there is no chunk."""
    import pyarrow as pa

    if isinstance(column, pa.Array):
        return column
    return pa.concat_arrays(column.chunks) if column.num_chunks else pa.nulls(0, column.type)


_DATASET_IMPORT = threading.Lock()


def dataset_module():
    """``pyarrow.dataset``, imported without importing pandas (the package's only way to import it).

    ``pyarrow._dataset`` makes one constant at import, an expression of the scalar ``True``,
    through ``pyarrow.lib.scalar``, whose first call imports pandas. For the length of that
    import ``pyarrow.lib.scalar`` makes a bool with :func:`scalar` (the same scalar) and
    passes anything else on.
    """
    module = sys.modules.get("pyarrow.dataset")
    if module is not None:
        return module
    import pyarrow.lib as lib

    with _DATASET_IMPORT:
        real = lib.scalar

        def bool_without_pandas(value, *args, **kwargs):
            if isinstance(value, bool) and not args and not kwargs:
                return scalar(value)
            return real(value, *args, **kwargs)

        setattr(lib, "scalar", bool_without_pandas)  # noqa: B010 (a module's attribute, put back below)
        try:
            import pyarrow.dataset
        finally:
            setattr(lib, "scalar", real)  # noqa: B010
    return pyarrow.dataset
