"""The canonical changelog record (DESIGN section 3), defined once.

Every importer produces :class:`Record` values; every Spark stage reads the same
fields through :func:`record_struct_type`. JSON Lines is the on-disk form for
humans (``xattr_value`` is base64 there, null fields may be left out), Parquet the
form in the warehouse.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import operator
from collections.abc import Iterable
from dataclasses import dataclass
from typing import IO, Any

from epochsync.core.errors import RecordError

#: Lustre changelog type numbers (formats.md). The canonical record keeps names.
LUSTRE_TYPES: dict[int, str] = {
    0: "MARK",
    1: "CREAT",
    2: "MKDIR",
    3: "HLINK",
    4: "SLINK",
    5: "MKNOD",
    6: "UNLNK",
    7: "RMDIR",
    8: "RENME",
    9: "RNMTO",
    10: "OPEN",
    11: "CLOSE",
    12: "LYOUT",
    13: "TRUNC",
    14: "SATTR",
    15: "XATTR",
    16: "HSM",
    17: "MTIME",
    18: "CTIME",
    19: "ATIME",
    20: "MIGRT",
    21: "FLRW",
    22: "RESYNC",
    23: "GXATR",
    24: "NOPEN",
}

#: Types replication acts on.
REPLICATED_TYPES = frozenset(
    "CREAT MKDIR HLINK SLINK MKNOD UNLNK RMDIR RENME OPEN CLOSE LYOUT TRUNC SATTR XATTR "
    "MTIME CTIME ATIME WRITE EPOCH MARK".split()
)
#: Every type a canonical record may carry (the rest are kept and ignored).
RECORD_TYPES = REPLICATED_TYPES | frozenset(LUSTRE_TYPES.values())

#: Types whose ``name`` is a new directory entry (a basename that must be safe).
NAMING_TYPES = frozenset({"CREAT", "MKDIR", "HLINK", "SLINK", "MKNOD", "RENME"})
#: Types whose ``name`` removes an entry.
UNNAMING_TYPES = frozenset({"UNLNK", "RMDIR"})

#: Lustre flag bits (formats.md).
FLAG_UNLINK_LAST = 0x1
FLAG_RENAME_OVERWROTE_LAST = 0x1


@dataclass(slots=True, frozen=True)
class LayoutObject:
    """One object of a file's layout: its OST and object id."""

    ost: str
    oid: str


@dataclass(slots=True, frozen=True)
class Layout:
    """RAID-0 layout: byte ``x`` is in stripe ``x // stripe_size``, object ``stripe % count``."""

    stripe_size: int
    stripe_count: int
    objects: tuple[LayoutObject, ...] = ()


@dataclass(slots=True, frozen=True)
class ObjectRef:
    """The stripe object an OST ``WRITE`` touched, with the store version after it and that
    version's length in bytes (``size``, when the writer knows it: what lets apply copy a
    changed file server-side from its pinned version, ``stages.translate``)."""

    ost: str
    oid: str
    version: str | None = None
    size: int | None = None


@dataclass(slots=True, frozen=True)
class Extent:
    """A byte range ``[offset, offset + length)`` a record says was written."""

    offset: int
    length: int


