"""``python -m epochsync_dev.bench gluster-pool``: cuts and an append on a ``replica 3`` volume over three servers.

A pool of three Gluster servers on this machine (:mod:`epochsync_dev.pool`: each in its own
network and mount namespace, a btrfs brick each), one ``replica 3`` volume, a posix target.
Epoch 1 publishes a tree of small files and a 100 MiB file. Then, while a writer creates a
file on the mount every 20 ms, ``--cuts`` cuts with ``cut.barrier: false`` (the default) and as
many with ``barrier: true``, alternating; each is timed end to end (:func:`cut_source`, the
``epochsync cut`` of a DAG's first task) with the cut's own split. Last, 64 KiB appended to the
100 MiB file, one cut, one replicate: the bytes pulled from the source, and (through agents)
every byte the agents answered for that cut and pull, which is what crossed between hosts.

By default the pipeline reaches the bricks as production does, through an ``epochsync agent``
per server (its cuts, the cut's reads and the pull); ``--here`` reads the bricks where the
bench runs instead (``cut.bricks_here``).

Rows (``bench/results/gluster.pool.json``), each with ``topology: replica3-3servers`` and
``via`` (agents, here): ``cut`` (one per cut), ``cuts`` (medians and maxima per barrier setting),
``append``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import yaml

from epochsync_dev.bench import write_results

TOPOLOGY = "replica3-3servers"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns 0, or 1 when the replica differs from its cut."""
    p = argparse.ArgumentParser(prog="python -m epochsync_dev.bench gluster-pool", description=__doc__.split("\n")[0])
    p.add_argument("--cuts", type=int, default=10, help="cuts per barrier setting")
    p.add_argument("--files", type=int, default=2000, help="small files of epoch 1")
    p.add_argument("--here", action="store_true", help="read the bricks here, not through an agent per server")
    args = p.parse_args(argv)

    from epochsync.core.config import load_config
    from epochsync.journal.undo import read_json
    from epochsync.spark import spark_session
    from epochsync.stages.cut import cut_source
    from epochsync.stages.replicate import replicate
    from epochsync.targets import open_target
    from epochsync.warehouse.paths import Warehouse, local_path
    from epochsync_dev.embedded import SparkConnectServer
    from epochsync_dev.gluster_truth import compare, cut_truth
    from epochsync_dev.pool import GlusterPool, PoolAgents

    work = Path(tempfile.mkdtemp(prefix="epochsync-bench-pool-"))
    rows: list[dict] = []
    pool = GlusterPool(nodes=3, image_size="2G", rollover=1)
    spark_server = SparkConnectServer("local[2]", work_dir=work / "spark")
    stop = threading.Event()
    agents = None
    via = "here" if args.here else "agents"
    try:
        pool.start(progress=print)
        vol = pool.create_volume("bench", type="replica", progress=print)
        doc = vol.config(
            str(work / "warehouse"),
            [{"name": "local", "source": "vol", "kind": "posix", "path": str(work / "replica")}],
        )
        if not args.here:
            agents = PoolAgents(pool, pool.work_dir / "agents")
            os.environ["AIRFLOW_CONN_BENCH_AGENTS"] = agents.conn_json()
            doc["sources"][0].update(agents=agents.urls, agent_conn_id="bench_agents")
        cfgs = {}
        for barrier in (False, True):
            doc["sources"][0]["cut"]["barrier"] = barrier
            path = work / f"epochsync-{'barrier' if barrier else 'default'}.yaml"
            path.write_text(yaml.safe_dump(doc, sort_keys=False))
            cfgs[barrier] = load_config(path)
        cfg = cfgs[False]
        mount = Path(vol.mount)
        (mount / "tree").mkdir()
        for i in range(args.files):
            (mount / "tree" / f"f{i:05d}").write_text(f"file {i}\n" * (1 + i % 50))
        with open(mount / "big.bin", "wb") as f:
            for _ in range(100):
                f.write(os.urandom(1 << 20))
        spark = spark_session("bench-gluster-pool", remote=spark_server.start(), shuffle_partitions=2)
        first = cut_source(cfg, "vol", progress=lambda _l: None)["cuts"][-1]["epoch"]
        replicate(cfg, "local", first, spark=spark, progress=lambda _l: None)
        print(f"bench gluster-pool: epoch {first} published and replicated ({args.files} files and 100 MiB)")

        def writer():
            i = 0
            (mount / "writer").mkdir(exist_ok=True)
            while not stop.is_set():
                (mount / "writer" / f"w{i:06d}").write_text("w\n")
                i += 1
                time.sleep(0.02)

        w = threading.Thread(target=writer, daemon=True)
        w.start()
        cut_rows = []
        for i in range(2 * args.cuts):
            barrier = i % 2 == 1
            t0 = time.monotonic()
            out = cut_source(cfgs[barrier], "vol", progress=lambda _l: None)["cuts"][-1]
            took = time.monotonic() - t0
            c = out.get("cut") or {}
            row = {
                "row": "cut",
                "topology": TOPOLOGY,
                "via": via,
                "epoch": out["epoch"],
                "barrier": barrier,
                "end_to_end_s": round(took, 3),
                "cut_total_s": c.get("total_s"),
                "barrier_on_s": c.get("barrier_on_s") if barrier else None,
                "snapshots_s": c.get("snapshots_s"),
                "loadavg_1m": os.getloadavg()[0],
            }
            cut_rows.append(row)
            print(f"bench gluster-pool: cut {out['epoch']} barrier {barrier}: {took:.3f} s end to end")
            time.sleep(0.5)
        stop.set()
        w.join()
        rows += cut_rows
        for barrier in (False, True):
            e2e = [r["end_to_end_s"] for r in cut_rows if r["barrier"] is barrier]
            rows.append(
                {
                    "row": "cuts",
                    "topology": TOPOLOGY,
                    "via": via,
                    "barrier": barrier,
                    "cuts": len(e2e),
                    "end_to_end_s_median": round(statistics.median(e2e), 3),
                    "end_to_end_s_max": max(e2e),
                    "target_s": 0.5 if not barrier else None,
                }
            )
        last = cut_rows[-1]["epoch"]
        replicate(cfg, "local", last, spark=spark, progress=lambda _l: None)
        with open(mount / "big.bin", "ab") as f:
            f.write(os.urandom(64 << 10))
        served0 = agents.served_bytes() if agents else 0
        epoch = cut_source(cfg, "vol", progress=lambda _l: None)["cuts"][-1]["epoch"]
        replicate(cfg, "local", epoch, spark=spark, progress=lambda _l: None)
        between = agents.served_bytes() - served0 if agents else None
        stats = read_json(local_path(Warehouse(cfg.warehouse).stats("local", epoch)))
        from epochsync.sources.gluster.reader import data_roots
        from epochsync.stages.cut import read_cut

        roots = [r for _, r in sorted(data_roots(read_cut(cfg, "vol", epoch)).items())]
        problems = compare(open_target(cfg.target("local")), cut_truth(roots), limit=10)
        rows.append(
            {
                "row": "append",
                "topology": TOPOLOGY,
                "via": via,
                "file_mib": 100,
                "appended_kib": 64,
                "bytes_pulled": stats.get("bytes_pulled"),
                "bytes_between_hosts": between,
                "target_bytes": 1 << 20,
                "replica_equals_cut": not problems,
            }
        )
        print(
            f"bench gluster-pool: 64 KiB appended to a 100 MiB file: {stats.get('bytes_pulled')} bytes pulled"
            + (f", {between} bytes answered by the agents (cut and pull)" if agents else "")
        )
        spark.stop()
        write_results("gluster.pool", rows)
        return 1 if problems else 0
    finally:
        stop.set()
        spark_server.stop()
        if agents is not None:
            agents.stop()
        pool.stop()
