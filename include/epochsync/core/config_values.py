"""The vocabulary and the value types of the config file: the names a key may take (formats,
kinds, events), durations, sizes, times, names, paths and prefixes, each parsed and checked by
one function whose one-line wording is the error a person reads, and each with the constraint
that gives the published JSON Schema (:func:`epochsync.core.config.config_schema`).

The models of the file are in :mod:`epochsync.core.config`, which imports these types.
"""

from __future__ import annotations

import re
import typing
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    StringConstraints,
    ValidationInfo,
    WithJsonSchema,
)

FormatName = Literal["jsonl", "lustre", "gluster"]
EpochSource = Literal["records", "mark", "time"]
TargetKindName = Literal["s3", "posix", "feed"]
FeedFormatName = Literal["jsonl", "parquet"]
FeedEventName = Literal["create", "delete", "rename", "data", "attrs", "xattrs"]
OnBadRecordName = Literal["fail", "quarantine"]
ViewSnapshotsName = Literal["auto", "required", "never"]
VerifyContentsName = Literal["changed", "full"]

FORMATS: tuple[str, ...] = typing.get_args(FormatName)
EPOCH_SOURCES: tuple[str, ...] = typing.get_args(EpochSource)
#: ``changelogs.epochs_from`` when absent: JSON Lines carry their epoch, a Lustre MARK closes
#: one, a Gluster rollover file falls in one window of ``epoch``
DEFAULT_EPOCHS_FROM = {"jsonl": "records", "lustre": "mark", "gluster": "time"}
TARGET_KINDS: tuple[str, ...] = typing.get_args(TargetKindName)
#: a feed target's file format (``targets[].format``) and event mask (``targets[].events``)
FEED_FORMATS: tuple[str, ...] = typing.get_args(FeedFormatName)
FEED_EVENTS: tuple[FeedEventName, ...] = typing.get_args(FeedEventName)
ON_BAD_RECORD: tuple[str, ...] = typing.get_args(OnBadRecordName)
#: a posix target's committed view (``targets[].view.snapshots``)
VIEW_SNAPSHOTS: tuple[str, ...] = typing.get_args(ViewSnapshotsName)
VERIFY_CONTENTS: tuple[str, ...] = typing.get_args(VerifyContentsName)
#: target keys of earlier versions that now stop the load with a way forward
REMOVED_TARGET_KEYS = {
    "engine": "removed: Spark is the only engine of merge and translate; delete this key",
    "local_max_records": "removed with the local engine (Spark runs every epoch); delete this key",
}
#: keys only ``kind: s3`` targets take (a feed takes conn_id, bucket and prefix too)
S3_ONLY_KEYS = ("conn_id", "bucket", "prefix", "stripe_size", "stripe_count")
#: keys only ``kind: posix`` targets take
POSIX_ONLY_KEYS = ("view",)
MIN_PART_SIZE = 5 * 1024 * 1024
#: ``targets[].small_file``'s default: on this machine's SeaweedFS a GET of 256 KiB took as long as
#: a ranged GET of 4 KiB of it (docs/INTERNALS.md, "Requests per changed file")
SMALL_FILE = 256 * 1024

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# one spelling each for the parser and the published schema (JSON Schema regexes take no flags)
_DURATION_RE = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d)?\s*$")
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([Bb]|[KkMmGgTt](?:[Ii]?[Bb])?)?\s*$")
_UNITS_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}
_UNITS_B = {
    None: 1,
    "b": 1,
    "k": 1024,
    "kib": 1024,
    "m": 1024**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gib": 1024**3,
    "t": 1024**4,
    "tib": 1024**4,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
}

# --------------------------------------------------------------------------- values


def parse_duration(value: Any) -> float:
    """``5m`` → 300.0; a bare number is seconds. Returns seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    m = _DURATION_RE.match(str(value)) if isinstance(value, str) else None
    if not m or int(m.group(1)) <= 0:
        raise ValueError(f"expected a positive duration like 15s, 5m, 1h, got {value!r}")
    return int(m.group(1)) * _UNITS_S[m.group(2)]


def parse_size(value: Any) -> int:
    """``8MiB`` → 8388608; a bare integer is bytes. Returns bytes."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    m = _SIZE_RE.match(value) if isinstance(value, str) else None
    if not m:
        raise ValueError(f"expected a byte size like 1048576 or 8MiB, got {value!r}")
    return int(m.group(1)) * _UNITS_B[m.group(2).lower() if m.group(2) else None]


def parse_datetime(value: Any) -> datetime:
    """An ISO 8601 time (``Z`` allowed) or a datetime; returns it timezone-aware (UTC if naive)."""
    if isinstance(value, datetime):
        dt = value
    elif isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"expected an ISO 8601 time like 2026-01-01T00:00:00Z, got {value!r}") from None
    else:
        raise ValueError(f"expected an ISO 8601 time, got {value!r}")
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def _name(v: Any) -> str:
    if not isinstance(v, str) or not NAME_RE.match(v):
        raise ValueError(f"expected a name of letters, digits, '_', '-', '.', got {v!r}")
    return v


