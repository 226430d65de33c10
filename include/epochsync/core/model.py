"""Tables between stages: the namespace snapshot and the net change set.

Defined once here (Spark ``StructType``s plus the Python field lists); the merge
writes them, translate/apply/verify read them, the oracle produces the same
snapshot rows from a sequential replay so tests can compare whole tables.
"""

from __future__ import annotations

#: Snapshot ``type`` values.
FILE, DIR, SYMLINK, OTHER = "file", "dir", "symlink", "other"
NODE_TYPES = (FILE, DIR, SYMLINK, OTHER)

#: Snapshot columns, in order. One row per fid the target holds at a committed epoch.
#:
#: - ``links``: sorted array of (pfid, name): every name of the fid (hard links).
#:   The root has no links. A fid exists iff it has a link or is the root.
#: - ``xattrs``: array of (name, value) sorted by name.
#: - ``objects``: the latest known version of each stripe object at this epoch
#:   (from ``WRITE`` records), so a whole-file pull reads the frozen state.
SNAPSHOT_FIELDS = (
    "fid",
    "type",
    "links",
    "mode",
    "uid",
    "gid",
    "size",
    "atime_ns",
    "mtime_ns",
    "ctime_ns",
    "xattrs",
    "symlink",
    "layout",
    "objects",
)

#: Net change set columns, in order. One row per fid that changed in the epoch
#: (or window). Values after the change are in snapshot E, before in snapshot E-1.
#:
#: - ``created``: absent at E-1, present at E.  ``deleted``: present at E-1, absent at E.
#: - ``links_changed``: the set of (pfid, name) differs (moves, renames, hard links).
#:   Descendants of a renamed directory are NOT flagged: translate derives their new
#:   paths by comparing resolved paths in the two snapshots.
#: - ``attrs_changed``: mode/uid/gid/times differ.  ``xattrs_changed``: any xattr differs.
#: - ``data_changed``: some bytes may differ; ``whole_file`` when extents are unknown
#:   (Lustre text, Gluster D records, LYOUT) or the file is new without extents.
#: - ``ranges``: disjoint, sorted, non-adjacent file-offset intervals, clipped to
#:   ``new_size``, including the truncate rule (size went below its E-1 value at any
#:   point → [min size, new_size) changed too). Empty when only the size changed.
CHANGE_FIELDS = (
    "fid",
    "type",
    "created",
    "deleted",
    "links_changed",
    "attrs_changed",
    "xattrs_changed",
    "data_changed",
    "whole_file",
    "ranges",
    "old_size",
    "new_size",
)


def snapshot_struct_type():
    """Returns the Spark schema of a snapshot row (:data:`SNAPSHOT_FIELDS`, in that order)."""
    from pyspark.sql.types import ArrayType, BinaryType, LongType, StringType, StructField, StructType

    from epochsync.core.schema import record_struct_type

    rec = {f.name: f.dataType for f in record_struct_type().fields}
    link = StructType([StructField("pfid", StringType(), False), StructField("name", StringType(), False)])
    xattr = StructType([StructField("name", StringType(), False), StructField("value", BinaryType())])
    types = {
        "fid": StringType(),
        "type": StringType(),
        "links": ArrayType(link, False),
        "mode": LongType(),
        "uid": LongType(),
        "gid": LongType(),
        "size": LongType(),
        "atime_ns": LongType(),
        "mtime_ns": LongType(),
        "ctime_ns": LongType(),
        "xattrs": ArrayType(xattr, False),
        "symlink": StringType(),
        "layout": rec["layout"],
        "objects": rec["object"] and ArrayType(rec["object"], False),
    }
    not_null = {"fid", "type", "links", "xattrs"}
    return StructType([StructField(n, types[n], n not in not_null) for n in SNAPSHOT_FIELDS])


def change_arrow_schema():
    """The Arrow schema of change-set rows as the merge writes them (every field nullable): what
    pyspark's ``to_arrow_schema`` makes of ``nullable_type(change_struct_type())``, built without
    importing pyspark (which imports pandas: half a second an epoch that needs no Spark pays)."""
    import pyarrow as pa

    extent = pa.struct([pa.field("offset", pa.int64()), pa.field("length", pa.int64())])
    types = {
        "fid": pa.string(),
        "type": pa.string(),
        "ranges": pa.list_(pa.field("element", extent)),
        "old_size": pa.int64(),
        "new_size": pa.int64(),
    }
    return pa.schema([pa.field(n, types.get(n, pa.bool_())) for n in CHANGE_FIELDS])


def snapshot_arrow_schema():
    """The Arrow schema of snapshot rows (every field nullable, as Spark writes them): what
    ``to_arrow_schema(nullable_type(snapshot_struct_type()))`` gives, without pyspark."""
    import pyarrow as pa

    from epochsync.core.schema import record_arrow_schema

    rec = record_arrow_schema()

    def pairs(a, b, tb):
        return pa.list_(pa.field("element", pa.struct([pa.field(a, pa.string()), pa.field(b, tb)])))

    types = {
        "fid": pa.string(),
        "type": pa.string(),
        "links": pairs("pfid", "name", pa.string()),
        "xattrs": pairs("name", "value", pa.binary()),
        "symlink": pa.string(),
        "layout": rec.field("layout").type,
        "objects": pa.list_(pa.field("element", rec.field("object").type)),
    }
    return pa.schema([pa.field(n, types.get(n, pa.int64())) for n in SNAPSHOT_FIELDS])


def change_struct_type():
    """Returns the Spark schema of a change-set row (:data:`CHANGE_FIELDS`, in that order)."""
    from pyspark.sql.types import ArrayType, BooleanType, LongType, StringType, StructField, StructType

    extent = StructType([StructField("offset", LongType(), False), StructField("length", LongType(), False)])
    types = {
        "fid": StringType(),
        "type": StringType(),
        "created": BooleanType(),
        "deleted": BooleanType(),
        "links_changed": BooleanType(),
        "attrs_changed": BooleanType(),
        "xattrs_changed": BooleanType(),
        "data_changed": BooleanType(),
        "whole_file": BooleanType(),
        "ranges": ArrayType(extent, False),
        "old_size": LongType(),
        "new_size": LongType(),
    }
    nullable = {"old_size", "new_size", "type"}
    return StructType([StructField(n, types[n], n in nullable) for n in CHANGE_FIELDS])
