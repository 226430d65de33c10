"""Feed targets (``kind: feed``): each epoch's net change published as one ordered, durable file.

A feed is a consumer of the source like a replica, with the same epoch run (ingest →
merge → publish): publishing takes the place of translate, apply, verify and commit.
Under the feed's directory or S3 prefix:

``_feed.json``
    The commit point, written last and atomically like a replica's manifest:
    ``{"feed", "source", "schema_version", "format", "epoch", "first_epoch", "file",
    "records", "bytes", "sha256", "events", "fileset", "committed_at"}``. ``epoch`` is
    the last published epoch; an epoch file above it is not published (a crash mid-publish
    left it; the rerun writes the same bytes over it).
``epochs/<E, 10 digits>.jsonl.gz`` (or ``.parquet``)
    The net change of epoch E (of the window ``first_epoch..E`` when a catch-up run
    merged several epochs at once): the records of ``epochsync changes --from E-1 --to E
    --format jsonl``, filtered, each with ``epoch`` and ``seq`` (its line number).
    gzip-compressed JSON Lines (``format: jsonl``, the default; gzip header without a
    time or name, so republishing an epoch writes the same bytes) or one Parquet file
    (``format: parquet``; ``ranges`` as ``list<struct<offset, length>>``, ``xattrs`` as
    ``list<struct<name, value: binary>>``).
``dumps/<E>.jsonl.gz`` (or ``.parquet``)
    The namespace at E, one row per path (``path, type, size, mode, uid, gid, mtime_ns,
    symlink, fid``), sorted by path: where a new consumer starts (Triton's hydration).
``_consumers/<name>.json``
    A registered consumer: ``{"consumer", "acked", "dump_epoch", "registered_at",
    "updated_at"}``. It reads ``epochs/`` files after ``acked`` in name order and says
    so with ``epochsync feed ack``.
``_purged.json``
    ``{"through": P}``: the newest epoch file the purge deleted. A consumer that acked
    less than P missed files for good: it is refused and must hydrate.

Filters (Couchbase's channels: one source, several filtered feeds): the target's
``fileset`` (subtrees; a move across the boundary is a NEW or a DELETE) and ``events``,
a mask of ``create`` (NEW, LINK), ``delete``, ``rename``, ``data``, ``attrs``,
``xattrs`` (what a MODIFY says; a MODIFY left with nothing is dropped).

Consumers (``epochsync feed register|ack|status|hydrate|unregister --consumer NAME``):
``register`` writes (or reuses) the dump at the last published epoch E and sets the
consumer's acknowledgement to E; ``ack --epoch E`` records that everything up to E was
processed; ``status`` says what to read next; ``hydrate`` starts a consumer again from a
fresh dump. The purge (:func:`purge_feed`, run by the source's purge DAG) deletes epoch
files every registered consumer acknowledged and that ``retention.epochs`` no longer
keeps; ``retention.max_epochs`` bounds what an absent consumer can hold back (its files
go anyway, and it must hydrate); consumers idle past ``retention.idle_limit`` with
unacknowledged epochs are reported and fail the purge, as idle targets do.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import sys
import time
from datetime import UTC, datetime
from typing import Any

from epochsync.core.config import Config, TargetConfig, load_config
from epochsync.core.errors import EpochError
from epochsync.journal.lease import holds_target_lease
from epochsync.journal.undo import advance_cursor, manifest_epoch, write_json_atomic
from epochsync.report.changes import check_inputs, diff_entries, gather_entries, to_json_line
from epochsync.targets.feed import FEED_DOC, FeedStore, open_feed_store
from epochsync.warehouse.events import COMMITTED, record_event
from epochsync.warehouse.paths import Warehouse, local_path

SCHEMA_VERSION = 1
EPOCHS_DIR, DUMPS_DIR, CONSUMERS_DIR = "epochs", "dumps", "_consumers"
PURGED_DOC = "_purged.json"
#: which event of the mask each line kind is
EVENT_OF_KIND = {"NEW": "create", "LINK": "create", "DELETE": "delete", "RENAME": "rename"}
DUMP_FIELDS = ("path", "type", "size", "mode", "uid", "gid", "mtime_ns", "symlink", "fid")
_CONSUMER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_EPOCH_FILE_RE = re.compile(r"^(\d{10})\.(jsonl\.gz|parquet)$")


class FeedError(EpochError):
    """A feed or one of its consumers cannot do what was asked (the message says what to do)."""


def _config(cfg) -> Config:
    return cfg if isinstance(cfg, Config) else load_config(cfg)


def _feed_cfg(cfg: Config, target) -> TargetConfig:
    tcfg = target if isinstance(target, TargetConfig) else cfg.target(target)
    if tcfg.kind != "feed":
        raise FeedError(f"target {tcfg.name} is a {tcfg.kind} target, not a feed (kind: feed)")
    return tcfg


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _suffix(fmt: str) -> str:
    return "parquet" if fmt == "parquet" else "jsonl.gz"


def epoch_file(epoch: int, fmt: str) -> str:
    """``epochs/0000000042.jsonl.gz``: names sort in epoch order."""
    return f"{EPOCHS_DIR}/{epoch:010d}.{_suffix(fmt)}"


def dump_file(epoch: int, fmt: str) -> str:
    """Returns the name of the namespace dump at ``epoch`` in a feed: ``dumps/0000000042.<suffix>``."""
    return f"{DUMPS_DIR}/{epoch:010d}.{_suffix(fmt)}"


def published_epochs(store: FeedStore) -> list[int]:
    """Epochs with a file under ``epochs/`` (published or not: compare with ``_feed.json``)."""
    return sorted(int(m.group(1)) for n in store.list(EPOCHS_DIR) if (m := _EPOCH_FILE_RE.match(n)))


# --------------------------------------------------------------------------- filters and encoding


def filter_events(records: list[dict], events: tuple[str, ...] | list[str]) -> list[dict]:
    """Records the event mask lets through; a MODIFY keeps only the masked parts of what changed."""
    mask = set(events)
    out = []
    for r in records:
        if r["kind"] != "MODIFY":
            if EVENT_OF_KIND[r["kind"]] in mask:
                out.append(r)
            continue
        what = [w for w in r["changed"] if w in mask]
        if not what:
            continue
        r = dict(r, changed=what)
        if "data" not in what:
            for k in ("ranges", "whole_file", "old_size"):
                r.pop(k, None)
        out.append(r)
    return out


def _parquet_schema():
    import pyarrow as pa

    rng = pa.struct([("offset", pa.int64()), ("length", pa.int64())])
    xat = pa.struct([("name", pa.string()), ("value", pa.binary())])
    return pa.schema(
        [
            ("epoch", pa.int64()),
            ("seq", pa.int64()),
            ("kind", pa.string()),
            ("path", pa.string()),
            ("old_path", pa.string()),
            ("link_to", pa.string()),
            ("fid", pa.string()),
            ("type", pa.string()),
            ("changed", pa.list_(pa.string())),
            ("size", pa.int64()),
            ("old_size", pa.int64()),
            ("mode", pa.int64()),
            ("uid", pa.int64()),
            ("gid", pa.int64()),
            ("mtime_ns", pa.int64()),
            ("symlink", pa.string()),
            ("xattrs", pa.list_(xat)),
            ("whole_file", pa.bool_()),
            ("ranges", pa.list_(rng)),
        ]
    )


def _dump_schema():
    import pyarrow as pa

    types = {
        "path": pa.string(),
        "type": pa.string(),
        "size": pa.int64(),
        "mode": pa.int64(),
        "uid": pa.int64(),
        "gid": pa.int64(),
        "mtime_ns": pa.int64(),
        "symlink": pa.string(),
        "fid": pa.string(),
    }
    return pa.schema([(f, types[f]) for f in DUMP_FIELDS])


def _to_parquet_row(r: dict) -> dict:
    import base64

    row = dict(r)
    if "xattrs" in row:
        row["xattrs"] = [{"name": k, "value": base64.b64decode(v)} for k, v in sorted((row["xattrs"] or {}).items())]
    if "ranges" in row:
        row["ranges"] = [{"offset": o, "length": n} for o, n in row["ranges"]]
    return row


def _from_parquet_row(row: dict) -> dict:
    import base64

    r = {k: v for k, v in row.items() if v is not None}
    if "xattrs" in r:
        r["xattrs"] = {x["name"]: base64.b64encode(x["value"]).decode() for x in r["xattrs"]}
    if "ranges" in r:
        r["ranges"] = [[x["offset"], x["length"]] for x in r["ranges"]]
    return r


def encode_rows(rows: list[dict], fmt: str, schema=None) -> bytes:
    """Rows as the bytes of one feed file; the same rows always give the same bytes."""
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = schema or _parquet_schema()
        table = pa.Table.from_pylist([_to_parquet_row(r) for r in rows], schema=schema)
        buf = io.BytesIO()
        pq.write_table(table, buf, compression="zstd")
        return buf.getvalue()
    text = "".join(to_json_line(r) + "\n" for r in rows).encode("utf-8")
    return gzip.compress(text, compresslevel=6, mtime=0)


def decode_rows(data: bytes, fmt: str) -> list[dict]:
    """The rows of a feed file (epoch file or dump), as the JSON form gives them."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return [_from_parquet_row(r) for r in pq.read_table(io.BytesIO(data)).to_pylist()]
    return [json.loads(line) for line in gzip.decompress(data).decode("utf-8").splitlines() if line]


