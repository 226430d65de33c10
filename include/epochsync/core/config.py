"""The YAML configuration of DESIGN section 7, loaded and validated once.

The file is described by pydantic models that refuse unknown keys (``extra="forbid"``);
``python -m epochsync.core.config --schema`` prints their JSON Schema, published as
``docs/config.schema.json``. Every mistake is a :class:`ConfigError` naming the file, the key
path (``targets[1].verify.sample``) and what was expected, so an operator can fix it without
reading code (pydantic's own report never reaches the user).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import re
import types
import typing
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    model_validator,
)
from pydantic.dataclasses import dataclass
from pydantic.json_schema import GenerateJsonSchema
from pydantic_core import PydanticCustomError

from epochsync.core.errors import ConfigError

ENV_VAR = "EPOCHSYNC_CONFIG"

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

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
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


def _kind(v: Any) -> str:
    kinds: dict[type, str] = {dict: "a mapping", list: "a list", str: "a string"}
    return kinds.get(type(v), type(v).__name__)


def _name(v: Any) -> str:
    if not isinstance(v, str) or not _NAME_RE.match(v):
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
Name = Annotated[str, StringConstraints(pattern=_NAME_RE.pattern), BeforeValidator(_name)]
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


def _key_error(key: str, reason: str) -> PydanticCustomError:
    """A rule across keys, reported at ``key`` (relative to the mapping it is raised in)."""
    return PydanticCustomError("config_key", "{reason}", {"key": key, "reason": reason})


_C = typing.TypeVar("_C", bound=type)


def _constructed(cls: _C) -> _C:
    """Built in Python (``TargetConfig(...)``, ``dataclasses.replace``), a bad value is a
    :class:`ConfigError` naming the class and the field, like one in the file."""
    init: Callable[..., None] = vars(cls)["__init__"]  # pydantic's, defined on cls itself

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        try:
            init(self, *args, **kwargs)
        except ValidationError as exc:
            raise _config_error(cls.__name__, cls, exc) from None

    setattr(cls, "__init__", __init__)  # noqa: B010 (mypy refuses assigning a method)
    return cls


#: every mapping of the file: unknown keys are errors; the YAML spellings (aliases:
#: ``interval``, ``idle_limit``) are the keys of the file, the Python names build objects in code
_KEYS = ConfigDict(extra="forbid", validate_by_alias=True, validate_by_name=True, use_attribute_docstrings=True)


# --------------------------------------------------------------------------- sources


@_constructed
@dataclass(frozen=True, config=_KEYS)
class ChangelogConfig:
    """Where a source's changelogs are and how to read them (``sources[].changelogs``)."""

    uri: ChangelogUri
    """s3://bucket/prefix/, file:///dir or an absolute path: one directory per server below it"""
    format: Format = "jsonl"
    """how the changelog files are written: canonical JSON Lines, Lustre ``lfs changelog`` text, or
    GlusterFS changelog files"""
    epochs_from: EpochsFrom = "records"
    """where epochs come from: the records' own ``epoch``/EPOCH records, Lustre MARK records, or
    the time windows of ``epoch``; default by format: jsonl records, lustre mark, gluster time"""
    conn_id: Text | None = None
    """connection for an ``s3://`` changelog URI (defaults to the store's)"""

    @model_validator(mode="before")
    @classmethod
    def _epochs_from_by_format(cls, data: Any) -> Any:
        if isinstance(data, dict) and "epochs_from" not in data:
            fmt = data.get("format", "jsonl")
            if isinstance(fmt, str) and fmt in DEFAULT_EPOCHS_FROM:
                return {**data, "epochs_from": DEFAULT_EPOCHS_FROM[fmt]}
        return data


@_constructed
@dataclass(frozen=True, config=_KEYS)
class StoreConfig:
    """The S3 bucket holding the source's file data (``sources[].store``)."""

    conn_id: Text
    """connection of the S3 store (an Airflow connection, or an AIRFLOW_CONN_<ID> variable)"""
    bucket: Text
    """the versioned bucket holding the file data"""
    key: KeyTemplate = "{ost}/{oid}"
    """object key of a striped file's stripe object, from {ost}, {oid}, {fid}"""
    unstriped_key: KeyTemplate = "data/{fid}"
    """object key of a file without stripes"""


@_constructed
@dataclass(frozen=True, config=_KEYS)
class EpochConfig:
    """The epoch grid (``sources[].epoch``)."""

    interval_s: Annotated[Duration, Field(alias="interval")]
    """length of one epoch"""
    start: When
    """start of epoch 1 (ISO 8601; UTC if no zone is given)"""

    def window(self, epoch: int) -> tuple[datetime, datetime]:
        """Epoch E covers [start + (E-1)*interval, start + E*interval) (:mod:`epochsync.core.epochs`)."""
        from epochsync.core.epochs import window

        return window(self.start, self.interval_s, epoch)

    def epoch_of(self, when_ns: int) -> int:
        """The epoch whose window holds ``when_ns`` (ns since 1970)."""
        from epochsync.core.epochs import epoch_of_ns, grid

        return epoch_of_ns(*grid(self.start, self.interval_s), when_ns)


