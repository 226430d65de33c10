"""``make bench-warm``: small epochs on one warm Spark Connect server (issue 15's rows).

One run, one machine, one server (``local[2]``), started once and warmed by epoch 1:

- ``dag-run``: one Airflow DAG run (``dag.test()``, as the demo runs it: in the process kept
  from the target's previous run) of a ~1,700-record epoch (epoch 2 of a 2,000-file
  simulated source, 2 MDTs, 4 OSTs) into a posix target;
- ``dag-run-fresh-process``: the same epoch into another posix target with
  ``python -m epochsync.airflow.dagtest`` (Airflow's start-up included);
- ``cli-replicate``: ``epochsync replicate`` of the same epoch into a second posix target;
- ``cli-replicate-empty-epoch``: ``epochsync replicate`` of an epoch with no change (every
  server's changelog holds its ``EPOCH`` record only), into that target;
- ``cli-no-server-first``, ``cli-no-server-second``, ``cli-no-server-third``:
  ``epochsync replicate`` of epochs 1, 2 and 3 into a third target with no server
  configured: the first call that needs Spark starts the local Spark server
  (:mod:`epochsync.spark_server`), the later ones find it; an epoch whose stages all run in
  their own process, as these small ones may, starts none (``started_server`` says)
  (``--no-server-rows`` off: skipped);
- ``catch-up-100``: 100 closed epochs of another source through the Airflow DAG, in runs of
  ``max_epochs_per_run`` epochs (``--catchup-window``, default 25), into a posix target,
  in one kept ``dag.test()`` process;
- ``server-peak-rss``: the Connect server's peak resident memory (JVM and Python workers)
  over the whole run.

Every replica is compared with the simulator's ground truth after its run. Rows go to
``bench/results/warm.json``, with the load average when each row was measured.

    python -m epochsync_dev.bench warm [--catchup-epochs 100] [--catchup-window 25] [--workdir bench/scratch/warm]
                                       [--no-preload-daemon] [--no-write]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from epochsync.airflow.dagtest import DagTestProcess


class ServerSampler:
    """Peak summed RSS of a process tree (the Connect server: its JVM and Python workers)."""

    def __init__(self, pid: int, interval: float = 0.2):
        import psutil

        self.root = psutil.Process(pid)
        self.peak = 0
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            total = 0
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except Exception:  # the server is stopping
                return
            for p in procs:
                try:
                    total += p.memory_info().rss
                except Exception:  # a worker exited between listing and reading
                    pass
            self.peak = max(self.peak, total)
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=5)


def _row(name: str, seconds: float, **extra) -> dict:
    return {"name": name, "seconds": round(seconds, 2), "loadavg_1m": round(os.getloadavg()[0], 2), **extra}


def _simulate(out: Path, env: dict, *, epochs: int, files: int, seed: int, bucket: str, extra: list[str]) -> Path:
    cmd = [
        sys.executable,
        "-m",
        "epochsync_dev",
        "simulate",
        "--out",
        str(out),
        "--epochs",
        str(epochs),
        "--files",
        str(files),
        "--seed",
        str(seed),
        "--bucket",
        bucket,
        "--conn-id",
        "source_s3",
        *extra,
    ]
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    return out / "epochsync.yaml"


def _posix_targets(config: Path, names: list[str]) -> None:
    """The simulated config with posix targets ``names`` only (each its own replica folder)."""
    import yaml

    doc = yaml.safe_load(config.read_text())
    doc["targets"] = [
        {"name": n, "source": "sim", "kind": "posix", "path": str(config.parent / f"replica-{n}")} for n in names
    ]
    config.write_text(yaml.safe_dump(doc, sort_keys=False))


def append_empty_epoch(sim: Path) -> int:
    """Close one more epoch with no change: every server's changelog gets a file holding its
    ``EPOCH`` record alone, and the ground truth of the epoch is the last one's. Returns the epoch."""
    last = max(int(p.stem.split("=", 1)[1]) for p in (sim / "truth").glob("epoch=*.jsonl"))
    epoch = last + 1
    for server in sorted(p for p in (sim / "changelogs").iterdir() if p.is_dir()):
        newest = sorted(server.glob("*.jsonl"))[-1]
        final = json.loads(newest.read_text().splitlines()[-1])
        record = {
            "server": server.name,
            "index": final["index"] + 1,
            "epoch": epoch,
            "type": "EPOCH",
            "time_ns": final["time_ns"] + 1000,
        }
        (server / f"{epoch:06d}.jsonl").write_text(json.dumps(record) + "\n")
    shutil.copyfile(sim / "truth" / f"epoch={last}.jsonl", sim / "truth" / f"epoch={epoch}.jsonl")
    return epoch


