"""Snapshots: epoch 0, atomic writes, retention, namespace dumps, fid → path resolution."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.testing import assertDataFrameEqual

from epochsync.core.errors import EpochError
from epochsync.core.model import SNAPSHOT_FIELDS, snapshot_struct_type
from epochsync.warehouse.paths import Warehouse
from epochsync.warehouse.snapshots import (
    SnapshotError,
    empty_snapshot,
    load_namespace_dump,
    prune_snapshots,
    read_snapshot,
    resolve_paths,
    snapshot_epochs,
    write_snapshot,
)
from epochsync_dev.oracle import FsModel, snapshot_row_to_json
from epochsync_dev.simulate.workload import simulate_history

R = "[0x200000007:0x1:0x0]"


def rows_df(spark, rows):
    return spark.createDataFrame([tuple(r[f] for f in SNAPSHOT_FIELDS) for r in rows], snapshot_struct_type())


@pytest.fixture(scope="module")
def hist():
    # several MDTs, renames of directories, hard links: every path shape
    return simulate_history(21, 3, 15, mdts=2, osts=2, ops_per_epoch=30, data=False)


def test_epoch_zero_is_the_root_alone(spark, tmp_path):
    wh = Warehouse(f"file://{tmp_path}")
    got = read_snapshot(spark, wh, "t", 0, R)
    # the oracle's empty model: same root row
    assertDataFrameEqual(got, rows_df(spark, FsModel(R).snapshot_rows()))
    assert got.first()["mode"] == 0o40755
    with pytest.raises(EpochError, match=r"no snapshot of target 't' at epoch 4 .*merge epoch 4 first"):
        read_snapshot(spark, wh, "t", 4, R)


def test_write_read_replace_and_retention(spark, tmp_path, hist):
    wh = Warehouse(f"file://{tmp_path}")
    for e in range(1, 4):
        write_snapshot(spark, wh, "t", e, rows_df(spark, hist.at(e).snapshot))
    assertDataFrameEqual(read_snapshot(spark, wh, "t", 2, R), rows_df(spark, hist.at(2).snapshot))
    # a write that fails half-way leaves the old snapshot whole
    from pyspark.sql import functions as F

    broken = rows_df(spark, hist.at(3).snapshot).withColumn("fid", F.expr("raise_error('boom')"))
    with pytest.raises(Exception, match="boom"):
        write_snapshot(spark, wh, "t", 2, broken)
    assertDataFrameEqual(read_snapshot(spark, wh, "t", 2, R), rows_df(spark, hist.at(2).snapshot))
    assert not [p for p in Path(tmp_path, "snapshots", "target=t").iterdir() if "tmp" in p.name]
    # retention: keep 2 at or below the committed epoch 2, and the uncommitted 3
    assert prune_snapshots(spark, wh, "t", 2, committed_epoch=2) == []
    write_snapshot(spark, wh, "t", 0, empty_snapshot(spark, R))
    assert prune_snapshots(spark, wh, "t", 2, committed_epoch=2) == [0]
    assert snapshot_epochs(spark, wh, "t") == [1, 2, 3]
    assert prune_snapshots(spark, wh, "t", 1) == [1, 2]
    assert snapshot_epochs(spark, wh, "t") == [3]
    with pytest.raises(ValueError):
        prune_snapshots(spark, wh, "t", 0)


def test_snapshots_written_before_objects_had_a_size_still_read(spark, tmp_path, hist):
    """A snapshot's files from before ``objects`` carried the version's length (the three-field
    struct) read on Spark and with pyarrow as the same rows with that length unknown (null):
    snapshot files are shared with later epochs, so old and new files meet in one snapshot."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from epochsync.warehouse.snapshots import snapshot_files

    wh = Warehouse(f"file://{tmp_path}")
    rows = hist.at(3).snapshot
    assert any(o[3] is not None for r in rows for o in r["objects"])  # the simulator gives lengths
    write_snapshot(spark, wh, "t", 3, rows_df(spark, rows))
    old_object = pa.struct([("ost", pa.string()), ("oid", pa.string()), ("version", pa.string())])
    files = list(Path(tmp_path, "snapshots", "target=t", "epoch=3").glob("*.parquet"))
    assert files
    for f in files:
        t = pq.read_table(f)
        i = t.schema.get_field_index("objects")
        objects = [[{k: o[k] for k in ("ost", "oid", "version")} for o in v or []] for v in t.column(i).to_pylist()]
        t = t.set_column(i, pa.field("objects", pa.list_(old_object)), pa.array(objects, pa.list_(old_object)))
        pq.write_table(t, f)
    assert pq.read_schema(files[0]).field("objects").type == pa.list_(old_object)
    unknown = [dict(r, objects=[(*o[:3], None) for o in r["objects"]]) for r in rows]
    assertDataFrameEqual(read_snapshot(spark, wh, "t", 3, R), rows_df(spark, unknown))
    got = snapshot_files(wh, "t", 3, R).scan().to_pylist()
    assert sorted((r["fid"], [tuple(o.values()) for o in r["objects"]]) for r in got) == sorted(
        (r["fid"], r["objects"]) for r in unknown
    )


