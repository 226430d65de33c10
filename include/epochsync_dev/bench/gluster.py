"""``make bench-gluster``: epochsync side by side with GlusterFS's geo-replication and rsync (issue 33);
``make bench-gluster-source`` (``--parts airflow,cuts``): the live-source figures of issue 31.

Set-up (everything is stopped and removed at the end, also on Ctrl-C or SIGTERM):

- a master volume (:class:`epochsync_dev.gluster.GlusterStack`: 2 btrfs bricks, changelog on,
  ``--rollover`` seconds, sharding off) mounted with FUSE; a 1-brick slave volume;
- **epochsync**: one warm Spark Connect server; two driver processes (imported once, as an Airflow
  worker keeps its imports): a cutter that cuts the volume (``cut_source``) and a driver that
  replicates every cut epoch since the last commit in one pass (a window, as a DAG run's
  ``max_epochs_per_run``) into a posix target; the target is on a btrfs loop image of its own
  (:class:`epochsync_dev.btrfs.BtrfsLoop`) with its committed view (``view.snapshots: required``,
  ``keep: 3``): readers read ``<view>/current``;
- **geo-replication**: a session master -> slave (gsyncd, ``sync_method tarssh``,
  ``change_interval 1``) over an sshd of our own; it must reach Active within ``--active-timeout``;
- **rsync**: ``rsync -a --delete`` from the master's mount into a directory.

The three read the same changelogs at the same rollover (one volume). Set-up steps that wait on
each other run at once (:data:`OVERLAPPED`, also in the meta file); a measured workload never
shares the machine with another or with a set-up step. Workloads, each in its own folder of the
volume, each replicated by all three before the next starts:

- ``untar``: the ``sysdeps`` tree of Debian's glibc source tarball (``glibc-source``, installed when
  missing) untarred: 11,422 files and 631 directories (the whole tarball's 21,116 entries took 210 s
  through FUSE here; the issue asks for 10,000 files);
- ``rename``: that ``sysdeps`` directory (12,053 entries) renamed;
- ``append``: 64 KiB appended to each of 20 files of 100 MiB;
- ``small-writes``: 4 KiB written into 1 % of 50,000 files of 8 KiB;
- ``delete``: 10,000 of those files deleted;
- ``steady``: a writer creating 3 files of 8 KiB a second for 2 minutes, each followed by a line
  appended to a journal file; epochsync's schedule as above (no final cut: its convergence is
  when every file is whole in ``current``), rsync runs back to back.

What each row measures (``bench/results/gluster.json``, one row per tool and workload):

- ``convergence_s``: from the end of the workload until the replica equals the source.
  epochsync (``--epochsync live``, the default): its schedule runs during the workload as an
  operator runs it all the time (:class:`EpochSchedule`: a cut every ``--rollover`` seconds,
  windows back to back, each replicating every epoch cut since the last commit); at the workload's
  end an on-demand cut is taken and the row's time is the commit of the window that holds it.
  That time includes waiting for a scheduled cut that was running at the end (it started before
  the end, so it cannot hold the final state) and for the window that was running then (the
  driver runs one window at a time, as a DAG runs one at a time for a target). The stage rows
  (``gluster.stages.json``) have one row per window (``pass`` k of ``passes``); the ``final``
  one is timed from the workload's end: the cut (``cut_queued_s`` of it waiting for a scheduled
  one), ``window_queued_s``, then its stages. ``--epochsync at-end``, the old way: nothing during
  the workload, one cut at its end and one epoch (the meta file's ``epochsync_mode`` says which
  ran; so does each epochsync row). geo-replication: it runs all along; its replica is polled
  (its brick, every second) until it equals the source. rsync: one run started once the others
  converged (the source is quiet by then);
- ``lag_median_s``, ``lag_p95_s`` (steady): from a file's write on the mount to the moment it is
  whole on the replica (polled every 0.5 s through the tool's read path);
- ``bytes_read`` / ``bytes_written``: epochsync: the bytes its apply and verify read from the cuts,
  the bytes its apply wrote (stats rows of every window from the workload's start); geo-replication: the bytes of the tar streams its slave
  extracted (tar ``--totals``: whole files plus 512-byte headers; the master's tar reads as much);
  rsync: ``--stats`` (a local rsync copies whole files);
- ``cpu_s``: epochsync: the cutter and the driver (with the cuts' ``gluster``/``btrfs`` commands)
  and the Spark server, from the start of the workload to the final commit (``at-end``: from its
  end); geo-replication: gsyncd (monitor, workers, the slave's side),
  their ssh and tar, the session's aux mounts and our sshd, from the start of the workload to
  convergence; rsync: its process;
- ``consistent_fraction`` (steady, rename): once a second a reader walks the replica through the
  tool's read path (epochsync: its committed view, ``current`` resolved once per sample;
  geo-replication: the slave volume's FUSE mount; rsync: its directory) and the sample counts
  when it equals a state the source was in. The
  harness is the only writer, so it knows every state: after each of the steady writer's steps
  (files 1..k, the journal's k lines), before and after the rename.

Each replica is checked equal to the source (type, size, mode and mtime in seconds of every entry,
the last 128 KiB of chosen files) through its read path once it converged: ``replica_equals_source``.

Issue 31's rows (``bench/results/gluster.source.json``): ``--cuts`` cuts of the volume with
Gluster's barrier and as many without (``cut.barrier: false``), alternating, while a writer probe
appends every 50 ms and a renamer probe renames a file back and forth (the slowest write, the
longest rename: the hold seen from outside, beside the cut record's ``held_s`` from the brick logs); the untar's cut to its commit
(``live``: the on-demand cut at its end; the schedule's epochs before it hold the rest); live 10 s
epochs under ``airflow standalone`` (each epoch's commit after its cut: :class:`LiveAirflow`, the first part, its Airflow started during
the set-up). The airflow and cuts parts are not in the default ``--parts`` (issue33,steady).

    python -m epochsync_dev.bench gluster [--size full|quick] [--parts airflow,issue33,steady,cuts]
                                          [--rollover 5] [--epochsync live|at-end]
                                          [--workdir bench/scratch/gluster] [--no-write]
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from epochsync_dev.bench.gluster_tools import CpuMeter, Expect, GeoRep, rsync, walk

TOOLS = ("epochsync", "geo-replication", "rsync")
#: every row's ``topology``: one host with every brick (the pool's rows say ``replica3-3servers``)
TOPOLOGY = "single-host"
PARTS = ("airflow", "issue33", "steady", "cuts")
#: the parts that run the peers (geo-replication and rsync)
PEER_PARTS = {"issue33", "steady"}
#: the peers' commands beside the stack's, and their Debian packages
PEER_PACKAGES = {"rsync": "rsync", "sshd": "openssh-server"}


def check_peers(*, install: bool = True) -> None:
    """Raises :class:`~epochsync_dev.gluster.GlusterUnavailable` (naming the package) unless the
    peers can run: rsync is installed with apt-get when missing; sshd (geo-replication's
    transport: the bench starts an sshd of its own on a free port) is not, because Debian's
    ``openssh-server`` may start a system sshd on port 22, so its absence is an error that
    says what to install. Checked before anything starts: a fresh machine of this kind has
    neither."""
    from epochsync_dev.gluster import GlusterUnavailable, _which, check_machine

    if _which("sshd") is None:
        raise GlusterUnavailable(
            "geo-replication needs sshd (the bench starts its own on a free port), which is not installed: "
            "apt-get install openssh-server"
        )
    check_machine(install=install, packages={k: v for k, v in PEER_PACKAGES.items() if k != "sshd"})


#: ``make bench-gluster``'s parts: issue 33's rows. The airflow and cuts parts (issue 31's rows in
#: ``gluster.source.json``, about 3 minutes more with Airflow's start) run with ``make bench-gluster-source``
DEFAULT_PARTS = ("issue33", "steady")
FIELDS = (
    "workload",
    "tool",
    "convergence_s",
    "lag_median_s",
    "lag_p95_s",
    "bytes_read",
    "bytes_written",
    "cpu_s",
    "consistent_fraction",
)
#: the set-up steps that run at the same time as another (the meta file's ``overlapped``); no
#: measured workload shares the machine with another measured workload or a set-up step
OVERLAPPED = [
    "set-up: the Spark Connect server starts and warms up while the master volume, the slave volume and "
    "geo-replication are made and checked",
    "set-up: airflow standalone starts (the airflow part's) while geo-replication starts and is checked, "
    "the Spark server warms up and epochsync's epoch 1 runs; the airflow part runs first, before the workloads",
    "set-up of append and small-writes (and of the steady writer's folder): the big files written beside the "
    "small ones; then epochsync's epoch and the source's walk run at once, geo-replication replicates "
    "meanwhile; rsync's replica is seeded with a local copy of epochsync's committed view of that data (the "
    "same bytes, modes, owners and mtimes), then rsync -a from the mount brings it up to date",
    "after each workload: the three replicas are compared with the source at once",
]
SIZES = {
    "full": {
        # 11,422 files and 631 directories: the issue's 10,000 files and more (the whole tarball,
        # 21,116 entries, took 210 s through FUSE with the schedule's cuts every 5 s; 2026-11-28)
        "untar_members": ["glibc-2.36/sysdeps"],
        "rename_dir": "sysdeps",
        "append_files": 20,
        "append_mib": 100,
        "small_files": 50_000,
        "delete_files": 10_000,
        "steady_s": 120,
        "steady_rate": 3.0,
    },
    "quick": {
        "untar_members": ["glibc-2.36/elf", "glibc-2.36/posix", "glibc-2.36/stdlib"],
        "rename_dir": "elf",
        "append_files": 4,
        "append_mib": 8,
        "small_files": 2_000,
        "delete_files": 400,
        "steady_s": 30,
        "steady_rate": 3.0,
    },
}
STEADY_FILE = 8192
SMALL_FILE = 8192


def say(msg: str) -> None:
    print(f"bench gluster: {msg}", file=sys.stderr, flush=True)


def load() -> float:
    return round(os.getloadavg()[0], 2)


def content(k: int, n: int = STEADY_FILE) -> bytes:
    """The steady writer's file ``k``: ``n`` bytes that name it."""
    line = f"steady file {k:06d} ".encode()
    return (line * (n // len(line) + 1))[:n]


# --------------------------------------------------------------------------- the epochsync driver


class Driver:
    """The epochsync driver: ``python -m epochsync_dev.bench.gluster CONFIG SOURCE TARGET [CONFIG2]``
    kept running, told over its stdin to cut (``cut``), to cut as ``CONFIG2`` says (``cut2``: the
    same source with ``cut.barrier: true``), to cut and replicate (``cycle``) or to replicate every
    cut epoch since the last commit (``window``)."""

    def __init__(self, config: Path, source: str, target: str, env: dict, log: Path, config2: Path | None = None):
        self.log = open(log, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "epochsync_dev.bench.gluster", str(config), source, target]
            + ([str(config2)] if config2 else []),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=env,
            text=True,
        )
        self.lock = threading.Lock()
        ready = self._read()
        if not ready.get("ready"):
            raise RuntimeError(f"the epochsync driver did not start: {ready}")

    def _read(self) -> dict:
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the epochsync driver exited ({self.proc.poll()}); see {self.log.name}")
            if line.startswith("RESULT "):
                return json.loads(line[7:])

    def call(self, op: str) -> dict:
        with self.lock:
            assert self.proc.stdin is not None
            self.proc.stdin.write(op + "\n")
            self.proc.stdin.flush()
            out = self._read()
        if out.get("error"):
            raise RuntimeError(f"epochsync {op}: {out['error']}")
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                self.proc.stdin.close()  # type: ignore[union-attr]
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def driver_main(argv: list[str]) -> int:
    """The driver's loop (see :class:`Driver`)."""
    import resource

    from epochsync.core.config import load_config
    from epochsync.journal.undo import read_stage_stats
    from epochsync.stages.cut import cut_source
    from epochsync.stages.replicate import replicate

    config, source, target = argv[:3]
    cfg = load_config(config)
    cfg2 = load_config(argv[3]) if len(argv) > 3 else None

    def cpu() -> float:
        a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime

    def log(line: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {line}", file=sys.stderr, flush=True)

    def answer(doc: dict) -> None:
        print("RESULT " + json.dumps(doc, default=str), flush=True)

    answer({"ready": True})
    for line in sys.stdin:
        op = line.strip()
        c0, t0 = cpu(), time.time()
        try:
            if op == "window":
                doc = _window(cfg, source, target, log)
            else:
                if op == "cut2" and cfg2 is None:
                    raise RuntimeError("cut2: the driver was started without a second config")
                out = cut_source(cfg2 if op == "cut2" else cfg, source, progress=log)
                cut = out["cuts"][-1]
                doc = {
                    "epoch": out["epoch"],
                    "t0": t0,
                    "t_cut": time.time(),
                    "cut": cut["cut"],
                    "publish": cut["publish"],
                }
                if op == "cycle":
                    doc["stats"] = replicate(cfg, target, out["epoch"], progress=log)
                    doc["t_end"] = time.time()
            if doc.get("stats"):
                doc["verify_source_bytes"] = _verify_bytes(cfg, target, doc["stats"], read_stage_stats)
            doc["cpu_s"] = cpu() - c0
            answer(doc)
        except Exception as exc:  # told to the harness, which stops
            log(f"FAILED: {type(exc).__name__}: {exc}")
            answer({"error": f"{type(exc).__name__}: {exc}"})
    return 0


def _verify_bytes(cfg, target: str, rows: list[dict], read_stage_stats) -> int:
    """Bytes verify read from the cut for the epochs of ``rows``."""
    total = 0
    for r in rows:
        stages = read_stage_stats(cfg.warehouse, target, r["epoch"])
        src = (stages.get("verify") or {}).get("source_requests") or {}
        total += int(src.get("bytes_received", 0) or 0)
    return total


def _window(cfg, source: str, target: str, log) -> dict:
    """Every cut epoch after the committed one in one pass, as the Airflow DAG replicates a window of
    closed epochs (``max_epochs_per_run``): the stages of ``epochsync.airflow.operators.stage`` in order."""
    from epochsync.journal.lease import target_lease
    from epochsync.journal.undo import mark_closed_seen, write_stage_stats
    from epochsync.spark import spark_session
    from epochsync.stages.apply import run_apply
    from epochsync.stages.commit import run_commit
    from epochsync.stages.context import _target_cfg, check_preconditions, committed_epoch
    from epochsync.stages.cut import published_epoch
    from epochsync.stages.ingest import run_ingest
    from epochsync.stages.merge import run_merge
    from epochsync.stages.translate import run_translate
    from epochsync.stages.verify import run_verify

    t0 = time.time()
    tcfg = _target_cfg(cfg, target)
    through = published_epoch(cfg, source)
    # the window starts after the committed epoch (without first_epoch, a window of several epochs is a "gap")
    pre = check_preconditions(cfg, tcfg, through, first_epoch=committed_epoch(cfg, tcfg) + 1)
    if pre["action"] == "noop":
        return {"t0": t0, "t_end": time.time(), "first": through + 1, "through": through, "stats": []}
    spark = spark_session(f"epochsync-bench-{target}", cfg=cfg, session_key=f"bench/{cfg.file}/{target}")
    rolled_back = None
    if pre["action"] == "rollback_first":
        # a window that failed half way (a server killed during its pull): undone first, as the
        # DAG's next run does (replicate's own rule), then the window plans from the committed epoch
        from epochsync.stages.rollback import rollback_target

        log(f"{target}: {pre['message']}")
        rolled_back = rollback_target(cfg, tcfg, spark, progress=log)["message"]
        pre = check_preconditions(cfg, tcfg, through, first_epoch=committed_epoch(cfg, tcfg) + 1)
    if pre["action"] != "run":
        raise RuntimeError(pre["message"])
    first = pre["committed"] + 1
    durations = {}
    with target_lease(cfg, tcfg):
        for e in range(first, through + 1):
            mark_closed_seen(cfg.warehouse, target, e)

        def step(name, fn):
            t = time.monotonic()
            out = fn()
            durations[name] = round(time.monotonic() - t, 3)
            log(f"{target} epochs {first}..{through}: {name} done in {durations[name]:.1f}s")
            if name in ("ingest", "merge"):
                flat = {k: v for k, v in out.items() if isinstance(v, (int, float, str, bool))}
                write_stage_stats(cfg.warehouse, target, through, name, {**flat, "seconds": durations[name]})
            return out

        step("ingest", lambda: run_ingest(cfg, source, first, through, spark, consumer=target))
        step("merge", lambda: run_merge(cfg, target, first, through, spark))
        step("translate", lambda: run_translate(cfg, target, through, spark, first_epoch=first))
        step("apply", lambda: run_apply(cfg, target, through, spark, first_epoch=first))
        step("verify", lambda: run_verify(cfg, target, through, spark, first_epoch=first))
        row = step("commit", lambda: run_commit(cfg, target, through, first_epoch=first))
    return {
        "t0": t0,
        "t_end": time.time(),
        "first": first,
        "through": through,
        "stats": [row],
        "rolled_back": rolled_back,
    }


class EpochSchedule:
    """epochsync's epoch schedule, as an operator runs it all the time: the cutter process cuts the
    volume every ``interval`` seconds and the driver replicates, back to back, every cut epoch since
    the last commit in one pass (a DAG run's window, the driver's ``window`` op).

    :meth:`finish` is the workload's end: no scheduled cut starts after it; an on-demand cut is
    taken at once (the cutter serves one call at a time, so a scheduled cut running then is waited
    for: it started before the end and cannot hold the final state); the windows go on until one
    has committed the epoch of that cut. A window running at the end is waited for (the driver
    serves one call at a time), as an operator's on-demand epoch would queue behind it: that wait
    is part of the convergence. :meth:`stop` ends the schedule without a final cut (the steady
    writer's, whose convergence is what its watchers see).

    ``retry``: a cut or a window that fails is recorded (:attr:`failures`: time, op, error) and
    tried again, at the next scheduled cut or after a second, as Airflow retries a failed task
    (a server killed in the middle of a workload); without it the first failure ends the schedule."""

    def __init__(self, cutter: Driver, driver: Driver, interval: float, *, retry: bool = False):
        self.cutter, self.driver, self.interval, self.retry = cutter, driver, interval, retry
        self.failures: list[dict] = []
        self.cuts: list[dict] = []  # the scheduled cuts, in order
        self.passes: list[dict] = []  # every window that replicated something, in order
        self.final_cut: dict | None = None
        self.final_epoch: int | None = None
        self.committed = 0  # the last epoch a window committed
        self.errors: list[BaseException] = []
        self._no_more_cuts = threading.Event()
        # held through each scheduled cut: once finish() has it, no scheduled cut starts after the end
        self._cut_gate = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._guard, args=(f,), daemon=True, name=f.__name__)
            for f in (self._cut_loop, self._window_loop)
        ]

    def _guard(self, fn) -> None:
        try:
            fn()
        except BaseException as exc:  # raised by finish() or stop()
            self.errors.append(exc)
            self._no_more_cuts.set()
            self._stop.set()

    def _cut_loop(self) -> None:
        t0 = time.time()
        k = 0
        while not self._no_more_cuts.is_set():
            k += 1
            wait = t0 + k * self.interval - time.time()
            if wait > 0 and self._no_more_cuts.wait(wait):
                break
            with self._cut_gate:
                if self._no_more_cuts.is_set():
                    break
                try:
                    self.cuts.append(self.cutter.call("cut"))
                except RuntimeError as exc:
                    if not self.retry or not _running(self.cutter):
                        raise
                    self.failures.append({"t": time.time(), "op": "cut", "error": str(exc)[:300]})

    def _window_loop(self) -> None:
        while not self._stop.is_set():
            if self.final_epoch is not None and self.committed >= self.final_epoch:
                return
            try:
                out = self.driver.call("window")
            except RuntimeError as exc:
                if not self.retry or not _running(self.driver):
                    raise
                self.failures.append({"t": time.time(), "op": "window", "error": str(exc)[:300]})
                self._stop.wait(1.0)
                continue
            if out["stats"]:
                self.passes.append(out)
                self.committed = max(self.committed, out["through"])
            else:
                self._stop.wait(0.2)

    def start(self) -> EpochSchedule:
        for th in self._threads:
            th.start()
        return self

    def finish(self, timeout: float) -> dict:
        """The on-demand cut at the workload's end and the window that commits it; returns that
        window (its ``t_end`` is the commit), with ``final_cut`` the cut's answer."""
        t = time.time()
        with self._cut_gate:  # a scheduled cut running now ends first (it cannot hold the final state)
            self._no_more_cuts.set()
            self.final_cut = self.cutter.call("cut")
        self.final_cut["called_at"] = t
        self.final_epoch = self.final_cut["epoch"]
        self._threads[0].join()
        self._threads[1].join(timeout)
        if self._threads[1].is_alive():
            self._stop.set()
            raise TimeoutError(f"epochsync: epoch {self.final_epoch} not committed within {timeout:.0f} s")
        self._raise()
        final = self.passes[-1]
        if final["through"] < self.final_epoch:
            raise RuntimeError(f"epochsync: the windows ended before epoch {self.final_epoch} was committed")
        return final

    def stop(self) -> None:
        self._no_more_cuts.set()
        self._stop.set()
        for th in self._threads:
            th.join(600)
        self._raise()

    def abort(self) -> None:
        """Stops scheduling without waiting (the workload failed; the teardown stops the drivers)."""
        self._no_more_cuts.set()
        self._stop.set()

    def _raise(self) -> None:
        if self.errors:
            raise self.errors[0]


