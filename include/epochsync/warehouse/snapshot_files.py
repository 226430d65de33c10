"""How a snapshot is stored: files partitioned by fid, shared between epochs, one delta per epoch.

A snapshot ``snapshots/target=T/epoch=E/`` is a folder of Parquet files and a
``_snapshot.json`` naming them (:class:`SnapshotLayout`):

- **base files** ``base-<G>-b<K>.parquet``: every fid's row as of epoch ``G`` (the last
  compaction), in bucket ``K`` of ``buckets`` (:func:`bucket_of`: CRC-32 of the fid's UTF-8
  bytes modulo a power of two), sorted by fid;
- **delta files** ``delta-<G>-b<K>.parquet``: the rows epoch ``G``'s merge wrote, one per fid
  a record named (its row at ``G``) or a tombstone (``_deleted``: the fid is gone).

Every file has the snapshot columns plus ``_gen`` (the epoch that wrote the row) and
``_deleted``. A fid's row at E is its row of the highest ``_gen``; a tombstone there means
absent. Snapshot E holds hard links to the files of E-1 plus its own delta, so a merge
writes the rows of the fids its records name and nothing else; when the deltas hold more
than :data:`COMPACT_RATIO` of the base's rows (or :data:`MAX_DELTAS` files per bucket),
the merge writes a new base instead (compaction, once every so many epochs). Removing an
old epoch's folder removes its links only: files still linked from newer epochs stay.

Reading the rows of some fids (:meth:`SnapshotFiles.rows`) opens only the files of their
buckets, and their base files only for the fids the deltas do not hold (the fids an
epoch's merge wrote are read from its delta alone); the directories
(:meth:`SnapshotFiles.directories`, what path resolution needs) and the links under given
directories (:meth:`SnapshotFiles.linked_under`) are column scans. All of this runs in the caller with pyarrow (no Spark job: a lookup of a few
thousand rows is milliseconds here and a Spark job's fixed cost is 0.1-0.3 s);
:func:`epochsync.warehouse.snapshots.read_snapshot` reads a whole snapshot on Spark.

A folder without ``_snapshot.json`` (written before this layout, or by a test) is one
base file set of generation -1 in one bucket: still readable, and the next merge links it.
"""

from __future__ import annotations

import json
import os
import uuid
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from epochsync.core.arrow import array, combine, dataset_module, empty_table, scalar
from epochsync.core.errors import EpochError
from epochsync.core.model import DIR, SNAPSHOT_FIELDS

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

#: the file naming a snapshot's files (Spark and pyarrow skip names starting with "_")
LAYOUT_FILE = "_snapshot.json"
LAYOUT_VERSION = 2
#: storage columns beside the snapshot's
GEN, DELETED = "_gen", "_deleted"
#: rows per bucket a compaction aims at (buckets double as the namespace grows)
BUCKET_ROWS = 65_536
#: deltas above this share of the base's rows are compacted into a new base
COMPACT_RATIO = 0.25
#: at most this many deltas on one base
MAX_DELTAS = 32


def buckets_for(rows: int) -> int:
    """Returns the bucket count for ``rows`` rows: the least power of two giving at most :data:`BUCKET_ROWS` a bucket."""
    n = 1
    while n * BUCKET_ROWS < rows:
        n *= 2
    return n


def bucket_of(fid: str, buckets: int) -> int:
    """Returns the bucket of ``fid`` among ``buckets`` (a power of two); Spark's :func:`bucket_sql` computes the same."""
    return zlib.crc32(fid.encode("utf-8", "surrogatepass")) % buckets


def bucket_sql(buckets: int, column: str = "fid") -> str:
    """The Spark SQL expression of :func:`bucket_of`."""
    return f"CAST(pmod(crc32(CAST({column} AS binary)), {buckets}) AS int)"


def snapshot_arrow_schema() -> pa.Schema:
    """Returns the Arrow schema of snapshot rows (every field nullable, as Spark writes them;
    :func:`epochsync.core.model.snapshot_arrow_schema`, built without pyspark)."""
    from epochsync.core.model import snapshot_arrow_schema as schema

    return schema()


