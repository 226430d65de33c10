"""``python -m epochsync_dev.bench rollback``: roll back a directory rename on an s3 target.

An embedded SeaweedFS (``weed mini``), a versioned source bucket and an s3 target: epoch 1
creates ``--files`` files in ``a/`` and is committed; epoch 2 renames ``a/`` to ``z/`` (two
undo entries per file: the new key's put, the old key's delete). Then, ``--rounds`` times
and for each replay (``threads``: :meth:`S3Target.undo_all`; ``sequential``: the contract's
default, one entry at a time, what every target did before), epoch 2 is applied again and
rolled back with :func:`epochsync.stages.rollback.rollback_target` (no Spark check); the
replica is compared with epoch 1 (paths, sizes, hashes) after every rollback. No Spark:
plans come from the real planner fed with hand-written snapshot entries.

Rows (``bench/results/rollback.json``): replay, round, undo entries, seconds, this
process's CPU seconds, requests sent, the 1-minute load average before and after.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from pathlib import Path

from epochsync_dev.bench import write_results


def _row(size: int, version: str, fid: str) -> dict:
    return {
        "type": "file" if fid else "dir",
        "mode": 0o644 if fid else 0o755,
        "uid": 0,
        "gid": 0,
        "size": size,
        "atime_ns": 1_700_000_000_000_000_000,
        "mtime_ns": 1_700_000_000_000_000_000,
        "xattrs": [],
        "symlink": None,
        "layout": None,
        "objects": [{"ost": "OST0000", "oid": fid, "version": version}] if fid else [],
    }


def _entry(fid: str, old, new, old_paths: list[str], new_paths: list[str]) -> dict:
    return {"fid": fid, "old": old, "new": new, "old_paths": old_paths, "new_paths": new_paths, "change": None}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns 0, or 1 when a rollback did not restore epoch 1."""
    p = argparse.ArgumentParser(prog="python -m epochsync_dev.bench rollback", description=__doc__.split("\n")[0])
    p.add_argument("--files", type=int, default=2000, help="files in the renamed directory")
    p.add_argument("--rounds", type=int, default=2, help="rollbacks per replay (alternating order)")
    p.add_argument("--replays", default="sequential,threads", help="comma-separated: sequential, threads")
    args = p.parse_args(argv)

    from concurrent.futures import ThreadPoolExecutor

    import epochsync.stages.rollback as rollback_stage
    from epochsync.core.config import config_from_dict
    from epochsync.journal.undo import journal_dir, read_journal
    from epochsync.stages.apply import apply_plan
    from epochsync.stages.context import _target_dict
    from epochsync.stages.translate import build_plan
    from epochsync.stores.connections import resolve_s3
    from epochsync.stores.s3_access import S3Access
    from epochsync.targets import open_target
    from epochsync.targets.base import Target
    from epochsync.targets.s3 import S3Target
    from epochsync_dev.embedded import SeaweedFS

    work = Path(tempfile.mkdtemp(prefix="epochsync-bench-rollback-"))
    rows: list[dict] = []
    with SeaweedFS(work / "weed") as ep:
        os.environ["AIRFLOW_CONN_BENCH_ROLLBACK"] = ep.airflow_conn_json()
        client = ep.client()
        src = "src-" + uuid.uuid4().hex[:8]
        client.create_bucket(Bucket=src)
        client.put_bucket_versioning(Bucket=src, VersioningConfiguration={"Status": "Enabled"})
        cfg = config_from_dict(
            {
                "warehouse": str(work / "wh"),
                "sources": [
                    {
                        "name": "s",
                        "root_fid": "R",
                        "servers": ["M"],
                        "changelogs": {"uri": "/x"},
                        "store": {"conn_id": "bench_rollback", "bucket": src},
                        "epoch": {"interval": 60, "start": "2026-01-01"},
                    }
                ],
                "targets": [
                    {"name": "t", "source": "s", "kind": "s3", "conn_id": "bench_rollback", "bucket": "replica"}
                ],
            },
            file=str(work / "c.yaml"),
        )
        target = open_target(cfg.target("t"))
        target.ensure_bucket()
        store = {"key": "{ost}/{oid}", "unstriped_key": "data/{fid}", "bucket": src}

        def put(i: int):
            data = os.urandom(1024)
            return i, client.put_object(Bucket=src, Key=f"data/F{i}", Body=data)["VersionId"]

        with ThreadPoolExecutor(16) as pool:
            versions = dict(pool.map(put, range(args.files)))
        d = _row(0, "", "")
        files = {i: _row(1024, versions[i], f"F{i}") for i in range(args.files)}

        def apply(entries: list[dict], epoch: int) -> None:
            plan = build_plan(entries, target=_target_dict(cfg.target("t")), store=store, epoch=epoch)
            problems, state = target.fence_check(plan["fence"], target.fence_time_ns())
            if problems:
                raise SystemExit(f"fence: {problems[:3]}")
            io = S3Access(resolve_s3("bench_rollback"))
            apply_plan(plan, target, io, src, journal_dir(cfg.warehouse, "t", epoch), state)

        apply(
            [_entry("D", None, d, [], ["a"])] + [_entry(f"F{i}", None, f, [], [f"a/f{i}"]) for i, f in files.items()], 1
        )
        target.write_manifest({"epoch": 1})
        epoch1 = sorted((e.path, e.size, e.sha256) for e in target.walk())
        rename = [_entry("D", d, d, ["a"], ["z"])] + [
            _entry(f"F{i}", f, f, [f"a/f{i}"], [f"z/f{i}"]) for i, f in files.items()
        ]
        replays = [r.strip() for r in args.replays.split(",") if r.strip()]
        opened: list = []
        real_open = rollback_stage.open_target

        def counting_open(tcfg):
            opened.append(real_open(tcfg))
            return opened[-1]

        rollback_stage.open_target = counting_open  # type: ignore[assignment]
        threaded = S3Target.undo_all
        ok = True
        for rnd in range(1, args.rounds + 1):
            for replay in replays if rnd % 2 else list(reversed(replays)):
                S3Target.undo_all = threaded if replay == "threads" else Target.undo_all  # type: ignore[method-assign]
                apply(rename, 2)
                entries = len(read_journal(journal_dir(cfg.warehouse, "t", 2)))
                load0 = os.getloadavg()[0]
                cpu0, t0 = time.process_time(), time.monotonic()
                r = rollback_stage.rollback_target(cfg, "t", check=False)
                seconds, cpu = time.monotonic() - t0, time.process_time() - cpu0
                load1 = os.getloadavg()[0]
                back = sorted((e.path, e.size, e.sha256) for e in target.walk()) == epoch1
                ok = ok and back and r["undone"] == entries
                row = {
                    "replay": replay,
                    "round": rnd,
                    "files": args.files,
                    "undo_entries": entries,
                    "seconds": round(seconds, 2),
                    "cpu_seconds": round(cpu, 2),
                    "requests": sum(opened[-1].io.counters.requests.values()),
                    "load_before": round(load0, 2),
                    "load_after": round(load1, 2),
                    "equals_epoch_1": back,
                }
                rows.append(row)
                print(row, flush=True)
        S3Target.undo_all = threaded  # type: ignore[method-assign]
        rollback_stage.open_target = real_open  # type: ignore[assignment]
    print(f"results: {write_results('rollback', rows)}")
    return 0 if ok else 1
