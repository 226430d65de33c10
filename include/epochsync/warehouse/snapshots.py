"""Namespace snapshots: one Parquet table per target and committed epoch (schema in :mod:`epochsync.core.model`).

- :func:`empty_snapshot` is epoch 0: the root alone.
- :func:`read_snapshot` / :func:`write_table` read and write ``Warehouse.snapshot(target, E)``;
  writes go to a temporary sibling and are renamed into place, so a reader never sees a
  half-written snapshot and a retried stage overwrites its own output.
- :func:`load_namespace_dump` reads a source namespace dump (JSON Lines of snapshot
  columns, ``snapshot/epoch=E/`` written by the source or by ``python -m epochsync_dev simulate``), used
  by hydrate, and checks it.
- :func:`resolve_paths` maps fid → path(s) with Spark joins (pointer jumping over the
  directory tree: O(log depth) joins), failing clearly on a cycle or an orphan.
- :func:`prune_snapshots` keeps the last N snapshots of a target
  (``TargetConfig.snapshot_retention``).
"""

from __future__ import annotations

import re
import stat
from typing import TYPE_CHECKING, Any

from epochsync.core.errors import SnapshotError
from epochsync.core.model import DIR, NODE_TYPES, SNAPSHOT_FIELDS

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

    from epochsync.warehouse.paths import Warehouse

#: mode of the root of an empty target (same as the oracle's default root)
ROOT_MODE = stat.S_IFDIR | 0o755
#: deepest directory tree resolve_paths accepts before calling it a cycle
MAX_DEPTH = 4096


def empty_snapshot(spark: SparkSession, root_fid: str) -> DataFrame:
    """The snapshot of epoch 0: the root directory alone (mode 0o40755, uid/gid 0, size 0, no links)."""
    from epochsync.core.model import snapshot_struct_type

    row: dict[str, Any] = {f: None for f in SNAPSHOT_FIELDS}
    row.update(fid=root_fid, type=DIR, links=[], mode=ROOT_MODE, uid=0, gid=0, size=0, xattrs=[], objects=[])
    return spark.createDataFrame([tuple(row[f] for f in SNAPSHOT_FIELDS)], snapshot_struct_type())


# --------------------------------------------------------------------------- file system helpers


def path_exists(spark: SparkSession | None, uri: str) -> bool:
    """True if ``uri`` (a file or a directory) exists (checked by the caller, not by Spark)."""
    from epochsync.warehouse import fs as warehouse_fs

    return warehouse_fs.exists(uri)


def _delete(spark: SparkSession | None, uri: str) -> None:
    from epochsync.warehouse import fs as warehouse_fs

    warehouse_fs.delete(uri)


# --------------------------------------------------------------------------- snapshots


def read_snapshot(spark: SparkSession, wh: Warehouse, target: str, epoch: int, root_fid: str) -> DataFrame:
    """Snapshot ``epoch`` of ``target``; epoch 0 is :func:`empty_snapshot` unless one was written.

    The files of the snapshot (:mod:`epochsync.warehouse.snapshot_files`) are read whole;
    when deltas sit on the base, each fid's newest row is kept and tombstones dropped (a
    window over the snapshot: readers of a few fids use
    :class:`~epochsync.warehouse.snapshot_files.SnapshotFiles` instead). A missing snapshot
    above 0 is an error that says what to run.
    """
    return read_snapshot_files(spark, snapshot_files(wh, target, epoch, root_fid))