# --------------------------------------------------------------------------- the bench


class Bench:
    """The single-host bench (the module docstring); :class:`epochsync_dev.bench.gluster_pool_tools.PoolBench`
    runs the same workloads on a pool of servers."""

    #: the rows' ``topology``
    topology = TOPOLOGY
    #: the tools compared, their rows in this order
    tools: tuple[str, ...] = TOOLS
    #: the parts this bench has, in the order they run
    parts_all: tuple[str, ...] = PARTS
    make_target = "bench-gluster"

    def __init__(self, args):
        self.args = args
        self.size = SIZES[args.size]
        self.work = Path(args.workdir).resolve()
        self.parts = [x.strip() for x in args.parts.split(",") if x.strip()]
        self.replica_rsync = str(self.work / "replica-rsync")
        self.rows: list[dict] = []
        self.source_rows: list[dict] = []
        self.lag_series: list[dict] = []
        self.stage_rows: list[dict] = []
        self.cycles: list[dict] = []
        self.stop_event = threading.Event()
        self.phase_s: dict[str, float] = {}
        self.phase_load: dict[str, list[float]] = {}  # 1-minute load average at each phase's start and end
        self.jobs: list[Background] = []  # set-up steps run in the background

    # ------------------------------------------------------------------ set-up
    def setup(self, stack) -> None:
        """Everything the parts need, with what waits on something else overlapped: the Spark server
        starts (and warms up) while the volumes are made; Airflow (for the airflow part) starts while
        geo-replication starts and is checked; the epochsync target's btrfs loop meanwhile."""
        from epochsync_dev.embedded import SparkConnectServer
        from epochsync_dev.gluster import GlusterStack

        a = self.args
        if PEER_PARTS & set(self.parts):
            check_peers()
        self.server = SparkConnectServer(
            "local[2]", work_dir=self.work / "spark", event_log=self.work / "spark-events", warm_up=True
        )
        stack.callback(self.server.stop)
        spark = self.background("the Spark Connect server", self.server.start, cancel=self.server.stop)
        brick = "6G" if a.size == "full" else "2G"
        self.master_stack = GlusterStack(self.work / "master", bricks=2, brick_size=brick, rollover=a.rollover)
        stack.callback(self.master_stack.stop)
        self.master = self.master_stack.start(progress=say)
        self.mnt = self.master.mount
        url = spark.result()
        say(f"Spark Connect server {url} (warming up)")
        if "airflow" in self.parts:
            self.airflow = LiveAirflow(self, stack)
            self.airflow_ready = self.background(
                "airflow standalone", self.airflow.prepare, cancel=self.airflow.af.stop
            )
        peers = None
        if not {"issue33", "steady"} & set(self.parts):
            say("no part compares tools: no slave volume, geo-replication or rsync")
        else:
            peers = self.background("geo-replication's set-up", lambda: self._setup_peers(stack))
        self._setup_epochsync(stack)
        if peers is not None:
            peers.result()
        # epoch 1: the volume before the workloads (geo-replication's check files), the driver's first Spark session
        first = self.driver.call("cycle")
        say(f"epochsync: epoch {first['epoch']} (the empty volume) in {first['t_end'] - first['t0']:.1f} s")

    def background(self, what: str, fn, cancel=None) -> Background:
        """``fn()`` in a thread beside the set-up's next steps; :meth:`join_background` waits for it
        (calling ``cancel`` meanwhile) before anything is torn down, so nothing it makes is missed."""
        job = Background(what, fn, cancel)
        self.jobs.append(job)
        return job

    def join_background(self) -> None:
        """Before the teardown: each background step ends (cancelled: its processes stopped, again
        until its thread is done, since a stop can come before the start it should undo)."""
        self.stop_event.set()
        for job in self.jobs:
            while job.alive():
                if job.cancel is not None:
                    with contextlib.suppress(Exception):
                        job.cancel()
                job.join(1.0)

    def _setup_peers(self, stack) -> None:
        from epochsync_dev.gluster import GlusterStack

        a = self.args
        self.slave_stack = GlusterStack(
            self.work / "slave", bricks=1, brick_size="8G" if a.size == "full" else "3G", rollover=a.rollover
        )
        stack.callback(self.slave_stack.stop)
        self.slave = self.slave_stack.start(progress=say)
        self.slave_brick = self.slave.bricks[0].split(":", 1)[1]
        self.slave_mnt = self.slave.mount
        self.geo = GeoRep(self.master.name, self.slave.name, self.master.host, self.work / "geo")
        stack.callback(self.geo.stop)
        self.geo.start(active_timeout=a.active_timeout, say=say)
        self.check_geo_workers()
        self.geo_cpu = self.geo.cpu()

    def _setup_epochsync(self, stack) -> None:
        import yaml

        from epochsync_dev.btrfs import BtrfsLoop

        a = self.args
        # the posix target on a btrfs file system of its own, with its committed view: readers
        # (the samplers, the lag watcher, the final comparison) read ``current``, its documented read path
        self.es_loop = BtrfsLoop(self.work / "target-btrfs", size="12G" if a.size == "full" else "4G")
        stack.callback(self.es_loop.stop)
        fs = self.es_loop.start()
        self.replica_es = str(fs / "replica-epochsync")
        self.view_es = str(fs / "replica-epochsync.epochs")
        say(f"epochsync: posix target {self.replica_es} on a btrfs loop image, committed view {self.view_es}/current")
        os.makedirs(self.replica_rsync, exist_ok=True)
        target = {
            "name": "es",
            "source": "vol",
            "kind": "posix",
            "path": self.replica_es,
            # keep 3: a reader who resolved current keeps its epoch for 2 more commits (a rename walk spans one)
            "view": {"snapshots": "required", "path": self.view_es, "keep": 3},
        }
        doc = self.master.config(str(self.work / "warehouse"), [target], source="vol", interval=f"{a.rollover}s")
        # the default every user gets: no barrier (``cut.barrier: false``)
        doc["sources"][0]["cut"] = {"barrier": False}
        self.config = self.work / "epochsync.yaml"
        self.config.write_text(yaml.safe_dump(doc, sort_keys=False))
        # the same source cut with Gluster's barrier (``cut.barrier: true``), for the cuts part
        doc["sources"][0]["cut"] = {"barrier": True}
        self.config_barrier = self.work / "epochsync-barrier.yaml"
        self.config_barrier.write_text(yaml.safe_dump(doc, sort_keys=False))
        from epochsync.spark import REMOTE_ENV

        self.env = dict(os.environ, **{REMOTE_ENV: self.server.url})
        self.server.wait_warm_up(300)
        self.driver = Driver(self.config, "vol", "es", self.env, self.work / "driver.log", config2=self.config_barrier)
        stack.callback(self.driver.stop)
        # the steady writer's cuts come from a process of their own, on the epoch's schedule
        self.cutter = Driver(self.config, "vol", "es", self.env, self.work / "cutter.log")
        stack.callback(self.cutter.stop)
        self.es_cpu = CpuMeter(lambda procs: {self.driver.proc.pid, self.cutter.proc.pid, self.server.proc.pid})

    def readers(self) -> dict[str, Callable[[], str]]:
        """Per tool, the folder its documented read path shows now (called once per sample):
        epochsync's ``current`` resolved, the slave volume's FUSE mount, rsync's directory."""
        return {
            "epochsync": lambda: committed_view(self.view_es),
            "geo-replication": lambda: self.slave_mnt,
            "rsync": lambda: self.replica_rsync,
        }

    def check_geo_workers(self, files: int = 40, timeout: float = 30, attempts: int = 5) -> None:
        """Every geo-replication worker replicates: files written on every master brick reach the slave.

        A worker can be Active and still never receive a changelog from its brick (seen once: the
        second brick's worker registered, went to Changelog Crawl and synced nothing for 15 minutes
        while the first one synced 11,000 files). Such a brick's worker is restarted alone
        (:meth:`GeoRep.restart_workers`); after ``attempts``
        the run stops, naming the silent bricks. A worker that replicates brought the files over in
        5 to 14 s (a restart's history crawl included); 30 s, not the 60 s of earlier runs, is when a
        silent one is restarted (3 of 5 set-ups up to 2026-11-27 had one)."""
        sub = "geo-check"
        os.makedirs(os.path.join(self.mnt, sub), exist_ok=True)
        for attempt in range(1, attempts + 1):
            # files written before a worker's first crawls end are brought by those crawls, also by a
            # worker whose live changelogs never come (seen: the check passed, then the untar's files
            # of that brick never reached the slave): the check files are written after them
            if not self.geo.wait_changelog_crawl(timeout):
                say(f"geo-replication: a worker not in Changelog Crawl after {timeout:.0f} s")
            names = [f"{sub}/a{attempt}-{i:03d}" for i in range(files)]
            for n in names:
                with open(os.path.join(self.mnt, n), "wb") as f:
                    f.write(n.encode())
            bricks = [b.split(":", 1)[1] for b in self.master.bricks]
            # a file's brick holds its bytes (a DHT linkto elsewhere is empty)
            owner = {n: next((b for b in bricks if _size(os.path.join(b, n))), "?") for n in names}
            t0 = time.monotonic()
            missing = names
            # a brick none of whose files arrived is silent; one whose files are arriving is slow
            # (a loaded machine): it gets up to 3 timeouts before it counts as silent
            while True:
                if self.stop_event.is_set():
                    raise RuntimeError("geo-replication's check: the run is stopping")
                missing = [n for n in names if not os.path.isfile(os.path.join(self.slave_brick, n))]
                if not missing:
                    say(f"geo-replication: every brick's worker replicates ({time.monotonic() - t0:.0f} s)")
                    return
                waited = time.monotonic() - t0
                arrived = {owner[n] for n in names if n not in missing}
                silent = sorted({owner[n] for n in missing} - arrived)
                if waited >= 3 * timeout or (waited >= timeout and silent):
                    break
                time.sleep(1)
            what = "nothing" if silent else f"{len(names) - len(missing)} of {len(names)} files"
            silent = silent or sorted({owner[n] for n in missing})
            say(
                f"geo-replication: {what} from {', '.join(silent)} after {time.monotonic() - t0:.0f} s "
                f"(attempt {attempt} of {attempts})"
            )
            if attempt < attempts:
                # only the silent bricks' workers: the others replicate and keep doing so, and a
                # worker's registration with its brick works or not on its own (a whole restart
                # needed every brick to win at once: 5 attempts in both runs of 2026-11-28)
                self.geo.restart_workers(silent, active_timeout=self.args.active_timeout, say=say)
        raise RuntimeError(f"geo-replication: the workers of {', '.join(silent)} replicate nothing (see gsyncd.log)")

    # ------------------------------------------------------------------ helpers
    def phase(self, name: str, t0: float, load0: float) -> None:
        """Records a phase's seconds (from ``time.monotonic()`` ``t0``) and its load at start and end."""
        self.phase_s[name] = round(time.monotonic() - t0, 1)
        self.phase_load[name] = [load0, load()]
        say(f"phase {name}: {self.phase_s[name]:.0f} s (load {load0} -> {self.phase_load[name][1]})")

    def es_cycle(self) -> dict:
        out = self.driver.call("cycle")
        self.cycles.append(out)
        return out

    def wait_geo(self, expect: Expect, t0: float, timeout: float) -> float | None:
        """Seconds from ``t0`` until the slave's brick equals ``expect`` (polled every second); None at the timeout."""
        deadline = time.time() + timeout
        while time.time() < deadline and not self.stop_event.is_set():
            if not expect.differences(self.slave_brick, mtimes=False, limit=1):
                return time.time() - t0
            time.sleep(1)
        return None

    def converge_all(self, subs: list[str], probes=(), timeout: float = 1200) -> None:
        """Bring every replica to the source's state under ``subs`` (a set-up step, not measured):
        epochsync's cycle beside the walks of the source that geo-replication's poll compares with;
        then rsync (its replica of ``subs`` seeded with a local copy of epochsync's committed view,
        which equals the source: the same bytes, modes, owners and mtimes, so ``rsync -a`` through
        the mount finds them up to date instead of reading every byte through FUSE beside the other
        two); then geo-replication polled. Each tool's time is printed."""
        t0 = time.monotonic()
        walks = Background("the source's walk", lambda: [Expect.of(self.mnt, sub, probes) for sub in subs])
        self.es_cycle()
        t_es = time.monotonic() - t0
        view = committed_view(self.view_es)
        copy = {"bytes_read": 0}
        if "rsync" in self.tools:
            for sub in subs:
                dst = os.path.join(self.replica_rsync, sub)
                shutil.rmtree(dst, ignore_errors=True)
                os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
                subprocess.run(["cp", "-a", os.path.join(view, sub), dst], check=True)
        t_seed = time.monotonic() - t0
        if "rsync" in self.tools:
            copy = rsync(self.mnt, self.replica_rsync)
        t_rsync = time.monotonic() - t0
        t_geo = None
        for expect in walks.result():
            if self.wait_geo(expect, time.time(), timeout) is None:
                raise RuntimeError(f"geo-replication did not bring {expect.sub} to the slave within {timeout:.0f} s")
            t_geo = time.monotonic() - t0
        say(
            f"set-up: epochsync's epoch committed after {t_es:.0f} s; rsync's replica seeded by {t_seed:.0f} s, "
            f"rsync -a done by {t_rsync:.0f} s ({copy['bytes_read']:,} bytes sent); geo-replication equal by {t_geo:.0f} s"
        )

    def compare(self, expect: Expect) -> dict[str, tuple[list[str], int]]:
        """Per tool, how its replica read through its read path differs from ``expect`` and how many
        files it lacks or has wrong (:meth:`Expect.lost`; the walks at once: the slave's FUSE mount
        is the slow one)."""
        walks = {
            t: Background(
                f"{t}'s comparison", lambda read=read: (lambda r: (expect.differences(r), expect.lost(r)))(read())
            )
            for t, read in self.readers().items()
        }
        return {t: w.result() for t, w in walks.items()}

    def between_hosts(self) -> dict[str, int]:
        """Per tool, the bytes it has moved between hosts so far (a reading: rows take differences);
        empty on one host."""
        return {}

    def sh(self, script: str) -> float:
        t0 = time.monotonic()
        subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=self.mnt, check=True)
        return time.monotonic() - t0

    # ------------------------------------------------------------------ one measured workload
    def measure(self, name: str, sub: str, work, probes=(), sampler=None) -> dict:
        """Runs ``work()`` on the mount and measures every tool (see the module docstring)."""
        phase0, load0 = time.monotonic(), load()
        live = self.args.epochsync == "live"
        say(f"{name}: workload ..." + (" (epochsync's schedule live)" if live else ""))
        geo_c0, geo_b0 = self.geo_cpu.read(), self.geo.bytes_sent()
        es_c0 = self.es_cpu.read()
        hosts0 = self.between_hosts()
        l0 = load()
        if sampler:
            sampler.start()
        schedule = EpochSchedule(self.cutter, self.driver, self.args.rollover).start() if live else None
        t_start = time.time()
        try:
            work()
        except BaseException:
            if schedule is not None:
                schedule.abort()
            raise
        t_end = time.time()
        say(
            f"{name}: workload done in {t_end - t_start:.1f} s; epochsync "
            + ("cut on demand, the windows go on until its epoch is committed" if live else "cut")
            + ", geo-replication polled"
        )
        result: dict = {}

        def expect_and_geo():
            result["expect"] = Expect.of(self.mnt, sub, probes)
            result["geo"] = self.wait_geo(result["expect"], t_end, self.args.converge_timeout)
            result["geo_cpu"] = self.geo_cpu.read() - geo_c0
            result["geo_bytes"] = self.geo.bytes_sent() - geo_b0

        th = threading.Thread(target=expect_and_geo, daemon=True)
        th.start()
        if schedule is not None:
            final = schedule.finish(self.args.converge_timeout)
            passes, final_cut = schedule.passes, schedule.final_cut
        else:
            es_c0 = self.es_cpu.read()  # the old way: epochsync does nothing before the end
            final = self.es_cycle()
            passes, final_cut = [final], final
        es_cpu = self.es_cpu.read() - es_c0
        th.join()
        if sampler:
            sampler.stop()
        expect: Expect = result["expect"]
        hosts = {t: v - hosts0.get(t, 0) for t, v in self.between_hosts().items()}
        rs = {"bytes_read": None, "bytes_written": None, "cpu_s": None, "seconds": None}
        if "rsync" in self.tools:
            say(f"{name}: rsync ...")
            rs = rsync(self.mnt, self.replica_rsync)
        compared = self.compare(expect)
        equal = {t: d for t, (d, _n) in compared.items()}
        stats = [r for c in passes for r in c.get("stats") or []]
        es_row = {
            "convergence_s": final["t_end"] - t_end,
            "bytes_read": sum(r.get("bytes_pulled", 0) for r in stats)
            + sum(c.get("verify_source_bytes", 0) for c in passes),
            "bytes_written": sum(r.get("bytes_written", 0) for r in stats),
            "cpu_s": es_cpu,
            "epochsync_mode": self.args.epochsync,
            "epochs": len(schedule.cuts) + 1 if schedule is not None else 1,
            "passes": len(passes),
        }
        geo_row = {
            "convergence_s": result["geo"],
            "bytes_read": result["geo_bytes"],
            "bytes_written": result["geo_bytes"],
            "cpu_s": result["geo_cpu"],
        }
        rs_row = {k: rs[k] for k in ("bytes_read", "bytes_written", "cpu_s")} | {"convergence_s": rs["seconds"]}
        fractions = sampler.fractions() if sampler else {}
        by_tool = {"epochsync": es_row, "geo-replication": geo_row, "rsync": rs_row}
        for tool in self.tools:
            row = {f: None for f in FIELDS} | by_tool[tool] | {"workload": name, "tool": tool}
            row["topology"] = self.topology
            row["files_lost"] = compared[tool][1]
            if tool in hosts:
                row["bytes_between_hosts"] = hosts[tool]
            row["consistent_fraction"] = fractions.get(tool)
            row["replica_equals_source"] = not equal[tool]
            if equal[tool]:
                row["differences"] = equal[tool][:3]
            row["workload_s"] = round(t_end - t_start, 2)
            row["entries"] = len(expect.entries)
            row["loadavg_1m"] = [l0, load()]
            if sampler:
                row["samples"] = sampler.counts.get(tool, 0)
            self.rows.append(_rounded(row))
        if schedule is not None:
            self.stage_rows += _live_stage_rows(name, t_end, passes, final_cut)
        else:
            self.stage_rows.append(_stage_row(name, final))
        line = ", ".join(
            f"{r['tool']} {r['convergence_s'] if r['convergence_s'] is not None else 'TIMEOUT'} s"
            for r in self.rows[-len(self.tools) :]
        )
        epochs = f" (epochsync: {es_row['epochs']} epochs in {len(passes)} passes)" if schedule is not None else ""
        say(f"{name}: convergence {line}{epochs}; load {load()}")
        self.phase(name, phase0, load0)
        bad = [t for t, d in equal.items() if d]
        if bad:
            say(f"{name}: NOT EQUAL to the source: " + "; ".join(f"{t}: {equal[t][:2]}" for t in bad))
        return {"final": final, "final_cut": final_cut, "passes": passes, "t_end": t_end}

    # ------------------------------------------------------------------ workloads
    def run_issue33(self) -> None:
        s = self.size
        tarball = _tarball()
        os.makedirs(os.path.join(self.mnt, "untar"), exist_ok=True)
        members = " ".join(s["untar_members"])
        untar = self.measure(
            "untar",
            "untar",
            lambda: self.sh(f"tar -xJf {tarball} -C untar --no-same-owner {members}"),
            probes=50,  # every 50th file's tail
        )
        final, cut = untar["final"], untar["final_cut"]
        self.source_rows.append(
            _rounded(
                {
                    "row": "untar-replicated",
                    "entries": self.rows[-1]["entries"],
                    # live: from the on-demand cut at the untar's end (the schedule's epochs before it
                    # hold the rest of the untar); at-end: from the one cut of the whole untar
                    "epochsync_mode": self.args.epochsync,
                    "epochs": self.rows[-3]["epochs"],
                    "cut_to_commit_s": final["t_end"] - cut["t0"],
                    "cut_s": cut["t_cut"] - cut["t0"],
                    "target_s": 60,
                    "loadavg_1m": load(),
                }
            )
        )
        src = f"untar/glibc-2.36/{s['rename_dir']}"
        dst = f"{src}-renamed"
        sampler = RenameSampler(self, "untar/glibc-2.36", s["rename_dir"])
        self.measure(
            "rename",
            "untar",
            lambda: os.rename(os.path.join(self.mnt, src), os.path.join(self.mnt, dst)),
            sampler=sampler,
        )

        say(f"set-up: {s['append_files']} files of {s['append_mib']} MiB and {s['small_files']:,} files of 8 KiB ...")
        t0, load0 = time.monotonic(), load()
        # epochsync copies the set-up data in one epoch after it is written, in both modes: with its
        # schedule live meanwhile, the cuts and windows slowed the writing 3.5x (20,000 files: 161 s
        # against 45 s) and the whole set-up took longer (292 s against 260 s, load 13 to 25)
        self._setup_append_small()
        subs = ["data"]
        if "steady" in self.parts:  # the steady writer's folder, converged with the rest, not on its own
            self._setup_steady()
            subs.append("steady")
        self.converge_all(subs, probes=97)
        self.phase("set-up of append and small-writes", t0, load0)
        say(f"set-up: every replica has them after {time.monotonic() - t0:.0f} s")
        rnd = random.Random(33)
        tails = {i: rnd.randbytes(64 * 1024) for i in range(s["append_files"])}

        def appends():
            for i, data in tails.items():
                with open(os.path.join(self.mnt, f"data/big/f{i:02d}"), "ab") as f:
                    f.write(data)

        big = [f"data/big/f{i:02d}" for i in range(s["append_files"])]
        self.measure("append", "data/big", appends, probes=big)
        touched = [f"data/small/d{(i // 1000):03d}/f{i:06d}" for i in range(0, s["small_files"], 100)]

        def small_writes():
            block = rnd.randbytes(4096)

            def one(p):
                fd = os.open(os.path.join(self.mnt, p), os.O_WRONLY)
                try:
                    os.pwrite(fd, block, 4096)
                finally:
                    os.close(fd)

            with ThreadPoolExecutor(4) as ex:
                list(ex.map(one, touched))

        self.measure("small-writes", "data/small", small_writes, probes=touched)
        doomed = [
            f"data/small/d{(i // 1000):03d}/f{i:06d}"
            for i in range(1, s["small_files"], s["small_files"] // s["delete_files"])
        ][: s["delete_files"]]

        def deletes():
            with ThreadPoolExecutor(4) as ex:
                list(ex.map(lambda p: os.remove(os.path.join(self.mnt, p)), doomed))

        self.measure("delete", "data/small", deletes)

    def _setup_steady(self, sub: str = "steady") -> None:
        os.makedirs(os.path.join(self.mnt, sub), exist_ok=True)
        open(os.path.join(self.mnt, sub, "journal"), "wb").close()

    def _setup_append_small(self) -> None:
        """The append and small-write data, written through the mount and a second FUSE client of
        the volume by several threads at once (FUSE round trips, not bytes, bound the small files,
        and one client's requests go through one FUSE channel), the big files meanwhile."""
        s = self.size
        os.makedirs(os.path.join(self.mnt, "data/big"), exist_ok=True)
        chunk = os.urandom(1 << 20)

        def big(i):
            with open(os.path.join(self.mnt, f"data/big/f{i:02d}"), "wb") as f:
                for m in range(s["append_mib"]):
                    f.write(f"{i:02d}:{m:06d}".encode() + chunk[9:])

        for d in range((s["small_files"] + 999) // 1000):
            os.makedirs(os.path.join(self.mnt, f"data/small/d{d:03d}"), exist_ok=True)
        base = os.urandom(SMALL_FILE)
        second = self.master_stack.mount_client(self.work / "mnt-setup")
        mounts = (self.mnt, second)

        def one(i):  # open, write, close: no buffered file object's extra fstat through FUSE
            fd = os.open(
                os.path.join(mounts[i % 2], f"data/small/d{(i // 1000):03d}/f{i:06d}"),
                os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                0o644,
            )
            try:
                os.write(fd, f"{i:08d}".encode() + base[8:])
            finally:
                os.close(fd)

        def bigs() -> float:
            # one big file after the other: geo-replication (running all along) sends a file whole
            # for every changelog that names it, so files written over many rollovers at once cost it more
            t = time.monotonic()
            for i in range(s["append_files"]):
                big(i)
            return time.monotonic() - t

        t0 = time.monotonic()
        try:
            big_files = Background("the big files", bigs)
            with ThreadPoolExecutor(16) as ex:
                list(ex.map(one, range(s["small_files"])))
            t1 = time.monotonic()
            big_s = big_files.result()
        finally:
            self.master_stack.unmount_client(second)
        say(
            f"set-up: {s['small_files']:,} small files written in {t1 - t0:.0f} s (two FUSE clients), "
            f"{s['append_files']} big files meanwhile in {big_s:.0f} s"
        )

    # ------------------------------------------------------------------ steady writer
    def run_steady(self) -> None:
        self._steady("steady", "steady")

    def write_steady(self, sub: str, k: int) -> None:
        """The steady writer's step ``k``: file ``k`` in two writes, then its line in the journal."""
        data = content(k)
        with open(os.path.join(self.mnt, sub, f"f{k:06d}"), "wb") as f:
            f.write(data[:4096])
            f.flush()
            f.write(data[4096:])
        with open(os.path.join(self.mnt, sub, "journal"), "ab") as f:
            f.write(f"{k}\n".encode())

    def _steady(self, name: str, sub: str, fault=None, seconds: float | None = None) -> None:
        """The steady writer as workload ``name`` in folder ``sub``; ``fault(t_start, events)``, when
        given, runs in a thread beside it (a server killed and brought back) and records what it did
        and when in ``events``, which the rows get."""
        s = self.size
        if not os.path.exists(os.path.join(self.mnt, sub, "journal")):  # without the issue33 part
            self._setup_steady(sub)
            self.converge_all([sub])
        n = int((seconds or s["steady_s"]) * s["steady_rate"])
        written: dict[int, float] = {}
        watchers = {t: SteadyWatcher(t, read, written, sub=sub) for t, read in self.readers().items()}
        geo_c0, geo_b0, es_c0 = self.geo_cpu.read(), self.geo.bytes_sent(), self.es_cpu.read()
        hosts0 = self.between_hosts()
        l0 = load()
        done = threading.Event()
        rs_runs: list[dict] = []

        def rsync_loop():
            while not done.is_set():
                rs_runs.append(rsync(self.mnt, self.replica_rsync, nice=10))

        rs_thread = threading.Thread(target=rsync_loop, daemon=True)
        for w in watchers.values():
            w.start()
        schedule = EpochSchedule(self.cutter, self.driver, self.args.rollover, retry=fault is not None).start()
        if "rsync" in self.tools:
            rs_thread.start()
        say(
            f"{name}: {n} files in {n / s['steady_rate']:.0f} s; epochsync cuts every {self.args.rollover} s and "
            "replicates every cut epoch since its last commit in one pass (as a DAG run's window)"
            + (", rsync back to back" if "rsync" in self.tools else "")
        )
        t_start = time.time()
        events: dict = {}
        faulted = Background(f"{name}'s fault", lambda: fault(t_start, events)) if fault else None
        for k in range(1, n + 1):
            delay = t_start + k / s["steady_rate"] - time.time()
            if delay > 0:
                time.sleep(delay)
            self.write_steady(sub, k)
            written[k] = time.time()
        t_end = time.time()
        if faulted is not None:
            faulted.result()
        say(f"{name}: writer done in {t_end - t_start:.0f} s; waiting for the replicas to show every file")
        deadline = time.time() + self.args.converge_timeout
        conv: dict[str, float | None] = {}
        while time.time() < deadline and len(conv) < len(watchers):
            for t, w in watchers.items():
                if t not in conv and w.complete(n):
                    conv[t] = w.seen_all_at - t_end
            time.sleep(0.5)
        # every file is whole; the journal's last lines may still be on their way (a cut between a
        # file and its journal line): the schedule goes on until each replica equals the source
        expect = Expect.of(self.mnt, sub, [])
        equal_at: dict[str, float] = {}
        while time.time() < deadline and len(equal_at) < len(watchers):
            for t, read in self.readers().items():
                if t not in equal_at and not expect.differences(read(), limit=1):
                    equal_at[t] = time.time() - t_end
            time.sleep(0.5)
        done.set()
        schedule.stop()
        if "rsync" in self.tools:
            rs_thread.join(600)
        es_cycles, es_cuts = schedule.passes, schedule.cuts
        for w in watchers.values():
            w.stop()
        geo_cpu, geo_bytes, es_cpu = (
            self.geo_cpu.read() - geo_c0,
            self.geo.bytes_sent() - geo_b0,
            self.es_cpu.read() - es_c0,
        )
        hosts = {t: v - hosts0.get(t, 0) for t, v in self.between_hosts().items()}
        compared = self.compare(expect)
        stats = [r for c in es_cycles for r in c.get("stats") or []]
        figures = {
            "epochsync": {
                "bytes_read": sum(r.get("bytes_pulled", 0) for r in stats)
                + sum(c.get("verify_source_bytes", 0) for c in es_cycles),
                "bytes_written": sum(r.get("bytes_written", 0) for r in stats),
                "cpu_s": es_cpu,
                "epochs": len(es_cuts),
                "passes": len(es_cycles),
                "failed_cuts": sum(1 for f in schedule.failures if f["op"] == "cut"),
                "failed_windows": sum(1 for f in schedule.failures if f["op"] == "window"),
            },
            "geo-replication": {"bytes_read": geo_bytes, "bytes_written": geo_bytes, "cpu_s": geo_cpu},
            "rsync": {
                "bytes_read": sum(r["bytes_read"] for r in rs_runs),
                "bytes_written": sum(r["bytes_written"] for r in rs_runs),
                "cpu_s": sum(r["cpu_s"] for r in rs_runs),
                "runs": len(rs_runs),
            },
        }
        if schedule.failures:
            figures["epochsync"]["failures"] = [{**f, "t": round(f["t"] - t_start, 1)} for f in schedule.failures[:10]]
        for t, w in watchers.items():
            lags = sorted(w.lags())
            row = {f: None for f in FIELDS} | figures[t] | {"workload": name, "tool": t}
            row["topology"] = self.topology
            row["convergence_s"] = conv.get(t)
            if lags:
                row["lag_median_s"] = statistics.median(lags)
                row["lag_p95_s"] = lags[min(len(lags) - 1, int(round(0.95 * (len(lags) - 1))))]
            row["consistent_fraction"] = w.fraction()
            row["instant_fraction"] = w.instant_fraction()
            row["samples"] = w.samples
            if w.inconsistent:
                row["inconsistent_examples"] = w.inconsistent
            row["equal_s"] = equal_at.get(t)
            row["files"] = n
            row["visible"] = len(lags)
            diffs, lost = compared[t]
            row["files_lost"] = lost
            row["replica_equals_source"] = not diffs
            if diffs:
                row["differences"] = diffs[:3]
            if t in hosts:
                row["bytes_between_hosts"] = hosts[t]
            if fault is not None:
                row.update(self.fault_figures(t, events, written, w.seen, t_start))
            row["workload_s"] = round(t_end - t_start, 2)
            row["loadavg_1m"] = [l0, load()]
            self.rows.append(_rounded(row))
            self.lag_series.append(
                {
                    "workload": name,
                    "tool": t,
                    "points": [
                        [round(written[k] - t_start, 2), round(v, 2)] for k, v in sorted(w.lag_by_file().items())
                    ],
                }
            )
        for c in es_cycles:
            self.stage_rows.append(_stage_row(name, c))
        self.source_rows.append(
            _rounded(
                {
                    "row": "steady-cuts" if name == "steady" else f"{name}-cuts",
                    "cuts": len(es_cuts),
                    "end_to_end_s_median": statistics.median(c["t_cut"] - c["t0"] for c in es_cuts)
                    if es_cuts
                    else None,
                    "held_s_max": max((c["cut"].get("held_s") or 0 for c in es_cuts), default=None),
                    "loadavg_1m": load(),
                }
            )
        )
        mine = self.rows[-len(watchers) :]
        say(
            f"{name}: lag median "
            + ", ".join(f"{r['tool']} {r['lag_median_s']}" for r in mine)
            + "; consistent "
            + ", ".join(f"{r['tool']} {r['consistent_fraction']}" for r in mine)
            + "; files lost "
            + ", ".join(f"{r['tool']} {r['files_lost']}" for r in mine)
        )

    def fault_figures(self, tool: str, events: dict, written: dict, seen: dict, t_start: float) -> dict:
        """A faulted workload's figures for one tool (the pool's bench has them)."""
        return {}

    # ------------------------------------------------------------------ issue 31: cuts with probes
    def run_cuts(self) -> None:
        n = self.args.cuts
        probe_dir = os.path.join(self.mnt, "probe")
        os.makedirs(probe_dir, exist_ok=True)
        stop = threading.Event()
        writes: list[tuple[float, float]] = []
        renames: list[tuple[float, float]] = []

        def writer():
            with open(os.path.join(probe_dir, "appends"), "ab", buffering=0) as f:
                while not stop.is_set():
                    t = time.time()
                    f.write(b"x" * 512)
                    writes.append((t, time.time() - t))
                    stop.wait(0.05)

        def renamer():
            a, b = os.path.join(probe_dir, "ping"), os.path.join(probe_dir, "pong")
            open(a, "wb").close()
            while not stop.is_set():
                t = time.time()
                os.rename(a, b)
                renames.append((t, time.time() - t))
                a, b = b, a
                stop.wait(0.05)

        threads = [threading.Thread(target=f, daemon=True) for f in (writer, renamer)]
        for th in threads:
            th.start()
        time.sleep(2)
        say(
            f"cuts: {n} cuts with Gluster's barrier and {n} without (cut.barrier: false), alternating, "
            "with a writer and a renamer probe on the mount"
        )
        cuts = []
        for i in range(2 * n):
            barrier = i % 2 == 0
            t0 = time.time()
            out = self.driver.call("cut2" if barrier else "cut")
            cuts.append((t0, time.time(), barrier, out))
            time.sleep(1.0)  # a cut's probe window starts 0.5 s before it: the windows never overlap
        stop.set()
        for th in threads:
            th.join(10)
        for t0, t1, barrier, out in cuts:
            c = out["cut"]
            w = [d for t, d in writes if t0 - 0.5 <= t <= t1]
            r = [d for t, d in renames if t0 - 0.5 <= t <= t1]
            self.source_rows.append(
                _rounded(
                    {
                        "row": "cut",
                        "epoch": out["epoch"],
                        "barrier": barrier,
                        "cut_total_s": c.get("total_s"),
                        "end_to_end_s": t1 - t0,
                        "barrier_on_s": c.get("barrier_on_s"),
                        "snapshots_s": c.get("snapshots_s"),
                        "barrier_off_s": c.get("barrier_off_s"),
                        "held_s": c.get("held_s"),
                        "rename_probe_max_s": max(r) if r else None,
                        "write_probe_max_s": max(w) if w else None,
                        "publish_s": (out.get("publish") or {}).get("resolve_s"),
                        "loadavg_1m": load(),
                    }
                )
            )
        for barrier in (True, False):
            rows = [r for r in self.source_rows if r["row"] == "cut" and r["barrier"] is barrier]
            summary = {
                "row": "cuts-summary",
                "barrier": barrier,
                "cuts": len(rows),
                "end_to_end_s_max": max(r["end_to_end_s"] for r in rows),
                "end_to_end_s_median": statistics.median(r["end_to_end_s"] for r in rows),
                "held_s_max": max((r["held_s"] for r in rows if r["held_s"] is not None), default=None),
                "rename_probe_max_s": max((r["rename_probe_max_s"] or 0) for r in rows),
                "write_probe_max_s": max((r["write_probe_max_s"] or 0) for r in rows),
                "targets": {"end_to_end_s": 3, "held_s": 1, "write_probe_max_s": 0.5},
                "loadavg_1m": load(),
            }
            self.source_rows.append(_rounded(summary))
            say(
                f"cuts {'with' if barrier else 'without'} the barrier: end to end median "
                f"{summary['end_to_end_s_median']:.2f} s, max {summary['end_to_end_s_max']:.2f} s; held (brick logs) "
                f"max {summary['held_s_max']}; rename probe max {summary['rename_probe_max_s']:.2f} s; "
                f"slowest write {summary['write_probe_max_s']:.3f} s"
            )
        # the last part: the probes' cuts are not replicated (nothing measured follows)

    # ------------------------------------------------------------------ issue 31: live epochs under Airflow
    def run_airflow(self) -> None:
        self.airflow_ready.result()
        self.airflow.run()

    # ------------------------------------------------------------------ results
    def write(self, seconds: float, complete: bool) -> None:
        from epochsync_dev.bench import results_dir, write_results

        for r in self.rows + self.source_rows + self.stage_rows:
            r.setdefault("topology", self.topology)
        if self.args.no_write:
            for r in self.rows + self.source_rows:
                print(json.dumps(r))
            for r in self.stage_rows:
                print(json.dumps({"stages": r}))
            print(json.dumps({"run": self.run_doc(seconds, complete)}))
            return
        d = results_dir()
        name = self.args.results_name
        earlier = _earlier_results(d, name) if self.args.merge else None
        rows, source_rows, lag, stage_rows = self.rows, self.source_rows, self.lag_series, self.stage_rows
        if earlier:
            # this run's rows replace the earlier run's of the same workloads and kinds; the rest are kept
            mine = {r["workload"] for r in rows}
            rows = [r for r in earlier["rows"] if r.get("workload") not in mine] + rows
            kinds = {r["row"] for r in source_rows}
            source_rows = [r for r in earlier["source"] if r.get("row") not in kinds] + source_rows
            lag = lag or earlier["lag"]
            staged = {r["workload"] for r in stage_rows}
            stage_rows = [r for r in earlier["stages"] if r.get("workload") not in staged] + stage_rows
        path = write_results(name, rows)
        (d / f"{name}.source.json").write_text(json.dumps(source_rows, indent=2) + "\n")
        (d / f"{name}.lag.json").write_text(json.dumps(lag) + "\n")
        (d / f"{name}.stages.json").write_text(json.dumps(stage_rows, indent=1) + "\n")
        meta_path = d / f"{name}.meta.json"
        meta = json.loads(meta_path.read_text())
        if earlier:
            prev = earlier["meta"]
            meta["merged_with"] = [*prev.pop("merged_with", []), prev]
        meta.update(self.run_doc(seconds, complete))
        meta_path.write_text(json.dumps(meta, indent=2) + "\n")
        say(f"results: {path} (+ .source, .lag, .stages)")

    def run_doc(self, seconds: float, complete: bool) -> dict:
        """What the meta file says of this run: sizes, parts, phases (seconds and load), overlaps."""
        return {
            "make_target": self.make_target,
            "topology": self.topology,
            "size": self.args.size,
            "sizes": self.size,
            "rollover_s": self.args.rollover,
            "epochsync_mode": self.args.epochsync,
            "parts": self.args.parts,
            "seconds": round(seconds, 1),
            "phase_seconds": self.phase_s,
            "phase_load_1m": self.phase_load,
            "overlapped": OVERLAPPED,
            "complete": complete,
            "load_average_before": self.load_before,
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        }


# --------------------------------------------------------------------------- live epochs under Airflow


class LiveAirflow:
    """The airflow part: ``airflow standalone`` schedules 10 s epochs of a second source (``live``,
    the same volume) into a posix target while a writer adds a file every 0.5 s.

    :meth:`prepare` (in the background during the set-up: it mostly waits) writes the config, with
    the epochs starting ``--airflow-lead`` seconds later, starts Airflow and waits for the DAG;
    :meth:`run` (the part, the first after the set-up: a source's first cut publishes the whole
    volume, so it runs before the workloads fill it) unpauses the DAG, writes, and reads each
    epoch's cut and commit times. Should the set-up take longer than the lead, the first epochs
    are late: the row says by how much (``late_s``)."""

    interval = 10

    def __init__(self, bench: Bench, stack):
        from epochsync_dev.devstack import AirflowStandalone, airflow_environment, write_admin_password
        from epochsync_dev.embedded import free_port

        self.bench = bench
        self.epochs = bench.args.live_epochs
        self.base = bench.work / "live"
        self.base.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.config = self.base / "epochsync.yaml"
        home = self.base / "airflow-home"
        self.password = write_admin_password(home)
        env = airflow_environment(home, port=port, config=self.config, connections={}, spark_url=bench.server.url)
        env.pop("EPOCHSYNC_SCHEDULE_FROM", None)
        self.af = AirflowStandalone(home, env, port)
        stack.callback(self.af.stop)
        self.dag = "epochsync__live__dr"
        self.start_at = 0.0
        self.token = ""

    def prepare(self) -> None:
        from datetime import UTC, datetime

        import yaml

        t0, load0 = time.monotonic(), load()
        lead = self.bench.args.airflow_lead
        self.start_at = float(int(time.time() + lead) // self.interval * self.interval + self.interval)
        start = datetime.fromtimestamp(self.start_at, tz=UTC)
        doc = self.bench.master.config(
            str(self.base / "warehouse"),
            [{"name": "dr", "source": "live", "kind": "posix", "path": str(self.base / "replica")}],
            source="live",
            interval=f"{self.interval}s",
            start=start.strftime("%Y-%m-%dT%H:%M:%SZ"),
        )
        self.config.write_text(yaml.safe_dump(doc, sort_keys=False))
        self.af.start(timeout=600)
        self.af.create_pools(self.config)
        self.token = self.af.token(self.password)
        self.af.wait_for_dag(self.token, self.dag)
        self.bench.phase("airflow start (during the set-up)", t0, load0)
        say(
            f"airflow: standalone up, DAG {self.dag} parsed in {time.monotonic() - t0:.0f} s; epochs from {start:%H:%M:%S}"
        )

    def run(self) -> None:
        from epochsync.warehouse.paths import Warehouse, local_path

        mnt = self.bench.mnt
        stop = threading.Event()

        def writer():
            k = 0
            os.makedirs(os.path.join(mnt, "live"), exist_ok=True)
            while not stop.is_set():
                k += 1
                with open(os.path.join(mnt, f"live/f{k:05d}"), "wb") as f:
                    f.write(content(k))
                stop.wait(0.5)

        late = max(0.0, time.time() - self.start_at)
        say(
            f"airflow: {self.epochs} epochs of {self.interval} s from "
            f"{time.strftime('%H:%M:%S', time.gmtime(self.start_at))}"
            + (f" (the set-up ended {late:.0f} s after their start)" if late else "")
        )
        wt = threading.Thread(target=writer, daemon=True)
        try:
            self.af.api("PATCH", f"/dags/{self.dag}", self.token, {"is_paused": False})
            wt.start()
            wh = Warehouse(f"file://{self.base / 'warehouse'}")
            deadline = self.start_at + (self.epochs + 1) * self.interval + 600
            while time.time() < deadline:
                if os.path.exists(local_path(wh.stats("dr", self.epochs))):
                    break
                time.sleep(1)
            stop.set()
            delays = []
            for e in range(1, self.epochs + 1):
                spath = local_path(wh.stats("dr", e))
                cpath = local_path(wh.cut("live", e))
                if not (os.path.exists(spath) and os.path.exists(cpath)):
                    delays.append({"epoch": e, "committed": False})
                    continue
                stats = json.loads(Path(spath).read_text())
                cut = json.loads(Path(cpath).read_text())
                delays.append(
                    {
                        "epoch": e,
                        "committed": True,
                        "cut_at_s": round(cut["time_ns"] / 1e9 - self.start_at - e * self.interval, 2),
                        "commit_after_cut_s": round(stats["committed_at"] - cut["time_ns"] / 1e9, 2),
                        "records_in": stats.get("records_in"),
                    }
                )
            done = [d for d in delays if d.get("committed")]
            self.bench.source_rows.append(
                _rounded(
                    {
                        "row": "live-airflow",
                        "interval_s": self.interval,
                        "epochs": self.epochs,
                        "committed": len(done),
                        "commit_after_cut_s_max": max((d["commit_after_cut_s"] for d in done), default=None),
                        "commit_after_cut_s_median": statistics.median(d["commit_after_cut_s"] for d in done)
                        if done
                        else None,
                        "target_s": 20,
                        "late_s": round(late, 1),
                        "per_epoch": delays,
                        "loadavg_1m": load(),
                    }
                )
            )
            say(
                f"airflow: {len(done)}/{self.epochs} epochs committed; commit after cut: "
                f"{[d.get('commit_after_cut_s') for d in delays]}"
            )
        finally:
            stop.set()
            self.af.stop(grace=5)


# --------------------------------------------------------------------------- samplers


class RenameSampler:
    """Once a second per replica, during the rename: is the directory whole under exactly one of its
    names? Each sample reads one folder of the tool's read path (:meth:`Bench.readers`, resolved once)."""

    def __init__(self, bench: Bench, parent: str, name: str):
        self.bench, self.parent, self.name = bench, parent, name
        self.want = {
            os.path.relpath(p, os.path.join(parent, name)): v
            for p, v in walk(bench.mnt, os.path.join(parent, name), mtimes=False).items()
        }
        self.readers = bench.readers()
        self.counts: dict[str, int] = {}
        self.good: dict[str, int] = {}
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(t, r), daemon=True) for t, r in self.readers.items()]

    def _state(self, root: str, name: str) -> dict | None:
        base = os.path.join(self.parent, name)
        if not os.path.isdir(os.path.join(root, base)):
            return None
        return {os.path.relpath(p, base): v for p, v in walk(root, base, mtimes=False).items()}

    def consistent(self, root: str) -> bool:
        a, b = self._state(root, self.name), self._state(root, self.name + "-renamed")
        return (a == self.want and b is None) or (a is None and b == self.want)

    def _run(self, tool: str, read: Callable[[], str]) -> None:
        while not self._stop.is_set():
            t = time.time()
            ok = self.consistent(read())
            self.counts[tool] = self.counts.get(tool, 0) + 1
            self.good[tool] = self.good.get(tool, 0) + int(ok)
            self._stop.wait(max(0.0, 1.0 - (time.time() - t)))

    def start(self) -> None:
        for th in self._threads:
            th.start()

    def stop(self) -> None:
        self._stop.set()
        for th in self._threads:
            th.join(120)

    def fractions(self) -> dict[str, float]:
        return {t: self.good.get(t, 0) / n for t, n in self.counts.items() if n}


class SteadyWatcher:
    """One replica during the steady writer: each file's first moment whole on it (every 0.5 s) and,
    every other look, whether the whole folder equals the source after some number of steps."""

    def __init__(self, tool: str, read: Callable[[], str], written: dict[int, float], *, sub: str = "steady"):
        self.tool, self.read, self.written, self.sub = tool, read, written, sub
        self.inconsistent: list[str] = []
        self.instants = 0  # samples equal to a step boundary or to a moment inside one step (mid_step)
        self.seen: dict[int, float] = {}
        self.samples = 0
        self.good = 0
        self.seen_all_at = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        tick = 0
        while not self._stop.is_set():
            t = time.time()
            tick += 1
            d = os.path.join(self.read(), self.sub)  # one folder per look (epochsync: current resolved)
            try:
                names = set(os.listdir(d))
            except OSError:
                names = set()
            files = {int(n[1:]) for n in names if n.startswith("f") and n[1:].isdigit()}
            for k in sorted(files - set(self.seen)):
                try:
                    with open(os.path.join(d, f"f{k:06d}"), "rb") as f:
                        if f.read() == content(k):
                            self.seen[k] = t
                except OSError:
                    pass
            if tick % 2 == 0:
                self.samples += 1
                whole = self._consistent(d, names, files)
                self.good += int(whole)
                self.instants += int(whole or self.mid_step(d, names))
            self._stop.wait(max(0.0, 0.5 - (time.time() - t)))

    def _consistent(self, d: str, names: set[str], files: set[int]) -> bool:
        why = self.inconsistency(d, names)
        if why is not None and len(self.inconsistent) < 5:
            self.inconsistent.append(why)
        return why is None

    def mid_step(self, d: str, names: set[str]) -> bool:
        """Does folder ``d`` equal a moment inside one of the writer's steps, a state the source
        was in between two step boundaries: the journal's lines 1..k and their files whole, and
        file k+1 there with a prefix of its bytes (created, half written, or whole before its
        journal line)? A cut is an instant of the source, so it may fall there."""
        try:
            with open(os.path.join(d, "journal"), "rb") as f:
                journal = f.read()
        except OSError:
            return False
        k = journal.count(b"\n")
        nxt = f"f{k + 1:06d}"
        if journal != "".join(f"{i}\n" for i in range(1, k + 1)).encode():
            return False
        if names != {"journal", nxt} | {f"f{i:06d}" for i in range(1, k + 1)}:
            return False
        try:
            with open(os.path.join(d, nxt), "rb") as f:
                if not content(k + 1).startswith(f.read()):
                    return False
            for i in range(1, k + 1):
                with open(os.path.join(d, f"f{i:06d}"), "rb") as f:
                    if f.read() != content(i):
                        return False
        except OSError:
            return False
        return True

    def inconsistency(self, d: str, names: set[str]) -> str | None:
        """How the folder ``d`` (its ``names``) differs from every state the writer's steps made
        (None: it equals one), in words for the row (the first few, ``inconsistent_examples``)."""
        try:
            with open(os.path.join(d, "journal"), "rb") as f:
                journal = f.read()
        except OSError:
            return "no journal"
        k = journal.count(b"\n")
        if journal != "".join(f"{i}\n" for i in range(1, k + 1)).encode():
            return f"a journal of {len(journal)} bytes that is not lines 1..{k}"
        want = {"journal"} | {f"f{i:06d}" for i in range(1, k + 1)}
        if names != want:
            extra, missing = sorted(names - want), sorted(want - names)
            sizes = []
            for n in extra[:2]:
                with contextlib.suppress(OSError):
                    sizes.append(f"{n} {os.path.getsize(os.path.join(d, n))} B")
            return f"journal {k} lines; files beyond it: {', '.join(sizes) or extra[:2]}; missing: {missing[:2]}"
        for i in range(1, k + 1):
            try:
                with open(os.path.join(d, f"f{i:06d}"), "rb") as f:
                    if f.read() != content(i):
                        return f"journal {k} lines; f{i:06d} not whole"
            except OSError:
                return f"journal {k} lines; f{i:06d} unreadable"
        return None

    def complete(self, n: int) -> bool:
        if len(self.seen) >= n:
            self.seen_all_at = self.seen_all_at or max(self.seen.values())
            return True
        return False

    def lag_by_file(self) -> dict[int, float]:
        return {k: t - self.written[k] for k, t in self.seen.items() if k in self.written}

    def lags(self) -> list[float]:
        return list(self.lag_by_file().values())

    def fraction(self) -> float | None:
        return self.good / self.samples if self.samples else None

    def instant_fraction(self) -> float | None:
        """The share of samples equal to an instant of the source (a step boundary or inside a step)."""
        return self.instants / self.samples if self.samples else None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)