def read_epoch(cfg, target, epoch: int) -> list[dict]:
    """The published records of ``epoch`` (a consumer's read, for scripts and tests)."""
    cfg = _config(cfg)
    tcfg = _feed_cfg(cfg, target)
    store = open_feed_store(tcfg)
    data = store.read(epoch_file(epoch, tcfg.format))
    if data is None:
        raise FeedError(
            f"feed {tcfg.name}: no file for epoch {epoch} ({store.describe()}{epoch_file(epoch, tcfg.format)})"
        )
    return decode_rows(data, tcfg.format)


# --------------------------------------------------------------------------- publish


def _fault_counter(cfg: Config, tcfg: TargetConfig, epoch: int, inject):
    """Fault injection for the publish: mutation 1 writes the epoch file, 2 commits ``_feed.json``."""
    from epochsync.journal.faults import FaultCounter, resolve
    from epochsync.journal.undo import plan_dir

    spec = resolve(inject)
    if spec is None or not spec.applies(tcfg.name, epoch):
        return None
    pdir = plan_dir(cfg.warehouse, tcfg.name, epoch)
    os.makedirs(pdir, exist_ok=True)
    counter = os.path.join(pdir, "publish-faults.count")
    if os.path.exists(counter):
        os.remove(counter)
    return FaultCounter(spec, counter, os.path.join(pdir, "fault.fired"))