def storage_arrow_schema() -> pa.Schema:
    """Returns the Arrow schema of a snapshot file: the snapshot columns, ``_gen`` and ``_deleted``."""
    import pyarrow as pa

    return snapshot_arrow_schema().append(pa.field(GEN, pa.int64())).append(pa.field(DELETED, pa.bool_()))


def storage_struct_type():
    """Returns the Spark schema of a snapshot file (:func:`storage_arrow_schema`)."""
    from pyspark.sql.types import BooleanType, LongType, StructField, StructType

    from epochsync.core.model import snapshot_struct_type
    from epochsync.warehouse.tables import nullable_type

    fields = list(nullable_type(snapshot_struct_type()).fields)
    return StructType([*fields, StructField(GEN, LongType()), StructField(DELETED, BooleanType())])


# --------------------------------------------------------------------------- the layout


@dataclass
class SnapshotLayout:
    """The files of one snapshot: ``files`` are dicts ``{name, kind (base|delta), gen, bucket, rows}``."""

    epoch: int
    buckets: int
    rows: int
    files: list[dict] = field(default_factory=list)
    legacy: bool = False

    @property
    def base_rows(self) -> int:
        """Returns the rows of the base files."""
        return sum(f["rows"] for f in self.files if f["kind"] == "base")

    @property
    def delta_rows(self) -> int:
        """Returns the rows of the delta files (tombstones included)."""
        return sum(f["rows"] for f in self.files if f["kind"] == "delta")

    @property
    def has_deltas(self) -> bool:
        """Returns whether a fid may have several rows (a reader must keep the newest)."""
        return any(f["kind"] == "delta" for f in self.files)

    def files_of(self, bucket: int | None = None) -> list[dict]:
        """Returns the files of ``bucket`` (all of them for None), newest generation first."""
        fs = [f for f in self.files if bucket is None or f["bucket"] == bucket]
        return sorted(fs, key=lambda f: -f["gen"])

    def add(self, folder: str, name: str, table: pa.Table, *, kind: str, bucket: int) -> None:
        """Write ``table`` (storage rows of this layout's epoch) sorted by fid as ``folder/name``, one of its files."""
        import pyarrow.compute as pc

        table = table.take(pc.sort_indices(table, sort_keys=[("fid", "ascending")]))
        _write_parquet(table, os.path.join(folder, name))
        self.files.append({"name": name, "kind": kind, "gen": self.epoch, "bucket": bucket, "rows": table.num_rows})

    def save(self, folder: str) -> None:
        """Write ``_snapshot.json`` into ``folder``."""
        with open(os.path.join(folder, LAYOUT_FILE), "w", encoding="utf-8") as fh:
            json.dump(self.to_json(), fh, indent=1)

    def to_json(self) -> dict:
        """Returns the ``_snapshot.json`` document of this layout."""
        return {
            "version": LAYOUT_VERSION,
            "epoch": self.epoch,
            "buckets": self.buckets,
            "rows": self.rows,
            "files": sorted(self.files, key=lambda f: (f["kind"], f["gen"], f["bucket"], f["name"])),
        }


def read_layout(uri: str) -> SnapshotLayout | None:
    """The layout of the snapshot folder ``uri``; None when there is no such folder."""
    from epochsync.warehouse.paths import local_path

    path = local_path(uri)
    if not os.path.isdir(path):
        return None
    doc_path = os.path.join(path, LAYOUT_FILE)
    if os.path.exists(doc_path):
        with open(doc_path, encoding="utf-8") as f:
            doc = json.load(f)
        epoch = int(doc["epoch"])
        return SnapshotLayout(epoch, int(doc["buckets"]), int(doc["rows"]), list(doc["files"]))
    # a plain Parquet table (written before this layout, or by a test): one base in one bucket
    import pyarrow.parquet as pq

    files = []
    for name in sorted(os.listdir(path)):
        if name.endswith(".parquet") and not name.startswith(("_", ".")):
            rows = pq.ParquetFile(os.path.join(path, name)).metadata.num_rows
            files.append({"name": name, "kind": "base", "gen": -1, "bucket": 0, "rows": rows})
    return SnapshotLayout(-1, 1, sum(f["rows"] for f in files), files, legacy=True)


# --------------------------------------------------------------------------- reading (pyarrow)