@dataclass(slots=True)
class Record:
    """Typed Python view of one canonical record. Field order is the schema's."""

    server: str
    index: int
    epoch: int
    type: str
    time_ns: int | None = None
    flags: int | None = None
    tfid: str | None = None
    pfid: str | None = None
    name: str | None = None
    sfid: str | None = None
    spfid: str | None = None
    sname: str | None = None
    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    size: int | None = None
    atime_ns: int | None = None
    mtime_ns: int | None = None
    ctime_ns: int | None = None
    xattr_name: str | None = None
    xattr_value: bytes | None = None
    symlink: str | None = None
    layout: Layout | None = None
    object: ObjectRef | None = None
    extents: tuple[Extent, ...] | None = None
    cookie: str | None = None
    jobid: str | None = None
    nid: str | None = None

    def to_dict(self, *, drop_nulls: bool = True) -> dict[str, Any]:
        """JSON-ready dict: bytes as base64, nested values as dicts and lists."""
        values = zip(FIELD_NAMES, _all_fields(self), strict=True)
        out: dict[str, Any] = {f: v for f, v in values if v is not None} if drop_nulls else dict(values)
        # the few fields that are not JSON as they are (in place: the keys keep the schema's order)
        v = self.xattr_value
        if v is not None:
            out["xattr_value"] = base64.b64encode(v).decode("ascii")
        lay = self.layout
        if lay is not None:
            out["layout"] = {
                "stripe_size": lay.stripe_size,
                "stripe_count": lay.stripe_count,
                "objects": [{"ost": o.ost, "oid": o.oid} for o in lay.objects],
            }
        obj = self.object
        if obj is not None:
            out["object"] = {"ost": obj.ost, "oid": obj.oid, "version": obj.version}
            if obj.size is not None:
                out["object"]["size"] = obj.size
        ext = self.extents
        if ext is not None:
            out["extents"] = [{"offset": e.offset, "length": e.length} for e in ext]
        return out

    def to_row(self) -> tuple:
        """Tuple in schema order for ``spark.createDataFrame(rows, record_struct_type())``."""
        d = self
        lay = None
        if d.layout is not None:
            lay = (
                d.layout.stripe_size,
                d.layout.stripe_count,
                [(o.ost, o.oid) for o in d.layout.objects],
            )
        obj = None if d.object is None else (d.object.ost, d.object.oid, d.object.version, d.object.size)
        ext = None if d.extents is None else [(e.offset, e.length) for e in d.extents]
        return (
            d.server,
            d.index,
            d.epoch,
            d.type,
            d.time_ns,
            d.flags,
            d.tfid,
            d.pfid,
            d.name,
            d.sfid,
            d.spfid,
            d.sname,
            d.mode,
            d.uid,
            d.gid,
            d.size,
            d.atime_ns,
            d.mtime_ns,
            d.ctime_ns,
            d.xattr_name,
            d.xattr_value,
            d.symlink,
            lay,
            obj,
            ext,
            d.cookie,
            d.jobid,
            d.nid,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Record:
        """Returns the record a JSON object holds, its keys and types checked.

        Raises :class:`RecordError` (no location; the caller adds file and line).
        """
        if not isinstance(data, dict):
            raise RecordError(f"expected a JSON object, got {type(data).__name__}")
        unknown = set(data) - _FIELD_SET
        if unknown:
            raise RecordError(f"unknown field(s) {', '.join(sorted(unknown))}")
        kwargs: dict[str, Any] = {}
        for name, value in data.items():
            if value is None:
                continue
            kwargs[name] = _decode_field(name, value)
        for required in ("server", "index", "epoch", "type"):
            if required not in kwargs:
                raise RecordError(f"missing required field {required!r}")
        return cls(**kwargs)

    def replace(self, **changes: Any) -> Record:
        """Returns a copy of the record with ``changes`` applied."""
        return dataclasses.replace(self, **changes)


FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Record))
#: every field's value of a record at once, in schema order (one call, not one getattr per field)
_all_fields = operator.attrgetter(*FIELD_NAMES)
_FIELD_SET = frozenset(FIELD_NAMES)

_INT_FIELDS = {
    "index",
    "epoch",
    "time_ns",
    "flags",
    "mode",
    "uid",
    "gid",
    "size",
    "atime_ns",
    "mtime_ns",
    "ctime_ns",
}
_STR_FIELDS = {
    "server",
    "type",
    "tfid",
    "pfid",
    "name",
    "sfid",
    "spfid",
    "sname",
    "xattr_name",
    "symlink",
    "cookie",
    "jobid",
    "nid",
}

INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1


