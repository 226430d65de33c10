"""The YAML configuration of DESIGN section 7, loaded and validated once.

Every mistake is a :class:`ConfigError` naming the file and the key path
(``targets[1].verify.sample``), so an operator can fix it without reading code.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, NoReturn, overload

from epochsync.core.errors import ConfigError

ENV_VAR = "EPOCHSYNC_CONFIG"

FORMATS = ("jsonl", "lustre", "gluster")
EPOCH_SOURCES = ("records", "mark", "time")
TARGET_KINDS = ("s3", "posix", "feed")
#: a feed target's file format (``targets[].format``) and event mask (``targets[].events``)
FEED_FORMATS = ("jsonl", "parquet")
FEED_EVENTS = ("create", "delete", "rename", "data", "attrs", "xattrs")
#: target keys of earlier versions that now stop the load with a way forward
REMOVED_TARGET_KEYS = {
    "engine": "removed: Spark is the only engine of merge and translate; delete this key",
    "local_max_records": "removed with the local engine (Spark runs every epoch); delete this key",
}
MIN_PART_SIZE = 5 * 1024 * 1024

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_DURATION_RE = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d)?\s*$")
_SIZE_RE = re.compile(r"^\s*(\d+)\s*(B|KiB|MiB|GiB|TiB|KB|MB|GB|TB|K|M|G|T)?\s*$", re.IGNORECASE)
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


@dataclass(frozen=True)
class ChangelogConfig:
    uri: str
    format: str = "jsonl"
    #: where epochs come from: the records' own ``epoch``/EPOCH records, Lustre MARK
    #: records, or the time windows of ``epoch``.
    epochs_from: str = "records"
    #: connection for an ``s3://`` changelog URI (defaults to the store's).
    conn_id: str | None = None


@dataclass(frozen=True)
class StoreConfig:
    conn_id: str
    bucket: str
    key: str = "{ost}/{oid}"
    unstriped_key: str = "data/{fid}"


@dataclass(frozen=True)
class EpochConfig:
    interval_s: float
    start: datetime

    def window(self, epoch: int) -> tuple[datetime, datetime]:
        """Epoch E covers [start + (E-1)*interval, start + E*interval) (:mod:`epochsync.core.epochs`)."""
        from epochsync.core.epochs import window

        return window(self.start, self.interval_s, epoch)

    def epoch_of(self, when_ns: int) -> int:
        """The epoch whose window holds ``when_ns`` (ns since 1970)."""
        from epochsync.core.epochs import epoch_of_ns, grid

        return epoch_of_ns(*grid(self.start, self.interval_s), when_ns)


@dataclass(frozen=True)
class RetentionConfig:
    #: keep ingested changelogs and records this many epochs below the min cursor
    epochs: int = 10
    #: a consumer whose cursor has not moved for this long is reported idle
    idle_limit_s: float = 86400.0


@dataclass(frozen=True)
class SourceConfig:
    name: str
    root_fid: str
    servers: tuple[str, ...]
    changelogs: ChangelogConfig
    store: StoreConfig
    epoch: EpochConfig
    on_bad_record: str = "fail"
    retention: RetentionConfig = field(default_factory=RetentionConfig)


@dataclass(frozen=True)
class VerifyConfig:
    sample: float = 1.0


@dataclass(frozen=True)
class FeedRetentionConfig:
    """How long a feed keeps its epoch files (``targets[].retention`` of a ``kind: feed`` target)."""

    #: the newest epochs kept even when every registered consumer has acknowledged them
    epochs: int = 10
    #: epochs older than this many below the last published one go even if unacknowledged
    #: (their consumers must hydrate); None keeps them until every consumer acknowledged
    max_epochs: int | None = None
    #: a consumer with unacknowledged epochs that has not acknowledged for this long is idle
    idle_limit_s: float = 86400.0


@dataclass(frozen=True)
class TargetConfig:
    name: str
    source: str
    kind: str
    conn_id: str | None = None
    bucket: str | None = None
    prefix: str = ""
    path: str | None = None
    fileset: tuple[str, ...] = ()
    verify: VerifyConfig = field(default_factory=VerifyConfig)
    #: a striped s3 target: its own geometry (layout translation proper)
    stripe_size: int | None = None
    stripe_count: int | None = None
    #: ranges of one object closer than this are fetched with one GET
    coalesce_gap: int = 1024 * 1024
    #: multipart part size for partial updates (>= 5 MiB)
    part_size: int = 8 * 1024 * 1024
    #: objects up to this size are patched in memory and put whole
    small_object: int = 8 * 1024 * 1024
    #: how many committed namespace snapshots to keep
    snapshot_retention: int = 3
    #: attempts per S3 request before a clear failure
    max_attempts: int = 6
    #: the replica's own directory at its root (manifest, scratch area, s3 stripes and
    #: attribute sidecars); a source entry of that name at the root is refused
    control_dir: str = ".epochsync"
    #: feed targets: file format, event mask, retention of epoch files
    format: str = "jsonl"
    events: tuple[str, ...] = FEED_EVENTS
    retention: FeedRetentionConfig = field(default_factory=FeedRetentionConfig)


@dataclass(frozen=True)
class Config:
    file: str
    warehouse: str
    sources: tuple[SourceConfig, ...]
    targets: tuple[TargetConfig, ...]
    #: the Spark Connect server every stage uses (``spark.remote``); None: see epochsync.spark
    spark_remote: str | None = None

    def source(self, name: str) -> SourceConfig:
        for s in self.sources:
            if s.name == name:
                return s
        raise ConfigError(self.file, "sources", f"no source named {name!r} (have: {_names(self.sources)})")

    def target(self, name: str) -> TargetConfig:
        for t in self.targets:
            if t.name == name:
                return t
        raise ConfigError(self.file, "targets", f"no target named {name!r} (have: {_names(self.targets)})")

    def source_of(self, target: TargetConfig) -> SourceConfig:
        return self.source(target.source)


def _names(items) -> str:
    return ", ".join(i.name for i in items) or "none"


# --------------------------------------------------------------------------- parsing helpers


def parse_duration(value: Any) -> float:
    """``5m`` → 300.0; a bare number is seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    m = _DURATION_RE.match(str(value)) if isinstance(value, str) else None
    if not m or int(m.group(1)) <= 0:
        raise ValueError(f"expected a positive duration like 15s, 5m, 1h, got {value!r}")
    return int(m.group(1)) * _UNITS_S[m.group(2)]