def missing_snapshot(target: str, epoch: int, uri: str) -> EpochError:
    """Returns the error for a snapshot that should be there and is not: it says what to run."""
    return EpochError(
        f"no snapshot of target {target!r} at epoch {epoch} ({uri}): merge epoch {epoch} first "
        f"(epochsync replicate --config FILE --target {target} --epoch {epoch}) or hydrate the target"
    )


def root_row(root_fid: str) -> dict:
    """Returns the snapshot row of the root of an empty target (epoch 0)."""
    import stat

    row: dict[str, Any] = {f: None for f in SNAPSHOT_FIELDS}
    row.update(fid=root_fid, type=DIR, links=[], mode=stat.S_IFDIR | 0o755, uid=0, gid=0, size=0, xattrs=[], objects=[])
    return row


class SnapshotFiles:
    """Snapshot ``epoch`` of a target, read in this process with pyarrow (see the module doc).

    Epoch 0 without a folder is the root alone. A missing snapshot above 0 raises the
    ``EpochError`` of :func:`epochsync.warehouse.snapshots.missing_snapshot`.
    """

    def __init__(self, uri: str, epoch: int, root_fid: str, *, target: str = ""):
        self.uri, self.epoch, self.root_fid = uri, epoch, root_fid
        self.layout = read_layout(uri)
        if self.layout is None and epoch != 0:
            raise missing_snapshot(target, epoch, uri)

    @property
    def rows_count(self) -> int:
        """Returns the number of fids in the snapshot."""
        return 1 if self.layout is None else self.layout.rows

    def _path(self, name: str) -> str:
        from epochsync.warehouse.paths import local_path

        return os.path.join(local_path(self.uri), name)

    def _read(self, files: list[dict], *, filter=None, columns: list[str] | None = None) -> pa.Table:
        """The live rows of ``files`` matching ``filter``, the newest of each fid.

        ``filter`` must test columns a fid's rows all agree on (``fid``, ``type``): it is
        applied to each file before the newest row is chosen. The deltas are small: their
        rows (tombstones included) are read, the newest of each fid kept, and the base's
        rows of those fids dropped (no sort of the base).
        """
        import pyarrow as pa
        import pyarrow.compute as pc

        schema = storage_arrow_schema()
        cols = list(dict.fromkeys(["fid", *(columns or SNAPSHOT_FIELDS)]))
        if self.layout is None:  # epoch 0: the root alone
            table = pa.Table.from_pylist([{**root_row(self.root_fid), GEN: 0, DELETED: False}], schema)
            if filter is not None:
                table = table.filter(filter)
            return table.select(cols)
        deltas = [f for f in files if f["kind"] == "delta"]
        bases = [f for f in files if f["kind"] != "delta"]
        live = self._read_files(bases, filter, cols)
        if not deltas:
            return live
        tombstone = pc.field(DELETED) == scalar(True)
        newer = newest_rows(
            self._read_files(deltas, None if filter is None else filter | tombstone, [*cols, GEN, DELETED])
        )
        live = live.filter(pc.invert(pc.is_in(live["fid"], value_set=combine(newer["fid"]))))
        newer = newer.filter(pc.invert(pc.fill_null(newer[DELETED], scalar(False)))).select(cols)
        return pa.concat_tables([live, newer])

    def _read_files(self, files: list[dict], filter, cols: list[str]) -> pa.Table:
        import pyarrow as pa

        ds = dataset_module()

        schema = storage_arrow_schema()
        target = pa.schema([schema.field(c) for c in cols])
        parts = []
        for f in files:
            dataset = ds.dataset(self._path(f["name"]), format="parquet")
            present = [c for c in cols if c in dataset.schema.names]
            t = dataset.to_table(columns=present, filter=filter)
            for c in cols:  # a legacy file has neither _gen nor _deleted
                if c not in t.column_names:
                    value = f["gen"] if c == GEN else False
                    t = t.append_column(c, array([value] * t.num_rows, schema.field(c).type))
            t = t.select(cols)
            parts.append(t if t.schema == target else t.cast(target))
        return pa.concat_tables(parts) if parts else empty_table(target)

    def rows(self, fids: Iterable[str], columns: list[str] | None = None) -> pa.Table:
        """The rows of ``fids`` (those the snapshot holds), snapshot columns, in no order; reads only their buckets."""
        import pyarrow as pa
        import pyarrow.compute as pc

        wanted = sorted(set(fids))
        if not wanted:
            return empty_table(storage_arrow_schema()).select(
                list(dict.fromkeys(["fid", *(columns or SNAPSHOT_FIELDS)]))
            )
        value_set = array(wanted, pa.string())
        cond = pc.field("fid").isin(value_set)
        if self.layout is None:
            return self._read([], filter=cond, columns=columns)
        buckets = {bucket_of(f, self.layout.buckets) for f in wanted}
        files = [f for f in self.layout.files if f["bucket"] in buckets]
        deltas = [f for f in files if f["kind"] == "delta"]
        if not deltas:
            return self._read(files, filter=cond, columns=columns)
        # the deltas first: a fid they hold (a row or a tombstone) needs nothing from the base,
        # and the fids an epoch's merge just wrote (translate's new side) are all there, so the
        # base (every fid's row: the namespace) is read only for the others, in their buckets
        cols = list(dict.fromkeys(["fid", *(columns or SNAPSHOT_FIELDS)]))
        newer = newest_rows(self._read_files(deltas, cond, [*cols, GEN, DELETED]))
        rest = sorted(set(wanted) - set(combine(newer["fid"]).to_pylist()))
        live = newer.filter(pc.invert(pc.fill_null(newer[DELETED], scalar(False)))).select(cols)
        if not rest:
            return live
        rest_buckets = {bucket_of(f, self.layout.buckets) for f in rest}
        bases = [f for f in files if f["kind"] != "delta" and f["bucket"] in rest_buckets]
        base = self._read_files(bases, pc.field("fid").isin(array(rest, pa.string())), cols)
        return pa.concat_tables([base, live])

    def scan(self, filter=None, columns: list[str] | None = None) -> pa.Table:
        """Every row matching ``filter`` (a pyarrow expression; None: all), the given columns."""
        return self._read([] if self.layout is None else self.layout.files, filter=filter, columns=columns)

    def directories(self) -> pa.Table:
        """``fid, links`` of every directory (path resolution's input)."""
        import pyarrow.compute as pc

        return self.scan(pc.field("type") == scalar(DIR), ["fid", "links"])

    def linked_under(self, parents: Iterable[str]) -> list[str]:
        """Returns the fids with a link whose parent is one of ``parents`` (a column scan of ``links``)."""

        parents = sorted(set(parents))
        if not parents:
            return []
        return _linked_under(self.scan(None, ["fid", "links"]), parents)