# --------------------------------------------------------------------------- helpers


def committed_view(view_dir: str) -> str:
    """The folder a reader of epochsync's committed view reads now: ``<view>/current`` resolved once
    (as a reader who opens a path through it does), so a sample walks one epoch's read-only
    snapshot even when ``current`` flips during the walk. Before the first commit: a folder that
    does not exist (an empty view)."""
    from epochsync.targets.posix import VIEW_LINK

    try:
        return os.path.join(view_dir, os.readlink(os.path.join(view_dir, VIEW_LINK)))
    except OSError:
        return os.path.join(view_dir, "no-epoch-committed")


class Background:
    """``fn()`` in a daemon thread; :meth:`result` waits for it and returns its value or raises
    what it raised (a set-up step overlapped with another). ``cancel`` stops what it started."""

    def __init__(self, what: str, fn: Callable[[], object], cancel: Callable[[], object] | None = None):
        self.what, self.cancel = what, cancel
        self._out: dict = {}
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True, name=what)
        self._thread.start()

    def _run(self, fn) -> None:
        try:
            self._out["value"] = fn()
        except BaseException as exc:  # handed to the caller of result()
            self._out["error"] = exc

    def alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def result(self, timeout: float | None = None):
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"{self.what}: still running after {timeout:.0f} s")
        if "error" in self._out:
            raise self._out["error"]
        return self._out.get("value")