def parse_size(value: Any) -> int:
    """``8MiB`` → 8388608; a bare integer is bytes."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    m = _SIZE_RE.match(value) if isinstance(value, str) else None
    if not m:
        raise ValueError(f"expected a byte size like 1048576 or 8MiB, got {value!r}")
    return int(m.group(1)) * _UNITS_B[(m.group(2) or "b").lower() if m.group(2) else None]


def parse_datetime(value: Any) -> datetime:
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


class _Reader:
    """Walks one mapping of the YAML, remembering the key path for errors."""

    def __init__(self, file: str, path: str, data: Any):
        self.file = file
        self.path = path
        if not isinstance(data, dict):
            raise ConfigError(file, path or "(top level)", f"expected a mapping, got {_kind(data)}")
        self.data = data
        self.used: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def fail(self, name: str, reason: str) -> NoReturn:
        raise ConfigError(self.file, self.key(name), reason)

    def get(self, name: str, conv=None, *, required: bool = False, default: Any = None):
        self.used.add(name)
        if name not in self.data or self.data[name] is None:
            if required:
                self.fail(name, "missing required key")
            return default
        value = self.data[name]
        if conv is None:
            return value
        try:
            return conv(value)
        except (ValueError, TypeError) as exc:
            self.fail(name, str(exc))

    @overload
    def sub(self, name: str, *, required: Literal[True]) -> _Reader: ...

    @overload
    def sub(self, name: str, *, required: bool = False) -> _Reader | None: ...

    def sub(self, name: str, *, required: bool = False) -> _Reader | None:
        self.used.add(name)
        if name not in self.data or self.data[name] is None:
            if required:
                self.fail(name, "missing required key")
            return None
        return _Reader(self.file, self.key(name), self.data[name])

    def done(self, allowed: tuple[str, ...] = ()):
        unknown = sorted(set(self.data) - self.used - set(allowed))
        if unknown:
            known = ", ".join(sorted(self.used | set(allowed)))
            self.fail(unknown[0], f"unknown key (known keys here: {known})")


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


def _list_of(conv):
    def inner(v: Any):
        if not isinstance(v, list) or not v:
            raise ValueError(f"expected a non-empty list, got {_kind(v)}")
        return tuple(conv(x) for x in v)

    return inner


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


# --------------------------------------------------------------------------- loading


def load_config(path: str | os.PathLike | None = None) -> Config:
    """Load and validate the config at ``path`` (default: ``$EPOCHSYNC_CONFIG``)."""
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
    top = _Reader(file, "", data)
    base = Path(file).resolve().parent if file and not file.startswith("(") else Path.cwd()
    warehouse = top.get("warehouse", _text, default=f"file://{base / 'warehouse'}")
    if "://" not in warehouse:
        warehouse = f"file://{(base / warehouse).resolve()}"
    src_list = top.get("sources", required=True)
    tgt_list = top.get("targets", default=[])
    spark_remote = None
    spark = top.sub("spark")
    if spark is not None:
        spark_remote = spark.get("remote", _spark_remote)
        spark.done()
    top.done()
    if not isinstance(src_list, list) or not src_list:
        top.fail("sources", "expected a non-empty list of sources")
    if not isinstance(tgt_list, list):
        top.fail("targets", "expected a list of targets")

    sources = tuple(_load_source(file, i, s) for i, s in enumerate(src_list))
    _unique(file, "sources", [s.name for s in sources])
    targets = tuple(_load_target(file, i, t, base) for i, t in enumerate(tgt_list))
    _unique(file, "targets", [t.name for t in targets])
    names = {s.name for s in sources}
    for i, t in enumerate(targets):
        if t.source not in names:
            raise ConfigError(
                file, f"targets[{i}].source", f"no source named {t.source!r} (have: {', '.join(sorted(names))})"
            )
    return Config(
        file=file, warehouse=warehouse.rstrip("/"), sources=sources, targets=targets, spark_remote=spark_remote
    )


def _spark_remote(v: Any) -> str:
    if not isinstance(v, str) or not v.startswith("sc://"):
        raise ValueError(f"expected a Spark Connect URL like sc://host:15002, got {v!r}")
    return v


def _unique(file: str, key: str, names: list[str]):
    seen = set()
    for i, n in enumerate(names):
        if n in seen:
            raise ConfigError(file, f"{key}[{i}].name", f"duplicate name {n!r}")
        seen.add(n)


def _load_source(file: str, i: int, data: Any) -> SourceConfig:
    r = _Reader(file, f"sources[{i}]", data)
    name = r.get("name", _name, required=True)
    root_fid = r.get("root_fid", _text, required=True)
    servers = r.get("servers", _list_of(_name), required=True)
    if len(set(servers)) != len(servers):
        r.fail("servers", "duplicate server names")

    c = r.sub("changelogs", required=True)
    fmt = c.get("format", _choice(FORMATS), default="jsonl")
    default_epochs = {"jsonl": "records", "lustre": "mark", "gluster": "time"}[fmt]
    changelogs = ChangelogConfig(
        uri=c.get("uri", _text, required=True),
        format=fmt,
        epochs_from=c.get("epochs_from", _choice(EPOCH_SOURCES), default=default_epochs),
        conn_id=c.get("conn_id", _text),
    )
    c.done()
    if not (changelogs.uri.startswith(("s3://", "file://", "/"))):
        c.fail("uri", f"expected s3://bucket/prefix/, file:///dir or an absolute path, got {changelogs.uri!r}")

    s = r.sub("store", required=True)
    store = StoreConfig(
        conn_id=s.get("conn_id", _text, required=True),
        bucket=s.get("bucket", _text, required=True),
        key=s.get("key", _key_template, default="{ost}/{oid}"),
        unstriped_key=s.get("unstriped_key", _key_template, default="data/{fid}"),
    )
    s.done()

    e = r.sub("epoch", required=True)
    epoch = EpochConfig(
        interval_s=e.get("interval", parse_duration, required=True),
        start=e.get("start", parse_datetime, required=True),
    )
    e.done()

    on_bad = r.get("on_bad_record", _choice(("fail", "quarantine")), default="fail")
    rt = r.sub("retention")
    retention = RetentionConfig()
    if rt is not None:
        retention = RetentionConfig(
            epochs=rt.get("epochs", _int_range(0), default=retention.epochs),
            idle_limit_s=rt.get("idle_limit", parse_duration, default=retention.idle_limit_s),
        )
        rt.done()
    r.done()
    return SourceConfig(name, root_fid, servers, changelogs, store, epoch, on_bad, retention)


def _load_target(file: str, i: int, data: Any, base: Path) -> TargetConfig:
    r = _Reader(file, f"targets[{i}]", data)
    name = r.get("name", _name, required=True)
    source = r.get("source", _name, required=True)
    kind = r.get("kind", _choice(TARGET_KINDS), required=True)
    kw: dict[str, Any] = {}
    if kind == "s3":
        kw["conn_id"] = r.get("conn_id", _text, required=True)
        kw["bucket"] = r.get("bucket", _text, required=True)
        prefix = r.get("prefix", str, default="")
        if prefix.startswith("/") or ".." in prefix.split("/"):
            r.fail("prefix", f"expected a relative key prefix like 'lustre1/', got {prefix!r}")
        kw["prefix"] = prefix if not prefix or prefix.endswith("/") else prefix + "/"
        kw["stripe_size"] = r.get("stripe_size", parse_size)
        kw["stripe_count"] = r.get("stripe_count", _int_range(1, 65535))
        if (kw["stripe_size"] is None) != (kw["stripe_count"] is None):
            r.fail(
                "stripe_count" if kw["stripe_count"] is None else "stripe_size",
                "a striped target needs both stripe_size and stripe_count",
            )
    elif kind == "feed":
        kw.update(_load_feed(r, base))
    else:
        path = r.get("path", _text, required=True)
        kw["path"] = str((base / path).resolve()) if not path.startswith("/") else path
        for k in ("conn_id", "bucket", "prefix", "stripe_size", "stripe_count"):
            if k in r.data:
                r.fail(k, "only s3 targets take this key")
    fileset = r.get("fileset", _list_of(_abs_subtree), default=())
    v = r.sub("verify")
    verify = VerifyConfig()
    if v is not None:

        def ratio(x: Any) -> float:
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0.0 <= x <= 1.0:
                raise ValueError(f"expected a ratio from 0.0 to 1.0, got {x!r}")
            return float(x)

        verify = VerifyConfig(sample=v.get("sample", ratio, default=1.0))
        v.done()
    d = TargetConfig(name=name, source=source, kind=kind)
    for key, why in REMOVED_TARGET_KEYS.items():
        if key in r.data:
            r.fail(key, why)
    part_size = r.get("part_size", parse_size, default=d.part_size)
    if part_size < MIN_PART_SIZE:
        r.fail("part_size", f"S3 parts are at least 5 MiB ({MIN_PART_SIZE} bytes), got {part_size}")
    t = TargetConfig(
        name=name,
        source=source,
        kind=kind,
        fileset=fileset,
        verify=verify,
        coalesce_gap=r.get("coalesce_gap", parse_size, default=d.coalesce_gap),
        part_size=part_size,
        small_object=r.get("small_object", parse_size, default=d.small_object),
        snapshot_retention=r.get("snapshot_retention", _int_range(1), default=d.snapshot_retention),
        max_attempts=r.get("max_attempts", _int_range(1, 100), default=d.max_attempts),
        control_dir=r.get("control_dir", _control_dir, default=d.control_dir),
        **kw,
    )
    r.done()
    return t


def _load_feed(r: _Reader, base: Path) -> dict[str, Any]:
    """The keys of a ``kind: feed`` target: where (a directory, or an S3 prefix), format, events, retention."""
    kw: dict[str, Any] = {}
    if "path" in r.data:
        path = r.get("path", _text)
        kw["path"] = str((base / path).resolve()) if not path.startswith("/") else path
        for k in ("conn_id", "bucket", "prefix"):
            if k in r.data:
                r.fail(k, "a feed goes to a directory (path) or to an S3 prefix (conn_id, bucket, prefix), not both")
    else:
        if "bucket" not in r.data and "conn_id" not in r.data:
            r.fail("path", "a feed needs a directory (path) or an S3 prefix (conn_id, bucket, prefix)")
        kw["conn_id"] = r.get("conn_id", _text, required=True)
        kw["bucket"] = r.get("bucket", _text, required=True)
        prefix = r.get("prefix", str, default="")
        if prefix.startswith("/") or ".." in prefix.split("/"):
            r.fail("prefix", f"expected a relative key prefix like 'feeds/audit/', got {prefix!r}")
        kw["prefix"] = prefix if not prefix or prefix.endswith("/") else prefix + "/"
    for k in ("stripe_size", "stripe_count"):
        if k in r.data:
            r.fail(k, "only s3 targets take this key")
    kw["format"] = r.get("format", _choice(FEED_FORMATS), default="jsonl")

    def events(v: Any) -> tuple[str, ...]:
        got = _list_of(_choice(FEED_EVENTS))(v)
        return tuple(e for e in FEED_EVENTS if e in got)

    kw["events"] = r.get("events", events, default=FEED_EVENTS)
    rt = r.sub("retention")
    d = FeedRetentionConfig()
    if rt is not None:
        kw["retention"] = FeedRetentionConfig(
            epochs=rt.get("epochs", _int_range(0), default=d.epochs),
            max_epochs=rt.get("max_epochs", _int_range(1), default=d.max_epochs),
            idle_limit_s=rt.get("idle_limit", parse_duration, default=d.idle_limit_s),
        )
        rt.done()
    return kw