def newest_rows(table: pa.Table) -> pa.Table:
    """Each fid's row of the highest ``_gen`` (``table`` has ``fid`` and ``_gen``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    order = pc.sort_indices(table, sort_keys=[("fid", "ascending"), (GEN, "descending")])
    table = table.take(order)
    fid = combine(table["fid"])
    if len(fid) < 2:
        return table
    first = pc.not_equal(fid.slice(1), fid.slice(0, len(fid) - 1))
    keep = pa.concat_arrays([array([True], pa.bool_()), pc.fill_null(first, scalar(True))])
    return table.filter(keep)


# --------------------------------------------------------------------------- writing (pyarrow)


def _write_parquet(table: pa.Table, path: str) -> None:
    import pyarrow.parquet as pq

    pq.write_table(table, path, compression="snappy")


def link_or_copy(src: str, dst: str) -> None:
    """Hard-link ``src`` at ``dst`` (the same file in two snapshots), or copy it where links fail."""
    try:
        os.link(src, dst)
    except OSError:  # a file system without hard links
        import shutil

        shutil.copyfile(src, dst)


@dataclass
class StagedSnapshot:
    """A snapshot written beside its place (:func:`stage_delta`): :meth:`publish` moves it there."""

    uri: str
    tmp: str
    layout: SnapshotLayout

    def publish(self) -> SnapshotLayout:
        """Move the snapshot into place (replacing what was there, atomically); returns its layout."""
        from epochsync.warehouse import fs as warehouse_fs

        warehouse_fs.move_replacing(self.tmp, self.uri)
        return self.layout

    def discard(self) -> None:
        """Remove what is left of the staged folder (nothing after :meth:`publish`)."""
        from epochsync.warehouse import fs as warehouse_fs

        warehouse_fs.delete(self.tmp)


def compaction_due(prev: SnapshotFiles, delta_rows: int, live_rows: int) -> bool:
    """Whether snapshot E should be a new base rather than ``prev``'s files plus a delta of ``delta_rows``."""
    layout = prev.layout
    if layout is None or layout.legacy or buckets_for(live_rows) > layout.buckets:
        return True
    deltas = len({f["gen"] for f in layout.files if f["kind"] == "delta"}) + (1 if delta_rows else 0)
    return layout.delta_rows + delta_rows > COMPACT_RATIO * max(layout.base_rows, 1) or deltas > MAX_DELTAS