def _text(v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise ValueError(f"expected a non-empty string, got {v!r}")
    return v


def _choice(options: tuple[str, ...]):
    def conv(v: Any) -> str:
        if v not in options:
            raise ValueError(f"expected one of {', '.join(options)}, got {v!r}")
        return v

    return conv


def _int_range(lo: int, hi: int | None = None):
    def conv(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
            bound = f"from {lo} to {hi}" if hi is not None else f"at least {lo}"
            raise ValueError(f"expected a whole number {bound}, got {v!r}")
        return v

    return conv


def _ratio(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
        raise ValueError(f"expected a ratio from 0.0 to 1.0, got {v!r}")
    return float(v)


def _part_size(v: int) -> int:
    if v < MIN_PART_SIZE:
        raise ValueError(f"S3 parts are at least 5 MiB ({MIN_PART_SIZE} bytes), got {v}")
    return v


def _abs_subtree(v: Any) -> str:
    if not isinstance(v, str) or not v.startswith("/") or "/../" in v + "/" or "/./" in v + "/":
        raise ValueError(f"fileset entries are absolute paths without . or .., got {v!r}")
    return "/" + v.strip("/")


def _control_dir(v: Any) -> str:
    from epochsync.core.errors import RecordError
    from epochsync.core.names import check_basename

    try:
        check_basename(_text(v), "control_dir")
    except RecordError as exc:
        raise ValueError(str(exc)) from None
    if v == ".epochsync-dir":
        raise ValueError("'.epochsync-dir' is the s3 directory marker's name; choose another")
    return v


def _key_template(v: Any) -> str:
    v = _text(v)
    try:
        v.format(ost="OST0000", oid="0x1", fid="[0x1:0x1:0x0]")
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"key template may use only {{ost}}, {{oid}}, {{fid}}: {exc}") from None
    return v


def _changelog_uri(v: str) -> str:
    if not v.startswith(("s3://", "file://", "/")):
        raise ValueError(f"expected s3://bucket/prefix/, file:///dir or an absolute path, got {v!r}")
    return v


def _spark_remote(v: Any) -> str:
    if not isinstance(v, str) or not v.startswith("sc://"):
        raise ValueError(f"expected a Spark Connect URL like sc://host:15002, got {v!r}")
    return v


def _key_prefix(example: str):
    """A relative key prefix, ending in ``/`` unless empty."""

    def conv(v: Any) -> str:
        p = str(v) if isinstance(v, int) and not isinstance(v, bool) else v
        if not isinstance(p, str) or p.startswith("/") or ".." in p.split("/"):
            raise ValueError(f"expected a relative key prefix like {example!r}, got {v!r}")
        return p if not p or p.endswith("/") else p + "/"

    return conv


def _distinct(what: str):
    def check(v: tuple) -> tuple:
        if len(set(v)) != len(v):
            raise ValueError(f"duplicate {what}")
        return v

    return check


def _feed_order(v: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(e for e in FEED_EVENTS if e in v)


def _config_dir(info: ValidationInfo) -> Path:
    """The directory relative paths in the file are taken from (the loader passes it)."""
    return (info.context or {}).get("dir") or Path.cwd()


def _local_path(v: str, info: ValidationInfo) -> str:
    return v if v.startswith("/") else str((_config_dir(info) / v).resolve())


def _warehouse_uri(v: str, info: ValidationInfo) -> str:
    return (v if "://" in v else f"file://{(_config_dir(info) / v).resolve()}").rstrip("/")


# The types of the file's values. A BeforeValidator parses and checks, with the one-line
# wording of the function it names; the constraint it wraps gives the published schema.
Name = Annotated[str, StringConstraints(pattern=NAME_RE.pattern), BeforeValidator(_name)]
Text = Annotated[str, StringConstraints(min_length=1), BeforeValidator(_text)]
LocalPath = Annotated[Text, AfterValidator(_local_path)]
Duration = Annotated[
    float,
    BeforeValidator(parse_duration),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "exclusiveMinimum": 0, "description": "seconds"},
                {
                    "type": "string",
                    "pattern": _DURATION_RE.pattern,
                    "description": "a whole number and a unit: ms, s, m, h, d (5m)",
                },
            ]
        }
    ),
]
Size = Annotated[
    int,
    BeforeValidator(parse_size),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 0, "description": "bytes"},
                {
                    "type": "string",
                    "pattern": _SIZE_RE.pattern,
                    "description": "a whole number and a unit: B, K or KiB, M or MiB, G or GiB, T or TiB (powers "
                    "of 1024), KB, MB, GB, TB (powers of 1000)",
                },
            ]
        }
    ),
]
When = Annotated[datetime, BeforeValidator(parse_datetime)]
Ratio = Annotated[float, Field(ge=0.0, le=1.0), BeforeValidator(_ratio)]
Format = Annotated[FormatName, BeforeValidator(_choice(FORMATS))]
EpochsFrom = Annotated[EpochSource, BeforeValidator(_choice(EPOCH_SOURCES))]
OnBadRecord = Annotated[OnBadRecordName, BeforeValidator(_choice(ON_BAD_RECORD))]
TargetKind = Annotated[TargetKindName, BeforeValidator(_choice(TARGET_KINDS))]
FeedFormat = Annotated[FeedFormatName, BeforeValidator(_choice(FEED_FORMATS))]
FeedEvent = Annotated[FeedEventName, BeforeValidator(_choice(FEED_EVENTS))]
ViewSnapshots = Annotated[ViewSnapshotsName, BeforeValidator(_choice(VIEW_SNAPSHOTS))]
VerifyContents = Annotated[VerifyContentsName, BeforeValidator(_choice(VERIFY_CONTENTS))]
Epochs = Annotated[int, Field(ge=0), BeforeValidator(_int_range(0))]
AtLeastOne = Annotated[int, Field(ge=1), BeforeValidator(_int_range(1))]
StripeCount = Annotated[int, Field(ge=1, le=65535), BeforeValidator(_int_range(1, 65535))]
Attempts = Annotated[int, Field(ge=1, le=100), BeforeValidator(_int_range(1, 100))]
PartSize = Annotated[Size, AfterValidator(_part_size)]
FilesetPath = Annotated[str, StringConstraints(pattern="^/"), BeforeValidator(_abs_subtree)]
ControlDir = Annotated[str, StringConstraints(min_length=1), BeforeValidator(_control_dir)]
KeyTemplate = Annotated[str, StringConstraints(min_length=1), BeforeValidator(_key_template)]
ChangelogUri = Annotated[Text, AfterValidator(_changelog_uri)]
SparkRemote = Annotated[str, StringConstraints(pattern="^sc://"), BeforeValidator(_spark_remote)]
Servers = Annotated[tuple[Name, ...], Field(min_length=1), AfterValidator(_distinct("server names"))]
Fileset = Annotated[tuple[FilesetPath, ...], Field(min_length=1)]
FeedEvents = Annotated[tuple[FeedEvent, ...], Field(min_length=1), AfterValidator(_feed_order)]
S3Prefix = Annotated[str, BeforeValidator(_key_prefix("lustre1/"))]
FeedPrefix = Annotated[str, BeforeValidator(_key_prefix("feeds/audit/"))]
WarehouseUri = Annotated[Text, AfterValidator(_warehouse_uri)]


