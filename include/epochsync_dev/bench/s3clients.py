"""Side-by-side measurement of the data path's S3 clients (issue 14): scaffolding, not shipped.

``python -m epochsync_dev.bench.s3clients micro``: N small PUT + ranged GET per client on an
embedded SeaweedFS, one thread and 8 threads sharing a client, wall and process CPU.

``python -m epochsync_dev.bench.s3clients e2e``: bench-e2e's small-writes-1pct-10k scenario set up
once, then epoch 2's ingest, merge, translate, apply and verify run once per client per round
(clients alternating), each followed by a rollback (not measured) so the next client applies the
same plan; requests counted at the proxy, CPU of this process and of the Spark Connect server's
process tree (JVM and Python workers: the apply's data operations run there).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

CLIENTS = ("fast", "botocore", "botocore-lean", "obstore")


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _access(settings, kind: str):
    from epochsync.targets.s3 import S3Access

    os.environ["EPOCHSYNC_S3_CLIENT"] = kind
    return S3Access(settings, max_attempts=3)


def micro(args) -> list[dict]:
    from concurrent.futures import ThreadPoolExecutor

    from epochsync.stores.connections import S3Settings
    from epochsync_dev.embedded import SeaweedFS

    rows = []
    with SeaweedFS(Path(args.workdir) / "weed-micro") as ep:
        admin = ep.client()
        bucket = "micro"
        admin.create_bucket(Bucket=bucket)
        admin.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
        settings = S3Settings("micro", ep.url, ep.access_key, ep.secret_key)
        body = os.urandom(4096)
        meta = {"es-type": "file", "es-mode": "33188", "es-uid": "1000", "es-gid": "1000", "es-size": "4096"}
        for rnd in range(args.rounds):
            for kind in args.clients:
                for threads in (1, 8):
                    io = _access(settings, kind)
                    c = io.client

                    def one(i, c=c, kind=kind):
                        key = f"{kind}/d{i % 50}/f{i}"
                        r = c.put_object(Bucket=bucket, Key=key, Body=body, Metadata=meta)
                        assert r.get("VersionId"), r
                        got = c.get_object(Bucket=bucket, Key=key, VersionId=r["VersionId"], Range="bytes=1024-2047")
                        assert got["Body"].read() == body[1024:2048]

                    for i in range(20):  # warm the connections
                        one(10**6 + i)
                    load = _load()
                    w0, c0 = time.perf_counter(), time.process_time()
                    if threads == 1:
                        for i in range(args.n):
                            one(i)
                    else:
                        with ThreadPoolExecutor(threads) as pool:
                            list(pool.map(one, range(args.n)))
                    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
                    row = {
                        "round": rnd + 1,
                        "client": kind,
                        "threads": threads,
                        "requests": 2 * args.n,
                        "wall_s": round(wall, 3),
                        "cpu_s": round(cpu, 3),
                        "cpu_ms_per_request": round(1000 * cpu / (2 * args.n), 3),
                        "requests_per_s": round(2 * args.n / wall),
                        "load_before": load,
                    }
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    return rows


def _tree_cpu(pid: int) -> float:
    import psutil

    total = 0.0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.NoSuchProcess:
            pass
    return total


def e2e(args) -> list[dict]:
    from epochsync.core.config import load_config
    from epochsync.spark import spark_session
    from epochsync.stages.apply import run_apply
    from epochsync.stages.merge import run_merge
    from epochsync.stages.replicate import _ingest, replicate
    from epochsync.stages.rollback import rollback_target
    from epochsync.stages.translate import run_translate
    from epochsync.stages.verify import run_verify
    from epochsync.stores.connections import S3Settings
    from epochsync_dev.bench import e2e as bench
    from epochsync_dev.embedded import S3Endpoint, SeaweedFS, SparkConnectServer
    from epochsync_dev.s3proxy import S3ProxyProcess
    from epochsync_dev.simulate.store import SourceStore

    scenario = bench.SCENARIOS[args.scenario]
    work = Path(args.workdir).resolve() / "e2e"
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rclone_bin, _ = bench.rclone_binary(install=False)
    server = SparkConnectServer("local[2]", work_dir=work / "spark")
    spark = spark_session("epochsync-bench-s3clients", remote=server.start())
    spark.range(1).count()
    rows = []
    say = lambda m: print(f"s3clients: {m}", file=sys.stderr, flush=True)  # noqa: E731
    try:
        with SeaweedFS(work / "seaweedfs") as w, S3ProxyProcess(w.url, w.access_key, w.secret_key) as proxy:
            slug = bench._slug(scenario)
            out = work / slug
            ep = S3Endpoint(proxy.url, w.access_key, w.secret_key)
            os.environ["AIRFLOW_CONN_BENCH_SOURCE"] = ep.airflow_conn_json()
            os.environ["AIRFLOW_CONN_BENCH_REPLICA"] = ep.airflow_conn_json()
            t0 = time.monotonic()
            store = SourceStore(S3Settings("bench", w.url, w.access_key, w.secret_key), f"src-{slug}", threads=32)
            store.ensure_versioned_bucket()
            contents = bench.generate_source(scenario, out, store, rclone_bin, w)
            cfg_path = bench.write_bench_config(out, scenario, contents["servers"], contents["root_fid"], f"es-{slug}")
            say(f"source in {time.monotonic() - t0:.0f}s")
            os.environ["EPOCHSYNC_S3_CLIENT"] = "botocore-lean"
            t0 = time.monotonic()
            replicate(str(cfg_path), "replica", epoch=1, spark=spark)
            say(f"replica at epoch 1 in {time.monotonic() - t0:.0f}s")
            cfg = load_config(cfg_path)
            tcfg = cfg.target("replica")
            src = cfg.source_of(tcfg)
            for rnd in range(args.rounds):
                order = list(args.clients) if rnd % 2 == 0 else list(reversed(args.clients))
                for kind in order:
                    os.environ["EPOCHSYNC_S3_CLIENT"] = kind
                    load = _load()
                    proxy.reset_counters()
                    stages = {}
                    cpu = {}
                    t_all = time.monotonic()
                    for name, fn in (
                        ("ingest", lambda: _ingest(cfg, src.name, 2, 2, spark, tcfg.name)),
                        ("merge", lambda: run_merge(cfg, tcfg.name, 2, 2, spark)),
                        ("translate", lambda: run_translate(cfg, tcfg, 2, spark)),
                        ("apply", lambda: run_apply(cfg, tcfg, 2, spark)),
                        ("verify", lambda: run_verify(cfg, tcfg, 2, spark)),
                    ):
                        s0, p0, t = _tree_cpu(server.proc.pid), time.process_time(), time.monotonic()
                        result = fn()
                        stages[name] = round(time.monotonic() - t, 3)
                        if name in ("apply", "verify"):
                            cpu[name] = {
                                "driver_cpu_s": round(time.process_time() - p0, 3),
                                "server_cpu_s": round(_tree_cpu(server.proc.pid) - s0, 3),
                            }
                        if name == "verify" and result.get("problems"):
                            raise SystemExit(f"verify found problems with {kind}: {result['problems'][:3]}")
                    seconds = time.monotonic() - t_all
                    counts = proxy.snapshot()
                    requests = sum(int(c.get("total_requests", 0)) for c in counts.values())
                    by_op: dict = {}
                    for c in counts.values():
                        for op, n in (c.get("requests") or {}).items():
                            by_op[op] = by_op.get(op, 0) + n
                    row = {
                        "round": rnd + 1,
                        "client": kind,
                        "seconds_ingest_to_verify": round(seconds, 3),
                        "stages_s": stages,
                        "cpu": cpu,
                        "requests": requests,
                        "requests_by_op": by_op,
                        "load_before": load,
                        "load_after": _load(),
                    }
                    print(json.dumps(row), flush=True)
                    rows.append(row)
                    if rnd == args.rounds - 1 and kind == order[-1] and not args.check:
                        continue  # the last run: nothing comes after it
                    t = time.monotonic()
                    r = rollback_target(cfg, tcfg, spark, check=False)
                    say(f"rolled back in {time.monotonic() - t:.0f}s: {r['message']} ({r['undone']} entries)")
            if args.check:
                from epochsync.targets import open_target
                from epochsync_dev.truth import compare_with_truth, load_truth, truth_path

                os.environ["EPOCHSYNC_S3_CLIENT"] = args.clients[-1]
                replicate(str(cfg_path), "replica", epoch=2, spark=spark)
                diffs = compare_with_truth(open_target(cfg.target("replica")), load_truth(truth_path(out, 2)))
                say(f"after a full replicate of epoch 2: {len(diffs)} differences from the ground truth {diffs[:3]}")
    finally:
        spark.stop()
        server.stop()
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m epochsync_dev.bench.s3clients")
    p.add_argument("what", choices=["micro", "e2e"])
    p.add_argument("--clients", nargs="+", default=list(CLIENTS), choices=CLIENTS)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("-n", type=int, default=1000, help="micro: PUT+GET pairs per client")
    p.add_argument("--scenario", default="small-writes-1pct-10k")
    p.add_argument("--workdir", default="bench/scratch/s3clients")
    p.add_argument("--check", action="store_true", help="e2e: finally replicate epoch 2 and compare with the truth")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    started = _load()
    rows = micro(args) if args.what == "micro" else e2e(args)
    doc = {"load_average_at_start": started, "load_average_at_end": _load(), "cpus": os.cpu_count(), "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
