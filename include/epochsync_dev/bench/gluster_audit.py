"""``python -m epochsync_dev.bench gluster-audit``: ``epochsync audit`` of a 50,000-file Gluster volume.

The volume of ``make bench-gluster``'s small-writes workload: a distribute volume of two btrfs
bricks on this machine (:class:`epochsync_dev.gluster.GlusterStack`), ``--files`` files of
8 KiB in directories of 1,000, written through two FUSE clients by 16 threads, plus a hard link
and a symlink for every 100th file and a ``user.*`` xattr on every 50th. Epoch 1 cuts it and
replicates it to a posix target on one warm Spark Connect server (local[2]). Then the audit of
that target against the cut, metadata only, ``--rounds`` times, and once with ``--deep``.

Rows (``bench/results/gluster.audit.json``): ``epoch`` (the cut and the replicate of epoch 1),
``audit`` (one per round: seconds, paths, differences; the deep one with ``deep: true``),
``audits`` (the metadata rounds' median and maximum against the target of 30 s).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from epochsync_dev.bench import write_results

TARGET_S = 30.0
SMALL_FILE = 8192


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns 0, or 1 when an audit finds a difference."""
    p = argparse.ArgumentParser(prog="python -m epochsync_dev.bench gluster-audit", description=__doc__.split("\n")[0])
    p.add_argument("--files", type=int, default=50_000, help="files of 8 KiB on the volume (default 50,000)")
    p.add_argument("--rounds", type=int, default=3, help="metadata audits (default 3)")
    args = p.parse_args(argv)

    from epochsync.core.config import load_config
    from epochsync.spark import spark_session
    from epochsync.stages.audit import audit_target
    from epochsync.stages.cut import cut_source
    from epochsync.stages.replicate import replicate
    from epochsync_dev.embedded import SparkConnectServer
    from epochsync_dev.gluster import GlusterStack

    work = Path(tempfile.mkdtemp(prefix="epochsync-bench-audit-"))
    stack = GlusterStack(work / "gluster", brick_size="4G", rollover=15)
    spark_server = SparkConnectServer("local[2]", work_dir=work / "spark")
    rows: list[dict] = []
    failed = False
    try:
        vol = stack.start(progress=print)
        doc = vol.config(
            str(work / "warehouse"),
            [{"name": "local", "source": "vol", "kind": "posix", "path": str(work / "replica")}],
        )
        (work / "epochsync.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        cfg = load_config(work / "epochsync.yaml")
        t0 = time.monotonic()
        _write_tree(stack, Path(vol.mount), args.files, work)
        print(f"bench gluster-audit: {args.files:,} files written in {time.monotonic() - t0:.0f} s")
        spark = spark_session("bench-gluster-audit", remote=spark_server.start(), shuffle_partitions=2)
        t0 = time.monotonic()
        epoch = cut_source(cfg, "vol", progress=lambda _l: None)["cuts"][-1]["epoch"]
        cut_s = time.monotonic() - t0
        replicate(cfg, "local", epoch, spark=spark, progress=lambda _l: None)
        rows.append(
            {
                "row": "epoch",
                "files": args.files,
                "epoch": epoch,
                "cut_s": round(cut_s, 2),
                "cut_and_replicate_s": round(time.monotonic() - t0, 2),
            }
        )
        print(f"bench gluster-audit: epoch {epoch} cut and replicated in {time.monotonic() - t0:.0f} s")
        spark.stop()
        spark_server.stop()  # the audit of a Gluster target needs no Spark: measured without it
        took = []
        for deep in [False] * args.rounds + [True]:
            r = audit_target(cfg, "local", deep=deep)
            row = {
                "row": "audit",
                "files": args.files,
                "deep": deep,
                "paths": r["paths"],
                "held": r["held"],
                "differences": len(r["differences"]),
                "seconds": r["seconds"],
                "loadavg_1m": round(os.getloadavg()[0], 2),
            }
            rows.append(row)
            failed |= bool(r["differences"])
            if not deep:
                took.append(r["seconds"])
            print(
                f"bench gluster-audit: {'deep' if deep else 'metadata'} audit of {r['paths']:,} paths: "
                f"{r['seconds']:.2f} s, {len(r['differences'])} differences"
                + (f" (first: {r['differences'][0]})" if r["differences"] else "")
            )
        rows.append(
            {
                "row": "audits",
                "files": args.files,
                "deep": False,
                "rounds": len(took),
                "seconds_median": round(statistics.median(took), 2),
                "seconds_max": max(took),
                "target_s": TARGET_S,
            }
        )
        write_results("gluster.audit", rows)
        return 1 if failed else 0
    finally:
        spark_server.stop()
        stack.stop()


def _write_tree(stack, mount: Path, files: int, work: Path) -> None:
    """The files through two FUSE clients (as bench-gluster writes its small files), then the links,
    symlinks and xattrs."""
    for d in range((files + 999) // 1000):
        (mount / f"small/d{d:03d}").mkdir(parents=True, exist_ok=True)
    (mount / "links").mkdir()
    base = os.urandom(SMALL_FILE)
    second = stack.mount_client(work / "mnt-2")
    mounts = (str(mount), second)

    def one(i: int) -> None:
        fd = os.open(
            os.path.join(mounts[i % 2], f"small/d{i // 1000:03d}/f{i:06d}"),
            os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
            0o644,
        )
        try:
            os.write(fd, f"{i:08d}".encode() + base[8:])
        finally:
            os.close(fd)

    def extra(i: int) -> None:
        path = os.path.join(mounts[i % 2], f"small/d{i // 1000:03d}/f{i:06d}")
        if i % 100 == 0:
            os.link(path, os.path.join(mounts[i % 2], f"links/h{i:06d}"))
            os.symlink(f"../small/d{i // 1000:03d}/f{i:06d}", os.path.join(mounts[i % 2], f"links/s{i:06d}"))
        if i % 50 == 0:
            os.setxattr(path, "user.bench", f"{i}".encode())

    try:
        with ThreadPoolExecutor(16) as ex:
            list(ex.map(one, range(files)))
            list(ex.map(extra, range(0, files, 50)))
    finally:
        stack.unmount_client(second)
