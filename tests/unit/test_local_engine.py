"""The local engine's merge equals the Spark merge, rule by rule and on random histories.

:func:`epochsync.local_engine.merge_rows` must produce exactly the snapshot and change
rows of :func:`epochsync.merge.merge_epoch` (the engines are interchangeable epoch by
epoch). Checked against every hand-written rule case of ``test_merge_rules`` (their
expected rows, no Spark needed) and against the Spark merge on simulated histories.
"""

from __future__ import annotations

import pytest
from test_merge_oracle import FIXED, Params, _rename_record, _rename_row, items_of
from test_merge_rules import Case, build_blind_cases, build_cases

from epochsync.local_engine import MergeInputError, cookie_group_rows, merge_rows
from epochsync.model import change_struct_type, snapshot_struct_type
from epochsync.schema import record_struct_type


def plain(value, dtype):
    """A tuple-shaped value (as the tests build rows) → pyarrow's ``to_pylist`` shape."""
    from pyspark.sql.types import ArrayType, BinaryType, StructType

    if value is None:
        return None
    if isinstance(dtype, StructType):
        if hasattr(value, "asDict"):
            value = tuple(value)
        if isinstance(value, dict):
            return {f.name: plain(value.get(f.name), f.dataType) for f in dtype.fields}
        return {f.name: plain(v, f.dataType) for f, v in zip(dtype.fields, value)}
    if isinstance(dtype, ArrayType):
        return [plain(v, dtype.elementType) for v in value]
    if isinstance(dtype, BinaryType):
        return bytes(value)
    return value


def rows(tuples, struct_type) -> list[dict]:
    return [plain(t, struct_type) for t in tuples]


def by_fid(rs) -> list[dict]:
    return sorted(rs, key=lambda r: r["fid"])


def _case_rows(case: Case):
    prev = rows(case.prev, snapshot_struct_type())
    recs = rows([r.to_row() for r in case.records], record_struct_type())
    return prev, recs


@pytest.mark.parametrize(("name", "known"), [(n, True) for n in build_cases()] + [(n, False) for n in build_blind_cases()])
def test_every_merge_rule(name, known):
    case, want_snap, want_changes = (build_cases() if known else build_blind_cases())[name]
    prev, recs = _case_rows(case)
    snap, changes = merge_rows(prev, recs, case.root, known)
    assert by_fid(snap) == by_fid(rows(want_snap, snapshot_struct_type()))
    assert by_fid(changes) == by_fid(rows(want_changes, change_struct_type()))


def test_name_for_unknown_fid_fails_naming_it():
    c = Case("bad").rec("HLINK", tfid="ghost", pfid="R", name="boo")
    prev, recs = _case_rows(c)
    with pytest.raises(MergeInputError, match=r"fid bad:ghost gains a name .*\(hydrate the target\)"):
        merge_rows(prev, recs, c.root)


def test_nameless_link_record_fails_naming_it():
    c = Case("bad").rec("UNLNK", tfid="x", pfid="R", name=None)
    prev, recs = _case_rows(c)
    with pytest.raises(MergeInputError, match=r"record MDT0000:1 \(UNLNK\) has no fid, parent fid or name"):
        merge_rows(prev, recs, c.root)


def _spark_rows(df, struct_type):
    return [plain(r, struct_type) for r in df.collect()]


HISTORIES = [*FIXED, Params(seed=11, epochs=4, files=12, mdts=2, osts=3, ops=30),
             Params(seed=99, epochs=3, files=25, mdts=3, osts=2, ops=50)]  # fmt: skip


@pytest.mark.parametrize("known", [True, False])
def test_local_merge_equals_spark_merge_on_simulated_histories(spark, known):
    """Every epoch and a catch-up window of 6 histories: snapshots, change sets, cookie groups."""
    from epochsync.merge import cookie_groups, merge_epoch

    items = [it for n, p in enumerate(HISTORIES) for it in items_of(n, p)]
    prev = [_rename_row(it.prefix, row) for it in items for row in it.prev]
    recs = [_rename_record(it.prefix, r).to_row() for it in items for r in it.records]
    rec_df = spark.createDataFrame(recs, record_struct_type())
    snap, changes = merge_epoch(
        spark.createDataFrame(prev, snapshot_struct_type()), rec_df, [it.root for it in items], known, cache=True
    )
    want_snap = by_fid(_spark_rows(snap, snapshot_struct_type()))
    want_changes = by_fid(_spark_rows(changes, change_struct_type()))
    got_snap, got_changes = merge_rows(rows(prev, snapshot_struct_type()), rows(recs, record_struct_type()),
                                       [it.root for it in items], known)  # fmt: skip
    # not vacuous: byte ranges with extents, whole files without
    assert len(want_changes) > 100 and any(c["ranges"] if known else c["whole_file"] for c in want_changes)
    assert got_snap == want_snap
    for got, want in zip(got_changes, want_changes, strict=True):
        assert got == want
    want_groups = sorted((r.asDict(recursive=True) for r in cookie_groups(rec_df).collect()), key=lambda g: g["cookie"])
    assert cookie_group_rows(rows(recs, record_struct_type())) == want_groups


