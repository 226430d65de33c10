"""``make bench-e2e``: epochsync vs ``aws s3 sync`` vs whole-file copy, same change set.

For each scenario a scripted source is simulated over two epochs (epoch 1 builds the
tree, epoch 2 is the change under test) into a versioned S3 source store on an embedded
SeaweedFS. Three replicas are brought to epoch 1 (not measured), then each tool brings
its replica to epoch 2 while an :class:`~epochsync.s3proxy.S3Proxy` (in its own process) in front of
SeaweedFS counts every request and byte, server side of the client:

- ``epochsync``: ``pipeline.replicate`` of epoch 2 into an s3 target (ingest, merge,
  translate, apply, verify, commit), every stage on a warm Spark Connect server started
  once for the benchmark (``local[2]``), as a deployment runs it; verify sampling 0 so
  the source is read only for the pull — correctness is checked after the measurement
  instead;
- ``aws-s3-sync``: ``aws s3 sync --delete`` from a bucket holding the source's files
  whole at epoch 2 (bucket to bucket: the CLI copies changed files server-side);
- ``whole-file``: what lustre_rsync and geo-replication do: every changed or new file is
  read whole and written whole, renames become copies, deletes deletes.

Every replica is then compared with the ground truth of epoch 2. Rows go to
``bench/results/e2e.json``: ``{scenario, tool, seconds, bytes_read_source,
bytes_written, requests, net_changed_bytes}`` (plus detail fields), with a chart.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from epochsync.bench import results_dir, write_results

MiB = 1024 * 1024


@dataclass(frozen=True)
class Scenario:
    name: str
    files: int
    max_file_size: int
    description: str
    #: appends of 64 KiB (appends), files created and deleted (churn) and kept (churn)
    appends: int = 0
    churn: int = 0
    kept: int = 0
    seed: int = 7


SCENARIOS = {
    "small-writes-1pct": Scenario("small-writes-1pct", 10_000, 128 * 1024,
                                  "1% of 10,000 files (16-128 KiB) get a 4 KiB write in place"),
    "appends-large": Scenario("appends-large", 24, 32 * MiB,
                              "24 large files (up to 32 MiB) get 200 appends of 64 KiB", appends=200),
    "dir-rename-1000": Scenario("dir-rename-1000", 1_000, 64 * 1024,
                                "a directory holding 1,000 files is renamed"),
    "create-delete-churn": Scenario("create-delete-churn", 2_000, 64 * 1024,
                                    "500 files created and deleted within the epoch, 20 kept", churn=500, kept=20),
}  # fmt: skip
QUICK = {  # the same shapes, small: the test suite's correctness run
    "small-writes-1pct": Scenario(
        "small-writes-1pct", 400, 128 * 1024, "1% of 400 files (16-128 KiB) get a 4 KiB write"
    ),
    "appends-large": Scenario(
        "appends-large", 3, 6 * MiB, "3 files (up to 6 MiB) get 12 appends of 64 KiB", appends=12
    ),
    "dir-rename-1000": Scenario("dir-rename-1000", 60, 8 * 1024, "a directory holding 60 files is renamed"),
    "create-delete-churn": Scenario(
        "create-delete-churn", 100, 8 * 1024, "40 files created and deleted, 5 kept", churn=40, kept=5
    ),
}


def scenario_workload(scenario: Scenario, sink):
    """A :class:`~epochsync.simulate.Workload` whose epoch 2 is the scenario's change."""
    from epochsync.simulate import SimConfig, Workload

    class ScenarioWorkload(Workload):
        def _initial_tree(self) -> None:
            if scenario.name.startswith("dir-rename"):
                self.op_mkdir()
                self.renamed_dir = self.dirs.choice(self.rng)
                while self.renamed_dir == self.cfg.root_fid:
                    self.renamed_dir = self.dirs.choice(self.rng)
                for _ in range(self.cfg.files):
                    fid = self._create_file(parent=self.renamed_dir)
                    self.write(fid, 0, self.rng.randrange(1, self.cfg.max_file_size))
                return
            for _ in range(max(1, self.cfg.files // 50)):
                self.op_mkdir()
            for _ in range(self.cfg.files):
                fid = self._create_file()
                half = self.cfg.max_file_size // 2
                lo = half if scenario.name.startswith("appends") else min(16 * 1024, half)
                self.write(fid, 0, self.rng.randrange(lo, self.cfg.max_file_size))

        def scripted_epoch(self, epoch: int) -> None:
            from epochsync.simulate import _NS, EPOCH_INTERVAL_S, EPOCH_START

            self.epoch = epoch
            self.clock = max(self.clock, (int(EPOCH_START.timestamp()) + (epoch - 1) * EPOCH_INTERVAL_S) * _NS)
            self.epoch_records = self.epoch_writes = 0
            files = sorted(self.files.items)
            if scenario.name.startswith("small-writes"):
                for fid in self.rng.sample(files, max(1, len(files) // 100)):
                    size = self.model.nodes[fid].size or 0
                    length = min(4096, size)
                    if length:
                        self.write(fid, self.rng.randrange(0, size - length + 1), length)
            elif scenario.name.startswith("appends"):
                for _ in range(scenario.appends):
                    fid = self.rng.choice(files)
                    self.write(fid, self.model.nodes[fid].size or 0, 64 * 1024)
            elif scenario.name.startswith("dir-rename"):
                link = next(iter(self.model.nodes[self.renamed_dir].links))
                self._rename(self.renamed_dir, link, (link[0], link[1] + "-renamed"))
            elif scenario.name.startswith("create-delete"):
                for _ in range(scenario.churn):
                    self.op_create_delete()
                for _ in range(scenario.kept):
                    self.op_create()
            for server in sorted(self.next_index):
                self.emit(server, "EPOCH")

    cfg = SimConfig(seed=scenario.seed, epochs=2, files=scenario.files, mdts=1, osts=4, ops_per_epoch=0,
                    unstriped_ratio=0.0, max_file_size=scenario.max_file_size)  # fmt: skip
    return ScenarioWorkload(cfg, sink)


def generate_source(scenario: Scenario, out: Path, store) -> dict:
    """Simulate the scenario into ``out`` (changelogs, truth) and the source ``store``.

    Returns {epoch: {path: bytes}} file contents at epochs 1 and 2 (for the whole-file buckets).
    """
    from epochsync.schema import record_to_json

    collected = []
    w = scenario_workload(scenario, collected.append)
    contents: dict[int, dict[str, bytes]] = {}
    for e in (1, 2):
        collected.clear()
        if e == 1:
            w.run_epoch(1)
        else:
            w.scripted_epoch(2)
        versions = store.put_versions(w.uploads)
        store.delete(w.deletes)
        w.remap_versions(versions, collected)
        for server in w.cfg.servers:
            d = out / "changelogs" / server
            d.mkdir(parents=True, exist_ok=True)
            with open(d / f"{e:06d}.jsonl", "w", encoding="utf-8") as f:
                for r in collected:
                    if r.server == server:
                        f.write(record_to_json(r) + "\n")
        truth = w.truth()
        (out / "truth").mkdir(parents=True, exist_ok=True)
        with open(out / "truth" / f"epoch={e}.jsonl", "w", encoding="utf-8") as f:
            for row in truth:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        data = w.contents()
        contents[e] = {row["path"]: data[row["fid"]] for row in truth if row["type"] == "file"}
        w.finish_epoch()
    contents["servers"] = list(w.cfg.servers)
    contents["root_fid"] = w.cfg.root_fid
    return contents


def write_bench_config(out: Path, scenario: Scenario, servers, root_fid: str, replica_bucket: str) -> Path:
    import yaml

    from epochsync.simulate import EPOCH_INTERVAL_S, EPOCH_START, STRIPED_KEY, UNSTRIPED_KEY

    cfg = {
        "warehouse": f"file://{out / 'warehouse'}",
        "sources": [{
            "name": "bench", "root_fid": root_fid, "servers": list(servers),
            "changelogs": {"uri": f"file://{out / 'changelogs'}/", "format": "jsonl"},
            "store": {"conn_id": "bench_source", "bucket": f"src-{_slug(scenario)}", "key": STRIPED_KEY,
                      "unstriped_key": UNSTRIPED_KEY},
            "epoch": {"interval": f"{EPOCH_INTERVAL_S}s", "start": EPOCH_START.strftime("%Y-%m-%dT%H:%M:%SZ")},
        }],
        "targets": [{"name": "replica", "source": "bench", "kind": "s3", "conn_id": "bench_replica",
                     "bucket": replica_bucket, "prefix": "", "verify": {"sample": 0.0}}],
    }  # fmt: skip
    path = out / "epochsync.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _slug(s: Scenario) -> str:
    return s.name.replace("_", "-")[:40]


def _put_tree(client, bucket: str, files: dict[str, bytes], threads: int = 16) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda kv: client.put_object(Bucket=bucket, Key=kv[0], Body=kv[1]), files.items()))


def _delete_keys(client, bucket: str, keys: list[str]) -> None:
    for i in range(0, len(keys), 1000):
        chunk = keys[i : i + 1000]
        if chunk:
            client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in chunk], "Quiet": True})