def stage_delta(uri: str, epoch: int, prev: SnapshotFiles, delta: pa.Table) -> StagedSnapshot:
    """Write snapshot ``epoch`` beside ``uri``: ``prev``'s files plus ``delta`` (storage rows of
    this epoch: the rows of the fids the merge touched, tombstones for those gone), or a new
    base when :func:`compaction_due`. :meth:`StagedSnapshot.publish` puts it in place."""
    import pyarrow.compute as pc

    from epochsync.warehouse import fs as warehouse_fs
    from epochsync.warehouse.paths import local_path

    schema = storage_arrow_schema()
    delta = delta.select(schema.names).cast(schema)
    born = int(pc.sum(pc.invert(pc.fill_null(delta[DELETED], scalar(False)))).as_py() or 0)
    if prev.layout is None:  # epoch 0: the root row is the base
        import pyarrow as pa

        root = pa.Table.from_pylist([{**root_row(prev.root_fid), GEN: 0, DELETED: False}], schema)
        prev_files, buckets = [], 1
        base_tables = [root]
    else:
        prev_files, buckets = prev.layout.files, prev.layout.buckets
        base_tables = []
    delta = delta.set_column(delta.column_names.index(GEN), GEN, _const(epoch, delta.num_rows))
    # fids at E: those at E-1, less those the delta names, plus the delta's live rows
    had = prev.rows(delta["fid"].to_pylist(), ["fid"]).num_rows if delta.num_rows else 0
    rows = prev.rows_count - had + born
    compact = compaction_due(prev, delta.num_rows, rows)
    dst = local_path(uri)
    tmp = f"{dst.rstrip('/')}.tmp-{uuid.uuid4().hex[:12]}"
    os.makedirs(tmp)
    try:
        if compact:
            new_buckets = max(buckets, buckets_for(rows))
            layout = SnapshotLayout(epoch, new_buckets, rows)
            delta_buckets = _bucket_ids(delta["fid"], buckets)
            for b in range(buckets):
                # one old bucket at a time (memory is bounded by a bucket): a fid of new bucket
                # nb was in old bucket nb % buckets, the bucket counts being powers of two
                old = prev._read(prev.layout.files_of(b)) if prev.layout else None
                table = _with_storage([t for t in (*base_tables, old) if t is not None], schema)
                mine = delta.filter(pc.equal(delta_buckets, scalar(b)))
                merged = newest_rows(_concat([table, mine], schema))
                merged = merged.filter(pc.invert(pc.fill_null(merged[DELETED], scalar(False))))
                merged = merged.set_column(merged.column_names.index(GEN), GEN, _const(epoch, merged.num_rows))
                ids = _bucket_ids(merged["fid"], new_buckets)
                for nb in range(b, new_buckets, buckets):
                    part = merged.filter(pc.equal(ids, scalar(nb)))
                    if part.num_rows:
                        layout.add(tmp, f"base-{epoch}-b{nb}.parquet", part, kind="base", bucket=nb)
                base_tables = []
        else:
            layout = SnapshotLayout(epoch, buckets, rows)
            src = local_path(prev.uri)
            for f in prev_files:
                link_or_copy(os.path.join(src, f["name"]), os.path.join(tmp, f["name"]))
                layout.files.append(dict(f))
            ids = _bucket_ids(delta["fid"], buckets)
            for b in range(buckets):
                part = delta.filter(pc.equal(ids, scalar(b)))
                if part.num_rows:
                    layout.add(tmp, f"delta-{epoch}-b{b}.parquet", part, kind="delta", bucket=b)
        layout.save(tmp)
    except BaseException:
        warehouse_fs.delete(tmp)
        raise
    return StagedSnapshot(uri, tmp, layout)


