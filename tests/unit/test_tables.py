"""write_tables: several warehouse tables, published in order, all or nothing."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest


def _rows(path) -> list[int]:
    return sorted(pq.read_table(str(path)).column("id").to_pylist())


def test_write_tables_publish_in_order_only_when_every_write_succeeded(spark, tmp_path, monkeypatch):
    from pyspark.sql import functions as F

    from epochsync.warehouse import fs as warehouse_fs
    from epochsync.warehouse.tables import write_tables

    a, b, c = (f"file://{tmp_path / name}" for name in ("a", "b", "c"))
    moved: list[str] = []
    real_move = warehouse_fs.move_replacing

    def move(src, dst):
        moved.append(dst)
        real_move(src, dst)

    monkeypatch.setattr(warehouse_fs, "move_replacing", move)
    write_tables(spark, [(spark.range(3), a), (spark.range(5), b), (spark.range(2), c)])
    assert moved == [a, b, c]
    assert (_rows(tmp_path / "a"), _rows(tmp_path / "b"), _rows(tmp_path / "c")) == ([0, 1, 2], [0, 1, 2, 3, 4], [0, 1])

    # a failing write: none of the three is replaced, no temporary copy is left
    moved.clear()
    bad = spark.range(4).select(F.expr("raise_error('epochsync test: this write fails')").alias("id"))
    with pytest.raises(Exception, match="this write fails"):
        write_tables(spark, [(spark.range(7), a), (bad, b), (spark.range(9), c)])
    assert moved == []
    assert (_rows(tmp_path / "a"), _rows(tmp_path / "b"), _rows(tmp_path / "c")) == ([0, 1, 2], [0, 1, 2, 3, 4], [0, 1])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "c"]