def read_snapshot_files(spark: SparkSession, files) -> DataFrame:
    """The snapshot held by ``files`` (a :class:`~epochsync.warehouse.snapshot_files.SnapshotFiles`) on Spark: see :func:`read_snapshot`."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from epochsync.core.model import snapshot_struct_type
    from epochsync.warehouse.snapshot_files import DELETED, GEN, storage_struct_type

    layout = files.layout
    if layout is None:
        return empty_snapshot(spark, files.root_fid)
    if layout.legacy:
        return spark.read.schema(snapshot_struct_type()).parquet(files.uri)
    df = spark.read.schema(storage_struct_type()).parquet(files.uri)
    if layout.has_deltas:
        newest = Window.partitionBy("fid").orderBy(F.col(GEN).desc())
        df = df.withColumn("_newest", F.row_number().over(newest)).filter(
            (F.col("_newest") == 1) & ~F.coalesce(F.col(DELETED), F.lit(False))
        )
    return df.select(*SNAPSHOT_FIELDS)


def snapshot_files(wh: Warehouse, target: str, epoch: int, root_fid: str):
    """Snapshot ``epoch`` of ``target`` for lookups in this process (:class:`~epochsync.warehouse.snapshot_files.SnapshotFiles`)."""
    from epochsync.warehouse.snapshot_files import SnapshotFiles

    return SnapshotFiles(wh.snapshot(target, epoch), epoch, root_fid, target=target)


def write_snapshot(spark: SparkSession, wh: Warehouse, target: str, epoch: int, df: DataFrame) -> str:
    """Write ``df`` (snapshot columns) as snapshot ``epoch`` of ``target``, a base of its own
    (every row, bucketed by fid); returns its URI. Counts ``df`` first (cache it if it is
    expensive to compute)."""
    from pyspark.sql import functions as F

    from epochsync.core.model import snapshot_struct_type
    from epochsync.warehouse.snapshot_files import DELETED, GEN
    from epochsync.warehouse.tables import conform

    uri = wh.snapshot(target, epoch)
    rows = conform(df, snapshot_struct_type()).select(
        "*", F.lit(epoch).cast("bigint").alias(GEN), F.lit(False).alias(DELETED)
    )
    stage_snapshot_files(uri, epoch, rows, live_rows=rows.count()).publish()
    return uri


def stage_snapshot_files(uri: str, epoch: int, rows: DataFrame, *, live_rows: int, prev=None):
    """Write snapshot ``epoch`` beside ``uri`` on Spark: ``rows`` (storage columns) bucketed by fid;
    returns the :class:`~epochsync.warehouse.snapshot_files.StagedSnapshot` to publish.

    Without ``prev``, ``rows`` are the whole snapshot (a base of ``live_rows`` rows); with
    ``prev`` (a :class:`~epochsync.warehouse.snapshot_files.SnapshotFiles`), they are this
    epoch's delta over its files, and the snapshot then holds ``live_rows`` fids (what
    :func:`~epochsync.warehouse.snapshot_files.stage_delta` writes, on Spark).
    """
    import os
    import uuid

    import pyarrow.parquet as pq
    from pyspark.sql import functions as F

    from epochsync.warehouse import fs as warehouse_fs
    from epochsync.warehouse.paths import local_path
    from epochsync.warehouse.snapshot_files import (
        SnapshotLayout,
        StagedSnapshot,
        bucket_sql,
        buckets_for,
        link_or_copy,
    )

    kind = "base" if prev is None else "delta"
    buckets = buckets_for(live_rows) if prev is None else prev.layout.buckets
    out_uri = f"{uri.rstrip('/')}.write-{uuid.uuid4().hex[:12]}"
    out = local_path(out_uri)
    tmp = local_path(f"{uri.rstrip('/')}.tmp-{uuid.uuid4().hex[:12]}")
    try:
        (
            rows.withColumn("_bucket", F.expr(bucket_sql(buckets)))
            .repartition(min(buckets, 64), "_bucket")
            .sortWithinPartitions("fid")
            .write.mode("overwrite")
            .partitionBy("_bucket")
            .parquet(out_uri)
        )
        os.makedirs(tmp)
        files = []
        for f in prev.layout.files if prev is not None else []:
            link_or_copy(os.path.join(local_path(prev.uri), f["name"]), os.path.join(tmp, f["name"]))
            files.append(dict(f))
        for folder in sorted(d for d in os.listdir(out) if d.startswith("_bucket=")):
            bucket = int(folder.split("=", 1)[1])
            names = sorted(n for n in os.listdir(os.path.join(out, folder)) if n.endswith(".parquet"))
            for i, name in enumerate(names):
                path = os.path.join(out, folder, name)
                n = pq.ParquetFile(path).metadata.num_rows
                if n:
                    new = f"{kind}-{epoch}-b{bucket}-{i}.parquet"
                    os.replace(path, os.path.join(tmp, new))
                    files.append({"name": new, "kind": kind, "gen": epoch, "bucket": bucket, "rows": n})
        layout = SnapshotLayout(epoch, buckets, live_rows, files)
        layout.save(tmp)
    except BaseException:
        warehouse_fs.delete(tmp)
        raise
    finally:
        warehouse_fs.delete(out)
    return StagedSnapshot(uri, tmp, layout)


def snapshot_epochs(spark: SparkSession, wh: Warehouse, target: str) -> list[int]:
    """Epochs that have a snapshot of ``target``, ascending."""
    from epochsync.warehouse import fs as warehouse_fs

    out = []
    for name in warehouse_fs.list_dirs(wh.snapshots(target)):
        m = re.fullmatch(r"epoch=(\d+)", name)
        if m:
            out.append(int(m.group(1)))
    return sorted(out)


def prune_snapshots(
    spark: SparkSession, wh: Warehouse, target: str, keep: int, committed_epoch: int | None = None
) -> list[int]:
    """Delete old snapshots of ``target``, keeping the ``keep`` newest; returns the epochs deleted.

    With ``committed_epoch``, the ``keep`` newest at or below it are kept plus every newer
    one (a merged but uncommitted epoch, and the snapshot a rollback checks against, stay).
    """
    if keep < 1:
        raise ValueError(f"snapshot retention must keep at least 1 snapshot, got {keep}")
    epochs = snapshot_epochs(spark, wh, target)
    candidates = epochs if committed_epoch is None else [e for e in epochs if e <= committed_epoch]
    doomed = candidates[:-keep] if len(candidates) > keep else []
    for e in doomed:
        _delete(spark, wh.snapshot(target, e))
    return doomed


# --------------------------------------------------------------------------- namespace dumps


def load_namespace_dump(spark: SparkSession, uri: str, root_fid: str) -> DataFrame:
    """A source namespace dump (JSON Lines, one snapshot row per line, xattr values base64).

    Checks what the merge relies on and fails with :class:`SnapshotError` naming the file
    and the offending line or fid: malformed JSON, a missing fid/type/links, an unknown
    type, a fid twice, no root row, a root with links. Returns a DataFrame of snapshot
    columns (lazily re-read; cache it if you use it more than once).
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    from epochsync.core.model import snapshot_struct_type

    if not path_exists(spark, uri):
        raise SnapshotError(f"namespace dump {uri} does not exist")
    schema = snapshot_struct_type()
    loose = StructType(
        [
            *(StructField(f.name, f.dataType, True) for f in schema.fields),
            StructField("_corrupt_record", StringType(), True),
        ]
    )
    df = (
        spark.read.schema(loose)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", "_corrupt_record")
        .json(uri)
        .withColumn("_file", F.input_file_name())
    ).cache()
    bad = df.filter(
        F.col("_corrupt_record").isNotNull()
        | F.col("fid").isNull()
        | F.col("type").isNull()
        | ~F.col("type").isin(*NODE_TYPES)
        | F.col("links").isNull()
        | F.expr("exists(links, l -> l.pfid IS NULL OR l.name IS NULL)")
    ).first()
    if bad is not None:
        df.unpersist()
        what = (
            f"not a JSON snapshot row: {bad['_corrupt_record'][:200]!r}"
            if bad["_corrupt_record"] is not None
            else f"fid {bad['fid']!r}: needs fid, type (one of {', '.join(NODE_TYPES)}) and links of (pfid, name)"
        )
        raise SnapshotError(f"{bad['_file']}: {what}")
    dup = df.groupBy("fid").count().filter("count > 1").first()
    if dup is not None:
        df.unpersist()
        raise SnapshotError(f"{uri}: fid {dup['fid']!r} appears {dup['count']} times")
    root = df.filter(F.col("fid") == root_fid).select("links").first()
    if root is None or root["links"]:
        df.unpersist()
        raise SnapshotError(
            f"{uri}: the root {root_fid!r} is " + ("missing" if root is None else "linked under a parent")
        )
    from epochsync.warehouse.tables import conform

    return conform(df.drop("_corrupt_record", "_file"), schema)


