"""``make bench-ingest``: ingest 1 million Lustre text lines and 1 million JSON Lines records on local[2].

The JSON Lines ingest runs twice: the first run pays for starting the Python workers
and warming the JVM (as a spark-submit stage does), the second shows the steady state.
Inputs are generated here, deterministically (seeded), under ``bench/scratch/ingest/``
and reused while their parameters match. Each row of ``bench/results/ingest.json`` is one
measured :func:`epochsync.stages.ingest.run_ingest` call (Spark session already up, as under
spark-submit after start-up; the start-up time is reported on its own):

    {"name", "records", "seconds", "records_per_s", "peak_rss_bytes", ...}

``peak_rss_bytes`` is the peak of the summed resident set of this process and all its
descendants (the JVM and the Python workers), sampled every 50 ms with psutil.
``cpu_seconds`` is the CPU time the same process tree used. Where the wall time goes:
``phase_seconds`` (listing, the Spark job, checks and commit on the driver) and, summed
over the executor tasks, ``parse_seconds`` (reading, parsing, checking, Arrow batches)
and ``write_seconds`` (Parquet). On a loaded machine wall times stretch; CPU does less.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import threading
import time
from pathlib import Path

from epochsync_dev.bench import write_results

SEED = 20260101
START_NS = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z


# --------------------------------------------------------------------------- inputs


def _lustre_time(ns: int) -> str:
    secs, frac = divmod(ns, 1_000_000_000)
    t = time.gmtime(secs)
    return f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}.{frac:09d} {t.tm_year}.{t.tm_mon:02d}.{t.tm_mday:02d}"


def _fid(n: int, seq: int = 0x200000402) -> str:
    return f"[0x{seq:x}:0x{n:x}:0x0]"


def generate_lustre(out: Path, lines: int, servers: list[str], epochs: int, files_per_server: int, seed: int) -> int:
    """``lines`` ``lfs changelog`` lines over ``servers``; every server ends each epoch with a MARK."""
    rnd = random.Random(seed)
    per_server = lines // len(servers)
    per_epoch = per_server // epochs
    per_file = -(-per_server // files_per_server)
    written = 0
    for s_i, server in enumerate(servers):
        d = out / server
        d.mkdir(parents=True, exist_ok=True)
        fh = None
        seq = 0x200000400 + s_i
        fid = 0x1000
        files: list[int] = []  # live fids
        for i in range(per_server):
            if i % per_file == 0:
                if fh:
                    fh.close()
                fh = open(d / f"{i // per_file:06d}.log", "w")  # noqa: SIM115 - closed above/below
            index = i + 1
            when = _lustre_time(START_NS + index * 1_000_003)
            head = f"{index} "
            tail = f" ef=0xf u=500:500 nid=10.0.0.{s_i + 1}@tcp"
            if (i + 1) % per_epoch == 0:
                line = f"{head}00MARK  {when} 0x0 t=[0x20001:0x0:0x0]{tail} p=[0:0x50:0xb] mdd_obd-lustre-{server}-0"
            else:
                pick = rnd.random()
                parent = _fid(0x200 + (i % 64))
                if pick < 0.30 or len(files) < 8:
                    fid += 1
                    files.append(fid)
                    line = f"{head}01CREAT {when} 0x0 t={_fid(fid, seq)}{tail} p={parent} file {fid:x}.dat"
                elif pick < 0.45:
                    line = f"{head}10OPEN  {when} 0x4a t={_fid(rnd.choice(files), seq)}{tail} m=-w-"
                elif pick < 0.60:
                    line = f"{head}11CLOSE {when} 0x242 t={_fid(rnd.choice(files), seq)}{tail}"
                elif pick < 0.70:
                    line = f"{head}14SATTR {when} 0x44 t={_fid(rnd.choice(files), seq)}{tail}"
                elif pick < 0.78:
                    line = f"{head}17MTIME {when} 0x7 t={_fid(rnd.choice(files), seq)}{tail}"
                elif pick < 0.84:
                    line = f"{head}15XATTR {when} 0x0 t={_fid(rnd.choice(files), seq)}{tail} x=user.tag{i % 7}"
                elif pick < 0.92:
                    victim = files.pop(rnd.randrange(len(files)))
                    line = f"{head}06UNLNK {when} 0x1 t={_fid(victim, seq)}{tail} p={parent} file {victim:x}.dat"
                else:
                    moved = rnd.choice(files)
                    line = (
                        f"{head}08RENME {when} 0x0 t=[0:0x0:0x0]{tail} p={parent} renamed {moved:x} "
                        f"s={_fid(moved, seq)} sp={parent} file {moved:x}.dat"
                    )
            fh.write(line + "\n")
            written += 1
        fh.close()
    return written


def generate_jsonl(out: Path, records: int, servers: list[str], epochs: int, seed: int) -> int:
    """Canonical JSON Lines, one file per server per epoch ending with its EPOCH record (as simulate writes)."""
    rnd = random.Random(seed)
    per_server = records // len(servers)
    per_epoch = per_server // epochs
    written = 0
    for s_i, server in enumerate(servers):
        d = out / server
        d.mkdir(parents=True, exist_ok=True)
        index = 0
        ost = server.startswith("OST")
        for epoch in range(1, epochs + 1):
            with open(d / f"{epoch:06d}.jsonl", "w") as fh:
                for k in range(per_epoch):
                    index += 1
                    rec: dict = {"server": server, "index": index, "epoch": epoch}
                    n = (s_i << 24) + index
                    if k == per_epoch - 1:
                        rec["type"] = "EPOCH"
                    elif ost:
                        rec.update(
                            type="WRITE",
                            time_ns=START_NS + index * 1000,
                            tfid=_fid(n),
                            object={"ost": server, "oid": f"0x{n:x}", "version": f"v{index}"},
                            extents=[{"offset": rnd.randrange(1 << 30) & ~4095, "length": 4096 * rnd.randint(1, 64)}],
                        )
                    else:
                        pick = rnd.random()
                        rec.update(time_ns=START_NS + index * 1000, tfid=_fid(n), uid=500, gid=500)
                        if pick < 0.35:
                            rec.update(
                                type="CREAT",
                                pfid=_fid(0x200 + index % 64),
                                name=f"file {n:x}.dat",
                                mode=0o100644,
                                layout={
                                    "stripe_size": 1048576,
                                    "stripe_count": 2,
                                    "objects": [
                                        {"ost": "OST0000", "oid": f"0x{n:x}"},
                                        {"ost": "OST0001", "oid": f"0x{n:x}"},
                                    ],
                                },
                            )
                        elif pick < 0.55:
                            rec.update(type="SATTR", mode=0o100600, size=rnd.randrange(1 << 34))
                        elif pick < 0.70:
                            rec.update(type="CLOSE", flags=0x242)
                        elif pick < 0.80:
                            rec.update(type="XATTR", xattr_name="user.tag", xattr_value="dmFsdWU=")
                        elif pick < 0.90:
                            rec.update(type="UNLNK", pfid=_fid(0x200 + index % 64), name=f"file {n - 9:x}.dat", flags=1)
                        else:
                            rec.update(
                                type="RENME",
                                pfid=_fid(0x201),
                                name=f"moved {n:x}",
                                sfid=_fid(n - 3),
                                spfid=_fid(0x200),
                                sname=f"file {n - 3:x}.dat",
                            )
                    fh.write(json.dumps(rec, separators=(",", ":")) + "\n")
                    written += 1
    return written


def _prepare(scratch: Path, name: str, params: dict, make) -> Path:
    """Generate once per parameter set (the stamp file says which)."""
    d = scratch / name
    stamp = d / ".params.json"
    if stamp.exists() and json.loads(stamp.read_text()) == params:
        return d
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    started = time.perf_counter()
    make(d / "changelogs")
    stamp.write_text(json.dumps(params))
    print(f"generated {name} inputs in {time.perf_counter() - started:.1f} s", flush=True)
    return d


# --------------------------------------------------------------------------- measuring


class TreeSampler:
    """Peak summed RSS and CPU time of this process and all its descendants."""

    def __init__(self, interval: float = 0.05):
        import psutil

        self.me = psutil.Process()
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _procs(self):
        return [self.me, *self.me.children(recursive=True)]

    def _rss(self) -> int:
        total = 0
        for p in self._procs():
            try:
                total += p.memory_info().rss
            except Exception:  # a worker may exit between listing and reading
                pass
        return total

    def cpu(self) -> float:
        total = 0.0
        for p in self._procs():
            try:
                c = p.cpu_times()
                total += c.user + c.system
            except Exception:
                pass
        return total

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss())
            self._stop.wait(self.interval)

    def __enter__(self):
        self.peak = self._rss()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss())


def _config(base: Path, fmt: str, servers: list[str]):
    from epochsync.core.config import config_from_dict

    base = base.resolve()
    return config_from_dict(
        {
            "warehouse": f"file://{base / 'warehouse'}",
            "sources": [
                {
                    "name": "bench",
                    "root_fid": "[0x200000007:0x1:0x0]",
                    "servers": servers,
                    "changelogs": {"uri": str(base / "changelogs"), "format": fmt},
                    "store": {"conn_id": "bench_s3", "bucket": "bench"},
                    "epoch": {"interval": "5m", "start": "2026-01-01T00:00:00Z"},
                }
            ],
        }
    )


def _measure(name: str, base: Path, fmt: str, servers: list[str], epochs: int, lines: int, spark) -> dict:
    from epochsync.stages.ingest import run_ingest

    cfg = _config(base, fmt, servers)
    shutil.rmtree(base / "warehouse", ignore_errors=True)
    sampler = TreeSampler()
    with sampler:
        cpu0 = sampler.cpu()
        started = time.perf_counter()
        stats = run_ingest(cfg, "bench", 1, epochs, spark)
        seconds = time.perf_counter() - started
        cpu = sampler.cpu() - cpu0
    load1 = os.getloadavg()[0]
    row = {
        "name": name,
        "records": stats["records"],
        "seconds": round(seconds, 3),
        "records_per_s": round(stats["records"] / seconds),
        "peak_rss_bytes": sampler.peak,
        "input_lines": lines,
        "cpu_seconds": round(cpu, 2),
        "parse_seconds": stats["parse_seconds"],
        "write_seconds": stats["write_seconds"],
        "phase_seconds": stats["phase_seconds"],
        "fast_path_records": sum(s["fast_path_records"] for s in stats["servers"].values()),
        "load_avg_1m_after": round(load1, 2),
    }
    print(json.dumps(row), flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    """Generate (or reuse) the inputs, ingest each on local[2], write bench/results/ingest.json."""
    p = argparse.ArgumentParser(prog="python -m epochsync_dev.bench ingest", description=__doc__.split("\n\n")[0])
    p.add_argument("--lines", type=int, default=1_000_000, help="Lustre lines and JSON Lines records each")
    p.add_argument("--scratch", default="bench/scratch/ingest", help="where inputs and the warehouse go")
    p.add_argument("--note", default="", help="free text stored with every row (e.g. machine load)")
    args = p.parse_args(argv)

    scratch = Path(args.scratch)
    n = args.lines
    lustre_servers, jsonl_servers = ["MDT0000", "MDT0001"], ["MDT0000", "MDT0001", "OST0000", "OST0001"]
    lustre_epochs, jsonl_epochs = 10, 4
    lustre = _prepare(
        scratch,
        "lustre",
        {"lines": n, "servers": lustre_servers, "epochs": lustre_epochs, "seed": SEED, "v": 1},
        lambda d: generate_lustre(d, n, lustre_servers, lustre_epochs, 4, SEED),
    )
    jsonl = _prepare(
        scratch,
        "jsonl",
        {"records": n, "servers": jsonl_servers, "epochs": jsonl_epochs, "seed": SEED, "v": 1},
        lambda d: generate_jsonl(d, n, jsonl_servers, jsonl_epochs, SEED),
    )

    from epochsync.spark import spark_session

    started = time.perf_counter()
    spark = spark_session("epochsync-bench-ingest", master="local[2]")
    spark.range(1).count()
    startup = time.perf_counter() - started
    print(f"Spark session up in {startup:.1f} s", flush=True)

    size = f"{n // 1_000_000}m" if n % 1_000_000 == 0 else str(n)
    rows = [
        _measure(f"jsonl_{size}_records", jsonl, "jsonl", jsonl_servers, jsonl_epochs, n, spark),
        # the same again: Python workers already started and the JVM warmed up, as for
        # a stage that is not the first in its session
        _measure(f"jsonl_{size}_records_again", jsonl, "jsonl", jsonl_servers, jsonl_epochs, n, spark),
        _measure(f"lustre_{size}_lines", lustre, "lustre", lustre_servers, lustre_epochs, n, spark),
    ]
    for row in rows:
        row["spark_startup_seconds"] = round(startup, 2)
        if args.note:
            row["note"] = args.note
    spark.stop()
    path = write_results("ingest", rows)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    import sys

    os.environ.setdefault("EPOCHSYNC_SPARK_PROFILE", "default")  # as ``python -m epochsync_dev.bench ingest``
    sys.exit(main())
