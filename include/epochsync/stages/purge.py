"""The purge DAG's logic: drop what every consumer has applied and retention no longer keeps.

For a source, the consumers are its targets; each keeps a cursor
(``cursors/source=S/<target>.json``: the last committed epoch and, per server, the
last index applied). Epochs at or below ``min(cursor epochs) - retention.epochs`` are
purgeable:

- warehouse records ``records/source=S/epoch=E/`` of those epochs are deleted;
- a raw changelog file under ``<changelogs.uri>/<server>/`` is deleted when its last
  record's index is at or below the last index of that server in the purgeable epochs
  (read from the warehouse records before they go), so a file still holding a record a
  consumer needs is kept whole.

A feed target (``kind: feed``) is a consumer like a replica (its cursor moves when it
publishes an epoch); its own epoch files are purged by :func:`epochsync.stages.publish.purge_feed`
for the consumers registered to the feed, whose idle ones are reported the same way.

A consumer whose cursor has not moved for ``retention.idle_limit`` holds the minimum
cursor forever: the purge lists it, and every consumer lagging more than
``retention.epochs`` behind the most advanced one, and fails naming the idle ones, so
an operator removes or repairs the consumer instead of the changelogs filling the disk.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from typing import IO, Any

from epochsync.core.config import Config, SourceConfig
from epochsync.core.errors import EpochsyncError
from epochsync.warehouse.paths import Warehouse, epoch_partitions, local_path


class PurgeBlocked(EpochsyncError):
    """A consumer would block purging forever (idle past the limit)."""


@dataclass
class Consumer:
    """Where one consumer of a source is: its committed epoch, per-server indexes and idle time."""

    name: str
    epoch: int
    servers: dict[str, int]
    idle_s: float | None  # seconds since the cursor last moved; None: never committed


@dataclass
class PurgePlan:
    """What a purge of a source would drop, and why not more (idle or lagging consumers)."""

    source: str
    consumers: list[Consumer]
    min_epoch: int
    purge_through: int  # epochs <= this are purged (0: nothing)
    idle: list[str] = field(default_factory=list)
    lagging: list[str] = field(default_factory=list)
    bounds: dict[str, int] = field(default_factory=dict)  # server -> last purgeable index
    record_dirs: list[str] = field(default_factory=list)
    changelog_files: list[str] = field(default_factory=list)


def read_consumers(config: Config, source: SourceConfig, *, now: float | None = None) -> list[Consumer]:
    """Every target of ``source`` with its cursor (epoch 0 and no servers when it never committed)."""
    import json

    now = time.time() if now is None else now
    wh = Warehouse(config.warehouse)
    out = []
    for t in config.targets:
        if t.source != source.name:
            continue
        path = local_path(wh.cursor(source.name, t.name))
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
            idle = now - os.stat(path).st_mtime
        except FileNotFoundError:
            doc, idle = {}, None
        out.append(Consumer(t.name, int(doc.get("epoch") or 0), dict(doc.get("servers") or {}), idle))
    return out


def _record_epochs(config: Config, source: str) -> list[int]:
    return epoch_partitions(Warehouse(config.warehouse).records(source))


def _last_indexes(config: Config, source: str, epochs: list[int]) -> dict[str, int]:
    """server -> highest record index in the warehouse records of ``epochs``."""
    if not epochs:
        return {}
    from epochsync.core.arrow import dataset_module

    ds = dataset_module()

    wh = Warehouse(config.warehouse)
    out: dict[str, int] = {}
    for e in epochs:
        path = local_path(wh.records(source, e))
        table = ds.dataset(path, format="parquet", partitioning="hive").to_table(columns=["server", "index"])
        if table.num_rows == 0:
            continue
        grouped = table.group_by("server").aggregate([("index", "max")])
        for server, index in zip(grouped.column("server").to_pylist(), grouped.column("index_max").to_pylist()):
            server = str(server)
            out[server] = max(out.get(server, index), index)
    return out


class ChangelogStore:
    """List, read and delete a source's raw changelog files (``file://``, a path, or ``s3://``)."""

    def __init__(self, source: SourceConfig):
        self.source = source
        self.uri = source.changelogs.uri.rstrip("/")
        self._s3 = None

    def _s3_client(self):
        if self._s3 is None:
            from epochsync.stores.connections import resolve_s3

            conn = self.source.changelogs.conn_id or self.source.store.conn_id
            self._s3 = resolve_s3(conn).client()
        return self._s3

    def _bucket_prefix(self, server: str) -> tuple[str, str]:
        rest = self.uri[len("s3://") :]
        bucket, _, prefix = rest.partition("/")
        prefix = f"{prefix.strip('/')}/{server}/" if prefix.strip("/") else f"{server}/"
        return bucket, prefix

    def files(self, server: str) -> list[str]:
        """The server's changelog files in name order (the order ingest reads them)."""
        if self.uri.startswith("s3://"):
            bucket, prefix = self._bucket_prefix(server)
            keys = []
            for page in self._s3_client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
                keys += [o["Key"] for o in page.get("Contents", []) if not o["Key"].endswith("/")]
            return [f"s3://{bucket}/{k}" for k in sorted(keys)]
        folder = os.path.join(local_path(self.uri), server)
        if not os.path.isdir(folder):
            return []
        return [os.path.join(folder, n) for n in sorted(os.listdir(folder)) if os.path.isfile(os.path.join(folder, n))]

    def last_index(self, file: str, server: str) -> int | None:
        """The highest record index in ``file`` (None when it holds no record)."""
        from epochsync.formats import ParseOptions, parse_stream

        if file.startswith("s3://"):
            import io

            bucket, _, key = file[len("s3://") :].partition("/")
            stream: IO[bytes] = io.BytesIO(self._s3_client().get_object(Bucket=bucket, Key=key)["Body"].read())
        else:
            stream = open(file, "rb")
        last = None
        with stream:
            # bad lines are not our business here: ingest already quarantined or refused them
            opts = ParseOptions(server=server, on_error=lambda err: None)
            for rec in parse_stream(self.source.changelogs.format, stream, file, opts):
                if last is None or rec.index > last:
                    last = rec.index
        return last

    def delete(self, file: str) -> None:
        """Delete one changelog file (local or ``s3://``)."""
        if file.startswith("s3://"):
            bucket, _, key = file[len("s3://") :].partition("/")
            self._s3_client().delete_object(Bucket=bucket, Key=key)
        else:
            os.unlink(file)