#: what a source is: changelog files and an S3 bucket of its data, or a live GlusterFS volume
SourceKindName = Literal["changelogs", "gluster"]
SOURCE_KINDS: tuple[str, ...] = typing.get_args(SourceKindName)
#: how a live source is cut (``sources[].cut.mechanism``); DESIGN section 4 and docs/INTERNALS.md
#: describe the others as the same interface (Gluster's own LVM-thin snapshots, remote agents)
CutMechanismName = Literal["btrfs"]
#: the root of every Gluster volume
GLUSTER_ROOT_GFID = "00000000-0000-0000-0000-000000000001"
#: the names a cut's ``snapshots`` template may use
SNAPSHOT_TEMPLATE_KEYS = ("subvolume", "subvolume_parent", "source", "volume", "brick")


def _snapshot_template(v: Any) -> str:
    v = _text(v)
    try:
        path = v.format(**{k: f"/x/{k}" for k in SNAPSHOT_TEMPLATE_KEYS})
    except (KeyError, IndexError, ValueError) as exc:
        keys = ", ".join("{" + k + "}" for k in SNAPSHOT_TEMPLATE_KEYS)
        raise ValueError(f"snapshot template may use only {keys}: {exc}") from None
    if not path.startswith("/"):
        raise ValueError(f"expected an absolute path (or one starting with {{subvolume_parent}}), got {v!r}")
    return v


def _brick_spec(v: Any) -> str:
    v = _text(v)
    host, sep, path = v.partition(":")
    if not sep or not host or not path.startswith("/"):
        raise ValueError(f"expected a brick as host:/absolute/path, got {v!r}")
    return v


SnapshotTemplate = Annotated[str, StringConstraints(min_length=1), BeforeValidator(_snapshot_template)]
BrickSpec = Annotated[str, StringConstraints(min_length=3), BeforeValidator(_brick_spec)]
CutMechanism = Annotated[CutMechanismName, BeforeValidator(_choice(typing.get_args(CutMechanismName)))]
