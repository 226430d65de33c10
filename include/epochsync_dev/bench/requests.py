"""What each request of one measured epoch is for: bench-e2e's scenario, counted by purpose.

``python -m epochsync_dev.bench.requests [--scenario small-writes-1pct-10k] [--tree DIR ...]``

The scenario's source is simulated as ``make bench`` does (:class:`~epochsync_dev.bench.e2e.ScenarioSource`:
epoch 1 the tree, epoch 2 the change) into a versioned bucket of an embedded SeaweedFS. For
each ``--tree`` (a checkout of this repository: its ``include`` is the code that runs; default
this one), a fresh replica bucket and warehouse are brought to epoch 1 straight to SeaweedFS
(not counted), then epoch 2 is replicated (``stages.replicate.replicate``, in a child process)
through an :class:`~epochsync_dev.s3proxy.S3Proxy` that logs every request: the table says
each request's purpose (the key and the sub-resource it names), per tree, side by side. So
two trees (main and a branch) are compared on the same source, in one run.

Unlike ``make bench``, nothing runs on Spark: the apply's data operations run in the child's
threads (``EPOCHSYNC_APPLY_EXECUTOR_MIN_OPS``) and verify reads contents on the driver; the
requests are the same, sent by one process instead of the executors.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

#: the child: one epoch of one tree's code, no Spark session (a stage that asks for one fails)
CHILD = """
import sys
import epochsync.stages.replicate as r
import epochsync.stages.verify as v

def no_spark(self):
    raise RuntimeError("this measurement runs without Spark: a stage asked for a session")