def _replicate(config: Path, target: str, epoch: int, env: dict) -> tuple[float, subprocess.CompletedProcess]:
    """``epochsync replicate`` of one epoch as a user runs it; returns its seconds and the process."""
    cmd = [sys.executable, "-m", "epochsync.cli", "replicate", "--config", str(config), "--target", target]
    t0 = time.monotonic()
    done = subprocess.run([*cmd, "--epoch", str(epoch)], env=env, capture_output=True, text=True)
    return time.monotonic() - t0, done


def _equals_truth(config: Path, target: str, epoch: int) -> bool:
    from epochsync.core.config import load_config
    from epochsync.targets import open_target
    from epochsync_dev.truth import compare_with_truth, load_truth, truth_path

    cfg = load_config(config)
    return not compare_with_truth(open_target(cfg.target(target)), load_truth(truth_path(config.parent, epoch)))


def _dag_run(
    env: dict, dag_id: str, epoch: int, conf: dict | None = None, *, kept: DagTestProcess | None = None, log: Path
) -> tuple[float, dict]:
    """One ``dag.test()`` run: in ``kept`` (the demo's way: one process per Airflow home, Airflow's
    start-up paid by its first run) or, without it, in a fresh process; its output goes to ``log``."""
    t0 = time.monotonic()
    if kept is not None:
        result = kept.run(dag_id, epoch, log, conf=conf, env=env)
        return time.monotonic() - t0, result
    cmd = [
        sys.executable,
        "-m",
        "epochsync.airflow.dagtest",
        "--dag-id",
        dag_id,
        "--epoch",
        str(epoch),
        "--conf",
        json.dumps(conf or {}),
    ]
    with open(log, "w") as out:
        subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    seconds = time.monotonic() - t0
    lines = [x for x in Path(log).read_text(errors="replace").splitlines() if x.startswith("DAGTEST_RESULT ")]
    result = json.loads(lines[-1].split(" ", 1)[1]) if lines else {"state": "failed"}
    return seconds, result


def _stage_seconds(config: Path, target: str, epoch: int) -> dict:
    from epochsync.core.config import load_config
    from epochsync.journal.undo import read_json
    from epochsync.warehouse.paths import Warehouse, local_path

    stats = read_json(local_path(Warehouse(load_config(config).warehouse).stats(target, epoch))) or {}
    return {k: round(v, 2) for k, v in (stats.get("durations") or {}).items() if isinstance(v, (int, float))}


def _no_server_rows(config: Path, env: dict, work: Path, records, say) -> list[dict]:
    """Epochs 1-3 into target ``auto`` by ``epochsync replicate`` with no server configured, one
    call each: the first starts the local Spark server, the later ones find it warm. The
    server is stopped afterwards (``epochsync spark stop``)."""
    home = work / "spark-home"
    local = {k: v for k, v in env.items() if k not in ("EPOCHSYNC_SPARK_REMOTE", "SPARK_REMOTE")}
    local.update(EPOCHSYNC_SPARK_HOME=str(home), EPOCHSYNC_SPARK_AUTOSTART="1")
    out = []
    try:
        for e, name in ((1, "first"), (2, "second"), (3, "third")):
            say(f"epoch {e} through epochsync replicate with no server configured ({name} call) ...")
            seconds, done = _replicate(config, "auto", e, local)
            ok = done.returncode == 0 and _equals_truth(config, "auto", e)
            started = "starting a local Spark server" in done.stderr
            out.append(
                _row(
                    f"cli-no-server-{name}",
                    seconds,
                    epoch=e,
                    records=records if e == 2 else None,
                    equals_truth=ok,
                    started_server=started,
                    stages=_stage_seconds(config, "auto", e),
                    note="no EPOCHSYNC_SPARK_REMOTE: the first call that needs Spark starts the local server, "
                    "later calls find it (started_server: whether this call started it)",
                )
            )
    finally:
        subprocess.run(
            [sys.executable, "-m", "epochsync.cli", "spark", "stop", "--now"], env=local, capture_output=True
        )
    return out