def _records_in(cfg: Config, source: str, first: int, last: int) -> int:
    from epochsync.core.arrow import dataset_module

    ds = dataset_module()

    n = 0
    for e in range(first, last + 1):
        path = local_path(Warehouse(cfg.warehouse).records(source, e))
        if os.path.isdir(path):
            t = ds.dataset(path, format="parquet", partitioning="hive").to_table(columns=["type"])
            n += sum(1 for x in t.column("type").to_pylist() if x != "EPOCH")
    return n


@holds_target_lease  # one publisher per feed (its lease: a hidden file in the feed folder)
def publish_epoch(cfg, target, first_epoch: int, epoch: int, spark=None, *, inject=None) -> dict:
    """Publish the net change of ``first_epoch..epoch`` (merged already) as one feed file; returns the stats row.

    The epoch DAG calls it in place of apply (and translate, verify, commit). Already
    published: a no-op. A gap (``_feed.json`` below ``first_epoch - 1``) is refused naming
    the missing epochs. Order: the epoch file (atomic; the same bytes on every rerun),
    the warehouse stats row, then ``_feed.json`` (the commit point), then the source
    cursor (so the source's purge may drop what the feed has published).
    """
    from epochsync.stages import commit

    t0 = time.monotonic()
    cfg = _config(cfg)
    tcfg = _feed_cfg(cfg, target)
    src = cfg.source_of(tcfg)
    store = open_feed_store(tcfg)
    published = manifest_epoch(store.read_json(FEED_DOC))
    if published >= epoch:
        return {
            "noop": True,
            "epoch": published,
            "message": f"feed {tcfg.name} is already at epoch {published}: epoch {epoch} is a no-op",
        }
    if published != first_epoch - 1:
        span = f"{published + 1}..{first_epoch - 1}" if first_epoch - 1 > published + 1 else f"{published + 1}"
        raise FeedError(
            f"feed {tcfg.name} is at epoch {published}, so epoch {first_epoch} would leave a gap: epoch(s) {span} "
            f"are missing. Backfill them first: epochsync replicate --config {cfg.file} --target {tcfg.name} "
            f"--through {first_epoch - 1}"
        )
    check_inputs(cfg, tcfg, first_epoch - 1, epoch, [(first_epoch, epoch)])
    if spark is None:
        from epochsync.spark import spark_session

        spark = spark_session(f"epochsync-publish-{tcfg.name}", cfg=cfg)
    records = filter_events(
        diff_entries(gather_entries(spark, cfg, tcfg, first_epoch - 1, epoch, [(first_epoch, epoch)])), tcfg.events
    )
    records = [{**r, "epoch": epoch, "seq": i} for i, r in enumerate(records)]
    data = encode_rows(records, tcfg.format)
    name = epoch_file(epoch, tcfg.format)
    faults = _fault_counter(cfg, tcfg, epoch, inject)
    if faults:
        faults.tick(f"write {name}")
    store.write(name, data)
    counts: dict[str, int] = {}
    for r in records:
        for k in [r["kind"]] if r["kind"] != "MODIFY" else [f"MODIFY {w}" for w in r["changed"]]:
            counts[k] = counts.get(k, 0) + 1
    row = {
        "target": tcfg.name,
        "source": src.name,
        "kind": "feed",
        "first_epoch": first_epoch,
        "epoch": epoch,
        "status": "committed",
        "records_in": _records_in(cfg, src.name, first_epoch, epoch),
        "net_operations": {
            "created": counts.get("NEW", 0),
            "deleted": counts.get("DELETE", 0),
            "moved": counts.get("RENAME", 0),
            "linked": counts.get("LINK", 0),
            "attrs": counts.get("MODIFY attrs", 0) + counts.get("MODIFY xattrs", 0),
            "data": counts.get("MODIFY data", 0),
        },
        "events": counts,
        "records_published": len(records),
        "file": name,
        "bytes_written": len(data),
        "bytes_changed": sum(n for r in records for _, n in r.get("ranges") or []),
        "bytes_pulled": 0,
        "bytes_copied": 0,
        "sha256": hashlib.sha256(data).hexdigest(),
        "durations": {"publish": round(time.monotonic() - t0, 3)},
        "committed_at": time.time(),
    }
    write_json_atomic(local_path(Warehouse(cfg.warehouse).stats(tcfg.name, epoch)), row)
    if faults:
        faults.tick(f"commit {FEED_DOC}")
    store.write_json(
        FEED_DOC,
        {
            "feed": tcfg.name,
            "source": src.name,
            "schema_version": SCHEMA_VERSION,
            "format": tcfg.format,
            "epoch": epoch,
            "first_epoch": first_epoch,
            "file": name,
            "records": len(records),
            "bytes": len(data),
            "sha256": row["sha256"],
            "events": list(tcfg.events),
            "fileset": list(tcfg.fileset),
            "snapshot": Warehouse(cfg.warehouse).snapshot(tcfg.name, epoch),
            "committed_at": _now_iso(),
        },
    )
    record_event(cfg.warehouse, tcfg.name, COMMITTED, epoch, first_epoch=first_epoch)
    advance_cursor(cfg.warehouse, src.name, tcfg.name, epoch, commit._last_indexes(cfg, src.name, first_epoch, epoch))
    row["durations"]["publish"] = round(time.monotonic() - t0, 3)
    return row