def plan_purge(config: Config, source_name: str, *, now: float | None = None) -> PurgePlan:
    """What a purge of ``source_name`` would delete, and which consumers hold it back."""
    source = config.source(source_name)
    consumers = read_consumers(config, source, now=now)
    if not consumers:
        return PurgePlan(source_name, [], 0, 0)
    limit = source.retention.idle_limit_s
    idle = [c.name for c in consumers if c.idle_s is not None and c.idle_s > limit]
    best = max(c.epoch for c in consumers)
    lagging = [c.name for c in consumers if best - c.epoch > source.retention.epochs]
    min_epoch = min(c.epoch for c in consumers)
    through = max(0, min_epoch - source.retention.epochs)
    plan = PurgePlan(source_name, consumers, min_epoch, through, idle, lagging)
    if through == 0:
        return plan
    epochs = [e for e in _record_epochs(config, source_name) if e <= through]
    plan.record_dirs = [local_path(Warehouse(config.warehouse).records(source_name, e)) for e in epochs]
    bounds = _last_indexes(config, source_name, epochs)
    # never past what every consumer has applied on that server (-1: one has applied nothing there)
    for server in list(bounds):
        bounds[server] = min(bounds[server], *(int(c.servers.get(server, -1)) for c in consumers))
    plan.bounds = bounds
    store = ChangelogStore(source)
    for server in source.servers:
        if server not in bounds:
            continue
        for f in store.files(server):
            last = store.last_index(f, server)
            if last is None or last > bounds[server]:
                break  # files are read in name order: the rest are newer
            plan.changelog_files.append(f)
    return plan


def purge_cuts(config: Config, source: SourceConfig, committed: int, *, dry_run: bool = False, log=print) -> list[int]:
    """Drops the cuts of a live source every consumer has committed (at or below ``committed``, their
    minimum), but the newest cut: the next cut compares each changed file with it. Returns the
    epochs dropped (or, with ``dry_run``, that would be)."""
    from epochsync.stages.cut import mechanism, published_epoch

    mech = mechanism(source)
    latest = published_epoch(config, source.name)
    drop = [e for e in mech.epochs() if e <= committed and e < latest]
    log(
        f"cuts of {source.name}: {len(drop)} of {len(mech.epochs())} committed by every consumer"
        f"{' (dry run: none dropped)' if dry_run else ' dropped'}" + (f": epochs {drop[0]}..{drop[-1]}" if drop else "")
    )
    if not dry_run:
        for e in drop:
            mech.drop(e)
    return drop