def _running(driver) -> bool:
    """Is a :class:`Driver`'s process still there (a failure it answered can be retried)?"""
    proc = getattr(driver, "proc", None)
    return proc is None or proc.poll() is None


def _rounded(row: dict) -> dict:
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}


def _stage_row(workload: str, cyc: dict) -> dict:
    """Where an epochsync cycle's time went: the cut, then each epoch's stages (stats rows)."""
    stages: dict[str, float] = {}
    for r in cyc.get("stats") or []:
        for k, v in (r.get("durations") or {}).items():
            if isinstance(v, (int, float)):
                stages[k] = stages.get(k, 0.0) + v
    total = (cyc.get("t_end") or cyc["t_cut"]) - cyc["t0"]
    cut_s = cyc["t_cut"] - cyc["t0"] if "t_cut" in cyc else 0.0
    cut = cyc.get("cut") or {}
    return _rounded(
        {
            "workload": workload,
            "epoch": cyc.get("epoch") or cyc.get("through"),
            "first_epoch": cyc.get("first"),
            "total_s": total,
            "cut_s": cut_s,
            "barrier_on_s": cut.get("barrier_on_s"),
            "held_s": cut.get("held_s"),
            "publish_s": (cyc.get("publish") or {}).get("resolve_s"),
            "records": sum((cyc.get("publish") or {}).get("records", {}).values()),
            "stages_s": {k: round(v, 3) for k, v in stages.items()},
            "other_s": total - cut_s - sum(stages.values()),
        }
    )