# --------------------------------------------------------------------------- dumps and consumers


def write_dump(cfg: Config, tcfg: TargetConfig, store: FeedStore, epoch: int, spark=None) -> str:
    """The namespace at ``epoch`` (fileset applied) as ``dumps/<E>``; reused when it exists."""
    name = dump_file(epoch, tcfg.format)
    if store.read(name) is not None:
        return name
    from pyspark.sql import functions as F

    from epochsync.warehouse.snapshots import read_snapshot, resolve_links, visible

    if spark is None:
        from epochsync.spark import spark_session

        spark = spark_session(f"epochsync-feed-dump-{tcfg.name}", cfg=cfg)
    src = cfg.source_of(tcfg)
    snap = read_snapshot(spark, Warehouse(cfg.warehouse), tcfg.name, epoch, src.root_fid)
    links = visible(resolve_links(snap, src.root_fid), tcfg.fileset).select("fid", "path")
    df = links.join(snap.select("fid", "type", "size", "mode", "uid", "gid", "mtime_ns", "symlink"), "fid")
    df = df.withColumn("size", F.when(F.col("type") == "file", F.col("size"))).select(*DUMP_FIELDS).orderBy("path")
    rows = [r.asDict() for r in df.toLocalIterator()]
    store.write(name, encode_rows(rows, tcfg.format, _dump_schema() if tcfg.format == "parquet" else None))
    return name


