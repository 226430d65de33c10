"""The vectorized merge-benchmark inputs: a consistent history the merge takes, equal to the oracle.

A small generated epoch (20,000 records) goes through the benchmark's own path (the
namespace dump into snapshot 1, the records Parquet into the warehouse, ``run_merge``) and
snapshot 2 must equal :func:`epochsync_dev.oracle.replay` of the same records on the dump.
"""

from __future__ import annotations

import json

import pyarrow.compute as pc
import pyarrow.parquet as pq

from epochsync.core.model import SNAPSHOT_FIELDS, snapshot_struct_type
from epochsync.core.schema import Extent, Layout, LayoutObject, ObjectRef, Record
from epochsync_dev.bench import merge as bench_merge
from epochsync_dev.bench.merge_inputs import SERVERS, generate_epoch
from epochsync_dev.oracle import replay, snapshot_row_from_json
from epochsync_dev.simulate.workload import ROOT_FID


def _record(row: dict) -> Record:
    lay, obj, ext = row.pop("layout"), row.pop("object"), row.pop("extents")
    return Record(
        **row,
        layout=None
        if lay is None
        else Layout(
            lay["stripe_size"], lay["stripe_count"], tuple(LayoutObject(o["ost"], o["oid"]) for o in lay["objects"])
        ),
        object=None if obj is None else ObjectRef(obj["ost"], obj["oid"], obj["version"]),
        extents=None if ext is None else tuple(Extent(e["offset"], e["length"]) for e in ext),
    )


def test_mix_and_consistency_of_a_generated_epoch():
    dump, table, meta = generate_epoch(20_000, seed=3)
    assert table.num_rows == meta.records == 20_000
    types = {d["values"]: d["counts"] for d in pc.value_counts(table.column("type")).to_pylist()}
    assert 0.65 <= types["WRITE"] / table.num_rows <= 0.75
    for kind in ("CREAT", "RENME", "HLINK", "UNLNK", "XATTR", "TRUNC", "SATTR", "MKDIR", "SLINK", "MKNOD", "MTIME"):
        assert types.get(kind, 0) > 0, kind
    # per server: indexes 1..n in time order, the EPOCH record last
    for server in SERVERS:
        part = table.filter(pc.equal(table.column("server"), server))
        assert part.column("index").to_pylist() == list(range(1, part.num_rows + 1))
        assert part.column("type")[-1].as_py() == "EPOCH"
        times = part.column("time_ns").to_pylist()
        assert times == sorted(times)
    # operations spanning servers share a cookie: renames across MDTs among them
    cookies = table.filter(pc.is_valid(table.column("cookie")))
    spans = {}
    for row in cookies.select(["cookie", "server", "type"]).to_pylist():
        spans.setdefault(row["cookie"], set()).add((row["server"], row["type"]))
    assert any(len({s for s, _ in v}) > 1 for v in spans.values())
    assert any({t for _, t in v} == {"RENME", "CTIME"} for v in spans.values())
    records = [_record(r) for r in table.to_pylist()]
    lines = dump()
    prev = [snapshot_row_from_json(json.loads(line)) for part in lines[1:] for line in part.to_pylist()]
    prev.append(snapshot_row_from_json(json.loads(lines[0])))
    replay(ROOT_FID, prev, records)  # raises InconsistentRecord if the history were not consistent


def test_the_merge_of_a_generated_epoch_equals_the_oracle(spark, tmp_path):
    from epochsync.stages.merge import run_merge
    from epochsync.warehouse.paths import Warehouse
    from epochsync.warehouse.snapshots import read_snapshot

    work = tmp_path / "merge_20k"
    bench_merge.generate(work, 20_000, seed=11)
    bench_merge.prepare(spark, work)
    cfg = bench_merge._config(work)
    stats = run_merge(cfg, "bench", 2, 2, spark)
    assert stats["records"] == 20_000

    prev = [
        snapshot_row_from_json(json.loads(line))
        for line in (work / "sim" / "snapshot" / "epoch=1" / "part-0.jsonl").read_text().splitlines()
    ]
    table = pq.read_table(work / "sim" / "records")  # server from the directory names
    rows = table.to_pylist()
    for r in rows:
        r["server"] = str(r["server"])
        r["epoch"] = 2
    records = [_record({k: r[k] for k in (f for f in Record.__slots__)}) for r in rows]
    expected = replay(ROOT_FID, prev, records)
    got = read_snapshot(spark, Warehouse(cfg.warehouse), "bench", 2, ROOT_FID)  # base and deltas, newest row per fid
    got_rows = {r.fid: r for r in got.select(*SNAPSHOT_FIELDS).collect()}
    want = spark.createDataFrame([tuple(r[f] for f in SNAPSHOT_FIELDS) for r in expected], snapshot_struct_type())
    want_rows = {r.fid: r for r in want.collect()}
    differ = sorted(fid for fid in got_rows.keys() | want_rows.keys() if got_rows.get(fid) != want_rows.get(fid))
    assert not differ, [(got_rows.get(f), want_rows.get(f)) for f in differ[:3]] + [f"{len(differ)} fids differ"]
    assert len(got_rows) == len(expected)
    assert stats["changes"] > 1000 and stats["cookie_groups"] > 0