def purge_source(config: Config, source_name: str, *, dry_run: bool = False, log=print) -> dict[str, Any]:
    """Run a purge; returns its figures (what was, or with ``dry_run`` would be, dropped; feeds
    too). Raises :class:`PurgeBlocked` after logging when a consumer is idle past the limit."""
    plan = plan_purge(config, source_name)
    source = config.source(source_name)
    for c in plan.consumers:
        idle = "never committed" if c.idle_s is None else f"cursor moved {c.idle_s:.0f}s ago"
        log(f"consumer {c.name}: epoch {c.epoch}, {idle}")
    if plan.lagging:
        log(f"lagging more than {source.retention.epochs} epochs behind the most advanced: {', '.join(plan.lagging)}")
    if plan.idle:
        log(f"idle past the limit of {source.retention.idle_limit_s:.0f}s: {', '.join(plan.idle)}")
    log(
        f"minimum cursor epoch {plan.min_epoch}, retention {source.retention.epochs} epochs: "
        f"purging epochs <= {plan.purge_through}: {len(plan.changelog_files)} changelog files, "
        f"{len(plan.record_dirs)} record partitions{' (dry run: nothing deleted)' if dry_run else ''}"
    )
    if not dry_run:
        # changelogs first: their bounds were read from the records about to go
        store = ChangelogStore(source)
        for f in plan.changelog_files:
            store.delete(f)
        for d in plan.record_dirs:
            shutil.rmtree(d, ignore_errors=True)
    cuts: list[int] = []
    if source.kind == "gluster" and plan.consumers:
        cuts = purge_cuts(config, source, plan.min_epoch, dry_run=dry_run, log=log)
    result = {
        "source": source_name,
        "min_epoch": plan.min_epoch,
        "purged_through": plan.purge_through,
        "changelog_files": len(plan.changelog_files),
        "record_partitions": len(plan.record_dirs),
        "idle": plan.idle,
        "lagging": plan.lagging,
        "dry_run": dry_run,
    }
    if source.kind == "gluster":
        result["cuts_dropped"] = cuts
    # feed targets: their epoch files, held by the feed's own registered consumers
    from epochsync.stages.publish import purge_feed

    feeds = [
        purge_feed(config, t, dry_run=dry_run, log=log)
        for t in config.targets
        if t.source == source_name and t.kind == "feed"
    ]
    result["feeds"] = feeds
    idle_feed = [f"{c} (feed {f['feed']})" for f in feeds for c in f["idle"]]
    if plan.idle or idle_feed:
        parts = []
        if plan.idle:
            parts.append(
                f"consumers idle past {source.retention.idle_limit_s:.0f}s hold the minimum cursor of source "
                f"{source_name!r} at epoch {plan.min_epoch} forever: {', '.join(plan.idle)}; remove them from the "
                "config or bring them up to date (trigger or backfill their epoch DAG)"
            )
        if idle_feed:
            parts.append(
                f"feed consumers idle past their feed's retention.idle_limit hold its epoch files: "
                f"{', '.join(idle_feed)}; acknowledge (epochsync feed ack), unregister (epochsync feed unregister) "
                "or bound them with the feed's retention.max_epochs"
            )
        raise PurgeBlocked("; ".join(parts) + "; then purge again")
    return result


# --------------------------------------------------------------------------- the verb


def configure_purge(parser) -> None:
    """Add the ``purge`` verb's options to ``parser``."""
    parser.add_argument("--config", required=True, metavar="FILE", help="epochsync YAML config")
    parser.add_argument("--source", required=True, metavar="NAME", help="the source to purge")
    parser.add_argument("--dry-run", action="store_true", help="say what would be dropped; drop nothing")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON document")


def run_purge(args) -> int:
    """The ``purge`` verb: what the purge DAG's task does, its log lines on stdout (or ``--json``);
    returns 0 (1, naming them, when idle consumers block it)."""
    import json

    from epochsync.core.config import load_config

    cfg = load_config(args.config)
    out = purge_source(cfg, args.source, dry_run=args.dry_run, log=(lambda _l: None) if args.json else print)
    if args.json:
        print(json.dumps(out, indent=1, sort_keys=True))
    return 0