def read_dump(cfg, target, epoch: int) -> list[dict]:
    """The rows of the dump at ``epoch``."""
    cfg = _config(cfg)
    tcfg = _feed_cfg(cfg, target)
    data = open_feed_store(tcfg).read(dump_file(epoch, tcfg.format))
    if data is None:
        raise FeedError(f"feed {tcfg.name}: no dump at epoch {epoch}")
    return decode_rows(data, tcfg.format)


def _consumer_doc_name(name: str) -> str:
    if not isinstance(name, str) or not _CONSUMER_RE.match(name):
        raise FeedError(f"consumer names are letters, digits, '_', '-', '.', got {name!r}")
    return f"{CONSUMERS_DIR}/{name}.json"


def read_consumers(store: FeedStore) -> list[dict]:
    """Returns every registered consumer's document in the feed, sorted by name."""
    out = []
    for n in store.list(CONSUMERS_DIR):
        if n.endswith(".json"):
            doc = store.read_json(f"{CONSUMERS_DIR}/{n}")
            if doc:
                out.append(doc)
    return sorted(out, key=lambda d: d["consumer"])


def purged_through(store: FeedStore) -> int:
    """Returns the last epoch whose files were purged from the feed (0: none)."""
    return int((store.read_json(PURGED_DOC) or {}).get("through") or 0)


def _behind_message(tcfg: TargetConfig, consumer: str, acked: int, purged: int, cfg: Config) -> str:
    return (
        f"consumer {consumer} of feed {tcfg.name} acknowledged epoch {acked}, but the feed's files through epoch "
        f"{purged} were purged (retention): it cannot catch up from the feed. Hydrate it from a new dump: "
        f"epochsync feed hydrate --config {cfg.file} --target {tcfg.name} --consumer {consumer}"
    )