r._Session._open = no_spark
v.EXECUTOR_MIN_FILES = 10**9
rows = r.replicate(sys.argv[1], "replica", epoch=int(sys.argv[2]), spark=None, progress=lambda line: None)
print(rows[-1]["requests"] if rows else "no row")
"""


def purpose(method: str, bucket: str, key: str, query: str, copy: str, source_bucket: str) -> str:
    """A request in words: which side, which object or listing, which operation."""
    q = dict(p.partition("=")[::2] for p in query.split("&") if p)
    side = "source" if bucket == source_bucket else "replica"
    if not key:
        if "versions" in q:
            what = f"ListObjectVersions prefix={_shape(q.get('prefix', ''))}"
        elif "versioning" in q:
            what = "GetBucketVersioning"
        elif "list-type" in q:
            what = f"ListObjectsV2 prefix={_shape(q.get('prefix', ''))}"
        elif "delete" in q:
            what = "DeleteObjects"
        elif method == "HEAD":
            what = "HeadBucket"
        else:
            what = f"bucket {query or '-'}"
        return f"{side} {method} {what}"
    if side == "source":
        return f"source {method} object{' (ranged or versioned)' if 'versionId' in q else ''}"
    if key.startswith(".epochsync/"):
        name = key.split("/", 2)[1]
        if name == "dirs":
            name = "dirs/... (a directory's object)"
        extra = " versionId" if "versionId" in q else ""
        return f"replica {method} .epochsync/{name}{extra}"
    if copy:
        origin = "source" if copy.lstrip("/").startswith(source_bucket + "/") else "replica"
        return f"replica {method} file object: CopyObject from the {origin}"
    return f"replica {method} file object"


def _shape(prefix: str) -> str:
    """A listing's prefix, with the file or directory names in it replaced by what they are."""
    from urllib.parse import unquote

    p = unquote(prefix)
    if p.startswith(".epochsync/"):
        return ".epochsync/" + p.split("/")[1] + ("/..." if p.count("/") > 1 else "")
    return "<directory>/" if p.endswith("/") else "<file key>" if p else "''"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m epochsync_dev.bench.requests", description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", default="small-writes-1pct-10k")
    p.add_argument("--tree", action="append", help="a checkout whose include/ runs (repeatable; default: this one)")
    p.add_argument("--workdir", default="bench/scratch/requests")
    p.add_argument("--json", help="write the counts here")
    args = p.parse_args(argv)

    import shutil

    import yaml

    from epochsync.stores.connections import S3Settings
    from epochsync_dev.bench.e2e import SCENARIOS, ScenarioSource, _slug, rclone_binary, write_bench_config
    from epochsync_dev.embedded import S3Endpoint, SeaweedFS
    from epochsync_dev.s3proxy import S3Proxy
    from epochsync_dev.simulate.store import SourceStore

    here = Path(__file__).resolve().parents[3]
    trees = [Path(t).resolve() for t in (args.tree or [str(here)])]
    scenario = SCENARIOS[args.scenario]
    work = Path(args.workdir).resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    say = lambda msg: print(f"requests: {msg}", file=sys.stderr, flush=True)  # noqa: E731
    rclone_bin, _ = rclone_binary(install=False)
    results: dict[str, dict] = {}
    with SeaweedFS(work / "seaweedfs") as weed, S3Proxy(weed.url, head_client=weed.client()) as proxy:
        ep = S3Endpoint(proxy.url, weed.access_key, weed.secret_key)
        direct, counted = weed.airflow_conn_json(), ep.airflow_conn_json()
        source_bucket = f"src-{_slug(scenario)}"
        store = SourceStore(S3Settings("bench", weed.url, weed.access_key, weed.secret_key), source_bucket, threads=16)
        store.ensure_versioned_bucket()
        out = work / "source"
        t0 = time.monotonic()
        source = ScenarioSource(scenario, out, store, rclone_bin, weed, epochs=2)
        source.epoch(1)
        say(f"source at epoch 1 in {time.monotonic() - t0:.0f}s")
        configs = []
        for i, _tree in enumerate(trees):
            path = write_bench_config(out, scenario, source.servers, source.root_fid, f"es-{i}")
            doc = yaml.safe_load(path.read_text())
            doc["warehouse"] = f"file://{work / f'warehouse-{i}'}"
            mine = work / f"epochsync-{i}.yaml"
            mine.write_text(yaml.safe_dump(doc, sort_keys=False))
            configs.append(mine)

        def run(i: int, epoch: int, conn: str) -> str:
            env = dict(
                os.environ,
                PYTHONPATH=str(trees[i] / "include"),
                AIRFLOW_CONN_BENCH_SOURCE=conn,
                AIRFLOW_CONN_BENCH_REPLICA=conn,
                EPOCHSYNC_APPLY_EXECUTOR_MIN_OPS="100000000",
            )
            t = time.monotonic()
            done = subprocess.run(
                [sys.executable, "-c", CHILD, str(configs[i]), str(epoch)],
                env=env,
                capture_output=True,
                text=True,
            )
            if done.returncode:
                raise RuntimeError(f"{trees[i]} epoch {epoch}: {done.stderr[-3000:]}")
            say(f"{trees[i]}: epoch {epoch} in {time.monotonic() - t:.1f}s")
            return done.stdout.strip()

        for i in range(len(trees)):
            run(i, 1, direct)
        source.epoch(2, scenario)
        for i, tree in enumerate(trees):
            proxy.keep_log(True)
            stats = run(i, 2, counted)
            log = proxy.keep_log(False)
            by = Counter(purpose(m, b, k, q, c, source_bucket) for m, b, k, q, _, c in log)
            failed = Counter(f"{m} {st}" for m, _, _, _, st, _ in log if st >= 300)
            results[str(tree)] = {"total": len(log), "by_purpose": dict(by), "not_2xx": dict(failed), "stats": stats}
    changed = scenario.changed or max(1, scenario.files // 100)
    names = sorted({k for r in results.values() for k in r["by_purpose"]})
    cols = list(results)
    print(f"{args.scenario}: requests of epoch 2 ({changed} changed files), by purpose; load {os.getloadavg()}")
    width = max(len(n) for n in names)
    print(" " * width + " | " + " | ".join(Path(c).name for c in cols))
    for n in names:
        print(n.ljust(width) + " | " + " | ".join(str(results[c]["by_purpose"].get(n, 0)) for c in cols))
    print("total".ljust(width) + " | " + " | ".join(str(results[c]["total"]) for c in cols))
    print("per changed file".ljust(width) + " | " + " | ".join(f"{results[c]['total'] / changed:.2f}" for c in cols))
    for c in cols:
        if results[c]["not_2xx"]:
            print(f"{Path(c).name}: answers that were not 2xx: {results[c]['not_2xx']}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