#: the rows whose Spark operations are broken down from the server's event log, and their target and epoch
_BROKEN_DOWN = {"dag-run": ("dag", 2), "cli-replicate": ("cli", 2), "cli-replicate-empty-epoch": ("cli", None)}


def _attach_breakdown(rows: list[dict], event_log: Path) -> None:
    """Per stage of a row: where its Spark seconds went (:func:`epochsync_dev.eventlog.connect_breakdown`)."""
    from epochsync_dev.eventlog import connect_breakdown

    try:
        tags = connect_breakdown(event_log)
    except OSError:
        return
    for r in rows:
        if r["name"] not in _BROKEN_DOWN:
            continue
        target, epoch = _BROKEN_DOWN[r["name"]]
        epoch = epoch if epoch is not None else r.get("epoch")
        suffix = f"-{target}-e{epoch}"
        r["spark"] = {t[len("epochsync-") : -len(suffix)]: v for t, v in tags.items() if t.endswith(suffix)}


def main(argv: list[str] | None = None) -> int:
    from epochsync_dev.bench import write_results
    from epochsync_dev.demo import demo_environment, migrate_airflow_db, target_environment
    from epochsync_dev.embedded import SeaweedFS, SparkConnectServer

    p = argparse.ArgumentParser(prog="python -m epochsync_dev.bench warm", description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", default="bench/scratch/warm")
    p.add_argument("--catchup-epochs", type=int, default=100)
    p.add_argument("--catchup-window", type=int, default=25, help="max_epochs_per_run of the catch-up runs")
    p.add_argument("--no-write", action="store_true", help="print the rows, do not write bench/results/warm.json")
    p.add_argument(
        "--no-server-rows",
        dest="no_server_rows",
        action="store_false",
        help="skip the rows of epochsync replicate with no server configured (they start a local server)",
    )
    p.add_argument(
        "--no-preload-daemon",
        action="store_true",
        help="Python workers fork from pyspark's own daemon, not epochsync_daemon (for side-by-side runs)",
    )
    args = p.parse_args(argv)
    work = Path(args.workdir).resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rows: list[dict] = []
    failures: list[str] = []

    def say(msg: str) -> None:
        print(f"bench warm: {msg}", file=sys.stderr, flush=True)

    with SeaweedFS(work / "seaweedfs") as endpoint:
        server = SparkConnectServer(
            "local[2]",
            work_dir=work / "spark",
            preload_daemon=not args.no_preload_daemon,
            event_log=work / "eventlog",
        )
        t0 = time.monotonic()
        url = server.start()
        rows.append(
            _row(
                "server-start",
                time.monotonic() - t0,
                preload_daemon=server.preload_daemon,
                note="spark-submit to a listening Connect server",
            )
        )
        try:
            with ServerSampler(server.proc.pid) as sampler, contextlib.ExitStack() as stack:
                env = demo_environment(work, endpoint, url)
                os.environ.update({k: v for k, v in env.items() if k.startswith(("AIRFLOW_CONN_", "EPOCHSYNC_SPARK"))})
                say("simulating the 2,000-file source (3 epochs) ...")
                config = _simulate(
                    work / "sim",
                    env,
                    epochs=3,
                    files=2000,
                    seed=2026,
                    bucket="warm-src",
                    extra=["--mdts", "2", "--osts", "4"],
                )
                empty_epoch = append_empty_epoch(work / "sim")
                _posix_targets(config, ["dag", "fresh", "cli", "auto"])
                env["EPOCHSYNC_CONFIG"] = str(config)
                tenv = target_environment(env, work, "dag")
                fenv = target_environment(env, work, "fresh")
                for e in (tenv, fenv):
                    migrate_airflow_db(e)
                logs = work / "logs"
                logs.mkdir()
                kept = stack.enter_context(DagTestProcess(tenv))
                say("epoch 1 of every target (warm-up, not measured) ...")
                _dag_run(tenv, "epochsync__sim__dag", 1, kept=kept, log=logs / "dag-e1.log")
                _dag_run(fenv, "epochsync__sim__fresh", 1, log=logs / "fresh-e1.log")
                subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "epochsync.cli",
                        "replicate",
                        "--config",
                        str(config),
                        "--target",
                        "cli",
                        "--epoch",
                        "1",
                    ],
                    env=env,
                    check=True,
                    stdout=subprocess.DEVNULL,
                )
                from epochsync.journal.undo import read_json
                from epochsync.warehouse.paths import Warehouse, local_path

                say("epoch 2 through the Airflow DAG (dag.test() in the process kept from epoch 1, as the demo) ...")
                seconds, result = _dag_run(tenv, "epochsync__sim__dag", 2, kept=kept, log=logs / "dag-e2.log")
                wh = Warehouse(f"file://{work / 'sim' / 'warehouse'}")
                records = (read_json(local_path(wh.stats("dag", 2))) or {}).get("records_in")

                def dag_row(name: str, target: str, seconds: float, result: dict, note: str) -> dict:
                    ok = result.get("state") == "success" and _equals_truth(config, target, 2)
                    stages = _stage_seconds(config, target, 2)
                    return _row(name, seconds, records=records, equals_truth=ok, stages=stages, target_s=20, note=note)

                rows.append(
                    dag_row(
                        "dag-run", "dag", seconds, result, "dag.test() in the kept process of the target's Airflow home"
                    )
                )
                say("epoch 2 through the Airflow DAG (dag.test() in a fresh process) ...")
                seconds, result = _dag_run(fenv, "epochsync__sim__fresh", 2, log=logs / "fresh-e2.log")
                rows.append(
                    dag_row(
                        "dag-run-fresh-process",
                        "fresh",
                        seconds,
                        result,
                        "python -m epochsync.airflow.dagtest: Airflow's start-up included; "
                        "the epoch was already ingested by dag-run",
                    )
                )
                say("epoch 2 through epochsync replicate ...")
                seconds, done = _replicate(config, "cli", 2, env)
                ok = done.returncode == 0 and _equals_truth(config, "cli", 2)
                rows.append(
                    _row(
                        "cli-replicate",
                        seconds,
                        records=records,
                        equals_truth=ok,
                        stages=_stage_seconds(config, "cli", 2),
                        target_s=4,
                    )
                )
                say(f"epoch 3, then the empty epoch {empty_epoch}, through epochsync replicate ...")
                for e in range(3, empty_epoch):
                    _replicate(config, "cli", e, env)
                seconds, done = _replicate(config, "cli", empty_epoch, env)
                ok = done.returncode == 0 and _equals_truth(config, "cli", empty_epoch)
                rows.append(
                    _row(
                        "cli-replicate-empty-epoch",
                        seconds,
                        epoch=empty_epoch,
                        records=0,
                        equals_truth=ok,
                        stages=_stage_seconds(config, "cli", empty_epoch),
                        target_s=1.5,
                    )
                )
                if args.no_server_rows:
                    rows.extend(_no_server_rows(config, env, work, records, say))

                n, window = args.catchup_epochs, args.catchup_window
                say(f"simulating a source of {n} closed epochs for the catch-up ...")
                cu = _simulate(
                    work / "catchup",
                    env,
                    epochs=n,
                    files=200,
                    seed=7,
                    bucket="warm-catchup",
                    extra=["--ops-per-epoch", "20", "--osts", "2"],
                )
                _posix_targets(cu, ["catchup"])
                cenv = target_environment(dict(env, EPOCHSYNC_CONFIG=str(cu)), work, "catchup")
                migrate_airflow_db(cenv)
                say(f"catching up {n} epochs through the Airflow DAG, {window} per run, in one dag.test process ...")
                t0 = time.monotonic()
                states = []
                ckept = stack.enter_context(DagTestProcess(cenv))
                for last in range(window, n + window, window):
                    last = min(last, n)
                    _, result = _dag_run(
                        cenv,
                        "epochsync__sim__catchup",
                        last,
                        {"max_epochs_per_run": window},
                        kept=ckept,
                        log=logs / f"catchup-{last}.log",
                    )
                    states.append(result.get("state"))
                seconds = time.monotonic() - t0
                ok = all(s == "success" for s in states) and _equals_truth(cu, "catchup", n)
                rows.append(
                    _row(
                        f"catch-up-{n}", seconds, runs=len(states), epochs_per_run=window, equals_truth=ok, target_s=600
                    )
                )
            rows.append(_row("server-peak-rss", 0, peak_rss_bytes=sampler.peak))
        finally:
            server.stop()
    _attach_breakdown(rows, work / "eventlog")
    for r in rows:
        print(json.dumps(r), flush=True)
        if r.get("equals_truth") is False:
            failures.append(r["name"])
    if not args.no_write:
        say(f"results: {write_results('warm', rows)}")
    if failures:
        say(f"FAILED: {', '.join(failures)} did not end equal to the ground truth")
        return 1
    return 0