def _start_from_dump(cfg: Config, tcfg: TargetConfig, store: FeedStore, name: str, spark, prior: dict | None) -> dict:
    published = manifest_epoch(store.read_json(FEED_DOC))
    dump = write_dump(cfg, tcfg, store, published, spark)
    now = _now_iso()
    doc = {
        "consumer": name,
        "acked": published,
        "dump_epoch": published,
        "dump": dump,
        "registered_at": (prior or {}).get("registered_at") or now,
        "updated_at": now,
    }
    store.write_json(_consumer_doc_name(name), doc)
    return doc


def register_consumer(cfg, target, name: str, spark=None) -> dict:
    """A new consumer: the dump at the last published epoch E, acknowledged through E (it reads from E+1)."""
    cfg = _config(cfg)
    tcfg = _feed_cfg(cfg, target)
    store = open_feed_store(tcfg)
    if store.read_json(_consumer_doc_name(name)) is not None:
        raise FeedError(
            f"consumer {name} of feed {tcfg.name} is already registered: to start it again from a new dump run "
            f"epochsync feed hydrate --config {cfg.file} --target {tcfg.name} --consumer {name}"
        )
    return _start_from_dump(cfg, tcfg, store, name, spark, None)


def hydrate_consumer(cfg, target, name: str, spark=None) -> dict:
    """Start a registered consumer again from the dump at the last published epoch; returns its document."""
    cfg = _config(cfg)
    tcfg = _feed_cfg(cfg, target)
    store = open_feed_store(tcfg)
    prior = _consumer(cfg, tcfg, store, name)
    return _start_from_dump(cfg, tcfg, store, name, spark, prior)


def unregister_consumer(cfg, target, name: str) -> dict:
    """Remove consumer ``name`` from the feed; returns its document as it was."""
    cfg = _config(cfg)
    tcfg = _feed_cfg(cfg, target)
    store = open_feed_store(tcfg)
    doc = _consumer(cfg, tcfg, store, name)
    store.delete(_consumer_doc_name(name))
    return doc


def _consumer(cfg: Config, tcfg: TargetConfig, store: FeedStore, name: str) -> dict:
    doc = store.read_json(_consumer_doc_name(name))
    if doc is None:
        have = ", ".join(d["consumer"] for d in read_consumers(store)) or "none"
        raise FeedError(
            f"feed {tcfg.name} has no consumer {name!r} (registered: {have}); register it: "
            f"epochsync feed register --config {cfg.file} --target {tcfg.name} --consumer {name}"
        )
    return doc


def ack_consumer(cfg, target, name: str, epoch: int) -> dict:
    """Record that consumer ``name`` processed everything up to ``epoch`` (a published epoch);
    returns its document."""
    cfg = _config(cfg)
    tcfg = _feed_cfg(cfg, target)
    store = open_feed_store(tcfg)
    doc = _consumer(cfg, tcfg, store, name)
    published = manifest_epoch(store.read_json(FEED_DOC))
    purged = purged_through(store)
    if doc["acked"] < purged:
        raise FeedError(_behind_message(tcfg, name, doc["acked"], purged, cfg))
    if epoch > published:
        raise FeedError(
            f"feed {tcfg.name} has published epochs up to {published}: consumer {name} cannot acknowledge epoch {epoch}"
        )
    if epoch < doc["acked"]:
        raise FeedError(
            f"consumer {name} of feed {tcfg.name} already acknowledged epoch {doc['acked']}; "
            f"acknowledgements only move forward (got {epoch})"
        )
    doc = dict(doc, acked=epoch, updated_at=_now_iso())
    store.write_json(_consumer_doc_name(name), doc)
    return doc


def _idle_s(doc: dict, now: float) -> float:
    try:
        return now - datetime.fromisoformat(doc["updated_at"].replace("Z", "+00:00")).timestamp()
    except (KeyError, ValueError, AttributeError):
        return 0.0