def test_namespace_dump_round_trip_and_errors(spark, tmp_path, hist):
    rows = hist.at(2).snapshot
    good = tmp_path / "good"
    good.mkdir()
    (good / "part-0.jsonl").write_text("".join(json.dumps(snapshot_row_to_json(r)) + "\n" for r in rows))
    assertDataFrameEqual(load_namespace_dump(spark, f"file://{good}", R), rows_df(spark, rows))

    def dump(name, lines):
        d = tmp_path / name
        d.mkdir()
        (d / "part-0.jsonl").write_text("".join(line + "\n" for line in lines))
        return f"file://{d}"

    first = json.dumps(snapshot_row_to_json(rows[1]))
    root = json.dumps(snapshot_row_to_json(rows[0]))
    with pytest.raises(SnapshotError, match=r"part-0.jsonl: not a JSON snapshot row: '\{oops'"):
        load_namespace_dump(spark, dump("bad-json", [root, "{oops"]), R)
    with pytest.raises(SnapshotError, match=r"part-0.jsonl: fid 'x': needs fid, type"):
        load_namespace_dump(spark, dump("bad-type", [root, json.dumps({"fid": "x", "type": "blob", "links": []})]), R)
    with pytest.raises(SnapshotError, match=r"appears 2 times"):
        load_namespace_dump(spark, dump("dup", [root, first, first]), R)
    with pytest.raises(SnapshotError, match=r"the root .* is missing"):
        load_namespace_dump(spark, dump("noroot", [first]), R)
    with pytest.raises(SnapshotError, match="does not exist"):
        load_namespace_dump(spark, f"file://{tmp_path}/nowhere", R)


def test_resolve_paths_equals_the_model(spark, hist):
    rows = hist.at(3).snapshot
    model = FsModel.from_snapshot_rows(R, rows)
    expected = sorted((fid, path) for path, fid in model.paths().items())
    assert any("/" in p for _, p in expected), "the history should have nested paths"
    got = resolve_paths(rows_df(spark, rows), R)
    assertDataFrameEqual(got, spark.createDataFrame(expected, "fid string, path string"))


def _node(fid, type_, links):
    return {f: None for f in SNAPSHOT_FIELDS} | {"fid": fid, "type": type_, "links": links, "xattrs": [], "objects": []}


def test_resolve_paths_deep_tree_hard_links_and_errors(spark):
    # a chain of 40 directories (pointer jumping: a handful of rounds), a file with two names
    chain = [_node(R, "dir", [])]
    parent = R
    for i in range(40):
        chain.append(_node(f"d{i}", "dir", [(parent, f"n{i}")]))
        parent = f"d{i}"
    chain.append(_node("f", "file", [(parent, "leaf"), (R, "top")]))
    got = resolve_paths(rows_df(spark, chain), R).filter("fid IN ('f', 'd2')")
    deep = "/".join(f"n{i}" for i in range(40)) + "/leaf"
    assertDataFrameEqual(
        got, spark.createDataFrame([("f", deep), ("f", "top"), ("d2", "n0/n1/n2")], "fid string, path string")
    )

    orphan = [_node(R, "dir", []), _node("a", "file", [("nowhere", "a")])]
    with pytest.raises(SnapshotError, match=r"orphan: a is linked as 'a' under nowhere"):
        resolve_paths(rows_df(spark, orphan), R)
    cycle = [_node(R, "dir", []), _node("x", "dir", [("y", "x")]), _node("y", "dir", [("x", "y")])]
    with pytest.raises(SnapshotError, match=r"cycle .* from (x, y|y, x)"):
        resolve_paths(rows_df(spark, cycle), R, max_depth=8)
