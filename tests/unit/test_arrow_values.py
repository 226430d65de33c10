"""``epochsync.core.arrow``: arrays and scalars equal to pyarrow's own, built without importing pandas."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from epochsync.core.arrow import array, combine, empty_table, scalar, table_from_pylist

CASES = [
    (pa.int64(), []),
    (pa.int64(), [0, 1, -1, 2**63 - 1, -(2**63)]),
    (pa.int64(), [None, 5, None]),
    (pa.int32(), [3, None, -(2**31), 2**31 - 1]),
    (pa.int16(), [1, 2]),
    (pa.int8(), [None]),
    (pa.bool_(), []),
    (pa.bool_(), [True, False, None, True, True, False, False, False, True]),
    (pa.string(), []),
    (pa.string(), ["", "a", None, "é", "名前", "\x00", "x" * 1000]),
    (pa.string(), [None, None]),
    (pa.binary(), [b"", b"\x00\xff", None, b"x" * 300]),
    (pa.list_(pa.string()), [["a", None], None, [], ["b"]]),
    (pa.list_(pa.field("element", pa.string(), nullable=False)), [["x", "y"], None, []]),
    (pa.list_(pa.struct([("offset", pa.int64()), ("length", pa.int64())])), [[{"offset": 0, "length": 4}], [], None]),
    (
        pa.struct(
            [
                ("stripe_size", pa.int64()),
                ("stripe_count", pa.int32()),
                ("objects", pa.list_(pa.struct([("ost", pa.string()), ("oid", pa.string())]))),
            ]
        ),
        [
            None,
            {"stripe_size": 1, "stripe_count": 2, "objects": [{"ost": "a", "oid": None}]},
            {"stripe_size": None, "stripe_count": None, "objects": None},
        ],
    ),
    (
        pa.list_(pa.struct([("name", pa.string()), ("value", pa.binary())])),
        [[{"name": "user.a", "value": None}], [{"name": "b", "value": b"\x01"}]],
    ),
]


@pytest.mark.parametrize("type_, values", CASES, ids=lambda c: str(c)[:40])
def test_array_equals_pyarrows(type_, values):
    got = array(values, type_)
    want = pa.array(values, type_)
    got.validate(full=True)
    assert got.type == want.type and got.null_count == want.null_count
    assert got.equals(want) and got.to_pylist() == values
    if not pa.types.is_nested(type_):
        # what the stages do with them: value sets (a null in the set matches a null)
        assert pc.is_in(want, value_set=got).to_pylist() == [True] * len(values)


def test_generators_and_other_types():
    assert array((i for i in range(3)), pa.int64()).to_pylist() == [0, 1, 2]
    other = pa.list_(pa.float64())
    assert array([[1.5], None], other).equals(pa.array([[1.5], None], other))  # passed to pa.array


def test_table_from_pylist_equals_pyarrows():
    from epochsync.stages.merge_rules import outcome_arrow_schema

    schema = outcome_arrow_schema()  # what the local merge builds: lists, structs, binary
    rows = [
        {"exists_after": True, "s_fid": "f1", "s_links": [{"pfid": "p", "name": "n"}], "s_xattrs": []},
        {"exists_after": None, "g_cookie": "c", "g_servers": ["MDT0000"], "g_records": 2},  # missing keys: null
        {},
    ]
    got, want = table_from_pylist(rows, schema), pa.Table.from_pylist(rows, schema=schema)
    got.validate(full=True)
    assert got.schema == want.schema and got.equals(want)


def test_out_of_range_integers_are_refused():
    with pytest.raises(OverflowError):
        array([2**31], pa.int32())
    with pytest.raises(OverflowError):
        array([2**63], pa.int64())


@pytest.mark.parametrize(
    "value, type_",
    [(True, None), (False, None), (7, None), (-1, pa.int32()), ("EPOCH", None), ("", pa.string()), (None, pa.int64())],
)
def test_scalar_equals_pyarrows(value, type_):
    got = scalar(value, type_)
    want = pa.scalar(value, type_ or pa.scalar(value).type)
    assert got.equals(want) and got.type == want.type and got.as_py() == value
    assert scalar(value, type_) is got  # cached: a constant costs one build


def test_scalar_of_another_type():
    with pytest.raises(TypeError, match="give one"):
        scalar(1.5)
    assert scalar(["a"], pa.list_(pa.string())).as_py() == ["a"]


def test_empty_tables_and_combined_chunks_equal_pyarrows(tmp_path):
    import pyarrow.parquet as pq

    from epochsync.core.model import change_arrow_schema, snapshot_arrow_schema

    for schema in (change_arrow_schema(), snapshot_arrow_schema()):  # lists, structs, binary
        got, want = empty_table(schema), schema.empty_table()
        got.validate(full=True)
        assert got.schema == want.schema and got.equals(want)
        # written, the two are the same file
        pq.write_table(got, tmp_path / "got.parquet")
        pq.write_table(want, tmp_path / "want.parquet")
        assert (tmp_path / "got.parquet").read_bytes() == (tmp_path / "want.parquet").read_bytes()
    for col in (pa.chunked_array([], pa.string()), pa.chunked_array([["a"], [], ["b", None]]), pa.array([1, 2])):
        assert combine(col).equals(col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col)


def test_building_them_never_imports_pandas():
    # pyarrow takes a failed import of pandas for "no pandas": the check is that it stays unimported
    code = (
        "import sys\n"
        "import pyarrow as pa, pyarrow.compute as pc\n"
        "from epochsync.core.arrow import array, combine, empty_table, scalar, table_from_pylist\n"
        "a = array(['x', None], pa.string()); b = array([1, 2], pa.int64()); c = array([True], pa.bool_())\n"
        "assert pc.equal(a, scalar('x')).to_pylist() == [True, None]\n"
        "assert pc.less(b, scalar(2)).to_pylist() == [True, False]\n"
        "assert pc.is_in(a, value_set=array(['x'], pa.string())).to_pylist() == [True, False]\n"
        "assert (pc.field('x') == scalar(True)) is not None\n"
        "assert empty_table(pa.schema([('l', pa.list_(pa.string()))])).num_rows == 0\n"
        "s = pa.schema([('l', pa.list_(pa.struct([('n', pa.string()), ('v', pa.binary())])))])\n"
        "assert table_from_pylist([{'l': [{'n': 'a', 'v': b'1'}]}, {}], s).num_rows == 2\n"
        "assert len(combine(pa.chunked_array([], pa.int64()))) == 0\n"
        "assert 'pandas' not in sys.modules, 'pandas was imported'\n"
        "pa.array([1])\n"
        "assert 'pandas' in sys.modules, 'the check above cannot fail: pa.array no longer imports pandas'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_dataset_module_is_pyarrows_and_imports_no_pandas():
    code = (
        "import sys\n"
        "from epochsync.core.arrow import dataset_module\n"
        "import pyarrow.lib as lib\n"
        "real = lib.scalar\n"
        "ds = dataset_module()\n"
        "import pyarrow.dataset\n"
        "assert ds is pyarrow.dataset and lib.scalar is real and dataset_module() is ds\n"
        "assert 'pandas' not in sys.modules, 'pandas was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_package_imports_pyarrow_dataset_only_through_dataset_module():
    """``import pyarrow.dataset`` anywhere else would import pandas when it comes first."""
    from pathlib import Path

    include = Path(__file__).resolve().parents[2] / "include" / "epochsync"
    found = [
        f"{p.relative_to(include)}:{i}"
        for p in include.rglob("*.py")
        if p.name != "arrow.py"
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if "import pyarrow.dataset" in line or "from pyarrow import dataset" in line or "pyarrow.acero" in line
    ]
    assert not found, f"import it with epochsync.core.arrow.dataset_module(): {found}"