def consumer_status(cfg, target, name: str | None = None, *, now: float | None = None) -> dict:
    """The feed and its consumers: acknowledged epoch, lag, next files to read, idle or behind retention.

    With ``name``, a consumer behind retention is refused (:class:`FeedError` naming hydrate).
    """
    cfg = _config(cfg)
    tcfg = _feed_cfg(cfg, target)
    store = open_feed_store(tcfg)
    now = time.time() if now is None else now
    doc = store.read_json(FEED_DOC) or {}
    published = manifest_epoch(doc) if doc else 0
    purged = purged_through(store)
    files = [e for e in published_epochs(store) if e <= published]
    consumers = [_consumer(cfg, tcfg, store, name)] if name else read_consumers(store)
    out: dict[str, Any] = {
        "feed": tcfg.name,
        "where": store.describe(),
        "format": tcfg.format,
        "published_epoch": published,
        "purged_through": purged,
        "epoch_files": files,
        "consumers": [],
    }
    for c in consumers:
        behind = c["acked"] < purged
        if name and behind:
            raise FeedError(_behind_message(tcfg, name, c["acked"], purged, cfg))
        idle = _idle_s(c, now)
        out["consumers"].append(
            {
                "consumer": c["consumer"],
                "acked": c["acked"],
                "lag_epochs": published - c["acked"],
                "behind_retention": behind,
                "idle_s": round(idle, 1),
                "idle": c["acked"] < published and idle > tcfg.retention.idle_limit_s,
                "next_files": [epoch_file(e, tcfg.format) for e in files if e > c["acked"]],
                "dump": c.get("dump") if c["acked"] == c.get("dump_epoch") else None,
            }
        )
    return out


# --------------------------------------------------------------------------- purge


def purge_feed(cfg, target, *, dry_run: bool = False, log=print, now: float | None = None) -> dict:
    """Delete epoch files every registered consumer acknowledged and retention no longer keeps.

    Returns ``{"feed", "purged_through", "files", "dumps", "idle", "dropped", "dry_run"}``:
    ``idle`` are consumers with unacknowledged epochs idle past ``retention.idle_limit``
    (the caller fails the purge naming them), ``dropped`` those whose unacknowledged files
    ``retention.max_epochs`` let go (they must hydrate).
    """
    cfg = _config(cfg)
    tcfg = _feed_cfg(cfg, target)
    store = open_feed_store(tcfg)
    ret = tcfg.retention
    st = consumer_status(cfg, tcfg, now=now)
    published = st["published_epoch"]
    live = [c for c in st["consumers"] if not c["behind_retention"]]
    through = min([published - ret.epochs] + [c["acked"] for c in live])
    if ret.max_epochs is not None:
        through = max(through, published - ret.max_epochs)
    doomed = [e for e in st["epoch_files"] if e <= through]
    newest = max(doomed) if doomed else 0
    dropped = [c["consumer"] for c in live if c["acked"] < newest]
    keep_dumps = {c["acked"] for c in st["consumers"] if c.get("dump")}
    dumps = sorted(int(n[:10]) for n in store.list(DUMPS_DIR) if n[:10].isdigit())
    dead_dumps = [d for d in dumps[:-1] if d not in keep_dumps]
    idle = [c["consumer"] for c in st["consumers"] if c["idle"]]
    for c in st["consumers"]:
        state = ", behind retention (must hydrate)" if c["behind_retention"] else ""
        if c["idle"]:
            state += f", idle for {c['idle_s']:.0f}s"
        log(f"feed {tcfg.name}: consumer {c['consumer']}: acknowledged epoch {c['acked']} of {published}{state}")
    if dropped:
        log(
            f"feed {tcfg.name}: retention.max_epochs {ret.max_epochs} lets go of epochs its consumers did not "
            f"acknowledge: {', '.join(dropped)} must hydrate"
        )
    log(
        f"feed {tcfg.name}: purging epoch files <= {max(through, 0)}: {len(doomed)} files, {len(dead_dumps)} old dumps"
        f"{' (dry run: nothing deleted)' if dry_run else ''}"
    )
    if not dry_run and doomed:
        # the marker first: a consumer that needs a file about to go is refused from now on
        store.write_json(PURGED_DOC, {"through": max(newest, purged_through(store)), "at": _now_iso()})
        for e in doomed:
            store.delete(epoch_file(e, tcfg.format))
    if not dry_run:
        for d in dead_dumps:
            store.delete(dump_file(d, tcfg.format))
    return {
        "feed": tcfg.name,
        "purged_through": newest,
        "files": len(doomed),
        "dumps": len(dead_dumps),
        "idle": idle,
        "dropped": dropped,
        "dry_run": dry_run,
    }