# --------------------------------------------------------------------------- paths


def resolve_paths(snapshot: DataFrame, root_fid: str, *, max_depth: int = MAX_DEPTH) -> DataFrame:
    """``(fid, path)`` for every name of every fid (hard links give several rows).

    Paths are relative to the root, without a leading ``/`` (the root's path is ``""``).
    Directories are resolved by pointer jumping: each row knows its path down from an
    ancestor ``anc``; joining a row with its ancestor's row doubles the distance covered,
    so a tree of depth D needs about log2(D) joins (one Spark action per round to see
    whether any row is left). A link to a missing parent, or to a parent that is not a
    directory, is an orphan; a directory chain that does not reach the root within
    ``max_depth`` is a cycle: both raise :class:`SnapshotError` naming fids.
    """
    from pyspark.sql import functions as F

    spark = snapshot.sparkSession
    links = snapshot.select("fid", "type", F.explode("links").alias("l")).select(
        "fid", "type", F.col("l.pfid").alias("pfid"), F.col("l.name").alias("name")
    )
    dirs = snapshot.filter(F.col("type") == DIR).select("fid")
    orphan = (
        links.join(dirs.withColumnRenamed("fid", "pfid"), "pfid", "left_anti").select("fid", "pfid", "name").first()
    )
    if orphan is not None:
        raise SnapshotError(
            f"orphan: {orphan['fid']} is linked as {orphan['name']!r} under {orphan['pfid']}, "
            "which is not a directory of this snapshot"
        )
    # (fid, anc, path): path is the way from anc down to fid
    state = links.filter(F.col("type") == DIR).select("fid", F.col("pfid").alias("anc"), F.col("name").alias("path"))
    done = spark.createDataFrame([], "fid string, path string")
    rounds = 0
    limit = max(1, max_depth).bit_length() + 1
    while True:
        state = state.localCheckpoint()
        done_before = done
        done = done.unionByName(state.filter(F.col("anc") == root_fid).select("fid", "path"))
        pending = state.filter(F.col("anc") != root_fid)
        if pending.isEmpty():
            break
        rounds += 1
        if rounds > limit:
            sample = [r["fid"] for r in pending.select("fid").distinct().limit(5).collect()]
            raise SnapshotError(
                f"directory cycle or tree deeper than {max_depth}: cannot reach the root from {', '.join(sample)}"
            )
        # every directory is either still in `state` or was resolved in an earlier round
        up = state.select(F.col("fid").alias("anc"), F.col("anc").alias("anc2"), F.col("path").alias("prefix"))
        resolved = done_before.select(
            F.col("fid").alias("anc"), F.lit(root_fid).alias("anc2"), F.col("path").alias("prefix")
        )
        state = pending.join(up.unionByName(resolved), "anc").select(
            "fid", F.col("anc2").alias("anc"), F.concat_ws("/", "prefix", "path").alias("path")
        )
    dir_paths = done.unionByName(spark.createDataFrame([(root_fid, "")], "fid string, path string"))
    return links.join(dir_paths.select(F.col("fid").alias("pfid"), F.col("path").alias("ppath")), "pfid").select(
        "fid", F.expr("CASE WHEN ppath = '' THEN name ELSE concat(ppath, '/', name) END").alias("path")
    )