@_constructed
@dataclass(frozen=True, config=_KEYS)
class RetentionConfig:
    """How long ingested changelogs and records stay (``sources[].retention``)."""

    epochs: Epochs = 10
    """keep ingested changelogs and records this many epochs below the min cursor"""
    idle_limit_s: Annotated[Duration, Field(alias="idle_limit")] = 86400.0
    """a consumer whose cursor has not moved for this long is reported idle"""


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


@_constructed
@dataclass(frozen=True, config=_KEYS)
class CutConfig:
    """How a live source is cut at each epoch boundary (``sources[].cut`` of a ``kind: gluster`` source)."""

    mechanism: CutMechanism = "btrfs"
    """btrfs: Gluster's barrier holds namespace operations while every brick's btrfs subvolume gets a
    read-only snapshot, on the bricks' host"""
    snapshots: SnapshotTemplate = "{subvolume_parent}/.epochsync-cuts/{source}/{brick}"
    """where a brick's snapshots go, one folder per brick on the brick's own btrfs file system; from
    {subvolume} (the brick's subvolume), {subvolume_parent}, {source}, {volume}, {brick} (brick1, ...)"""
    barrier: bool = False
    """hold namespace operations with Gluster's barrier while the bricks are snapshotted: every
    namespace operation is then in all bricks' snapshots or in none, for 2 s or more of held
    operations per cut (Gluster's floor); off (the default): nothing is held, each brick's
    snapshot is consistent on its own, an operation the cut splits between bricks waits one
    epoch; data writes are never held either way"""
    bricks_here: bool = False
    """the bricks of other hosts are mounted here, at the paths gluster volume info shows (a dev
    pool on one machine, epochsync_dev.pool): the cut snapshots and reads them here"""
    timeout_s: Annotated[Duration, Field(alias="timeout")] = 120.0
    """the longest a barrier or snapshot command may take before the cut fails (and the barrier is lifted)"""


@dataclass(frozen=True, config=_KEYS, kw_only=True)
class ChangelogSourceKeys:
    """A source known by its changelog files and an S3 bucket of its data (``sources[]``; the default kind)."""

    kind: Literal["changelogs"] = "changelogs"
    """changelogs (the default when absent): the source's servers publish their changelog files"""
    name: Name
    """the source's name (in DAG ids and the warehouse)"""
    root_fid: Text
    """FID of the replicated root"""
    servers: Servers
    """the servers (MDTs, OSTs, bricks) whose changelogs make up the source"""
    changelogs: ChangelogConfig
    """where the servers' changelog files are and how to read them"""
    store: StoreConfig
    """the S3 bucket holding the file data"""
    epoch: EpochConfig
    """the epoch grid: when epochs close"""
    on_bad_record: OnBadRecord = "fail"
    """fail the epoch, or quarantine the line and go on"""
    retention: RetentionConfig = dataclasses.field(default_factory=RetentionConfig)
    """how long ingested changelogs and records stay"""


@dataclass(frozen=True, config=_KEYS, kw_only=True)
class GlusterSourceKeys:
    """A live GlusterFS volume (distribute, replicated, arbiter or distributed-replicate), cut at
    each epoch boundary and read from its bricks' changelogs and snapshots (``kind: gluster``)."""

    kind: Literal["gluster"]
    """gluster: a live GlusterFS volume, cut by epochsync"""
    name: Name
    """the source's name (in DAG ids and the warehouse)"""
    volume: Text
    """the volume's name (gluster volume list)"""
    bricks: tuple[BrickSpec, ...] = ()
    """the volume's bricks as host:/path, in its order; default: read from gluster volume info --xml"""
    replica: AtLeastOne | None = None
    """bricks per replica set (each that many consecutive bricks hold the same files); default: the
    volume's (gluster volume info), 1 when bricks are listed"""
    arbiter: bool | None = None
    """the last brick of each replica set is an arbiter (names and metadata, no data); default: the volume's"""
    gluster_command: tuple[Text, ...] = ()
    """the command that runs Gluster's command line against the pool, as a list (e.g. [ssh, node1,
    gluster]); default: this machine's gluster, talking to its glusterd"""
    gluster_fallbacks: tuple[tuple[Text, ...], ...] = ()
    """more such commands, tried in order when gluster_command gets no answer or answers from a
    server cut off from most of its pool (e.g. [[ssh, node2, gluster], [ssh, node3, gluster]]):
    the cuts go on with that server down"""
    agents: dict[Text, Text] = dataclasses.field(default_factory=dict)
    """the epochsync agent of each server, by the host the bricks name (e.g. node1:
    https://node1:7411): each brick's snapshots are taken, purged and its bytes pulled through its
    server's agent; default: none (the bricks are snapshotted and read where the pipeline runs)"""
    agent_conn_id: Text | None = None
    """the Airflow connection whose password is the agents' shared secret (extras ca, cert, key
    for TLS); required with agents"""
    cut: CutConfig = dataclasses.field(default_factory=CutConfig)
    """how the volume is cut at each epoch boundary"""
    epoch: EpochConfig
    """the epoch grid: when the scheduler cuts the volume"""
    root_fid: Text = GLUSTER_ROOT_GFID
    """gfid of the replicated root (the volume's root)"""
    on_bad_record: OnBadRecord = "fail"
    """fail the epoch, or quarantine the record and go on"""
    retention: RetentionConfig = dataclasses.field(default_factory=RetentionConfig)
    """how long published records stay"""