def _bucket_files(client, bucket: str) -> dict[str, str]:
    """key -> sha256 of every object in ``bucket`` (checks the baselines' replicas)."""
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for o in page.get("Contents", []):
            out[o["Key"]] = hashlib.sha256(client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()).hexdigest()
    return out


def _expected_files(contents: dict[str, bytes]) -> dict[str, str]:
    return {p: hashlib.sha256(b).hexdigest() for p, b in contents.items()}


def whole_file_copy(client, src_bucket: str, dst_bucket: str, before: dict[str, bytes], after: dict[str, bytes]):
    """Bring ``dst_bucket`` from ``before`` to ``after`` the way whole-file replicators do."""
    from concurrent.futures import ThreadPoolExecutor

    sha_before = {p: hashlib.sha256(b).hexdigest() for p, b in before.items()}
    by_sha_before: dict[str, str] = {}
    for p, s in sha_before.items():
        by_sha_before.setdefault(s, p)
    jobs = []
    for path, data in after.items():
        if path in before and sha_before[path] == hashlib.sha256(data).hexdigest():
            continue
        old = by_sha_before.get(hashlib.sha256(data).hexdigest())
        jobs.append(("copy", path, old) if old and old not in after else ("put", path, None))

    def run(job):
        kind, path, old = job
        if kind == "copy":  # a rename: server-side copy, no bytes through the client
            client.copy_object(Bucket=dst_bucket, Key=path, CopySource={"Bucket": dst_bucket, "Key": old})
        else:  # changed or new: read whole, write whole
            body = client.get_object(Bucket=src_bucket, Key=path)["Body"].read()
            client.put_object(Bucket=dst_bucket, Key=path, Body=body)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(run, jobs))
    _delete_keys(client, dst_bucket, sorted(set(before) - set(after)))