def resolve_links(snapshot, root_fid: str, *, max_depth: int = 4096):
    """Every reachable link of a snapshot with its replica path: (fid, pfid, name, path), on Spark.

    Directory paths are resolved in this process from the directories' links alone
    (one collect: directories are a small share of a namespace), walking up with a
    depth bound so hostile cycles cannot loop; a directory with several links uses
    its first. Then every link (files included) joins its parent's path in Spark.
    Links under unreachable parents are dropped. For readers of a whole snapshot
    (rollback's check, feed dumps, change listings); translate resolves the paths of the
    changed fids only (:func:`epochsync.stages.translate.entries.plan_entries`).
    """
    from pyspark.sql import functions as F

    spark = snapshot.sparkSession
    links = snapshot.select("fid", "type", F.explode("links").alias("l")).select(
        "fid", "type", F.col("l.pfid").alias("pfid"), F.col("l.name").alias("name")
    )
    dir_links = [(r["fid"], r["pfid"], r["name"]) for r in links.filter(F.col("type") == DIR).collect()]
    paths = directory_paths(dir_links, root_fid, max_depth=max_depth)
    parents = spark.createDataFrame([(f, p) for f, p in paths.items() if p is not None], "pfid string, ppath string")
    return links.join(F.broadcast(parents), "pfid").select(
        "fid",
        "pfid",
        "name",
        F.when(F.col("ppath") == "", F.col("name")).otherwise(F.concat_ws("/", "ppath", "name")).alias("path"),
    )


def directory_paths(dir_links, root_fid: str, *, max_depth: int = 4096) -> dict[str, str | None]:
    """fid → replica path of every directory, from its links ``(fid, pfid, name)`` (the
    root is ``""``; None for one under no reachable parent). A directory with several
    links uses its first; the walk up is depth-bounded so hostile cycles cannot loop."""
    parent: dict[str, tuple[str, str]] = {}
    for fid, pfid, name in dir_links:
        if fid not in parent or (pfid, name) < parent[fid]:
            parent[fid] = (pfid, name)
    paths: dict[str, str | None] = {root_fid: ""}
    for fid in parent:
        chain: list[str] = []
        cur = fid
        while cur not in paths and cur in parent and len(chain) <= max_depth:
            chain.append(cur)
            cur = parent[cur][0]
            if cur in chain:
                break
        base = paths.get(cur) if cur not in chain else None
        for f in reversed(chain):
            if base is None:
                paths[f] = None
                continue
            name = parent[f][1]
            base = name if base == "" else f"{base}/{name}"
            paths[f] = base
    return paths


def visible(links_df, fileset):
    """Links inside the fileset's subtrees (all of them without a fileset)."""
    from pyspark.sql import functions as F

    if not fileset or any(not sub.strip("/") for sub in fileset):
        return links_df
    cond = None
    for sub in fileset:
        s = sub.strip("/")
        c = (F.col("path") == s) | F.col("path").startswith(s + "/")
        cond = c if cond is None else (cond | c)
    return links_df.filter(cond)