def _const(value: int, n: int):
    import pyarrow as pa

    return array([value] * n, pa.int64())


def _bucket_ids(fids, buckets: int):
    import pyarrow as pa

    if buckets == 1:
        return array([0] * len(fids), pa.int32())
    return array([bucket_of(f, buckets) for f in fids.to_pylist()], pa.int32())


def _concat(tables: list, schema):
    import pyarrow as pa

    tables = [t for t in tables if t is not None]
    if not tables:
        return empty_table(schema)
    return pa.concat_tables([t.select(schema.names).cast(schema) for t in tables])


def _with_storage(tables: list, schema):
    """Snapshot rows (with or without storage columns) as storage rows."""

    out = []
    for t in tables:
        for c, default in ((GEN, -1), (DELETED, False)):
            if c not in t.column_names:
                t = t.append_column(c, array([default] * t.num_rows, schema.field(c).type))
        out.append(t)
    return _concat(out, schema)


class SnapshotTable:
    """A snapshot held in memory (an Arrow table of snapshot rows) with the lookups of
    :class:`SnapshotFiles`: what tests and callers with rows in hand pass where a
    warehouse snapshot is read."""

    def __init__(self, table: pa.Table, root_fid: str):
        self.table = table.select(list(SNAPSHOT_FIELDS)).cast(snapshot_arrow_schema())
        self.root_fid = root_fid

    @property
    def rows_count(self) -> int:
        """Returns the number of fids in the snapshot."""
        return self.table.num_rows

    def rows(self, fids: Iterable[str], columns: list[str] | None = None) -> pa.Table:
        """The rows of ``fids`` (:meth:`SnapshotFiles.rows`)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        cols = list(dict.fromkeys(["fid", *(columns or SNAPSHOT_FIELDS)]))
        wanted = array(sorted(set(fids)), pa.string())
        return self.table.filter(pc.is_in(self.table["fid"], value_set=wanted)).select(cols)

    def scan(self, filter=None, columns: list[str] | None = None) -> pa.Table:
        """Every row matching ``filter`` (:meth:`SnapshotFiles.scan`)."""
        cols = list(dict.fromkeys(["fid", *(columns or SNAPSHOT_FIELDS)]))
        table = self.table if filter is None else self.table.filter(filter)
        return table.select(cols)

    def directories(self) -> pa.Table:
        """``fid, links`` of every directory (:meth:`SnapshotFiles.directories`)."""
        import pyarrow.compute as pc

        return self.scan(pc.field("type") == scalar(DIR), ["fid", "links"])

    def linked_under(self, parents: Iterable[str]) -> list[str]:
        """Returns the fids linked under ``parents`` (:meth:`SnapshotFiles.linked_under`)."""
        return _linked_under(self.scan(None, ["fid", "links"]), parents)


def _linked_under(table: pa.Table, parents: Iterable[str]) -> list[str]:
    import pyarrow as pa
    import pyarrow.compute as pc

    parents = sorted(set(parents))
    if not parents or not table.num_rows:
        return []
    links = combine(table["links"])
    pfids = pc.struct_field(pc.list_flatten(links), "pfid")
    hit = pc.is_in(pfids, value_set=array(parents, pa.string()))
    owner = pc.list_parent_indices(links)
    rows = pc.unique(pc.filter(owner, hit))
    return sorted(set(pc.take(table["fid"], rows).to_pylist()))


def snapshot_view(snapshot, root_fid: str):
    """``snapshot`` with the lookups of :class:`SnapshotFiles`: itself when it has them, else an
    Arrow table or a Spark DataFrame of snapshot rows wrapped in a :class:`SnapshotTable`."""
    import pyarrow as pa

    if isinstance(snapshot, (SnapshotFiles, SnapshotTable)):
        return snapshot
    if not isinstance(snapshot, pa.Table):  # a Spark DataFrame
        snapshot = snapshot.toArrow()
    return SnapshotTable(snapshot, root_fid)