def _source_kind(v: Any) -> str:
    kind = v.get("kind", "changelogs") if isinstance(v, dict) else getattr(v, "kind", "changelogs")
    return kind if isinstance(kind, str) else repr(kind)


SourceKeys = Annotated[
    Annotated[ChangelogSourceKeys, Tag("changelogs")] | Annotated[GlusterSourceKeys, Tag("gluster")],
    Discriminator(_source_kind),
]


@_constructed
@dataclass(frozen=True, config=_KEYS, kw_only=True)
class SourceConfig:
    """One replicated file system as the stages see it, whatever its kind. A gluster source's
    servers are its bricks, its changelogs the canonical records its cuts publish in the
    warehouse, and it has no S3 store (``store`` None: its bytes are read from its cuts)."""

    name: str
    root_fid: str
    servers: tuple[str, ...]
    changelogs: ChangelogConfig
    store: StoreConfig | None
    epoch: EpochConfig
    on_bad_record: str = "fail"
    retention: RetentionConfig = dataclasses.field(default_factory=RetentionConfig)
    kind: str = "changelogs"
    #: gluster: the volume, its bricks (host:/path, in order; brick names are brick1, brick2, ...)
    volume: str | None = None
    bricks: tuple[str, ...] = ()
    cut: CutConfig | None = None
    #: gluster: bricks per replica set (servers are then set1, set2, ...), the last one an arbiter
    replica: int = 1
    arbiter: bool = False
    gluster_command: tuple[str, ...] = ()
    gluster_fallbacks: tuple[tuple[str, ...], ...] = ()
    #: gluster: host -> agent URL, and the connection of the agents' secret
    agents: tuple[tuple[str, str], ...] = ()
    agent_conn_id: str | None = None

    @property
    def gluster_commands(self) -> tuple[tuple[str, ...], ...]:
        """``gluster_command`` then its ``gluster_fallbacks``: what :func:`epochsync.core.gluster.run_gluster`
        tries in order (an empty command: this machine's ``gluster``)."""
        return (tuple(self.gluster_command), *self.gluster_fallbacks)

    @classmethod
    def of(cls, keys: ChangelogSourceKeys | GlusterSourceKeys, warehouse: str) -> SourceConfig:
        """The source of one validated ``sources[]`` entry (a gluster volume's bricks are read
        from the volume when the entry does not list them)."""
        if isinstance(keys, ChangelogSourceKeys):
            return cls(
                name=keys.name,
                epoch=keys.epoch,
                on_bad_record=keys.on_bad_record,
                retention=keys.retention,
                root_fid=keys.root_fid,
                servers=keys.servers,
                changelogs=keys.changelogs,
                store=keys.store,
            )
        if keys.bricks:
            bricks, replica, arbiter = keys.bricks, keys.replica or 1, bool(keys.arbiter)
        else:
            bricks, replica, arbiter = _volume_bricks(
                keys.volume, warehouse, keys.name, (tuple(keys.gluster_command), *keys.gluster_fallbacks)
            )
            replica, arbiter = keys.replica or replica, arbiter if keys.arbiter is None else keys.arbiter
        if keys.agents and not keys.agent_conn_id:
            raise ValueError("agents need agent_conn_id: the Airflow connection whose password is their secret")
        if keys.agents:
            hosts = {str(b).split(":", 1)[0] for b in bricks}
            missing = sorted(hosts - set(keys.agents))
            if missing:
                raise ValueError(f"agents: no agent for the bricks of {', '.join(missing)}")
        if len(bricks) % replica:
            raise ValueError(f"{len(bricks)} bricks are not whole replica sets of {replica} (replica)")
        if arbiter and replica < 3:
            raise ValueError(f"an arbiter needs replica 3 or more, got replica {replica}")
        servers = (
            tuple(f"brick{i}" for i in range(1, len(bricks) + 1))
            if replica == 1
            else tuple(f"set{i}" for i in range(1, len(bricks) // replica + 1))
        )
        return cls(
            name=keys.name,
            epoch=keys.epoch,
            on_bad_record=keys.on_bad_record,
            retention=keys.retention,
            kind="gluster",
            root_fid=keys.root_fid,
            servers=servers,
            changelogs=ChangelogConfig(uri=f"{_cuts_uri(warehouse, keys.name)}/changelogs", format="jsonl"),
            store=None,
            volume=keys.volume,
            bricks=tuple(bricks),
            cut=keys.cut,
            replica=replica,
            arbiter=arbiter,
            gluster_command=keys.gluster_command,
            gluster_fallbacks=keys.gluster_fallbacks,
            agents=tuple(sorted(keys.agents.items())),
            agent_conn_id=keys.agent_conn_id,
        )


def _cuts_uri(warehouse: str, source: str) -> str:
    """``warehouse.paths.Warehouse(warehouse).cuts(source)`` (the config sits below the warehouse
    layer; ``tests/unit/test_config.py`` holds the two equal)."""
    return f"{warehouse.rstrip('/')}/cuts/source={source}"


def _volume_bricks(
    volume: str, warehouse: str, source: str, command: tuple[tuple[str, ...], ...] = ()
) -> tuple[tuple[str, ...], int, bool]:
    """A gluster source's bricks, replica count and arbiter when the config does not list them: those
    its last cut recorded (``cuts/source=S/volume.json``), else ``gluster volume info``."""
    import json
    from urllib.parse import urlparse

    uri = _cuts_uri(warehouse, source)
    if "://" in uri and urlparse(uri).scheme != "file":
        raise ValueError(f"a gluster source needs a file:// warehouse (its cuts live there), got {warehouse}")
    path = (urlparse(uri).path if "://" in uri else uri) + "/volume.json"
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        if doc.get("volume") == volume and doc.get("bricks"):
            return tuple(doc["bricks"]), int(doc.get("replica", 1)), bool(doc.get("arbiter", False))
    except (OSError, ValueError):
        pass
    from epochsync.core.errors import EpochsyncError
    from epochsync.core.gluster import check_supported, volume_info

    try:
        info = volume_info(volume, command=command)
        check_supported(info)
        return tuple(b.spec for b in info["bricks"]), info["replica"], bool(info["arbiter"])
    except EpochsyncError as exc:
        raise ValueError(f"cannot read the bricks of volume {volume!r} ({exc}); list them under 'bricks'") from None


# --------------------------------------------------------------------------- targets


@_constructed
@dataclass(frozen=True, config=_KEYS)
class VerifyConfig:
    """What verify checks after apply (``targets[].verify``)."""

    sample: Ratio = 1.0
    """share of changed files whose bytes are compared"""
    contents: VerifyContents = "changed"
    """changed: read only what no checksum covers (s3: the store's checksums of apply's writes and
    of a multipart upload's parts; posix: the ranges apply wrote, against its checksums of them,
    and nothing of a file only moved or re-attributed unless it changed since apply); full: every
    compared file whole, from the replica and the source"""


@_constructed
@dataclass(frozen=True, config=_KEYS)
class FeedRetentionConfig:
    """How long a feed keeps its epoch files (``targets[].retention`` of a ``kind: feed`` target)."""

    epochs: Epochs = 10
    """the newest epochs kept even when every registered consumer has acknowledged them"""
    max_epochs: AtLeastOne | None = None
    """epochs older than this many below the last published one go even if unacknowledged
    (their consumers must hydrate); none: kept until every consumer acknowledged"""
    idle_limit_s: Annotated[Duration, Field(alias="idle_limit")] = 86400.0
    """a consumer with unacknowledged epochs that has not acknowledged for this long is idle"""


@_constructed
@dataclass(frozen=True, config=_KEYS)
class ViewConfig:
    """A posix target's committed view (``targets[].view``): every committed epoch published as a
    read-only btrfs snapshot of the replica, and a ``current`` link to the newest, flipped at
    commit, so a reader of ``current`` never sees an epoch half applied."""

    snapshots: ViewSnapshots = "auto"
    """auto: where the replica's path is a btrfs subvolume (a new path whose parent is on btrfs is
    made one), none elsewhere, as epochsync status says; required: refuse to apply to a replica
    that cannot have them; never: no snapshots"""
    path: LocalPath | None = None
    """the folder of the snapshots (epoch-NNNNNNNNNN) and of the current link, on the replica's
    btrfs file system (relative: to the config file's directory); default: <path>.epochs beside
    the replica"""
    keep: AtLeastOne = 2
    """how many snapshots are kept, the newest included; older ones are deleted at commit, so a
    reader who opened current keeps a whole epoch for keep - 1 more commits"""


@_constructed
@dataclass(frozen=True, config=_KEYS)
class AuditConfig:
    """The scheduled audit of a target (``targets[].audit``): its DAG ``epochsync_audit__<target>``
    compares the committed epoch in full with the source, as ``epochsync audit`` does."""

    interval_s: Annotated[Literal["never"] | Duration, Field(alias="interval")] = 86400.0
    """how often the audit DAG runs; never: only when triggered"""
    deep: bool = False
    """compare every file's bytes too (reads the whole replica and its source versions)"""
    repair: bool = False
    """put what differs right after each scheduled audit, as epochsync audit ... --repair does (off: the
    audit fails and names the differences)"""


@dataclass(frozen=True, config=_KEYS, kw_only=True)
class _TargetKeys:
    """The keys every kind of target takes (described with Field: the subclasses that
    inherit them would not see attribute docstrings)."""

    name: Name = Field(description="the target's name (in DAG ids, pools and the warehouse)")
    source: Name = Field(description="name of the source this target replicates")
    kind: TargetKind = Field(description="s3, posix or feed: the keys below depend on it")
    fileset: Fileset = Field(default=(), description="subtrees to replicate (absolute paths); default: everything")
    verify: VerifyConfig = Field(default_factory=VerifyConfig)
    audit: AuditConfig = Field(
        default_factory=AuditConfig, description="the scheduled audit (s3 and posix targets; a feed ignores it)"
    )
    coalesce_gap: Size = Field(
        default=1024 * 1024, description="ranges of one object closer than this are fetched with one GET"
    )
    part_size: PartSize = Field(
        default=8 * 1024 * 1024, description="multipart part size for partial updates (at least 5 MiB)"
    )
    small_object: Size = Field(
        default=8 * 1024 * 1024, description="objects up to this size are patched in memory and put whole"
    )
    small_file: Size = Field(
        default=SMALL_FILE,
        description="s3: a changed file up to this size is read whole from its source version and written in one "
        "PUT, or copied server-side from that version where it is exactly the file, instead of its changed ranges "
        "patched onto the replica's old version (one or two requests fewer)",
    )
    snapshot_retention: AtLeastOne = Field(default=3, description="how many committed namespace snapshots to keep")
    max_attempts: Attempts = Field(default=6, description="attempts per S3 request before a clear failure")
    control_dir: ControlDir = Field(
        default=".epochsync",
        description="the replica's own directory at its root (manifest, scratch area, s3 stripes and attribute "
        "sidecars); a source entry of that name at the root is refused",
    )


@dataclass(frozen=True, config=_KEYS, kw_only=True)
class S3TargetKeys(_TargetKeys):
    """A replica in an S3 bucket (``kind: s3``)."""

    kind: Literal["s3"]
    conn_id: Text
    """connection of the replica's S3 store (an Airflow connection, or an AIRFLOW_CONN_<ID> variable)"""
    bucket: Text
    """the replica's bucket (epochsync turns versioning on)"""
    prefix: Annotated[str, BeforeValidator(_key_prefix("lustre1/"))] = ""
    """key prefix of the replica in the bucket (relative; a '/' is added)"""
    stripe_size: Size | None = None
    """a striped s3 target: its own stripe size (needs stripe_count)"""
    stripe_count: StripeCount | None = None
    """a striped s3 target: its own stripe count (needs stripe_size)"""

    @model_validator(mode="after")
    def _both_stripe_keys(self) -> S3TargetKeys:
        if (self.stripe_size is None) != (self.stripe_count is None):
            missing = "stripe_count" if self.stripe_count is None else "stripe_size"
            raise _key_error(missing, "a striped target needs both stripe_size and stripe_count")
        return self


@dataclass(frozen=True, config=_KEYS, kw_only=True)
class PosixTargetKeys(_TargetKeys):
    """A replica in a directory (``kind: posix``)."""

    kind: Literal["posix"]
    path: LocalPath
    """the replica's directory (relative: to the config file's directory)"""
    view: ViewConfig = dataclasses.field(default_factory=ViewConfig)


@dataclass(frozen=True, config=_KEYS, kw_only=True)
class FeedTargetKeys(_TargetKeys):
    """A change feed (``kind: feed``): one file per epoch, to a directory (path) or an S3
    prefix (conn_id, bucket, prefix)."""

    kind: Literal["feed"]
    path: LocalPath | None = None
    """the feed's directory (relative: to the config file's directory)"""
    conn_id: Text | None = None
    """connection of the feed's S3 store, for a feed in a bucket"""
    bucket: Text | None = None
    """the feed's bucket, for a feed in a bucket"""
    prefix: Annotated[str, BeforeValidator(_key_prefix("feeds/audit/"))] | None = None
    """key prefix of the feed in the bucket (relative; a '/' is added)"""
    format: FeedFormat = "jsonl"
    """the epoch files' format: gzip-compressed JSON Lines, or Parquet"""
    events: FeedEvents = FEED_EVENTS
    """the events published"""
    retention: FeedRetentionConfig = dataclasses.field(default_factory=FeedRetentionConfig)

    @model_validator(mode="after")
    def _directory_or_bucket(self) -> FeedTargetKeys:
        s3 = {"conn_id": self.conn_id, "bucket": self.bucket, "prefix": self.prefix}
        if self.path is not None:
            for key, value in s3.items():
                if value is not None:
                    raise _key_error(
                        key, "a feed goes to a directory (path) or to an S3 prefix (conn_id, bucket, prefix), not both"
                    )
        elif self.conn_id is None and self.bucket is None:
            raise _key_error("path", "a feed needs a directory (path) or an S3 prefix (conn_id, bucket, prefix)")
        else:
            for key in ("conn_id", "bucket"):
                if s3[key] is None:
                    raise _key_error(key, "missing required key")
        return self


#: keys a kind of target refuses with a reason of their own rather than "unknown key"
_REFUSED_KEYS: dict[type, dict[str, str]] = {
    S3TargetKeys: {**REMOVED_TARGET_KEYS, **dict.fromkeys(POSIX_ONLY_KEYS, "only posix targets take this key")},
    PosixTargetKeys: {**REMOVED_TARGET_KEYS, **dict.fromkeys(S3_ONLY_KEYS, "only s3 targets take this key")},
    FeedTargetKeys: {
        **REMOVED_TARGET_KEYS,
        **dict.fromkeys(S3_ONLY_KEYS[3:], "only s3 targets take this key"),
        **dict.fromkeys(POSIX_ONLY_KEYS, "only posix targets take this key"),
    },
}

TargetKeys = Annotated[S3TargetKeys | PosixTargetKeys | FeedTargetKeys, Discriminator("kind")]


@_constructed
@dataclass(frozen=True, config=_KEYS, kw_only=True)
class TargetConfig(_TargetKeys):
    """One target as the stages see it, whatever its kind; keys a kind does not take hold
    their defaults (``None``)."""

    conn_id: str | None = None
    bucket: str | None = None
    prefix: str = ""
    path: str | None = None
    fileset: tuple[str, ...] = ()
    #: a striped s3 target: its own geometry (layout translation proper)
    stripe_size: int | None = None
    stripe_count: int | None = None
    #: feed targets: file format, event mask, retention of epoch files
    format: str = "jsonl"
    events: tuple[str, ...] = FEED_EVENTS
    retention: FeedRetentionConfig = dataclasses.field(default_factory=FeedRetentionConfig)
    #: posix targets: the committed view (read-only snapshots, a ``current`` link)
    view: ViewConfig = dataclasses.field(default_factory=ViewConfig)

    @classmethod
    def of(cls, keys: S3TargetKeys | PosixTargetKeys | FeedTargetKeys) -> TargetConfig:
        """The target of one validated ``targets[]`` entry."""
        values = {f.name: getattr(keys, f.name) for f in dataclasses.fields(keys)}
        if values.get("prefix") is None:
            values.pop("prefix", None)
        return cls(**values)


# --------------------------------------------------------------------------- the file


@dataclass(frozen=True, config=_KEYS)
class SparkKeys:
    """How stages reach Spark (``spark``)."""

    remote: SparkRemote | None = None
    """the Spark Connect server every stage uses (sc://host:15002); none: see epochsync.spark"""


@dataclass(frozen=True, config=ConfigDict(**_KEYS, title="epochsync configuration"), kw_only=True)
class ConfigFile:
    """The epochsync YAML file (path in $EPOCHSYNC_CONFIG or --config). Connections (keys,
    endpoints) never live here: they come from Airflow or AIRFLOW_CONN_<ID> variables."""

    warehouse: Annotated[Text, AfterValidator(_warehouse_uri)] | None = None
    """where Spark keeps records, snapshots, plans, journals: a URI, or a path (relative: to
    the config file's directory); default: warehouse/ beside the config file"""
    sources: Annotated[tuple[SourceKeys, ...], Field(min_length=1)]
    """the file systems replicated (at least one); the keys of a source depend on its kind"""
    targets: tuple[TargetKeys, ...] = ()
    """the replicas and feeds, each of one source; the keys of a target depend on its kind"""
    spark: SparkKeys | None = None
    """how the command line reaches Spark"""

    @model_validator(mode="after")
    def _names_resolve(self) -> ConfigFile:
        for key, items in (("sources", self.sources), ("targets", self.targets)):
            seen: set[str] = set()
            for i, item in enumerate(items):
                if item.name in seen:
                    raise _key_error(f"{key}[{i}].name", f"duplicate name {item.name!r}")
                seen.add(item.name)
        names = [s.name for s in self.sources]
        for i, t in enumerate(self.targets):
            if t.source not in names:
                have = ", ".join(sorted(names))
                raise _key_error(f"targets[{i}].source", f"no source named {t.source!r} (have: {have})")
        return self


@_constructed
@dataclass(frozen=True, config=_KEYS)
class Config:
    """A loaded config: its file, the warehouse URI, sources and targets."""

    file: str
    warehouse: str
    sources: tuple[SourceConfig, ...]
    targets: tuple[TargetConfig, ...]
    #: the Spark Connect server every stage uses (``spark.remote``); None: see epochsync.spark
    spark_remote: str | None = None

    def source(self, name: str) -> SourceConfig:
        """The source called ``name``; a ConfigError names the ones there are."""
        for s in self.sources:
            if s.name == name:
                return s
        raise ConfigError(self.file, "sources", f"no source named {name!r} (have: {_names(self.sources)})")

    def target(self, name: str) -> TargetConfig:
        """The target called ``name``; a ConfigError names the ones there are."""
        for t in self.targets:
            if t.name == name:
                return t
        raise ConfigError(self.file, "targets", f"no target named {name!r} (have: {_names(self.targets)})")

    def source_of(self, target: TargetConfig) -> SourceConfig:
        """The source ``target`` replicates."""
        return self.source(target.source)


def _names(items) -> str:
    return ", ".join(i.name for i in items) or "none"


# --------------------------------------------------------------------------- loading


def load_config(path: str | os.PathLike | None = None) -> Config:
    """Load and validate the config at ``path`` (default: ``$EPOCHSYNC_CONFIG``); returns it."""
    import yaml

    if path is None:
        path = os.environ.get(ENV_VAR)
        if not path:
            raise ConfigError("(no file)", ENV_VAR, "set EPOCHSYNC_CONFIG or pass --config FILE")
    file = str(path)
    try:
        text = Path(file).read_text()
    except OSError as exc:
        raise ConfigError(file, "(file)", f"cannot read: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "(file)"
        raise ConfigError(file, where, f"not valid YAML: {getattr(exc, 'problem', exc)}") from None
    return config_from_dict(data, file=file)


def config_from_dict(data: Any, *, file: str = "(config)") -> Config:
    """Validate the parsed YAML ``data`` of ``file`` (relative paths are taken from its
    directory; the working directory for a ``(name)``); returns the :class:`Config`."""
    base = Path(file).resolve().parent if file and not file.startswith("(") else Path.cwd()
    try:
        keys = _file_adapter().validate_python(
            _without_nulls(data), by_alias=True, by_name=False, context={"dir": base}
        )
    except ValidationError as exc:
        raise _config_error(file, ConfigFile, exc) from None
    warehouse = keys.warehouse or f"file://{base / 'warehouse'}"
    sources = []
    for i, src in enumerate(keys.sources):
        try:
            sources.append(SourceConfig.of(src, warehouse))
        except ValueError as exc:
            raise ConfigError(file, f"sources[{i}]", str(exc)) from None
    return Config(
        file=file,
        warehouse=warehouse,
        sources=tuple(sources),
        targets=tuple(TargetConfig.of(t) for t in keys.targets),
        spark_remote=keys.spark.remote if keys.spark else None,
    )


def _without_nulls(data: Any) -> Any:
    """A key set to nothing (``key:`` or ``key: null``) is a key left out: its default applies."""
    if isinstance(data, dict):
        return {k: _without_nulls(v) for k, v in data.items() if v is not None}
    if isinstance(data, list):
        return [_without_nulls(v) for v in data]
    return data


@functools.cache
def _file_adapter() -> TypeAdapter[ConfigFile]:
    return TypeAdapter(ConfigFile)


# --------------------------------------------------------------------------- errors


#: pydantic's error types for a key the mapping does not take
_UNKNOWN_KEY = ("extra_forbidden", "unexpected_keyword_argument", "invalid_key")
_MAPPING = ("dataclass_type", "dataclass_args_type", "model_type", "model_attributes_type", "dict_type")
_LIST = ("list_type", "tuple_type", "iterable_type")


def _config_error(file: str, root: type, exc: ValidationError) -> ConfigError:
    """The one line a person reads for pydantic's report: file, key path, what was expected.

    The first problem is told (an unknown key before the others: a misspelt key is also a
    missing one); fixing it shows the next."""
    errors = sorted(exc.errors(include_url=False), key=lambda e: e["type"] not in _UNKNOWN_KEY)
    err = errors[0]
    kind, ctx, value, loc = err["type"], err.get("ctx") or {}, err.get("input"), err["loc"]
    if kind == "invalid_key":  # YAML reads `on:`, `yes:`, `1:` as keys that are no strings
        loc = (*loc[:-1], str(value))
    path, mapping = _key_path(root, loc)
    last = str(loc[-1]) if loc else ""
    tag = str(ctx.get("discriminator", "kind")).strip("'")
    if tag.endswith("()"):  # a callable discriminator (sources: kind defaults to changelogs)
        tag = "kind"
    if kind == "config_key":
        path = _join(path, ctx["key"])
        reason = ctx["reason"]
    elif kind in _UNKNOWN_KEY:
        hint = _REFUSED_KEYS.get(mapping, {}).get(last) if mapping else None
        reason = hint or _unknown_key(last, _keys_of(mapping))
    elif kind == "missing":
        reason = "missing required key"
    elif kind == "union_tag_not_found":
        path, reason = _join(path, tag), "missing required key"
    elif kind == "union_tag_invalid":
        options = str(ctx.get("expected_tags", "")).replace("'", "")
        path, reason = _join(path, tag), f"expected one of {options}, got {value.get(tag)!r}"
    elif kind == "value_error":
        reason = str(ctx.get("error", err["msg"]))
    elif kind in _MAPPING:
        reason = f"expected a mapping, got {_kind(value)}"
    elif kind in _LIST:
        reason = f"expected a list, got {_kind(value)}"
    elif kind == "too_short":
        reason = "expected a non-empty list"
    elif kind == "string_type":
        reason = f"expected a string, got {value!r}"
    else:
        reason = f"{err['msg'][0].lower()}{err['msg'][1:]}, got {value!r}"
    return ConfigError(file, path or "(top level)", reason)


def _join(path: str, key: str) -> str:
    if not path:
        return key
    return path + key if key.startswith("[") else f"{path}.{key}"


def _key_path(root: type, loc: tuple) -> tuple[str, type | None]:
    """``targets[1].verify.sample`` for pydantic's location ``('targets', 1, 'posix', 'verify',
    'sample')`` (a union's tag is not a key of the file), and the class of the mapping that
    holds the last key."""
    path, tp, mapping = "", root, None  # type: tuple[str, Any, type | None]
    for part in loc:
        tp = _unwrap(tp)
        members = _tagged(tp)
        if members and part in members:
            tp = members[part]
            continue
        mapping = tp if _keys_of(tp) else None
        if isinstance(part, int) and mapping and part < len(_keys_of(mapping)):
            part = list(mapping.__pydantic_fields__)[part]  # a positional argument of a constructor
        if isinstance(part, int) and not mapping:
            path += f"[{part}]"
            args = typing.get_args(tp)
            tp = args[0] if args else None
        else:
            path = _join(path, str(part))
            fields = getattr(tp, "__pydantic_fields__", {})
            tp = next((f.annotation for n, f in fields.items() if (f.alias or n) == part or n == part), None)
    return path, mapping


def _unwrap(tp: Any) -> Any:
    """The type under ``Annotated[...]`` and ``X | None``."""
    while True:
        if typing.get_origin(tp) is Annotated:
            tp = typing.get_args(tp)[0]
            continue
        args = typing.get_args(tp)
        if typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args:
            rest = [a for a in args if a is not type(None)]
            if len(rest) == 1:
                tp = rest[0]
                continue
        return tp


def _tagged(tp: Any) -> dict[str, type]:
    """The members of a union told apart by ``kind``, by tag."""
    if typing.get_origin(tp) not in (typing.Union, types.UnionType):
        return {}
    out = {}
    for member in typing.get_args(tp):
        member = _unwrap(member)
        field = getattr(member, "__pydantic_fields__", {}).get("kind")
        for tag in typing.get_args(field.annotation) if field is not None else ():
            out[tag] = member
    return out


def _keys_of(tp: Any) -> list[str]:
    """The keys a mapping of the file takes (its YAML spellings)."""
    fields = getattr(tp, "__pydantic_fields__", None) or {}
    return [f.alias or n for n, f in fields.items()]


def _unknown_key(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
    mean = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown key ({mean}known keys here: {', '.join(sorted(known))})"


# --------------------------------------------------------------------------- the schema


class _Schema(GenerateJsonSchema):
    """JSON Schema without a generated title on every key (the descriptions say more)."""

    def field_title_should_be_set(self, schema) -> bool:
        return False


def config_schema() -> dict[str, Any]:
    """The JSON Schema of the YAML file (``docs/config.schema.json``), for editors and checks."""
    schema = _file_adapter().json_schema(by_alias=True, schema_generator=_Schema)
    # sources[] are told apart by a callable (kind defaults to changelogs), which pydantic does not
    # publish: say in the schema what the loader does
    items = schema["properties"]["sources"]["items"]
    items.setdefault(
        "discriminator",
        {
            "propertyName": "kind",
            "mapping": {"changelogs": "#/$defs/ChangelogSourceKeys", "gluster": "#/$defs/GlusterSourceKeys"},
        },
    )
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **_plain_descriptions(schema)}


def _plain_descriptions(node: Any) -> Any:
    """Docstrings as one line of plain text (no line breaks, no reST ````literal```` marks)."""
    if isinstance(node, dict):
        return {
            k: " ".join(v.replace("``", "").split())
            if k == "description" and isinstance(v, str)
            else _plain_descriptions(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_plain_descriptions(v) for v in node]
    return node


def main(argv: list[str] | None = None) -> int:
    """``python -m epochsync.core.config --schema``: print the JSON Schema; ``FILE``: check one."""
    import argparse
    import json
    import sys

    parser = argparse.ArgumentParser(prog="python -m epochsync.core.config", description=main.__doc__)
    parser.add_argument("--schema", action="store_true", help="print the config's JSON Schema")
    parser.add_argument("file", nargs="?", help="a config file to check")
    args = parser.parse_args(argv)
    if args.schema:
        print(json.dumps(config_schema(), indent=2))
    if args.file:
        try:
            cfg = load_config(args.file)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"{cfg.file}: {len(cfg.sources)} source(s), {len(cfg.targets)} target(s)")
    if not args.schema and not args.file:
        parser.print_usage(sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