def _live_stage_rows(workload: str, t_end: float, passes: list[dict], final_cut: dict) -> list[dict]:
    """The stage rows of a workload measured with epochsync's schedule live: one per window pass
    (``pass`` k of ``passes``); the last, ``final``, is the pass that committed the on-demand cut's
    epoch, timed from the workload's end: ``cut_queued_s`` (a scheduled cut running at the end, waited
    for), ``cut_s`` (to the cut's publish, that wait included), ``window_queued_s`` (from the publish
    to the final window's start: the window running then, waited for) and its stages."""
    rows = []
    for k, p in enumerate(passes, 1):
        final = k == len(passes)
        if final:
            p = {
                **p,
                "t0": t_end,
                "t_cut": final_cut["t_cut"],
                "cut": final_cut["cut"],
                "publish": final_cut["publish"],
            }
        row = _stage_row(workload, p) | {"pass": k, "passes": len(passes), "final": final}
        if final:
            row["cut_queued_s"] = round(max(0.0, final_cut["t0"] - final_cut["called_at"]), 3)
            row["window_queued_s"] = round(max(0.0, passes[-1]["t0"] - final_cut["t_cut"]), 3)
            row["other_s"] = round(row["other_s"] - row["window_queued_s"], 3)
        rows.append(row)
    return rows


