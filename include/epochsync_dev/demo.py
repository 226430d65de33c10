"""``make demo``: the main job end to end on the embedded default.

Starts SeaweedFS on loopback, simulates a striped source (several MDTs and OSTs,
thousands of files, mixed changes over several epochs), and replicates every epoch
through the real Airflow DAG (``dag.test()`` per epoch, in one kept process per target) into a posix
target and an s3 target. Every Spark stage of every run is a client of one Spark Connect
server the demo starts (``local[2]``; with ``--cluster``, on a real standalone master and
worker), so Spark starts once, not once per stage. One epoch of the s3
target gets an injected apply failure: the run fails, the rollback task restores the
previous epoch (checked against the ground truth), and the retry succeeds.

After every epoch both targets are compared with the simulator's ground truth, byte for
byte; one line per (epoch, target) gives records in, net operations, bytes changed,
pulled and copied server-side, duration and status. It ends with the report path and a
verdict, exits non-zero if any verification failed, and stops everything it started.

With ``--reintegrate`` (``make demo REINTEGRATE=1``) it then runs cache reintegration
(docs/reintegration.md) on the same SeaweedFS and Spark Connect server: a simulated
write-back cache (its own changelogs, files unstriped) is flushed epoch by epoch into a
master striped 64 KiB x 4 through the DAG ``epochsync__cache__master``. At the last cache
epoch someone writes on the master a file the epoch changes too: the run refuses it (the
write fence) and leaves the master's version; once that version is dropped, an injected
apply failure rolls the master back to the previous boundary, and the retry reintegrates
the epoch. The master is compared with the cache's ground truth after every run.
``--reintegrate only`` skips the replica part.

    python -m epochsync_dev.demo [--epochs 6] [--files 2000] [--fail-epoch 4] [--workdir var/demo] [--cluster]
                             [--reintegrate [only]] [--cache-epochs 3] [--cache-files 40]
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

from epochsync.airflow.dagtest import close_kept_processes, kept_process
from epochsync.core.shutdown import INTERRUPTED

REPO = Path(__file__).resolve().parents[2]
SOURCE = "sim"
TARGETS = ("local", "s3")
#: ``--reintegrate``: the write-back cache (``python -m epochsync_dev simulate --cache``) and its master
CACHE, MASTER = "cache", "master"


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
    from epochsync.airflow.operators.stage import spark_connect_conn_json
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
        for task in (
            "wait_epoch_closed",
            "ingest",
            "merge",
            "translate",
            "wait_previous_epoch",
            "apply",
            "verify",
            "commit",
            "rollback",
        ):
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


def run_dag_epoch(
    env: dict,
    target: str,
    epoch: int,
    logs: Path,
    *,
    inject: str | None = None,
    source: str = SOURCE,
    suffix: str = "",
) -> dict:
    """One DAG run for (target, epoch) in its own process; returns the dagtest result."""
    dag_id = f"epochsync__{source}__{target}"
    run_env = dict(env)
    if inject:
        run_env["EPOCHSYNC_INJECT_FAILURE"] = inject
    log_path = logs / f"epoch{epoch:02d}-{target}{'-failing' if inject else ''}{suffix}.log"
    t0 = time.monotonic()
    if INTERRUPTED.is_set():  # stopping: start nothing new
        return {"state": "interrupted", "tasks": {}, "seconds": 0.0, "returncode": None, "log": str(log_path)}
    with RunWatcher(f"epoch {epoch} {target}", log_path):
        # the target's kept process: every run after its first skips Airflow's start-up
        result = kept_process(run_env, cwd=REPO).run(dag_id, epoch, log_path, env=run_env)
    result["seconds"] = time.monotonic() - t0
    result["log"] = str(log_path)
    return result


def verify_target(cfg, target: str, sim_dir: Path, epoch: int) -> list[str]:
    """Differences between the target and the ground truth at ``epoch`` (empty: identical)."""
    from epochsync.targets import open_target
    from epochsync_dev.truth import compare_with_truth, load_truth, truth_path

    tcfg = cfg.target(target)
    tgt = open_target(tcfg)
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


def stop_demo(weed, cfg, threads: list[threading.Thread], targets: tuple[str, ...] = TARGETS, also: list = ()) -> str:
    """Stop every process the demo started (``dag.test`` runs, the Spark Connect server, ``airflow db``),
    whatever session they run in, then roll back a target a killed run left mid-epoch while
    SeaweedFS still runs (``cfg``'s ``targets``, and ``also``: more (config, targets) pairs,
    the reintegration's master); one phrase."""
    from epochsync.core.shutdown import descendants, stop_processes
    from epochsync.stages.rollback import settle_targets

    keep = {weed.proc.pid} if weed.proc is not None else set()
    parts = [f"{stop_processes(descendants(), keep=keep)} processes stopped"]
    for t in threads:  # their runs are gone: each chain ends at its next check
        t.join(timeout=60)
    if weed.proc is not None:
        for c, names in ([(cfg, targets)] if cfg is not None else []) + list(also):
            parts += settle_targets(c, names)
    return "; ".join(parts + ["SeaweedFS stopped"])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m epochsync_dev.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", default=str(REPO / "var" / "demo"), help="scratch folder (emptied first)")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--files", type=int, default=2000)
    p.add_argument("--mdts", type=int, default=2)
    p.add_argument("--osts", type=int, default=4)
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--fail-epoch", type=int, default=4, help="epoch whose s3 apply fails once (0: none)")
    p.add_argument("--fail-after", type=int, default=25, help="mutations before the injected failure")
    p.add_argument(
        "--cluster",
        action="store_true",
        help="run the Connect server on a real Spark standalone master and worker (started here)",
    )
    p.add_argument(
        "--reintegrate",
        nargs="?",
        const="after",
        choices=("after", "only"),
        default=None,
        help="then reintegrate a simulated write-back cache into a striped s3 master through the "
        "DAG epochsync__cache__master, with a write-fence refusal and an injected failure "
        "(make demo REINTEGRATE=1); 'only': skip the replica part (make demo REINTEGRATE=only)",
    )
    p.add_argument("--cache-epochs", type=int, default=3, help="epochs of the cache (at least 2; default 3)")
    p.add_argument("--cache-files", type=int, default=40, help="files of the cache (default 40)")
    p.add_argument(
        "--cache-fail-after",
        type=int,
        default=3,
        help="mutations before the injected failure of the cache's last epoch (default 3)",
    )
    args = p.parse_args(argv)
    if args.reintegrate and args.cache_epochs < 2:
        p.error("--cache-epochs must be at least 2: the write fence and the failure need an epoch to come back to")
    if args.reintegrate != "only" and args.epochs < 1:
        p.error("--epochs must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    from epochsync.core.shutdown import Interrupted, signals_raise

    args = parse_args(argv)
    # SIGTERM (a CI timeout, kill) and Ctrl-C: stop every process, leave both targets committed
    try:
        with signals_raise():
            return _main(args)
    except KeyboardInterrupt as exc:  # outside the stack's lifetime (before SeaweedFS, or while ending)
        sig = Interrupted.of(exc)
        log(f"demo: stopped by {sig.name}; nothing was running")
        return sig.exit_code


def migrate_airflow_db(tenv: dict) -> None:
    subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"],
        env=tenv,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def replicate_demo(args, env: dict, workdir: Path, logs: Path, state: dict) -> None:
    """The replica part: simulate a striped source, two chains of DAG runs (posix, s3), verify each epoch."""
    from epochsync.core.config import load_config
    from epochsync.journal.undo import read_json
    from epochsync.stages.ingest.commit import INGEST_MARKER
    from epochsync.warehouse.events import ROLLED_BACK, read_events
    from epochsync.warehouse.paths import Warehouse, local_path

    failures, lines, runs, stop = state["failures"], state["lines"], state["runs"], state["stop"]
    sim_dir = workdir / "sim"
    log(
        f"demo: simulating a striped source: {args.files} files, {args.epochs} epochs, "
        f"{args.mdts} MDTs, {args.osts} OSTs (seed {args.seed})"
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "epochsync_dev",
            "simulate",
            "--out",
            str(sim_dir),
            "--seed",
            str(args.seed),
            "--epochs",
            str(args.epochs),
            "--files",
            str(args.files),
            "--mdts",
            str(args.mdts),
            "--osts",
            str(args.osts),
            "--conn-id",
            "source_s3",
        ],
        env=env,
        check=True,
    )
    cfg = load_config(sim_dir / "epochsync.yaml")
    state["cfg"] = cfg
    wh = Warehouse(cfg.warehouse)
    log(
        f"demo: replicating every epoch through the Airflow DAGs epochsync__{SOURCE}__{{{','.join(TARGETS)}}}: "
        "each target has its own Airflow database; the s3 chain starts an epoch once the posix chain has ingested it"
    )
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
            rolled = any(
                ev.get("event") == ROLLED_BACK and ev.get("epoch") == epoch for ev in read_events(cfg.warehouse, target)
            )
            ok = res["state"] == "failed" and tasks.get("apply") == "failed" and rolled and not diffs
            status = (
                ("FAILED as injected in apply; " if tasks.get("apply") == "failed" else f"apply {tasks.get('apply')}; ")
                + (f"rolled back to epoch {epoch - 1}" if rolled else "rollback DID NOT RUN")
                + (", equals it" if not diffs else f", but the target DIFFERS from epoch {epoch - 1}")
            )
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
        why: list[str] = []
        if not ok:
            why = why_failed(cfg, target, epoch)
            failed = [t for t, st in (res.get("tasks") or {}).items() if st == "failed" and t != "rollback"]
            status = f"FAILED in {', '.join(failed) or res['state']} (log {res['log']})"
            failures.append(f"epoch {epoch} {target}: " + (why[0] if why else f"run {res['state']}; log {res['log']}"))
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
        for w in why:
            log(f"    {w}")
        lines.append((epoch, TARGETS.index(target), 1, "\n".join([line] + [f"    {w}" for w in why])))
        runs.append(_run_row(epoch, target, "retry" if inject else "run", res, ok, status, stats))
        return ok

    def chain(target: str, follows: str | None) -> None:
        tenv = target_environment(env, workdir, target)
        try:
            migrate_airflow_db(tenv)
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

    threads = state["threads"]
    threads += [threading.Thread(target=chain, args=(t, TARGETS[i - 1] if i else None)) for i, t in enumerate(TARGETS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # epochs a chain never reached (an earlier epoch failed, or the demo was stopped): said, not left out
    ran = {(r["epoch"], r["target"]) for r in runs}
    for target in TARGETS:
        missing = [e for e in range(1, args.epochs + 1) if (e, target) not in ran]
        if missing:
            line = f"epochs {_spans(missing)} {target:<6} not run (an earlier epoch of {target} failed or the demo stopped)"
            log(line)
            lines.append((missing[0], TARGETS.index(target), 2, line))
    state["lines"] = [x[3] for x in sorted(lines)]


def _spans(epochs: list[int]) -> str:
    """``[3, 4, 5]`` -> ``"3-5"``, ``[4]`` -> ``"4"``."""
    return str(epochs[0]) if len(epochs) == 1 else f"{epochs[0]}-{epochs[-1]}"


def why_failed(cfg, target: str, epoch: int, limit: int = 5) -> list[str]:
    """What the user needs of a failed epoch, from the target's event log and the epoch's
    verify report (not the Airflow log's traceback): the stage that failed and why, the first
    verify differences, and where the rollback left the target."""
    from epochsync.journal.undo import plan_dir, read_json
    from epochsync.warehouse.events import FAILED, ROLLED_BACK, read_events

    events = [e for e in read_events(cfg.warehouse, target) if e.get("epoch") == epoch]
    out = []
    failed = next((e for e in reversed(events) if e.get("event") == FAILED), None)
    if failed is not None:
        out.append(
            f"epoch {epoch} {target}: {failed.get('stage') or 'a stage'} failed: {str(failed.get('message', ''))[:300]}"
        )
    report = read_json(os.path.join(plan_dir(cfg.warehouse, target, epoch), "verify.json")) or {}
    problems = report.get("problems") or []
    if problems and not report.get("ok", True):
        out.append(f"verify found {report.get('problem_count', len(problems))} difference(s); the first:")
        out += [f"  {p}" for p in problems[:limit]]
    rolled = next((e for e in reversed(events) if e.get("event") == ROLLED_BACK), None)
    if rolled is not None:
        back = rolled.get("back_at")
        out.append(f"rolled back to epoch {back}" if back is not None else str(rolled.get("message", "rolled back")))
    return out


def fence_victim(cache_dir: Path, epoch: int) -> str:
    """A file that exists at ``epoch - 1`` and whose bytes ``epoch`` changes: where a master-side write collides."""
    from epochsync_dev.truth import load_truth, truth_path

    before, after = load_truth(truth_path(cache_dir, epoch - 1)), load_truth(truth_path(cache_dir, epoch))
    changed = [
        p
        for p, row in before.items()
        if row["type"] == "file" and p in after and after[p]["type"] == "file" and after[p]["sha256"] != row["sha256"]
    ]
    if not changed:
        raise RuntimeError(f"cache epoch {epoch} changes no file that epoch {epoch - 1} had: no write to fence")
    return min(changed)


def _from_log(text: str, needle: str) -> str:
    """The first log line holding ``needle``, from there on (an error a DAG run's task raised)."""
    for line in text.splitlines():
        at = line.find(needle)
        if at >= 0:
            return line[at:].strip()
    return f"(no {needle.strip()!r} in the log)"


def reintegrate_demo(args, env: dict, workdir: Path, logs: Path, endpoint, state: dict) -> dict:
    """Cache reintegration through the DAG ``epochsync__cache__master`` (docs/reintegration.md).

    A simulated write-back cache is flushed epoch by epoch into a striped s3 master; at its
    last epoch a master-side write is refused by the write fence and kept, then (the cache
    wins: that version dropped) an injected apply failure rolls the master back to the
    boundary and the retry reintegrates the epoch. Every run is checked against the cache's
    ground truth. Returns the summary's ``reintegration`` section.
    """
    from epochsync.core.config import load_config
    from epochsync.journal.undo import read_json
    from epochsync.targets import open_target
    from epochsync.warehouse.events import ROLLED_BACK, read_events
    from epochsync.warehouse.paths import Warehouse, local_path

    failures = state["failures"]
    cache_dir = workdir / CACHE
    last = args.cache_epochs
    section: dict = {"dag_id": f"epochsync__{CACHE}__{MASTER}", "runs": [], "lines": []}
    state["reintegration"] = section
    log(
        f"reintegrate: simulating a write-back cache: {args.cache_files} files unstriped, {last} epochs "
        f"(seed {args.seed}), bucket {CACHE}"
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "epochsync_dev",
            "simulate",
            "--out",
            str(cache_dir),
            "--cache",
            "--seed",
            str(args.seed),
            "--epochs",
            str(last),
            "--files",
            str(args.cache_files),
            "--conn-id",
            "source_s3",
            "--bucket",
            CACHE,
        ],
        env=env,
        check=True,
    )
    cfg = load_config(cache_dir / "epochsync.yaml")
    state["also"].append((cfg, (MASTER,)))
    tcfg = cfg.target(MASTER)
    section.update(
        config=str(cfg.file),
        master=f"s3://{tcfg.bucket}/{tcfg.prefix}",
        stripe_size=tcfg.stripe_size,
        stripe_count=tcfg.stripe_count,
    )
    wh = Warehouse(cfg.warehouse)
    tenv = target_environment(env, workdir, MASTER)
    tenv["EPOCHSYNC_CONFIG"] = str(cfg.file)
    log(
        f"reintegrate: flushing every cache epoch into the master s3://{tcfg.bucket}/ (striped "
        f"{_human(tcfg.stripe_size)} x {tcfg.stripe_count}) through the Airflow DAG {section['dag_id']}"
    )
    migrate_airflow_db(tenv)

    def record(epoch: int, kind: str, res: dict, ok: bool, status: str, stats: dict | None) -> None:
        line = epoch_line(epoch, MASTER, stats, res["seconds"], status)
        log(line)
        section["lines"].append(line)
        section["runs"].append(_run_row(epoch, MASTER, kind, res, ok, status, stats))

    def rolled_back(epoch: int) -> bool:
        return any(
            ev.get("event") == ROLLED_BACK and ev.get("epoch") == epoch for ev in read_events(cfg.warehouse, MASTER)
        )

    for epoch in range(1, last + 1):
        if state["stop"].is_set():
            break
        if epoch == last:
            # someone writes on the master, since the last reintegration, a file this epoch changes too
            master = open_target(tcfg)
            try:
                victim = fence_victim(cache_dir, epoch)
            except RuntimeError as exc:  # another seed or size: say so, do not pretend the fence ran
                failures.append(f"reintegrate: {exc} (try another --seed or more --cache-files)")
                break
            key = master.prefix + master.key_of(victim, "file")
            s3 = endpoint.client()
            foreign = s3.put_object(Bucket=master.bucket, Key=key, Body=b"written on the master")["VersionId"]
            log(
                f"epoch {epoch:>2} {MASTER} someone writes s3://{master.bucket}/{key} on the master "
                f"(version {foreign}); epoch {epoch} of the cache changes it too"
            )
            res = run_dag_epoch(tenv, MASTER, epoch, logs, source=CACHE, suffix="-fenced")
            text = Path(res["log"]).read_text(errors="replace")
            kept = s3.get_object(Bucket=master.bucket, Key=key)["Body"].read() == b"written on the master"
            at = (master.read_manifest() or {}).get("epoch")
            named = "write fence" in text and victim in text and foreign in text and "Nothing was written" in text
            ok = res["state"] == "failed" and res.get("tasks", {}).get("apply") == "failed" and named and kept
            ok = ok and at == epoch - 1
            status = (
                f"REFUSED by the write fence ({'names the key and both versions' if named else 'NOT NAMED'}); "
                f"the master's version {'kept' if kept else 'OVERWRITTEN'}, master at epoch {at}"
            )
            record(epoch, "write-fence", res, ok, status, None)
            message = _from_log(text, "write fence: ")
            log(f"    apply: {message}")
            section["fence"] = {"key": key, "version": foreign, "refused": ok, "message": message}
            if not ok:
                failures.append(
                    f"reintegrate epoch {epoch}: the write fence did not refuse {key}: {status}; log {res['log']}"
                )
                break
            # the operator decides; here the cache wins: the master's own version goes
            s3.delete_object(Bucket=master.bucket, Key=key, VersionId=foreign)
            log(
                f"epoch {epoch:>2} {MASTER} the cache wins: version {foreign} deleted; injecting an apply failure "
                f"after {args.cache_fail_after} mutations"
            )
            inject = f"after={args.cache_fail_after},epoch={epoch},target={MASTER}"
            res = run_dag_epoch(tenv, MASTER, epoch, logs, inject=inject, source=CACHE)
            diffs = verify_target(cfg, MASTER, cache_dir, epoch - 1)
            rolled = rolled_back(epoch)
            ok = res["state"] == "failed" and res.get("tasks", {}).get("apply") == "failed" and rolled and not diffs
            status = (
                "FAILED as injected in apply; "
                + (f"rolled back to epoch {epoch - 1}" if rolled else "rollback DID NOT RUN")
                + (", equals it" if not diffs else f", but the master DIFFERS from epoch {epoch - 1}")
            )
            record(epoch, "injected-failure", res, ok, status, None)
            log(f"    rollback: {_from_log(Path(res['log']).read_text(errors='replace'), 'rolled back: ')}")
            if not ok:
                failures.append(
                    f"reintegrate epoch {epoch}: injected failure not handled: {diffs[:5]}; log {res['log']}"
                )
                break
        res = run_dag_epoch(tenv, MASTER, epoch, logs, source=CACHE)
        ok = res["state"] == "success"
        stats = read_json(local_path(wh.stats(MASTER, epoch))) if ok else None
        if not ok:
            status = f"FAILED (tasks {res.get('tasks')}; log {res['log']})"
            failures.append(f"reintegrate epoch {epoch}: run {res['state']}; log {res['log']}")
        else:
            diffs = verify_target(cfg, MASTER, cache_dir, epoch)
            ok = not diffs
            status = (
                "ok, equals the cache" + (" after retry" if epoch == last else "")
                if ok
                else "VERIFY FAILED: " + "; ".join(diffs[:3])
            )
            if diffs:
                failures.append(f"reintegrate epoch {epoch}: master differs from the cache: {diffs[:10]}")
        record(epoch, "retry" if epoch == last else "run", res, ok, status, stats)
        if not ok:
            break
    section["stripes"] = master_stripes(open_target(tcfg))
    return section


def master_stripes(master) -> dict:
    """How many stripe objects the master holds and the largest: the master's layout, not the cache's."""
    n = biggest = 0
    pages = master.io.client.get_paginator("list_objects_v2")
    for page in pages.paginate(Bucket=master.bucket, Prefix=f"{master.prefix}{master.control_dir}/stripes/"):
        for o in page.get("Contents", []):
            n, biggest = n + 1, max(biggest, o["Size"])
    return {"objects": n, "largest": biggest}


def _main(args: argparse.Namespace) -> int:
    from epochsync.report.status import build_report, report_path
    from epochsync_dev.embedded import SeaweedFS, SparkConnectServer, SparkStandalone, warm_up_wanted

    workdir = Path(args.workdir).resolve()
    if workdir.exists():
        shutil.rmtree(workdir)
    logs = workdir / "logs"
    logs.mkdir(parents=True)
    t_start = time.monotonic()
    # shared with the parts: failures, one line per DAG run, demo-summary.json's rows, what to settle on a signal
    state: dict = {
        "failures": [],
        "lines": [],
        "runs": [],
        "threads": [],
        "also": [],
        "stop": threading.Event(),
        "cfg": None,
        "reintegration": None,
    }
    failures = state["failures"]
    report = None
    interrupted = None
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
        spark_server = SparkConnectServer(
            master, work_dir=workdir / "spark", event_log=workdir / "spark-events", warm_up=warm_up_wanted()
        )
        spark_url = spark_server.start()
        spark_info = {"master": master, "connect": spark_url, "event_log": str(workdir / "spark-events")}
        log(f"demo: Spark Connect server {spark_url} on {master}: every stage of every run is its client")
        if spark_server.warm_up:
            log("demo: warming it up in the background (the stages' queries once, on a tiny source)")
        env = demo_environment(workdir, endpoint, spark_url)
        os.environ.update({k: v for k, v in env.items() if k.startswith(("AIRFLOW_CONN_", "EPOCHSYNC_CONFIG"))})
        if args.reintegrate != "only":
            replicate_demo(args, env, workdir, logs, state)
            cfg = state["cfg"]
            report = report_path(cfg)
            os.makedirs(os.path.dirname(report), exist_ok=True)
            with open(report, "w", encoding="utf-8") as f:
                f.write(build_report(cfg, list(cfg.targets)))
            log("demo: per epoch and target:\n" + "\n".join(state["lines"]))
        if args.reintegrate and not failures:
            section = reintegrate_demo(args, env, workdir, logs, endpoint, state)
            log(f"reintegrate: per epoch of the cache ({section['dag_id']}):\n" + "\n".join(section["lines"]))
            log(
                f"reintegrate: the master holds {section['stripes']['objects']} stripe objects of at most "
                f"{_human(section['stripes']['largest'])}: its own layout, not the cache's"
            )
        text = list(state["lines"])
        if state["reintegration"]:
            text += [f"reintegration ({state['reintegration']['dag_id']}):", *state["reintegration"]["lines"]]
        (workdir / "demo-summary.txt").write_text("\n".join(text) + "\n")
    except subprocess.CalledProcessError as exc:
        failures.append(f"{' '.join(map(str, exc.cmd[:4]))}... exited {exc.returncode}")
        report = None
    except KeyboardInterrupt as exc:
        from epochsync.core.shutdown import Interrupted, signals_deferred

        interrupted = Interrupted.of(exc)
        state["stop"].set()
        log(f"demo: {interrupted.name}: stopping ...")
        with signals_deferred():
            interrupted.outcome = stop_demo(weed, state["cfg"], state["threads"], also=state["also"])
        report = None
    finally:
        close_kept_processes()
        if cluster is not None:
            try:
                spark_info["cluster"] = cluster.json()
            except OSError as exc:
                spark_info["cluster"] = {"error": str(exc)}
        if spark_server is not None:
            spark_info["warm_up"] = spark_server.wait_warm_up(0)
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
    runs = state["runs"]
    runs.sort(key=lambda r: (r["epoch"], TARGETS.index(r["target"]) if r["target"] in TARGETS else 0))
    summary = {
        "verdict": verdict,
        "seconds": round(total, 1),
        "failures": failures,
        "report": report,
        "args": vars(args),
        "runs": runs,
        "spark": spark_info,
    }
    if args.reintegrate:
        summary["reintegration"] = state["reintegration"]
    (workdir / "demo-summary.json").write_text(json.dumps(summary, indent=1, default=str))
    if report:
        log(f"demo: report {report}")
    if interrupted is not None:
        log(f"demo: stopped by {interrupted.name} after {total:.0f}s: {interrupted.outcome}")
        return interrupted.exit_code
    if failures:
        verdict_line = f"demo: FAILED in {total:.0f}s: " + " | ".join(failures)
        _write_transcript(args, workdir, state, report, verdict_line)
        log(verdict_line)
        return 1
    done = []
    if args.reintegrate != "only":
        done.append(
            "every epoch of both targets equals the source's ground truth; "
            "the injected failure was rolled back and retried"
        )
    if args.reintegrate:
        done.append(
            "every cache epoch was reintegrated into the striped master and equals the cache's ground "
            "truth; the write fence refused the master-side change and kept it; the injected failure "
            "rolled the master back to the boundary and the retry reintegrated the epoch"
        )
    verdict_line = f"demo: PASSED in {total:.0f}s: " + "; ".join(done)
    # the transcript is the replica part's: make demo's verdict, with or without --reintegrate
    _write_transcript(args, workdir, state, report, f"demo: PASSED in {total:.0f}s: {done[0]}")
    log(verdict_line)
    return 0


def _write_transcript(args, workdir: Path, state: dict, report, verdict_line: str) -> None:
    """``demo-transcript.txt``: the replica part's lines, the report and the verdict, as the
    README shows them (``make demo-transcript``; :mod:`epochsync_dev.docs.demo_transcript`)."""
    if args.reintegrate == "only":
        return
    from epochsync_dev.docs.demo_transcript import transcript_lines

    text = transcript_lines(state["lines"], report, verdict_line, workdir)
    (workdir / "demo-transcript.txt").write_text(text)


if __name__ == "__main__":
    sys.exit(main())