def run_scenario(scenario: Scenario, weed_endpoint, spark, work: Path, verbose: bool = False,
                 profile: str | None = None) -> list[dict]:  # fmt: skip
    """Measure the three tools on one scenario; returns three result rows."""
    from epochsync.connections import S3Settings
    from epochsync.embedded import S3Endpoint
    from epochsync.pipeline import replicate
    from epochsync.s3proxy import S3ProxyProcess
    from epochsync.simulate import SourceStore
    from epochsync.truth import compare_with_truth, load_truth, truth_path

    slug = _slug(scenario)
    out = work / slug
    admin = weed_endpoint.client()
    # the proxy runs in its own process: in this one it would take the GIL from epochsync's
    # threads while aws runs as a subprocess beside it
    with S3ProxyProcess(weed_endpoint.url, weed_endpoint.access_key, weed_endpoint.secret_key) as proxy:
        ep = S3Endpoint(proxy.url, weed_endpoint.access_key, weed_endpoint.secret_key)
        conn = ep.airflow_conn_json()
        os.environ["AIRFLOW_CONN_BENCH_SOURCE"] = conn
        os.environ["AIRFLOW_CONN_BENCH_REPLICA"] = conn
        client = ep.client()
        t0 = time.monotonic()
        store = SourceStore(S3Settings("bench", ep.url, ep.access_key, ep.secret_key), f"src-{slug}")
        store.ensure_versioned_bucket()
        contents = generate_source(scenario, out, store)
        cfg_path = write_bench_config(out, scenario, contents["servers"], contents["root_fid"], f"es-{slug}")
        gen_s = time.monotonic() - t0
        print(f"bench e2e: {scenario.name}: source generated in {gen_s:.0f}s ({len(contents[1])} files at epoch 1)",
              file=sys.stderr, flush=True)  # fmt: skip
        for b in (f"files-{slug}", f"sync-{slug}", f"whole-{slug}"):
            client.create_bucket(Bucket=b)
        _put_tree(client, f"files-{slug}", contents[1])
        _put_tree(client, f"sync-{slug}", contents[1])
        _put_tree(client, f"whole-{slug}", contents[1])
        quiet = (
            (lambda msg: print(f"bench e2e:   {msg}", file=sys.stderr, flush=True)) if verbose else (lambda msg: None)
        )  # noqa: E731
        replicate(str(cfg_path), "replica", epoch=1, spark=spark, progress=quiet)
        # the whole-file source view moves to epoch 2 (not measured: the source's own change)
        _put_tree(client, f"files-{slug}", {p: b for p, b in contents[2].items() if contents[1].get(p) != b})
        _delete_keys(client, f"files-{slug}", sorted(set(contents[1]) - set(contents[2])))
        time.sleep(1.1)  # LastModified has 1 s resolution: sync must see the new versions as newer

        rows = []
        # --- epochsync
        proxy.reset_counters()
        profiler = None
        if profile:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        t = time.monotonic()
        stats = replicate(str(cfg_path), "replica", epoch=2, spark=spark, progress=quiet)
        es_seconds = time.monotonic() - t
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(f"{profile}.{slug}.pstats")
        c = proxy.snapshot()
        stat_row = stats[-1] if stats else {}
        net = int(stat_row.get("bytes_changed", 0))
        rows.append(_row(scenario, "epochsync", es_seconds, c, f"src-{slug}", f"es-{slug}", net,
                         pulled=stat_row.get("bytes_pulled")))  # fmt: skip
        from epochsync.config import load_config
        from epochsync.pipeline import open_target_for

        cfg = load_config(cfg_path)
        diffs = compare_with_truth(open_target_for(cfg, cfg.target("replica")), load_truth(truth_path(out, 2)))
        rows[-1]["replica_equals_source"] = not diffs
        rows[-1]["differences"] = diffs[:5]

        # --- aws s3 sync
        env = dict(os.environ, AWS_ACCESS_KEY_ID=ep.access_key, AWS_SECRET_ACCESS_KEY=ep.secret_key,
                   AWS_DEFAULT_REGION="us-east-1", AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull)  # fmt: skip
        aws = str(Path(sys.executable).parent / "aws")
        proxy.reset_counters()
        t = time.monotonic()
        subprocess.run([aws, "--endpoint-url", ep.url, "s3", "sync", f"s3://files-{slug}/", f"s3://sync-{slug}/",
                        "--delete", "--only-show-errors"], env=env, check=True)  # fmt: skip
        rows.append(_row(scenario, "aws-s3-sync", time.monotonic() - t, proxy.snapshot(), f"files-{slug}",
                         f"sync-{slug}", net))  # fmt: skip
        expected = _expected_files(contents[2])
        rows[-1]["replica_equals_source"] = _bucket_files(admin, f"sync-{slug}") == expected

        # --- whole-file copy
        proxy.reset_counters()
        t = time.monotonic()
        whole_file_copy(client, f"files-{slug}", f"whole-{slug}", contents[1], contents[2])
        rows.append(_row(scenario, "whole-file", time.monotonic() - t, proxy.snapshot(), f"files-{slug}",
                         f"whole-{slug}", net))  # fmt: skip
        rows[-1]["replica_equals_source"] = _bucket_files(admin, f"whole-{slug}") == expected
    return rows