def _earlier_results(d: Path, name: str) -> dict | None:
    """The rows of an earlier run's results files (``--merge``), or None when there are none."""
    try:
        return {
            "rows": json.loads((d / f"{name}.json").read_text()),
            "source": json.loads((d / f"{name}.source.json").read_text()),
            "lag": json.loads((d / f"{name}.lag.json").read_text()),
            "stages": json.loads((d / f"{name}.stages.json").read_text()),
            "meta": json.loads((d / f"{name}.meta.json").read_text()),
        }
    except (OSError, ValueError):
        return None


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _tarball() -> str:
    from epochsync_dev.demo_gluster import tarball

    return tarball()


# --------------------------------------------------------------------------- main


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m epochsync_dev.bench gluster", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--size",
        choices=list(SIZES),
        default="full",
        help="full (the issue's sizes, default) or quick (a check of the harness)",
    )
    p.add_argument(
        "--topology",
        choices=(TOPOLOGY, "replica3-3servers"),
        default=TOPOLOGY,
        help="single-host (default): every brick on this host; replica3-3servers: a replica 3 volume over a pool "
        "of three servers on this machine, geo-replication to a fourth (epochsync_dev.bench.gluster_pool_tools; "
        "its own parts, sizes and results name)",
    )
    p.add_argument(
        "--parts",
        default=None,
        help=f"which parts, in this order: {', '.join(PARTS)} (issue33: the five workloads; steady: the steady writer; "
        f"airflow: live 10 s epochs under airflow standalone; cuts: cuts with and without the barrier; "
        f"default {','.join(DEFAULT_PARTS)})",
    )
    p.add_argument(
        "--rollover",
        type=int,
        default=5,
        help="changelog.rollover-time of the master (s); epochsync's steady epochs as long",
    )
    p.add_argument(
        "--cuts",
        type=int,
        default=8,
        help="cuts measured with the writer and renamer probes, as many with the barrier as without",
    )
    p.add_argument(
        "--live-epochs",
        type=int,
        default=4,
        help="10 s epochs run by the Airflow scheduler (4: each DAG run took 15-27 s here, so every further epoch "
        "adds about 20 s to the bench; 6 until session 5)",
    )
    p.add_argument(
        "--airflow-lead",
        type=float,
        default=75,
        help="seconds from Airflow's start (during the set-up) to its first epoch's start: the set-up's rest must "
        "fit (Airflow took 53-60 s to start, the set-up's rest about 55 s; a late start is reported as late_s)",
    )
    p.add_argument("--active-timeout", type=float, default=180, help="seconds for geo-replication to reach Active")
    p.add_argument(
        "--kill-at",
        type=float,
        default=40,
        help="replica3-3servers' server-kill: seconds into the writer when the server is killed",
    )
    p.add_argument(
        "--down",
        type=float,
        default=40,
        help="replica3-3servers' server-kill: seconds from the kill until the server is started again",
    )
    p.add_argument(
        "--converge-timeout",
        type=float,
        default=300,
        help="seconds a replica may take to converge (the slowest seen: geo-replication's untar, 122 s at load 11); "
        "a row past it says it did not converge",
    )
    p.add_argument(
        "--epochsync",
        choices=("live", "at-end"),
        default="live",
        help="live (default): epochsync's schedule runs during each workload (a cut every --rollover s, windows "
        "back to back), then an on-demand cut at its end; at-end: the old way, one cut and one epoch after the end",
    )
    p.add_argument(
        "--workdir", default=None, help="default bench/scratch/gluster (the pool's: bench/scratch/gluster-pool)"
    )
    p.add_argument("--results-name", default=None, help="default gluster (the pool's: gluster-pool)")
    p.add_argument("--no-write", action="store_true", help="print the rows, do not write bench/results/")
    p.add_argument(
        "--merge",
        action="store_true",
        help="keep the rows of the results files' other workloads and parts (a rerun of some --parts)",
    )
    args = p.parse_args(argv)
    if args.topology != TOPOLOGY:
        from epochsync_dev.bench.gluster_pool_tools import pool_defaults

        pool_defaults(args)
    args.parts = args.parts or ",".join(DEFAULT_PARTS)
    args.workdir = args.workdir or "bench/scratch/gluster"
    args.results_name = args.results_name or "gluster"
    return args


