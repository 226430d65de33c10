"""``make demo SOURCE=gluster``: the main job on a real file system, a live GlusterFS volume.

Starts SeaweedFS, a Spark Connect server and a 2-brick GlusterFS volume (btrfs bricks,
changelog on, FUSE-mounted; :mod:`epochsync_dev.gluster`), then runs a real workload on the
mount between cuts:

- epoch 1: the volume as epochsync finds it (a README, a 96 MiB file, and a 64 MiB file written
  once sharding is on: Gluster's striped layout);
- epoch 2: the glibc source tarball Debian's ``glibc-source`` ships, untarred (21,000 files);
- epoch 3: directories renamed, 64 KiB appended to and 4 KiB overwritten in both large files,
  hard links, xattrs, a chmod of a subtree, a subtree deleted, symlinks;
- epoch 4: half a directory deleted, truncates, a file replaced by a directory, a rename
  over an existing file, a file created and deleted.

Every epoch goes through the Airflow DAG ``epochsync__vol__<target>`` (``dag.test()`` in one
kept process per target) into a posix target and an s3 target; the DAG's first task cuts
the volume (a read-only btrfs snapshot per brick, without Gluster's barrier: the default). Epoch 3 of the s3
target gets an injected apply failure: the run fails, the rollback restores epoch 2, the
retry succeeds. Each committed epoch is compared with its cut (the brick snapshots walked
directly): every path's type, size, mode, owner, mtime, xattrs, symlink target and hard links,
and the bytes of every file (on s3: of every file whose bytes the epoch changed, and of every
file at the last epoch). At the end the last cut is compared with what a fresh FUSE client sees.

With ``--nodes 3`` (``make demo SOURCE=gluster NODES=3``) the volume is ``replica 3`` over a pool of
three servers on this machine (:mod:`epochsync_dev.pool`): in the middle of epoch 3's workload
the server holding the reader of the cut before is killed (``kill -9`` of its glusterd, brick and
self-heal daemon), epoch 3 is cut with it down, and it comes back in the middle of epoch 4's
workload, which waits for the heal. Barrier off, as every volume's default.

    python -m epochsync_dev.demo_gluster [--workdir var/demo-gluster] [--fail-epoch 3] [--nodes 3]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from epochsync.airflow.dagtest import close_kept_processes
from epochsync_dev.demo import (
    REPO,
    demo_environment,
    epoch_line,
    log,
    migrate_airflow_db,
    run_dag_epoch,
    target_environment,
)

SOURCE = "vol"
TARGETS = ("local", "s3")
TARBALL_GLOB = "/usr/src/glibc/glibc-*.tar.xz"

#: the workload before each epoch's cut (run in the mount with bash -euo pipefail)
WORKLOADS = {
    1: """
        mkdir -p demo
        echo 'a GlusterFS volume replicated by epochsync, one cut per epoch' > demo/README
        dd if=/dev/urandom of=demo/plain.bin bs=1M count=96 status=none
        """,
    # (sharding is turned on between the plain file and this one: see run())
    "1-sharded": "dd if=/dev/urandom of=demo/sharded.bin bs=1M count=64 status=none",
    2: "tar -xJf {tarball} --no-same-owner",
    3: """
        mv glibc-2.36/sysdeps glibc-2.36/sysdeps-renamed
        mv glibc-2.36/elf glibc-2.36/manual/elf-moved
        # --- fault: (NODES=3) the server of the set's reader is killed here
        for f in demo/plain.bin demo/sharded.bin; do
          dd if=/dev/urandom bs=64k count=1 status=none >> $f
          dd if=/dev/urandom of=$f bs=4k count=1 seek=5000 conv=notrunc status=none
        done
        mkdir -p links && ln glibc-2.36/README links/README && ln glibc-2.36/COPYING links/COPYING
        setfattr -n user.origin -v debian-glibc-source glibc-2.36
        setfattr -n user.reviewed -v yes glibc-2.36/NEWS
        chmod -R go-w glibc-2.36/posix
        rm -rf glibc-2.36/localedata
        ln -s ../glibc-2.36/INSTALL links/INSTALL
        """,
    4: """
        ls glibc-2.36/iconvdata | awk 'NR % 2 == 0' | sed 's|^|glibc-2.36/iconvdata/|' | xargs rm -f
        truncate -s 1000 glibc-2.36/ChangeLog.old/ChangeLog.1 || true
        truncate -s 10M demo/sharded.bin
        # --- fault: (NODES=3) the killed server comes back here, and the volume heals
        rm glibc-2.36/manual/elf-moved/Makefile && mkdir glibc-2.36/manual/elf-moved/Makefile
        mv glibc-2.36/NEWS glibc-2.36/README
        echo scratch > demo/scratch && rm demo/scratch
        setfattr -x user.reviewed glibc-2.36/README
        """,
}


def tarball(install: bool = True) -> str:
    """The glibc source tarball Debian's ``glibc-source`` ships (installed with apt-get when missing)."""
    found = sorted(glob.glob(TARBALL_GLOB))
    if not found and install and shutil.which("apt-get") and os.geteuid() == 0:
        log("demo: installing Debian's glibc-source (the source tarball the workload untars)")
        subprocess.run(
            "apt-get update -qq && apt-get install -y -qq --no-install-recommends glibc-source",
            shell=True,
            check=True,
            stdout=subprocess.DEVNULL,
            env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"),
        )
        found = sorted(glob.glob(TARBALL_GLOB))
    if not found:
        raise RuntimeError(f"no {TARBALL_GLOB}: apt-get install glibc-source")
    return found[-1]


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m epochsync_dev.demo_gluster", description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", default=str(REPO / "var" / "demo-gluster"), help="scratch folder (emptied first)")
    p.add_argument("--fail-epoch", type=int, default=3, help="epoch whose s3 apply fails once (0: none)")
    p.add_argument("--fail-after", type=int, default=25, help="mutations before the injected failure")
    p.add_argument(
        "--nodes", type=int, default=1, help="1: a 2-brick volume here; 3: replica 3 over a 3-server pool, one killed"
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from epochsync.core.shutdown import Interrupted, signals_raise

    args = parse_args(argv)
    try:
        with signals_raise():
            return run(args)
    except KeyboardInterrupt as exc:
        sig = Interrupted.of(exc)
        log(f"demo: stopped by {sig.name}")
        return sig.exit_code


def run(args) -> int:
    from epochsync.core.config import load_config
    from epochsync.core.gluster import run_gluster
    from epochsync.journal.undo import read_json
    from epochsync.sources.gluster.reader import data_roots
    from epochsync.targets import open_target
    from epochsync.warehouse.events import ROLLED_BACK, read_events
    from epochsync.warehouse.paths import Warehouse, local_path
    from epochsync_dev.embedded import SeaweedFS, SparkConnectServer, warm_up_wanted
    from epochsync_dev.gluster import GlusterStack, GlusterUnavailable
    from epochsync_dev.gluster_truth import changed_files, compare, cut_truth, mount_truth
    from epochsync_dev.pool import GlusterPool

    workdir = Path(args.workdir).resolve()
    if workdir.exists():
        shutil.rmtree(workdir)
    logs = workdir / "logs"
    logs.mkdir(parents=True)
    t_start = time.monotonic()
    failures: list[str] = []
    lines: list[str] = []
    runs: list[dict] = []
    weed = SeaweedFS(workdir / "seaweedfs")
    pooled = args.nodes > 1
    stack = (
        GlusterPool(nodes=args.nodes, image_size="3G", rollover=5)
        if pooled
        else GlusterStack(workdir / "gluster", bricks=2, brick_size="3G", rollover=5)
    )
    spark_server = None
    try:
        src_tar = tarball()
        try:
            if pooled:
                stack.start(progress=log)
                vol = stack.create_volume("demo", type="replica", progress=log)
            else:
                vol = stack.start(progress=log)
        except GlusterUnavailable as exc:
            log(f"demo: cannot run a GlusterFS volume here: {exc}")
            return 1
        log(f"demo: starting SeaweedFS (S3 on loopback) in {workdir / 'seaweedfs'}")
        endpoint = weed.start()
        spark_server = SparkConnectServer(
            "local[2]", work_dir=workdir / "spark", event_log=workdir / "spark-events", warm_up=warm_up_wanted()
        )
        spark_url = spark_server.start()
        log(f"demo: Spark Connect server {spark_url} on local[2]: every stage of every run is its client")
        cfg_doc = vol.config(
            str(workdir / "warehouse"),
            [
                {"name": "local", "source": SOURCE, "kind": "posix", "path": str(workdir / "replica")},
                {
                    "name": "s3",
                    "source": SOURCE,
                    "kind": "s3",
                    "conn_id": "replica_s3",
                    "bucket": "replica",
                    "prefix": "vol/",
                },
            ],
            source=SOURCE,
            interval="1h",
        )
        cfg_path = workdir / "epochsync.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg_doc, sort_keys=False))
        cfg = load_config(cfg_path)
        wh = Warehouse(cfg.warehouse)
        env = demo_environment(workdir, endpoint, spark_url)
        env["EPOCHSYNC_CONFIG"] = str(cfg_path)
        os.environ.update({k: v for k, v in env.items() if k.startswith(("AIRFLOW_CONN_", "EPOCHSYNC_CONFIG"))})
        tenvs = {}
        for t in TARGETS:
            tenvs[t] = target_environment(env, workdir, t)
            migrate_airflow_db(tenvs[t])
        mount = Path(vol.mount)

        def sh(script: str) -> float:
            t0 = time.monotonic()
            subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=mount, check=True)
            return time.monotonic() - t0

        killed: list[int] = []

        def fault(epoch: int) -> None:
            """NODES=3: the server of the last cut's reader killed (epoch 3), brought back and healed (epoch 4)."""
            if not pooled:
                return
            if not killed:
                rec = read_json(local_path(wh.cut(SOURCE, epoch - 1)))
                reader = next(iter(rec["sets"].values()))["reader"]
                root = rec["bricks"][reader]["root"]
                node = next(n for n in range(1, stack.nodes + 1) if root.startswith(f"{stack.node_dir(n)}/"))
                stack.stop_node(node)
                killed.append(node)
                log(
                    f"demo: killed server {node} ({stack.address(node)}: glusterd, brick, self-heal daemon), the reader's"
                )
            else:
                node = killed[0]
                t0 = time.monotonic()
                stack.start_node(node)
                healed = stack.wait_healed(vol.name, timeout=600)
                log(
                    f"demo: server {node} is back; the volume healed {healed:.0f}s later ({time.monotonic() - t0:.0f}s)"
                )

        def workload(epoch: int) -> float:
            parts = WORKLOADS[epoch].format(tarball=src_tar).split("# --- fault:")
            took = sh(parts[0])
            for part in parts[1:]:
                fault(epoch)
                took += sh(part.split("\n", 1)[1])
            return took

        prev_truth: dict = {}
        for epoch in sorted(k for k in WORKLOADS if isinstance(k, int)):
            took = workload(epoch)
            if epoch == 1:
                command = tuple(getattr(vol, "gluster_command", ()))
                run_gluster(["volume", "set", vol.name, "features.shard", "on"], command=command)
                run_gluster(["volume", "set", vol.name, "features.shard-block-size", "4MB"], command=command)
                took += sh(WORKLOADS["1-sharded"])
            log(f"demo: epoch {epoch} workload on the mount done in {took:.1f}s")
            truth = None
            for target in TARGETS:
                tenv = tenvs[target]
                if target == "s3" and epoch == args.fail_epoch:
                    inject = f"after={args.fail_after},epoch={epoch},target={target}"
                    log(f"epoch {epoch:>2} {target:<6} injecting an apply failure after {args.fail_after} mutations")
                    res = run_dag_epoch(tenv, target, epoch, logs, inject=inject, source=SOURCE)
                    rolled = any(
                        e.get("event") == ROLLED_BACK and e.get("epoch") == epoch
                        for e in read_events(cfg.warehouse, target)
                    )
                    diffs = compare(open_target(cfg.target(target)), prev_truth, contents=set())
                    ok = res["state"] == "failed" and res["tasks"].get("apply") == "failed" and rolled and not diffs
                    status = (
                        f"FAILED as injected; apply {res['tasks'].get('apply')}, rollback {'ran' if rolled else 'DID NOT RUN'}, "
                        f"target {'equals' if not diffs else 'DIFFERS from'} epoch {epoch - 1}"
                    )
                    lines.append(epoch_line(epoch, target, None, res["seconds"], status))
                    log(lines[-1])
                    runs.append(
                        {
                            "epoch": epoch,
                            "target": target,
                            "kind": "injected-failure",
                            "ok": ok,
                            "state": res["state"],
                            "tasks": res["tasks"],
                            "seconds": round(res["seconds"], 1),
                        }
                    )
                    if not ok:
                        failures.append(f"epoch {epoch} {target}: the injected failure was not handled: {diffs[:5]}")
                        break
                    log(f"epoch {epoch:>2} {target:<6} retrying")
                res = run_dag_epoch(tenv, target, epoch, logs, source=SOURCE)
                stats = read_json(local_path(wh.stats(target, epoch)))
                if res["state"] != "success":
                    status = f"FAILED (tasks {res.get('tasks')}; log {res['log']})"
                    failures.append(f"epoch {epoch} {target}: run {res['state']}; log {res['log']}")
                    ok = False
                else:
                    if truth is None:
                        rec = read_json(local_path(wh.cut(SOURCE, epoch)))
                        truth = cut_truth([root for _, root in sorted(data_roots(rec).items())])
                        cut = rec["cut"]
                        held = (
                            f"barrier on {cut['barrier_on_s']:.2f}s, snapshots {cut['snapshots_s']:.3f}s, off {cut['barrier_off_s']:.2f}s"
                            if cut.get("barrier")
                            else f"no barrier, snapshots {cut['snapshots_s']:.3f}s"
                        )
                        log(
                            f"epoch {epoch:>2} cut    in {cut['total_s']:.2f}s ({held}); "
                            f"{sum(rec['publish']['records'].values())} records from {rec['publish']['raw_records']} raw ones"
                        )
                        for name, rs in (rec.get("sets") or {}).items():
                            down = [b for b, up in (rec.get("status") or {}).items() if not up]
                            log(
                                f"epoch {epoch:>2} {name} read through {rs['reader']}"
                                + (f" (down at the cut: {', '.join(down)})" if down else "")
                            )
                    last = epoch == max(k for k in WORKLOADS if isinstance(k, int))
                    contents = None if (target == "local" or last) else changed_files(prev_truth, truth)
                    diffs = compare(open_target(cfg.target(target)), truth, contents=contents)
                    ok = not diffs
                    what = (
                        "all bytes" if contents is None else f"bytes of the {len(contents)} files whose bytes changed"
                    )
                    status = (
                        f"ok, equals its cut ({len(truth)} paths; {what})"
                        if ok
                        else "DIFFERS from its cut: " + "; ".join(diffs[:3])
                    )
                    if not ok:
                        failures.append(f"epoch {epoch} {target}: differs from its cut: {diffs[:10]}")
                lines.append(epoch_line(epoch, target, stats, res["seconds"], status))
                log(lines[-1])
                runs.append(
                    {
                        "epoch": epoch,
                        "target": target,
                        "kind": "run",
                        "ok": ok,
                        "state": res["state"],
                        "tasks": res.get("tasks"),
                        "seconds": round(res["seconds"], 1),
                        "stats": stats,
                    }
                )
                if failures:
                    break
            if failures:
                break
            prev_truth = truth or prev_truth
        if not failures:
            # what a client sees now (a fresh mount: a writer's own client caches a sharded file's times)
            fresh = workdir / "fresh-mount"
            fresh.mkdir()
            subprocess.run(["mount", "-t", "glusterfs", f"{vol.host}:/{vol.name}", str(fresh)], check=True)
            try:
                seen = mount_truth(str(fresh))
            finally:
                subprocess.run(["umount", str(fresh)], check=False)
            drop = ("fid",)
            differ = [
                p
                for p in sorted(set(seen) | set(prev_truth))
                if _strip(seen.get(p), drop) != _strip(prev_truth.get(p), drop)
            ]
            if differ:
                failures.append(f"the last cut differs from what a client sees: {differ[:10]}")
            else:
                log(f"demo: the last cut equals what a fresh client of the volume sees ({len(seen)} paths)")
        log("demo: per epoch and target:\n" + "\n".join(lines))
    except subprocess.CalledProcessError as exc:
        failures.append(f"{' '.join(map(str, exc.cmd))[:120]} exited {exc.returncode}")
    finally:
        close_kept_processes()
        if spark_server is not None:
            spark_server.stop()
        weed.stop()
        stack.stop()
    total = time.monotonic() - t_start
    (workdir / "demo-summary.json").write_text(
        json.dumps(
            {
                "verdict": "failed" if failures else "passed",
                "seconds": round(total, 1),
                "failures": failures,
                "runs": runs,
            },
            indent=1,
            default=str,
        )
    )
    if failures:
        log(f"demo: FAILED in {total:.0f}s: " + " | ".join(failures))
        return 1
    log(
        f"demo: PASSED in {total:.0f}s: every epoch of both targets equals its cut of the live volume; "
        "the injected failure was rolled back and retried"
        + (f"; server {killed[0]} was killed in epoch 3's workload and came back in epoch 4's" if killed else "")
    )
    return 0


def _strip(row: dict | None, keys) -> dict | None:
    return None if row is None else {k: v for k, v in row.items() if k not in keys}


if __name__ == "__main__":
    sys.exit(main())