def _row(scenario: Scenario, tool: str, seconds: float, counters: dict, src: str, dst: str, net: int, **extra) -> dict:
    s = counters.get(src, {})
    d = counters.get(dst, {})
    return {
        "scenario": scenario.name,
        "tool": tool,
        "seconds": round(seconds, 3),
        "bytes_read_source": int(s.get("bytes_out", 0)) + int(s.get("bytes_copied_out", 0)),
        "bytes_written": int(d.get("bytes_in", 0)) + int(d.get("bytes_copied", 0)),
        "requests": sum(int(c.get("total_requests", 0)) for c in counters.values()),
        "net_changed_bytes": net,
        "bytes_uploaded": int(d.get("bytes_in", 0)),
        "bytes_copied_server_side": int(d.get("bytes_copied", 0)),
        "description": scenario.description,
        **{k: v for k, v in extra.items() if v is not None},
    }


def checks(rows: list[dict]) -> list[dict]:
    """The issue's targets, evaluated on the measured rows (pass or fail, never assumed)."""
    by = {(r["scenario"], r["tool"]): r for r in rows}
    out = []
    for (scen, tool), r in by.items():
        if tool != "epochsync":
            continue
        net = r["net_changed_bytes"]
        pulled = r["bytes_read_source"]
        if net:
            out.append({"check": f"{scen}: bytes pulled <= 1.1 x net changed", "value": round(pulled / net, 3),
                        "pass": pulled <= 1.1 * net})  # fmt: skip
        if scen.startswith("dir-rename"):
            out.append({"check": f"{scen}: no file bytes read from the source", "value": pulled, "pass": pulled == 0})
        sync = by.get((scen, "aws-s3-sync"))
        if scen.startswith("small-writes") and sync:
            # the bytes that matter: what is read out of the source store to find and move the change
            ratio_b = sync["bytes_read_source"] / max(1, pulled)
            ratio_t = sync["seconds"] / max(1e-9, r["seconds"])
            out.append({"check": f"{scen}: >= 10x fewer bytes read from the source than aws s3 sync",
                        "value": round(ratio_b, 2), "pass": ratio_b >= 10})  # fmt: skip
            out.append({"check": f"{scen}: >= 3x less time than aws s3 sync", "value": round(ratio_t, 2),
                        "pass": ratio_t >= 3})  # fmt: skip
    return out


