"""Warehouse tables: written whole and atomically, with the columns and types of their schema."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from epochsync.core.errors import SnapshotError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def write_table(spark: SparkSession, df: DataFrame, uri: str) -> None:
    """Write ``df`` as Parquet at ``uri``, replacing what was there, all or nothing.

    Spark writes into ``<uri>.tmp-<random>``; only a complete write is renamed onto ``uri``
    (on file:// in one atomic exchange where Linux can, so a reader sees the old table or
    the new one). A failed write leaves the old table untouched. The rename runs in this
    process (``pyarrow.fs`` or ``os``, no JVM): under Spark Connect the warehouse must be
    at the same path for this process and for Spark.
    """
    write_tables(spark, [(df, uri)])


def write_tables(spark: SparkSession, outputs: list[tuple[DataFrame, str]]) -> None:
    """:func:`write_table` of each ``(df, uri)``, in order; the tables are renamed into place
    in the list's order only once every one of them is written (so the presence of the last
    says the others are there), and a failed write publishes none of them.
    """
    staged = stage_tables(outputs)
    try:
        publish_staged(staged)
    finally:
        discard_staged(staged)


def stage_tables(outputs: list[tuple[DataFrame, str]]) -> list[tuple[str, str]]:
    """Write each ``(df, uri)`` on Spark beside its place; returns ``(tmp, uri)`` pairs for
    :func:`publish_staged` (a failed write leaves nothing behind)."""
    staged: list[tuple[str, str]] = []
    try:
        for df, uri in outputs:
            tmp = f"{uri.rstrip('/')}.tmp-{uuid.uuid4().hex[:12]}"
            staged.append((tmp, uri))
            df.write.mode("overwrite").parquet(tmp)
    except BaseException:
        discard_staged(staged)
        raise
    return staged


def discard_staged(staged: list[tuple[str, str]]) -> None:
    """Remove what is left of staged tables (nothing of those already published)."""
    from epochsync.warehouse import fs as warehouse_fs

    for tmp, _ in staged:
        warehouse_fs.delete(tmp)


def stage_arrow_table(table, uri: str) -> str:
    """Write an Arrow ``table`` as a Parquet table beside ``uri`` (one file); returns the staged
    folder, for :func:`publish_staged`. What a small epoch's merge writes from its one collect."""
    import os

    import pyarrow.parquet as pq

    from epochsync.warehouse.paths import local_path

    tmp = f"{uri.rstrip('/')}.tmp-{uuid.uuid4().hex[:12]}"
    os.makedirs(local_path(tmp))
    pq.write_table(table, os.path.join(local_path(tmp), "part-00000.snappy.parquet"), compression="snappy")
    return tmp


def publish_staged(staged: list[tuple[str, str]]) -> None:
    """Move each staged folder onto its table (``(tmp, uri)``, in order), replacing it."""
    from epochsync.warehouse import fs as warehouse_fs

    for tmp, uri in staged:
        try:
            warehouse_fs.move_replacing(tmp, uri)
        except OSError as exc:
            raise SnapshotError(f"could not move {tmp} to {uri}: {exc}") from None


def conform(df: DataFrame, schema) -> DataFrame:
    """Columns of ``schema``, in its order, cast to its types (nullability aside: Spark
    cannot cast to a non-null field; the values honour it by construction)."""
    from pyspark.sql import functions as F

    return df.select(*(F.col(f.name).cast(nullable_type(f.dataType)).alias(f.name) for f in schema.fields))


def nullable_type(dt):
    """Returns ``dt`` with every nested field and array element nullable (what a cast can target)."""
    from pyspark.sql.types import ArrayType, StructField, StructType

    if isinstance(dt, StructType):
        return StructType([StructField(f.name, nullable_type(f.dataType), True) for f in dt.fields])
    if isinstance(dt, ArrayType):
        return ArrayType(nullable_type(dt.elementType), True)
    return dt
