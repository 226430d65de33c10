"""The YAML configuration of DESIGN section 7, loaded and validated once.

The file is described by pydantic models that refuse unknown keys (``extra="forbid"``);
``python -m epochsync.core.config --schema`` prints their JSON Schema, published as
``docs/config.schema.json``. Every mistake is a :class:`ConfigError` naming the file, the key
path (``targets[1].verify.sample``) and what was expected, so an operator can fix it without
reading code (pydantic's own report never reaches the user).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import typing
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic.dataclasses import dataclass
from pydantic.json_schema import GenerateJsonSchema

from epochsync.core.config_errors import config_error, key_error
from epochsync.core.config_values import (
    DEFAULT_EPOCHS_FROM,
    FEED_EVENTS,
    GLUSTER_ROOT_GFID,
    POSIX_ONLY_KEYS,
    REMOVED_TARGET_KEYS,
    S3_ONLY_KEYS,
    SMALL_FILE,
    AtLeastOne,
    Attempts,
    BrickSpec,
    ChangelogUri,
    ControlDir,
    CutMechanism,
    Duration,
    Epochs,
    EpochsFrom,
    FeedEvents,
    FeedFormat,
    FeedPrefix,
    Fileset,
    Format,
    KeyTemplate,
    LocalPath,
    Name,
    OnBadRecord,
    PartSize,
    Ratio,
    S3Prefix,
    Servers,
    Size,
    SnapshotTemplate,
    SparkRemote,
    StripeCount,
    TargetKind,
    Text,
    VerifyContents,
    ViewSnapshots,
    WarehouseUri,
    When,
)
from epochsync.core.errors import ConfigError

ENV_VAR = "EPOCHSYNC_CONFIG"

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
            raise config_error(cls.__name__, cls, exc, _REFUSED_KEYS) from None

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
    prefix: S3Prefix = ""
    """key prefix of the replica in the bucket (relative; a '/' is added)"""
    stripe_size: Size | None = None
    """a striped s3 target: its own stripe size (needs stripe_count)"""
    stripe_count: StripeCount | None = None
    """a striped s3 target: its own stripe count (needs stripe_size)"""

    @model_validator(mode="after")
    def _both_stripe_keys(self) -> S3TargetKeys:
        if (self.stripe_size is None) != (self.stripe_count is None):
            missing = "stripe_count" if self.stripe_count is None else "stripe_size"
            raise key_error(missing, "a striped target needs both stripe_size and stripe_count")
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
    prefix: FeedPrefix | None = None
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
                    raise key_error(
                        key, "a feed goes to a directory (path) or to an S3 prefix (conn_id, bucket, prefix), not both"
                    )
        elif self.conn_id is None and self.bucket is None:
            raise key_error("path", "a feed needs a directory (path) or an S3 prefix (conn_id, bucket, prefix)")
        else:
            for key in ("conn_id", "bucket"):
                if s3[key] is None:
                    raise key_error(key, "missing required key")
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

    warehouse: WarehouseUri | None = None
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
                    raise key_error(f"{key}[{i}].name", f"duplicate name {item.name!r}")
                seen.add(item.name)
        names = [s.name for s in self.sources]
        for i, t in enumerate(self.targets):
            if t.source not in names:
                have = ", ".join(sorted(names))
                raise key_error(f"targets[{i}].source", f"no source named {t.source!r} (have: {have})")
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
        raise config_error(file, ConfigFile, exc, _REFUSED_KEYS) from None
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
