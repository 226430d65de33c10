"""The ``simulate`` verb: a workload written out as changelogs, objects, ground truth and a config (``--live``: in real time)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from epochsync.core.errors import EpochsyncError
from epochsync.core.schema import Record, record_to_json
from epochsync_dev.oracle import snapshot_row_to_json
from epochsync_dev.simulate.store import SourceStore

#: The simulated source's root directory fid (Lustre's well-known root).
from epochsync_dev.simulate.workload import (
    EPOCH_INTERVAL_S,
    EPOCH_START,
    STRIPED_KEY,
    UNSTRIPED_KEY,
    SimConfig,
    Workload,
    fast_record_json,
)

#: ``--cache``: the master's own layout (a striped s3 target), different from the cache's
MASTER_STRIPE_SIZE, MASTER_STRIPE_COUNT = 64 * 1024, 4


def write_config(
    out: Path,
    *,
    bucket: str,
    conn_id: str,
    servers: tuple[str, ...],
    root_fid: str,
    start: datetime = EPOCH_START,
    interval_s: float = EPOCH_INTERVAL_S,
    cache: bool = False,
) -> Path:
    """``DIR/epochsync.yaml``: source ``sim``, a posix target ``local`` and an s3 target ``s3``.

    ``cache``: the history is a write-back cache's (docs/reintegration.md): source ``cache``
    and one target, ``master``, striped with the master's own layout.
    """
    import yaml

    cfg = {
        "warehouse": f"file://{out / 'warehouse'}",
        "sources": [
            {
                "name": "sim",
                "root_fid": root_fid,
                "servers": list(servers),
                "changelogs": {"uri": f"file://{out / 'changelogs'}/", "format": "jsonl"},
                "store": {"conn_id": conn_id, "bucket": bucket, "key": STRIPED_KEY, "unstriped_key": UNSTRIPED_KEY},
                "epoch": {"interval": f"{interval_s:g}s", "start": start.strftime("%Y-%m-%dT%H:%M:%SZ")},
            }
        ],
        "targets": [
            {"name": "local", "source": "sim", "kind": "posix", "path": str(out / "replica")},
            {
                "name": "s3",
                "source": "sim",
                "kind": "s3",
                "conn_id": "replica_s3",
                "bucket": "replica",
                "prefix": "sim/",
            },
        ],
    }
    if cache:
        cfg["sources"][0]["name"] = "cache"
        cfg["targets"] = [
            {
                "name": "master",
                "source": "cache",
                "kind": "s3",
                "conn_id": "replica_s3",
                "bucket": "master",
                "prefix": "",
                "stripe_size": MASTER_STRIPE_SIZE,
                "stripe_count": MASTER_STRIPE_COUNT,
            }
        ]
    path = out / "epochsync.yaml"
    header = (
        "# Written by `python -m epochsync_dev simulate`. Keys come from AIRFLOW_CONN_SOURCE_S3 and\n"
        "# AIRFLOW_CONN_REPLICA_S3 (or Airflow connections), never from this file.\n"
    )
    path.write_text(header + yaml.safe_dump(cfg, sort_keys=False, allow_unicode=True))
    return path


def configure_simulate(parser) -> None:
    """Options of ``python -m epochsync_dev simulate``."""
    from epochsync.core.config_values import parse_size

    parser.add_argument("--out", required=True, metavar="DIR", help="output directory (changelogs, truth, config)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (same seed, same history)")
    parser.add_argument("--epochs", type=int, default=6, help="number of epochs (default 6)")
    parser.add_argument("--files", type=int, default=200, help="files created in epoch 1 (default 200)")
    parser.add_argument("--mdts", type=int, default=1, help="metadata servers (default 1)")
    parser.add_argument("--osts", type=int, default=4, help="object servers (default 4)")
    parser.add_argument("--records", type=int, help="target record count over all epochs (sets the ops per epoch)")
    parser.add_argument(
        "--records-per-epoch",
        type=int,
        help="records of each epoch after the first (epoch 1: the initial tree plus --ops-per-epoch operations)",
    )
    parser.add_argument("--ops-per-epoch", type=int, help="operations per epoch (default files/2)")
    parser.add_argument(
        "--write-share", type=float, help="steer each epoch to this share of WRITE records (e.g. 0.7 for benchmarks)"
    )
    parser.add_argument("--no-data", action="store_true", help="records only, fake object versions, nothing stored")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--endpoint", metavar="URL", help="S3 endpoint of the source store (keys from AWS_* env)")
    where.add_argument(
        "--conn-id", default=None, help="connection of the source store (AIRFLOW_CONN_<ID>; default source_s3)"
    )
    parser.add_argument("--bucket", default="sim-source", help="source data bucket (default sim-source)")
    parser.add_argument("--threads", type=int, default=16, help="parallel uploads (default 16)")
    parser.add_argument(
        "--unstriped-ratio",
        type=float,
        default=None,
        help="share of files with no layout (default 0.1; 1.0 with --cache)",
    )
    parser.add_argument(
        "--cache",
        action="store_true",
        help="a write-back cache's history for reintegration: every file unstriped (unless "
        "--unstriped-ratio says otherwise), config with source cache and a striped s3 "
        "target master (docs/reintegration.md)",
    )
    parser.add_argument(
        "--max-file-size", type=parse_size, default=256 * 1024, help="files stay below this size (default 256KiB)"
    )
    parser.add_argument(
        "--live",
        action="store_true",
        help="produce the epochs in real time: epoch E's changelogs appear (closed) at the end of its window",
    )
    parser.add_argument("--interval", default=None, help="epoch length (default 5m; 30s with --live)")
    parser.add_argument(
        "--start", default=None, help="start of epoch 1, ISO time (default: 2026-01-01; with --live the next boundary)"
    )


def _epoch_grid_of(args, live: bool) -> tuple[datetime, float]:
    """Start of epoch 1 and the epoch length: as given, else 2026-01-01 and 5 minutes, or, live,
    30 s epochs from the next whole interval at least 10 s away."""
    from epochsync.core.config_values import parse_datetime, parse_duration

    interval_s = (
        parse_duration(args.interval) if getattr(args, "interval", None) else (30.0 if live else EPOCH_INTERVAL_S)
    )
    if getattr(args, "start", None):
        start = parse_datetime(args.start)
    elif live:
        now = time.time() + 10
        start = datetime.fromtimestamp((int(now // interval_s) + 1) * interval_s, tz=UTC)
    else:
        start = EPOCH_START
    return start, interval_s


def _sleep_until(when: float) -> None:
    while (left := when - time.time()) > 0:
        time.sleep(min(left, 1.0))


def run_simulate(args) -> int:
    """Run the simulator and write the on-disk layout; progress on stderr, summary on stdout."""
    from epochsync.stores.connections import S3Settings, resolve_s3

    out = Path(args.out).resolve()
    live = bool(getattr(args, "live", False))
    if live and args.no_data:
        raise EpochsyncError("simulate: --live writes a source with data; drop --no-data")
    start, interval_s = _epoch_grid_of(args, live)
    cfg = SimConfig(
        seed=args.seed,
        epochs=args.epochs,
        files=args.files,
        mdts=args.mdts,
        osts=args.osts,
        ops_per_epoch=args.ops_per_epoch,
        records=args.records,
        records_per_epoch=args.records_per_epoch,
        data=not args.no_data,
        unstriped_ratio=args.unstriped_ratio if args.unstriped_ratio is not None else (1.0 if args.cache else 0.1),
        max_file_size=args.max_file_size,
        write_share=args.write_share,
    )
    conn_id = args.conn_id or "source_s3"
    store = None
    if cfg.data:
        if args.endpoint:
            settings = S3Settings(
                conn_id="--endpoint",
                endpoint_url=args.endpoint,
                access_key=os.environ.get("AWS_ACCESS_KEY_ID"),
                secret_key=os.environ.get("AWS_SECRET_ACCESS_KEY"),
                region=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
            )
        else:
            settings = resolve_s3(conn_id)
        store = SourceStore(settings, args.bucket, threads=args.threads)
        store.ensure_versioned_bucket()

    # this run owns these folders: a rerun replaces them, never mixes two histories
    stale = [p for p in (out / "warehouse", out / "replica") if p.exists()]
    if stale:
        print(
            f"simulate: note: {', '.join(map(str, stale))} hold an earlier replication; remove them to start afresh",
            file=sys.stderr,
        )
    for sub in ("changelogs", "truth", "snapshot"):
        shutil.rmtree(out / sub, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "truth").mkdir()
    for server in cfg.servers:
        (out / "changelogs" / server).mkdir(parents=True)

    collected: list[Record] = []
    handles: dict[str, Any] = {}
    progress_every = 1_000_000

    def stream(rec: Record) -> None:
        handles[rec.server].write(fast_record_json(rec) + "\n")
        if w.records_total % progress_every == 0:
            print(f"simulate: {w.records_total:,} records...", file=sys.stderr, flush=True)

    w = Workload(cfg, collected.append if cfg.data else stream)
    started = time.monotonic()
    stored_bytes = stored_versions = 0
    if live:
        # the config first: a scheduler reads the epoch grid before the first epoch closes
        config = write_config(
            out,
            bucket=args.bucket,
            conn_id=conn_id,
            servers=cfg.servers,
            root_fid=cfg.root_fid,
            start=start,
            interval_s=interval_s,
        )
        print(
            f"simulate: live: config {config}; epoch 1 starts {start.isoformat()}, every {interval_s:g}s",
            file=sys.stderr,
            flush=True,
        )
        _sleep_until(start.timestamp())
    for e in range(1, cfg.epochs + 1):
        t0 = time.monotonic()
        name = f"{e:06d}.jsonl"
        if not cfg.data:
            handles = {s: open(out / "changelogs" / s / name, "w", encoding="utf-8") for s in cfg.servers}
        collected.clear()
        try:
            w.run_epoch(e)
        finally:
            for h in handles.values():
                h.close()
        n_records = w.epoch_records
        if store is not None:
            versions = store.put_versions(w.uploads, lambda m: print(f"simulate: {m}", file=sys.stderr, flush=True))
            store.delete(w.deletes)
            stored_versions += len(w.uploads)
            stored_bytes += sum(len(u.data) for u in w.uploads)
            w.remap_versions(versions, collected)
            by_server: dict[str, list[Record]] = {s: [] for s in cfg.servers}
            for r in collected:
                by_server[r.server].append(r)
            if live:  # the epoch closes at the end of its window, not before
                _sleep_until(start.timestamp() + e * interval_s)
            for s, recs in by_server.items():
                # whole or not at all: a reader listing the folder never sees half a file
                tmp = out / "changelogs" / s / f".{name}.tmp"
                with open(tmp, "w", encoding="utf-8") as f:
                    for r in recs:
                        f.write(record_to_json(r) + "\n")
                os.replace(tmp, out / "changelogs" / s / name)
        n_paths = 0
        with open(out / "truth" / f"epoch={e}.jsonl", "w", encoding="utf-8") as f:
            for row in w.iter_truth():
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
                n_paths += 1
        snap_dir = out / "snapshot" / f"epoch={e}"
        snap_dir.mkdir(parents=True)
        with open(snap_dir / "part-0.jsonl", "w", encoding="utf-8") as f:
            for row in w.model.iter_snapshot_rows():
                f.write(json.dumps(snapshot_row_to_json(row), ensure_ascii=False) + "\n")
        if live:
            with open(out / "closed.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps({"epoch": e, "closed_at": time.time()}) + "\n")
        uploaded = f", {len(w.uploads)} object versions stored, {len(w.deletes)} deleted" if store else ""
        print(
            f"simulate: epoch {e}/{cfg.epochs}: {n_records:,} records, {n_paths:,} paths{uploaded} "
            f"({time.monotonic() - t0:.1f}s)",
            file=sys.stderr,
            flush=True,
        )
        w.finish_epoch()
    config = write_config(
        out,
        bucket=args.bucket,
        conn_id=conn_id,
        servers=cfg.servers,
        root_fid=cfg.root_fid,
        start=start,
        interval_s=interval_s,
        cache=args.cache,
    )
    data = (
        f"; {stored_versions:,} object versions ({stored_bytes / 1e6:.1f} MB) in bucket {args.bucket}" if store else ""
    )
    print(
        f"simulated {cfg.epochs} epochs, {w.records_total:,} records{data} in {time.monotonic() - started:.1f}s; "
        f"config {config}"
    )
    return 0