# --------------------------------------------------------------------------- the verb and the Spark app


def configure_feed(parser) -> None:
    """Add the ``feed`` verb's options to ``parser``."""
    parser.add_argument(
        "action",
        choices=("register", "ack", "status", "hydrate", "unregister"),
        help="register a consumer (starts from a dump), ack an epoch, show status, hydrate a "
        "consumer again from a new dump, or unregister it",
    )
    parser.add_argument("--config", required=True, metavar="FILE", help="epochsync YAML config")
    parser.add_argument("--target", required=True, metavar="NAME", help="the feed target")
    parser.add_argument("--consumer", metavar="NAME", help="the consumer (status: all when omitted)")
    parser.add_argument("--epoch", type=int, metavar="E", help="ack: the last epoch the consumer processed")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="status output")


def run_feed(args) -> int:
    """The ``feed`` verb: register, ack, show, hydrate or unregister a consumer; returns 0."""
    cfg = load_config(args.config)
    if args.action != "status" and not args.consumer:
        raise FeedError(f"feed {args.action} needs --consumer NAME")
    if args.action == "ack" and args.epoch is None:
        raise FeedError("feed ack needs --epoch E (the last epoch the consumer processed)")
    if args.action == "register":
        d = register_consumer(cfg, args.target, args.consumer)
        print(
            f"consumer {d['consumer']}: registered at epoch {d['acked']}: load {d['dump']}, then read epoch files "
            f"after {d['acked']}"
        )
    elif args.action == "hydrate":
        d = hydrate_consumer(cfg, args.target, args.consumer)
        print(
            f"consumer {d['consumer']}: hydrated at epoch {d['acked']}: load {d['dump']}, then read epoch files "
            f"after {d['acked']}"
        )
    elif args.action == "ack":
        d = ack_consumer(cfg, args.target, args.consumer, args.epoch)
        print(f"consumer {d['consumer']}: acknowledged through epoch {d['acked']}")
    elif args.action == "unregister":
        unregister_consumer(cfg, args.target, args.consumer)
        print(f"consumer {args.consumer}: unregistered")
    else:
        st = consumer_status(cfg, args.target, args.consumer)
        if args.format == "json":
            json.dump(st, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            print(
                f"feed {st['feed']} at {st['where']}: published through epoch {st['published_epoch']}, "
                f"{len(st['epoch_files'])} epoch files kept, purged through {st['purged_through']}"
            )
            for c in st["consumers"]:
                if c["behind_retention"]:
                    print(
                        f"  {c['consumer']}: acknowledged {c['acked']}, lag {c['lag_epochs']}, behind retention: "
                        f"hydrate it (epochsync feed hydrate --config {cfg.file} --target {args.target} --consumer {c['consumer']})"
                    )
                    continue
                nxt = "nothing"
                if c["next_files"]:
                    more = len(c["next_files"]) - 1
                    nxt = c["next_files"][0] + (f" (+{more} more)" if more else "")
                load = f"load {c['dump']}, then " if c["dump"] else ""
                print(
                    f"  {c['consumer']}: acknowledged {c['acked']}, lag {c['lag_epochs']}, "
                    f"{'idle' if c['idle'] else 'ok'}; {load}next: {nxt}"
                )
    return 0
