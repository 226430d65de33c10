"""``make demo``: the main job end to end on the embedded default.

Starts SeaweedFS on loopback, simulates a striped source (several MDTs and OSTs,
thousands of files, mixed changes over several epochs), and replicates every epoch
through the real Airflow DAG (``dag.test()`` per epoch, one process per run) into a posix
target and an s3 target. Every Spark stage of every run is a client of one Spark Connect
server the demo starts (``local[2]``; with ``--cluster``, on a real standalone master and
worker), so Spark starts once, not once per stage. One epoch of the s3
target gets an injected apply failure: the run fails, the rollback task restores the
previous epoch (checked against the ground truth), and the retry succeeds.

After every epoch both targets are compared with the simulator's ground truth, byte for
byte; one line per (epoch, target) gives records in, net operations, bytes changed,
pulled and copied server-side, duration and status. It ends with the report path and a
verdict, exits non-zero if any verification failed, and stops everything it started.

    python -m epochsync.demo [--epochs 6] [--files 2000] [--fail-epoch 4] [--workdir var/demo] [--cluster]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from epochsync.shutdown import INTERRUPTED

REPO = Path(__file__).resolve().parents[2]
SOURCE = "sim"
TARGETS = ("local", "s3")


def log(msg: str) -> None:
    print(msg, flush=True)


def _human(n) -> str:
    n = float(n or 0)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return str(n)


def demo_environment(workdir: Path, endpoint, spark_url: str) -> dict[str, str]:
    """Environment of every Airflow process the demo starts (the Spark Connect server at ``spark_url``)."""
    from epochsync.airflow.stages import spark_connect_conn_json
    from epochsync.spark import REMOTE_ENV

    env = dict(os.environ)
    env.update(
        AIRFLOW_HOME=str(workdir / "airflow"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__DAGS_FOLDER=str(REPO / "dags"),
        AIRFLOW__CORE__PLUGINS_FOLDER=str(REPO / "plugins"),
        AIRFLOW__CORE__PARALLELISM="2",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{workdir / 'airflow' / 'airflow.db'}",
        AIRFLOW__LOGGING__BASE_LOG_FOLDER=str(workdir / "airflow" / "logs"),
        AIRFLOW_CONN_SPARK_CONNECT_DEFAULT=spark_connect_conn_json(spark_url),
        AIRFLOW_CONN_SOURCE_S3=endpoint.airflow_conn_json(),
        AIRFLOW_CONN_REPLICA_S3=endpoint.airflow_conn_json(),
        EPOCHSYNC_CONFIG=str(workdir / "sim" / "epochsync.yaml"),
        EPOCHSYNC_CATCHUP="false",
        **{REMOTE_ENV: spark_url},
        PYTHONPATH=str(REPO / "include") + (":" + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""),
        PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
    )
    env.pop(  # the demo's failure is injected per run, never inherited
        "EPOCHSYNC_INJECT_FAILURE", None
    )
    return env


class RunWatcher:
    """Prints which task of a running DAG is busy, every ``every`` seconds."""

    def __init__(self, label: str, log_path: Path, every: float = 20.0):
        self.label, self.log_path, self.every = label, log_path, every
        self.stop = threading.Event()
        self.t0 = time.monotonic()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _current_task(self) -> str | None:
        try:
            text = self.log_path.read_text(errors="replace")[-20000:]
        except OSError:
            return None
        last = None
        for task in ("wait_epoch_closed", "ingest", "merge", "translate", "apply", "verify", "commit", "rollback"):
            pos = max(text.rfind(f"task_id={task}"), text.rfind(f"'{task}'"), text.rfind(f"Task {task}"))
            if pos >= 0 and (last is None or pos > last[0]):
                last = (pos, task)
        return last[1] if last else None

    def _run(self):
        while not self.stop.wait(self.every):
            task = self._current_task() or "starting"
            log(f"    ... {self.label}: {task} ({time.monotonic() - self.t0:.0f}s)")

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()


def target_environment(env: dict[str, str], workdir: Path, target: str) -> dict[str, str]:
    """One Airflow home (SQLite database, logs) per target, so two targets' runs never share a writer."""
    home = workdir / f"airflow-{target}"
    tenv = dict(env)
    tenv.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home / 'airflow.db'}",
        AIRFLOW__LOGGING__BASE_LOG_FOLDER=str(home / "logs"),
    )
    return tenv