def main(argv: list[str] | None = None) -> int:
    from epochsync.core.shutdown import Interrupted, signals_raise
    from epochsync_dev.gluster import GlusterUnavailable

    args = parse_args(argv)
    # a run that seems stuck: kill -USR1 <pid> prints where each of its threads is
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    kind: type[Bench] = Bench
    if args.topology != TOPOLOGY:
        from epochsync_dev.bench.gluster_pool_tools import PoolBench

        kind = PoolBench
    parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    unknown = [x for x in parts if x not in kind.parts_all]
    if unknown:
        say(f"--parts: no part named {', '.join(unknown)} (parts: {', '.join(kind.parts_all)})")
        return 2
    bench = kind(args)
    bench.load_before = [round(x, 2) for x in os.getloadavg()]
    shutil.rmtree(bench.work, ignore_errors=True)
    bench.work.mkdir(parents=True)
    t0 = time.monotonic()
    complete = False
    code = 1
    try:
        with signals_raise(), contextlib.ExitStack() as stack:
            try:
                steps = [("set-up", lambda: bench.setup(stack))]
                steps += [(p, getattr(bench, f"run_{p.replace('-', '_')}")) for p in bench.parts_all if p in parts]
                for name, fn in steps:
                    t_part, load0 = time.monotonic(), load()
                    fn()
                    bench.phase(name, t_part, load0)
                complete = True
                code = 0
            finally:
                bench.join_background()
                say("stopping: geo-replication session, sshd, Spark, volumes ...")
    except GlusterUnavailable as exc:
        say(f"cannot run here: {exc}")
        return 1
    except KeyboardInterrupt as exc:
        sig = Interrupted.of(exc)
        say(f"stopped by {sig.name}; everything started was stopped")
        code = sig.exit_code
    except (RuntimeError, TimeoutError, subprocess.CalledProcessError) as exc:
        say(f"FAILED: {exc}")
    seconds = time.monotonic() - t0
    if bench.rows or bench.source_rows:
        bench.write(seconds, complete)
    say(f"{'done' if complete else 'INCOMPLETE'} in {seconds / 60:.1f} min (load {load()})")
    unequal = sorted({(r["tool"], r["workload"]) for r in bench.rows if r.get("replica_equals_source") is False})
    for tool, workload in unequal:
        say(f"{workload}: {tool}'s replica did not end equal to the source (its row says so)")
    # a peer that did not converge is a result the rows report; epochsync not converging is a failure
    if complete and any(tool == "epochsync" for tool, _ in unequal):
        say("FAILED: epochsync's replica did not end equal to the source")
        return 1
    return code


if __name__ == "__main__":
    sys.exit(driver_main(sys.argv[1:]))