def _int(name: str, value: Any, lo: int = -INT64_MAX - 1, hi: int = INT64_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RecordError(f"field {name!r} must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise RecordError(f"field {name!r} out of range: {value}")
    return value


def _str(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise RecordError(f"field {name!r} must be a string, got {value!r}")
    return value


def _decode_field(name: str, value: Any) -> Any:
    if name in _INT_FIELDS:
        if name in ("flags", "mode", "uid", "gid"):
            return _int(name, value, -(INT32_MAX + 1) if name == "flags" else 0, 2**32 - 1)
        return _int(name, value)
    if name in _STR_FIELDS:
        return _str(name, value)
    if name == "xattr_value":
        try:
            return base64.b64decode(_str(name, value), validate=True)
        except (ValueError, TypeError) as exc:
            raise RecordError(f"field 'xattr_value' is not valid base64: {exc}") from None
    if name == "layout":
        if not isinstance(value, dict):
            raise RecordError("field 'layout' must be an object")
        objs = value.get("objects") or []
        if not isinstance(objs, list):
            raise RecordError("field 'layout.objects' must be a list")
        return Layout(
            stripe_size=_int("layout.stripe_size", value.get("stripe_size"), 1),
            stripe_count=_int("layout.stripe_count", value.get("stripe_count"), 0, 65535),
            objects=tuple(
                LayoutObject(_str("layout.objects.ost", o.get("ost")), _str("layout.objects.oid", o.get("oid")))
                if isinstance(o, dict)
                else _raise(RecordError("field 'layout.objects' entries must be objects"))
                for o in objs
            ),
        )
    if name == "object":
        if not isinstance(value, dict):
            raise RecordError("field 'object' must be an object")
        version, size = value.get("version"), value.get("size")
        return ObjectRef(
            _str("object.ost", value.get("ost")),
            _str("object.oid", value.get("oid")),
            None if version is None else _str("object.version", version),
            None if size is None else _int("object.size", size, 0),
        )
    if name == "extents":
        if not isinstance(value, list):
            raise RecordError("field 'extents' must be a list")
        out = []
        for e in value:
            if not isinstance(e, dict):
                raise RecordError("field 'extents' entries must be objects")
            out.append(Extent(_int("extents.offset", e.get("offset"), 0), _int("extents.length", e.get("length"), 0)))
        return tuple(out)
    raise RecordError(f"unknown field {name!r}")  # pragma: no cover - guarded by caller


def _raise(exc: Exception) -> Any:
    raise exc


# --------------------------------------------------------------------------- JSON Lines


def record_to_json(record: Record) -> str:
    """Returns the record as one compact JSON line (no newline), null fields left out."""
    return json.dumps(record.to_dict(), separators=(",", ":"), ensure_ascii=False)


def write_jsonl(records: Iterable[Record], stream: IO[str]) -> int:
    """Write records one per line; returns how many."""
    n = 0
    for r in records:
        stream.write(record_to_json(r))
        stream.write("\n")
        n += 1
    return n


# --------------------------------------------------------------------------- Arrow and Spark


def record_arrow_schema():
    """The Arrow schema of a canonical record: what pyspark's ``to_arrow_schema`` makes of
    :func:`record_struct_type`, built without importing pyspark (and pandas, which it
    imports): an ingest small enough to run in this process needs neither."""
    import pyarrow as pa

    def struct(*fields):
        return pa.struct([pa.field(n, t, nullable=True) for n, t in fields])

    def array(t):
        return pa.list_(pa.field("element", t, nullable=True))

    layout = struct(
        ("stripe_size", pa.int64()),
        ("stripe_count", pa.int32()),
        ("objects", array(struct(("ost", pa.string()), ("oid", pa.string())))),
    )
    obj = struct(("ost", pa.string()), ("oid", pa.string()), ("version", pa.string()), ("size", pa.int64()))
    extent = struct(("offset", pa.int64()), ("length", pa.int64()))
    types = {
        "server": pa.string(),
        "index": pa.int64(),
        "epoch": pa.int64(),
        "type": pa.string(),
        "time_ns": pa.int64(),
        "flags": pa.int32(),
        "tfid": pa.string(),
        "pfid": pa.string(),
        "name": pa.string(),
        "sfid": pa.string(),
        "spfid": pa.string(),
        "sname": pa.string(),
        "mode": pa.int64(),
        "uid": pa.int64(),
        "gid": pa.int64(),
        "size": pa.int64(),
        "atime_ns": pa.int64(),
        "mtime_ns": pa.int64(),
        "ctime_ns": pa.int64(),
        "xattr_name": pa.string(),
        "xattr_value": pa.binary(),
        "symlink": pa.string(),
        "layout": layout,
        "object": obj,
        "extents": array(extent),
        "cookie": pa.string(),
        "jobid": pa.string(),
        "nid": pa.string(),
    }
    not_null = {"server", "index", "epoch", "type"}
    return pa.schema([pa.field(n, types[n], nullable=n not in not_null) for n in FIELD_NAMES])


def record_struct_type():
    """The Spark ``StructType`` of a canonical record (pyspark imported lazily)."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    layout = StructType(
        [
            StructField("stripe_size", LongType()),
            StructField("stripe_count", IntegerType()),
            StructField(
                "objects",
                ArrayType(StructType([StructField("ost", StringType()), StructField("oid", StringType())])),
            ),
        ]
    )
    obj = StructType(
        [
            StructField("ost", StringType()),
            StructField("oid", StringType()),
            StructField("version", StringType()),
            StructField("size", LongType()),
        ]
    )
    extent = StructType([StructField("offset", LongType()), StructField("length", LongType())])
    types = {
        "server": StringType(),
        "index": LongType(),
        "epoch": LongType(),
        "type": StringType(),
        "time_ns": LongType(),
        "flags": IntegerType(),
        "tfid": StringType(),
        "pfid": StringType(),
        "name": StringType(),
        "sfid": StringType(),
        "spfid": StringType(),
        "sname": StringType(),
        "mode": LongType(),
        "uid": LongType(),
        "gid": LongType(),
        "size": LongType(),
        "atime_ns": LongType(),
        "mtime_ns": LongType(),
        "ctime_ns": LongType(),
        "xattr_name": StringType(),
        "xattr_value": BinaryType(),
        "symlink": StringType(),
        "layout": layout,
        "object": obj,
        "extents": ArrayType(extent),
        "cookie": StringType(),
        "jobid": StringType(),
        "nid": StringType(),
    }
    not_null = {"server", "index", "epoch", "type"}
    return StructType([StructField(n, types[n], n not in not_null) for n in FIELD_NAMES])