def test_plan_entries_local_equal_spark_and_need_only_touched_rows(spark):
    """plan_entry_rows equals Spark's plan_entries; reading only the directories, the changed
    fids and what lies below a moved directory gives the entries of the whole snapshots."""
    import pyarrow as pa

    from epochsync.local_engine import arrow_schema, moved_dirs, plan_entry_rows, plan_rows
    from epochsync.translate import plan_entries

    schema = arrow_schema(snapshot_struct_type())
    items = [it for n, p in enumerate(HISTORIES) for it in items_of(n, p)]
    narrowed = moves = compared = 0
    for i, it in enumerate(items):
        root = it.root[len(it.prefix) :]
        old = rows([_rename_row("", r) for r in it.prev], snapshot_struct_type())
        recs = rows([r.to_row() for r in it.records], record_struct_type())
        new, changes = merge_rows(old, recs, root)
        full = plan_entry_rows(old, new, changes, root_fid=root)
        few_old, few_new = plan_rows([pa.Table.from_pylist(old, schema=schema), pa.Table.from_pylist(new, schema=schema)], changes)
        narrowed += len(few_old) + len(few_new) < len(old) + len(new)
        moves += bool(moved_dirs(changes))
        assert plan_entry_rows(few_old, few_new, changes, root_fid=root) == full
        top = sorted(lk["name"] for r in new if r["type"] == "dir" for lk in r["links"] if lk["pfid"] == root)
        for fileset in ((), (f"/{top[0]}",) if top else ("/none",)) if i < 4 else ():
            compared += 1
            got = plan_entry_rows(old, new, changes, root_fid=root, fileset=fileset)
            want = plan_entries(
                spark.createDataFrame([tuple(r.values()) for r in old], snapshot_struct_type()),
                spark.createDataFrame([tuple(r.values()) for r in new], snapshot_struct_type()),
                spark.createDataFrame([tuple(r.values()) for r in changes], change_struct_type()),
                root_fid=root, fileset=fileset,
            )  # fmt: skip
            assert _plainer(got) == _plainer(want)
    assert narrowed > len(items) // 2 and moves and compared == 8


def _plainer(entries):
    """bytearray (Spark) and bytes (pyarrow) alike."""
    import json

    return json.loads(json.dumps(entries, sort_keys=True, default=lambda b: bytes(b).hex()))


def test_choose_engine_follows_the_target_keys_and_the_sizes(tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from epochsync import local_engine
    from epochsync.config import config_from_dict
    from epochsync.errors import ConfigError, EpochError
    from epochsync.local_engine import choose_engine, ingest_in_process

    def cfg_with(warehouse: str, **target):
        return config_from_dict({
            "warehouse": warehouse,
            "sources": [{"name": "s", "root_fid": "[0x1:0x1:0x0]", "servers": ["MDT0000"],
                         "changelogs": {"uri": f"file://{tmp_path}/cl", "format": "jsonl"},
                         "store": {"conn_id": "x", "bucket": "b"},
                         "epoch": {"interval": "5m", "start": "2026-01-01T00:00:00Z"}}],
            "targets": [{"name": "t", "source": "s", "kind": "posix", "path": str(tmp_path / "r"), **target}],
        })  # fmt: skip

    wh = f"file://{tmp_path}/wh"
    part = tmp_path / "wh" / "records" / "source=s" / "epoch=1" / "server=MDT0000"
    part.mkdir(parents=True)
    pq.write_table(pa.table({"type": ["CREAT"] * 10}), part / "part-0.parquet")
    auto = cfg_with(wh)
    assert choose_engine(auto, auto.target("t"), 1, 1) == "local"
    assert ingest_in_process(auto, auto.target("t")) == 50_000 * 256
    few = cfg_with(wh, local_max_records=9)
    assert choose_engine(few, few.target("t"), 1, 1) == "spark"  # 10 records > 9
    assert choose_engine(auto, auto.target("t"), 1, 2) == "spark"  # epoch 2 not ingested: Spark says so
    monkeypatch.setattr(local_engine, "LOCAL_MAX_SNAPSHOT_ROWS", 0)
    snap = tmp_path / "wh" / "snapshots" / "target=t" / "epoch=0"
    snap.mkdir(parents=True)
    pq.write_table(pa.table({"fid": ["a"]}), snap / "part-0.parquet")
    assert local_engine.snapshot_rows(auto, auto.target("t"), 0) == 1
    assert choose_engine(auto, auto.target("t"), 1, 1) == "spark"  # the snapshot is too big for the driver
    forced = cfg_with(wh, engine="local")
    assert choose_engine(forced, forced.target("t"), 1, 1) == "local"
    spark_only = cfg_with(wh, engine="spark")
    assert choose_engine(spark_only, spark_only.target("t"), 1, 1) == "spark"
    assert ingest_in_process(spark_only, spark_only.target("t")) is False
    remote = cfg_with("hdfs://nn/wh", engine="local")
    with pytest.raises(EpochError, match="engine local needs a local warehouse, not hdfs://nn/wh"):
        choose_engine(remote, remote.target("t"), 1, 1)
    with pytest.raises(ConfigError, match=r"targets\[0\]\.engine"):
        cfg_with(wh, engine="duckdb")