def chart(rows: list[dict], path: Path) -> None:
    """An SVG per scenario: bytes read from the source and seconds, per tool."""
    from epochsync.status import _svg_bars

    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>epochsync bench e2e</title></head><body>"]
    for scen in dict.fromkeys(r["scenario"] for r in rows):
        rs = [r for r in rows if r["scenario"] == scen]
        tools = [r["tool"] for r in rs]
        parts.append(f"<h2>{scen}</h2>")
        parts.append(_svg_bars("bytes read from the source, per tool (" + ", ".join(tools) + ")",
                               list(range(1, len(rs) + 1)), {"bytes read": [r["bytes_read_source"] for r in rs],
                               "bytes written": [r["bytes_written"] for r in rs]}, "bytes"))  # fmt: skip
        parts.append(_svg_bars("seconds, per tool (" + ", ".join(tools) + ")", list(range(1, len(rs) + 1)),
                               {"seconds": [r["seconds"] for r in rs]}, "s"))  # fmt: skip
    parts.append("</body></html>")
    path.write_text("\n".join(parts))


def format_table(rows: list[dict]) -> str:
    head = ("scenario", "tool", "seconds", "read from source", "written", "requests", "net changed", "ok")
    lines = [head]
    for r in rows:
        lines.append((r["scenario"], r["tool"], f"{r['seconds']:.2f}", f"{r['bytes_read_source']:,}",
                      f"{r['bytes_written']:,}", f"{r['requests']:,}", f"{r['net_changed_bytes']:,}",
                      "yes" if r.get("replica_equals_source") else "NO"))  # fmt: skip
    widths = [max(len(x[i]) for x in lines) for i in range(len(head))]
    return "\n".join("| " + " | ".join(c.ljust(w) for c, w in zip(x, widths)) + " |" for x in lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m epochsync.bench e2e", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small versions of the scenarios (a correctness run)")
    p.add_argument("--scenario", action="append", choices=list(SCENARIOS), help="only these (repeatable)")
    p.add_argument("--workdir", default="bench/scratch/e2e")
    p.add_argument("--verbose", action="store_true", help="print epochsync's stage progress and timings")
    p.add_argument(
        "--profile", metavar="PREFIX", help="cProfile epochsync's measured epoch into PREFIX.<scenario>.pstats"
    )
    p.add_argument("--results-name", default=None, help="results file name (default e2e, or e2e-quick)")
    args = p.parse_args(argv)

    import shutil

    from epochsync.embedded import SeaweedFS, SparkConnectServer
    from epochsync.spark import spark_session

    table = QUICK if args.quick else SCENARIOS
    names = args.scenario or list(table)
    work = Path(args.workdir).resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rows: list[dict] = []
    server = SparkConnectServer("local[2]", work_dir=work / "spark")
    print("bench e2e: starting the Spark Connect server (local[2]) ...", file=sys.stderr, flush=True)
    spark = spark_session("epochsync-bench-e2e", remote=server.start())
    spark.range(1).count()  # warm: the first query of a new server pays its start-up
    with SeaweedFS(work / "seaweedfs") as endpoint:
        for name in names:
            print(f"bench e2e: scenario {name}: {table[name].description}", file=sys.stderr, flush=True)
            rows.extend(run_scenario(table[name], endpoint, spark, work, verbose=args.verbose, profile=args.profile))
    spark.stop()
    server.stop()
    name = args.results_name or ("e2e-quick" if args.quick else "e2e")
    result = {"rows": rows, "checks": checks(rows)}
    path = write_results(name, rows)
    (results_dir() / f"{name}.checks.json").write_text(json.dumps(result["checks"], indent=2) + "\n")
    chart(rows, results_dir() / f"{name}.html")
    print(format_table(rows))
    for c in result["checks"]:
        print(f"{'PASS' if c['pass'] else 'FAIL'}  {c['check']}: {c['value']}")
    print(f"results: {path}")
    bad = [r for r in rows if not r.get("replica_equals_source")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