def run_dag_epoch(env: dict, target: str, epoch: int, logs: Path, *, inject: str | None = None) -> dict:
    """One DAG run for (target, epoch) in its own process; returns the dagtest result."""
    dag_id = f"epochsync__{SOURCE}__{target}"
    run_env = dict(env)
    if inject:
        run_env["EPOCHSYNC_INJECT_FAILURE"] = inject
    log_path = logs / f"epoch{epoch:02d}-{target}{'-failing' if inject else ''}.log"
    t0 = time.monotonic()
    if INTERRUPTED.is_set():  # stopping: start nothing new
        return {"state": "interrupted", "tasks": {}, "seconds": 0.0, "returncode": None, "log": str(log_path)}
    with open(log_path, "w") as out, RunWatcher(f"epoch {epoch} {target}", log_path):
        proc = subprocess.run(
            [sys.executable, "-m", "epochsync.airflow.dagtest", "--dag-id", dag_id, "--epoch", str(epoch)],
            env=run_env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
    result = {"state": "failed", "tasks": {}}
    for line in log_path.read_text(errors="replace").splitlines():
        if line.startswith("DAGTEST_RESULT "):
            result = json.loads(line.split(" ", 1)[1])
    result["seconds"] = time.monotonic() - t0
    result["returncode"] = proc.returncode
    result["log"] = str(log_path)
    return result


def verify_target(cfg, target: str, sim_dir: Path, epoch: int) -> list[str]:
    """Differences between the target and the ground truth at ``epoch`` (empty: identical)."""
    from epochsync.pipeline import open_target_for
    from epochsync.truth import compare_with_truth, load_truth, truth_path

    tcfg = cfg.target(target)
    tgt = open_target_for(cfg, tcfg)
    if epoch == 0:
        truth = {}
    else:
        truth = load_truth(truth_path(sim_dir, epoch))
    return compare_with_truth(tgt, truth)


def _run_row(epoch: int, target: str, kind: str, res: dict, ok: bool, status: str, stats: dict | None) -> dict:
    """One DAG run for demo-summary.json: what the tests and the README quote."""
    return {
        "epoch": epoch,
        "target": target,
        "kind": kind,
        "ok": ok,
        "state": res.get("state"),
        "tasks": res.get("tasks", {}),
        "tries": res.get("tries", {}),
        "seconds": round(res["seconds"], 1),
        "status": status,
        "log": res.get("log"),
        "stats": stats,
    }


def epoch_line(epoch: int, target: str, stats: dict | None, seconds: float, status: str) -> str:
    s = stats or {}
    ops = sum((s.get("net_operations") or {}).values())
    return (
        f"epoch {epoch:>2} {target:<6} records {s.get('records_in', 0):>6}  net ops {ops:>5}  "
        f"changed {_human(s.get('bytes_changed')):>9}  pulled {_human(s.get('bytes_pulled')):>9}  "
        f"copied {_human(s.get('bytes_copied')):>9}  {seconds:6.1f}s  {status}"
    )


def user_tag(job_tags: str) -> str | None:
    """The epochsync session tag among a job's ``spark.job.tags`` (Spark Connect wraps it:
    ``SparkConnect_SessionTag_User_<user>_Session_<id>_Tag_<tag>``)."""
    for t in job_tags.split(","):
        at = t.find("epochsync-")
        if at == 0 or (at > 0 and t[:at].endswith("_Tag_")):
            return t[at:]
    return None


def spark_tasks_by_tag(event_dir: Path) -> dict[str, dict]:
    """Per stage tag (``epochsync-<stage>-<target>-e<epoch>``): Spark jobs, tasks and the executors that ran them.

    Read from the Connect server's event log: the proof that a run's Spark work ran in the
    one application, and where (``driver`` for local masters, worker executors on a cluster).
    """
    out: dict[str, dict] = {}
    stage_tag: dict[int, str] = {}
    for f in sorted(p for p in event_dir.rglob("*") if p.is_file()):
        with open(f, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue  # a line cut by a server that was still writing
                if not isinstance(e, dict):
                    continue
                kind = e.get("Event")
                if kind == "SparkListenerJobStart":
                    tags = (e.get("Properties") or {}).get("spark.job.tags") or ""
                    tag = user_tag(tags)
                    if tag:
                        row = out.setdefault(tag, {"jobs": 0, "tasks": 0, "executors": []})
                        row["jobs"] += 1
                        for sid in e.get("Stage IDs", []):
                            stage_tag[sid] = tag
                elif kind == "SparkListenerTaskEnd" and e.get("Stage ID") in stage_tag:
                    row = out[stage_tag[e["Stage ID"]]]
                    row["tasks"] += 1
                    executor = (e.get("Task Info") or {}).get("Executor ID")
                    if executor is not None and executor not in row["executors"]:
                        row["executors"].append(executor)
    return out


def stop_demo(weed, cfg, threads: list[threading.Thread], targets: tuple[str, ...] = TARGETS) -> str:
    """Stop every process the demo started (``dag.test`` runs, the Spark Connect server, ``airflow db``),
    whatever session they run in, then roll back a target a killed run left mid-epoch while
    SeaweedFS still runs; one phrase."""
    from epochsync.shutdown import descendants, settle_targets, stop_processes

    keep = {weed.proc.pid} if weed.proc is not None else set()
    parts = [f"{stop_processes(descendants(), keep=keep)} processes stopped"]
    for t in threads:  # their runs are gone: each chain ends at its next check
        t.join(timeout=60)
    if cfg is not None and weed.proc is not None:
        parts += settle_targets(cfg, targets)
    return "; ".join(parts + ["SeaweedFS stopped"])


def main(argv: list[str] | None = None) -> int:
    from epochsync.shutdown import Interrupted, signals_raise

    # SIGTERM (a CI timeout, kill) and Ctrl-C: stop every process, leave both targets committed
    try:
        with signals_raise():
            return _main(argv)
    except KeyboardInterrupt as exc:  # outside the stack's lifetime (before SeaweedFS, or while ending)
        sig = Interrupted.of(exc)
        log(f"demo: stopped by {sig.name}; nothing was running")
        return sig.exit_code


def _main(argv: list[str] | None) -> int:
    p = argparse.ArgumentParser(prog="python -m epochsync.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", default=str(REPO / "var" / "demo"), help="scratch folder (emptied first)")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--files", type=int, default=2000)
    p.add_argument("--mdts", type=int, default=2)
    p.add_argument("--osts", type=int, default=4)
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--fail-epoch", type=int, default=4, help="epoch whose s3 apply fails once (0: none)")
    p.add_argument("--fail-after", type=int, default=25, help="mutations before the injected failure")
    p.add_argument("--cluster", action="store_true",
                   help="run the Connect server on a real Spark standalone master and worker (started here)")  # fmt: skip
    args = p.parse_args(argv)

    from epochsync.config import load_config
    from epochsync.embedded import SeaweedFS, SparkConnectServer, SparkStandalone
    from epochsync.events import ROLLED_BACK, read_events
    from epochsync.ingest import INGEST_MARKER
    from epochsync.journal import read_json
    from epochsync.paths import Warehouse, local_path
    from epochsync.status import build_report, report_path

    workdir = Path(args.workdir).resolve()
    if workdir.exists():
        shutil.rmtree(workdir)
    logs = workdir / "logs"
    logs.mkdir(parents=True)
    t_start = time.monotonic()
    failures: list[str] = []
    lines: list = []  # (epoch, target order, attempt, text), sorted at the end
    runs: list[dict] = []  # one row per DAG run, written to demo-summary.json
    report = None
    interrupted = None
    cfg = None
    threads: list[threading.Thread] = []
    stop = threading.Event()
    weed = SeaweedFS(workdir / "seaweedfs")
    cluster = SparkStandalone(work_dir=workdir / "spark-cluster") if args.cluster else None
    spark_server = None
    spark_info: dict = {}
    try:
        log(f"demo: starting SeaweedFS (S3 on loopback) in {workdir / 'seaweedfs'}")
        endpoint = weed.start()
        master = "local[2]"
        if cluster is not None:
            master = cluster.start()
            log(f"demo: Spark standalone master {master} (UI {cluster.webui}) with one worker")
        spark_server = SparkConnectServer(master, work_dir=workdir / "spark", event_log=workdir / "spark-events")
        spark_url = spark_server.start()
        spark_info = {"master": master, "connect": spark_url, "event_log": str(workdir / "spark-events")}
        log(f"demo: Spark Connect server {spark_url} on {master}: every stage of every run is its client")
        env = demo_environment(workdir, endpoint, spark_url)
        os.environ.update({k: v for k, v in env.items() if k.startswith(("AIRFLOW_CONN_", "EPOCHSYNC_CONFIG"))})
        sim_dir = workdir / "sim"
        log(f"demo: simulating a striped source: {args.files} files, {args.epochs} epochs, "
            f"{args.mdts} MDTs, {args.osts} OSTs (seed {args.seed})")  # fmt: skip
        subprocess.run(
            [sys.executable, "-m", "epochsync.cli", "simulate", "--out", str(sim_dir), "--seed", str(args.seed),
             "--epochs", str(args.epochs), "--files", str(args.files), "--mdts", str(args.mdts),
             "--osts", str(args.osts), "--conn-id", "source_s3"],
            env=env, check=True,
        )  # fmt: skip
        cfg = load_config(sim_dir / "epochsync.yaml")
        wh = Warehouse(cfg.warehouse)
        log(f"demo: replicating every epoch through the Airflow DAGs epochsync__{SOURCE}__{{{','.join(TARGETS)}}}: "
            "each target has its own Airflow database; the s3 chain starts an epoch once the posix chain has ingested it")  # fmt: skip
        done = {t: {e: threading.Event() for e in range(1, args.epochs + 1)} for t in TARGETS}

        def one_epoch(target: str, epoch: int, tenv: dict) -> bool:
            inject = None
            if target == "s3" and epoch == args.fail_epoch:
                inject = f"after={args.fail_after},epoch={epoch},target={target}"
                log(f"epoch {epoch:>2} {target:<6} injecting an apply failure after {args.fail_after} mutations")
                res = run_dag_epoch(tenv, target, epoch, logs, inject=inject)
                tasks = res.get("tasks", {})
                diffs = verify_target(cfg, target, sim_dir, epoch - 1)
                # the rollback task ends failed on purpose (the run must show red): judge it by its effect
                rolled = any(ev.get("event") == ROLLED_BACK and ev.get("epoch") == epoch
                             for ev in read_events(cfg.warehouse, target))  # fmt: skip
                ok = res["state"] == "failed" and tasks.get("apply") == "failed" and rolled and not diffs
                status = (f"FAILED as injected; apply {tasks.get('apply')}, rollback "
                          f"{'ran' if rolled else 'DID NOT RUN'}, target "
                          f"{'equals' if not diffs else 'DIFFERS from'} epoch {epoch - 1}")  # fmt: skip
                line = epoch_line(epoch, target, None, res["seconds"], status)
                log(line)
                lines.append((epoch, TARGETS.index(target), 0, line))
                runs.append(_run_row(epoch, target, "injected-failure", res, ok, status, None))
                if not ok:
                    failures.append(f"epoch {epoch} {target}: injected failure not handled: {res} {diffs[:5]}")
                    return False
                log(f"epoch {epoch:>2} {target:<6} retrying")
            res = run_dag_epoch(tenv, target, epoch, logs)
            stats = read_json(local_path(wh.stats(target, epoch)))
            ok = res["state"] == "success"
            if not ok:
                status = f"FAILED (tasks {res.get('tasks')}; log {res['log']})"
                failures.append(f"epoch {epoch} {target}: run {res['state']}; log {res['log']}")
            else:
                diffs = verify_target(cfg, target, sim_dir, epoch)
                if diffs:
                    ok = False
                    status = "VERIFY FAILED: " + "; ".join(diffs[:3])
                    failures.append(f"epoch {epoch} {target}: differs from ground truth: {diffs[:10]}")
                else:
                    status = "ok, equals ground truth" + (" after retry" if inject else "")
            line = epoch_line(epoch, target, stats, res["seconds"], status)
            log(line)
            lines.append((epoch, TARGETS.index(target), 1, line))
            runs.append(_run_row(epoch, target, "retry" if inject else "run", res, ok, status, stats))
            return ok

        def chain(target: str, follows: str | None) -> None:
            tenv = target_environment(env, workdir, target)
            try:
                subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=tenv, check=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
                for epoch in range(1, args.epochs + 1):
                    if follows:
                        # start once the chain ahead has ingested the epoch: this chain's ingest task
                        # then finds the records current and has nothing to do (no two ingests
                        # of one epoch at a time, and the two chains overlap instead of queueing)
                        marker = Path(local_path(wh.records(SOURCE, epoch))) / INGEST_MARKER
                        while not marker.exists() and not done[follows][epoch].wait(1.0):
                            pass
                    if stop.is_set() or not one_epoch(target, epoch, tenv):
                        break
                    done[target][epoch].set()
            except Exception as exc:  # a crash of this thread must not leave the other waiting
                failures.append(f"{target}: {type(exc).__name__}: {exc}")
            finally:
                if failures:
                    stop.set()
                for ev in done[target].values():
                    ev.set()

        threads = [
            threading.Thread(target=chain, args=(t, TARGETS[i - 1] if i else None)) for i, t in enumerate(TARGETS)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        lines = [x[3] for x in sorted(lines)]
        report = report_path(cfg)
        os.makedirs(os.path.dirname(report), exist_ok=True)
        with open(report, "w", encoding="utf-8") as f:
            f.write(build_report(cfg, list(cfg.targets)))
        summary = workdir / "demo-summary.txt"
        summary.write_text("\n".join(lines) + "\n")
        log("demo: per epoch and target:\n" + "\n".join(lines))
    except subprocess.CalledProcessError as exc:
        failures.append(f"{' '.join(map(str, exc.cmd[:4]))}... exited {exc.returncode}")
        report = None
    except KeyboardInterrupt as exc:
        from epochsync.shutdown import Interrupted, signals_deferred

        interrupted = Interrupted.of(exc)
        stop.set()
        log(f"demo: {interrupted.name}: stopping ...")
        with signals_deferred():
            interrupted.outcome = stop_demo(weed, cfg, threads)
        report = None
    finally:
        if cluster is not None:
            try:
                spark_info["cluster"] = cluster.json()
            except OSError as exc:
                spark_info["cluster"] = {"error": str(exc)}
        if spark_server is not None:
            spark_server.stop()
        if cluster is not None:
            cluster.stop()
        weed.stop()
    if spark_info.get("event_log"):
        spark_info["stages"] = spark_tasks_by_tag(Path(spark_info["event_log"]))
    total = time.monotonic() - t_start
    verdict = "passed" if not failures else "failed"
    if interrupted is not None:
        verdict = "interrupted"
        failures.append(f"stopped by {interrupted.name}: {interrupted.outcome}")
    runs.sort(key=lambda r: (r["epoch"], TARGETS.index(r["target"]) if r["target"] in TARGETS else 0))
    (workdir / "demo-summary.json").write_text(
        json.dumps(
            {
                "verdict": verdict,
                "seconds": round(total, 1),
                "failures": failures,
                "report": report,
                "args": vars(args),
                "runs": runs,
                "spark": spark_info,
            },
            indent=1,
            default=str,
        )  # fmt: skip
    )
    if report:
        log(f"demo: report {report}")
    if interrupted is not None:
        log(f"demo: stopped by {interrupted.name} after {total:.0f}s: {interrupted.outcome}")
        return interrupted.exit_code
    if failures:
        log(f"demo: FAILED in {total:.0f}s: " + " | ".join(failures))
        return 1
    log(f"demo: PASSED in {total:.0f}s: every epoch of both targets equals the source's ground truth; "
        f"the injected failure was rolled back and retried")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
