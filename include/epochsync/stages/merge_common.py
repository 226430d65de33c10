"""What the merge's two engines share: the record types each rule reads and the cookie groups'
Arrow schema (:mod:`epochsync.stages.merge`, Spark; :mod:`epochsync.stages.merge_rules`, this
process). A module of its own so that neither engine imports the other's module."""

from __future__ import annotations

#: record types that create ``tfid`` (MKNOD: the type comes from the mode's type bits)
CREATORS = ("CREAT", "MKDIR", "SLINK", "MKNOD")
#: types that add a name to ``tfid`` / remove one
LINK_ADDERS = (*CREATORS, "HLINK")
LINK_REMOVERS = ("UNLNK", "RMDIR")
TIME_TYPES = {"atime_ns": "ATIME", "mtime_ns": "MTIME", "ctime_ns": "CTIME"}
#: non-WRITE types that set the times they carry
TIME_SETTERS = (*CREATORS, "SATTR", "TRUNC", "MTIME", "CTIME", "ATIME")
#: attributes compared for ``attrs_changed``
ATTR_COLUMNS = ("mode", "uid", "gid", "atime_ns", "mtime_ns", "ctime_ns")
#: types that set the size
SIZE_SETTERS = ("TRUNC", "SATTR")
#: every type the merge reads; the rest (EPOCH, MARK, OPEN, HSM, ...) do not change the replica
MERGED_TYPES = (
    *CREATORS,
    "HLINK",
    "UNLNK",
    "RMDIR",
    "RENME",
    "CLOSE",
    "LYOUT",
    "TRUNC",
    "SATTR",
    "XATTR",
    "MTIME",
    "CTIME",
    "ATIME",
    "WRITE",
)
S_IFMT = 0o170000


def cookie_arrow_schema():
    """The Arrow schema of the cookie groups table (``merge.COOKIE_FIELDS``, in order)."""
    import pyarrow as pa

    strings = pa.list_(pa.field("element", pa.string()))
    return pa.schema(
        [
            ("cookie", pa.string()),
            ("servers", strings),
            ("fids", strings),
            ("types", strings),
            ("records", pa.int64()),
            ("first_epoch", pa.int64()),
            ("last_epoch", pa.int64()),
            ("first_time_ns", pa.int64()),
            ("last_time_ns", pa.int64()),
        ]
    )
