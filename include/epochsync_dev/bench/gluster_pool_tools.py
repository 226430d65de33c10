"""``make bench-gluster-pool`` (``bench gluster --topology replica3-3servers``): epochsync beside
geo-replication on a ``replica 3`` volume over three servers, and a server killed in the middle of
the steady writer.

Set-up (everything is stopped and removed at the end, also on Ctrl-C or SIGTERM): a pool of four
Gluster servers on this machine (:class:`epochsync_dev.pool.GlusterPool`, each in its own network
and mount namespace, a btrfs brick each), the master volume ``replica 3`` on servers 1-3 and
geo-replication's secondary, a 1-brick volume, on server 4 (the secondary site: killing a master
server leaves it up, and what reaches it crosses the bridge):

- **epochsync** through an ``epochsync agent`` per server (:class:`epochsync_dev.pool.PoolAgents`:
  the cuts, the cut's reads, the pull), cutter and driver processes and the warm Spark Connect
  server as on one host (:class:`epochsync_dev.bench.gluster.EpochSchedule`), into a posix target
  on a btrfs loop image here with its committed view;
- **geo-replication**: a session from the master volume to server 4's volume
  (:class:`epochsync_dev.bench.gluster_tools.PoolGeoRep`: an sshd of ours on server 4, tarssh,
  ``change_interval 1``); one worker per master brick, one Active, two Passive.

rsync is left out: a copy from this host's FUSE mount says nothing about the servers.

Parts (``--parts``, default all, in this order): ``workloads`` (append: 64 KiB appended to each of
``append_files`` files; small-writes: 4 KiB written into 1 % of ``small_files`` files, measured as
on one host), ``steady`` (the steady writer), ``server-kill`` (the steady writer again in a folder
of its own; ``--kill-at`` seconds in, the server that holds epochsync's reader of the last cut
(``sets.set1.reader``) and geo-replication's Active worker (its ``status``) is killed -9 whole
(glusterd, bricks, self-heal daemon, gsyncd, agent); ``--down`` seconds later it is started again
and its agent with it; the writer goes on to the end).

Each row, as on one host (:mod:`epochsync_dev.bench.gluster`), plus ``topology:
replica3-3servers``, ``files_lost`` (the replica's files missing or wrong at convergence,
:func:`~epochsync_dev.bench.gluster_tools.files_lost`) and ``bytes_between_hosts``: epochsync's,
the bytes every agent answered (:meth:`PoolAgents.served_bytes`: what left the servers for this
host); geo-replication's, the bytes that entered server 4 through its link (the interface
counters of its veth: tar over ssh, ssh's framing and TCP/IP headers, and glusterd's own chatter
with its peers, which the row's ``geo_tar_bytes``, the tar streams' payload, leaves out). The
geo-replication replica is read at server 4's brick, here, so reading it moves nothing.

The server-kill rows add, per tool: ``killed_server``, ``reader_server`` and ``active_server`` (the
two it was chosen by), ``down_s``, ``current_after_kill_s`` (from the kill until every file written
before it is whole on the replica), ``current_after_back_s`` (from the moment the server's bricks
are online again until every file written before that is), the same in epochs of ``--rollover``
seconds, ``lag_max_down_s`` (the largest lag of a file written while the server was down) and, for
epochsync, the cuts and windows that failed and were retried (as Airflow retries a task).
"""

from __future__ import annotations

import os
import time

from epochsync_dev.bench.gluster import Background, Bench, Driver, committed_view, say
from epochsync_dev.bench.gluster_tools import PoolGeoRep, current_again, link_bytes

TOPOLOGY = "replica3-3servers"
PARTS = ("workloads", "steady", "server-kill")
SIZES = {
    "full": {
        "append_files": 4,
        "append_mib": 32,
        "small_files": 5_000,
        "steady_s": 90,
        "steady_rate": 3.0,
        "kill_s": 150,
    },
    "quick": {
        "append_files": 2,
        "append_mib": 8,
        "small_files": 500,
        "steady_s": 30,
        "steady_rate": 3.0,
        "kill_s": 90,
    },
}
#: the server geo-replication's secondary volume lives on
SLAVE_NODE = 4


def pool_defaults(args) -> None:
    """The pool's defaults for what the command line left unset."""
    args.parts = args.parts or ",".join(PARTS)
    args.workdir = args.workdir or "bench/scratch/gluster-pool"
    args.results_name = args.results_name or "gluster-pool"


class PoolBench(Bench):
    """The bench on a pool (the module docstring)."""

    topology = TOPOLOGY
    tools = ("epochsync", "geo-replication")
    parts_all = PARTS
    make_target = "bench-gluster-pool"

    def __init__(self, args):
        super().__init__(args)
        self.size = SIZES[args.size]

    # ------------------------------------------------------------------ set-up
    def setup(self, stack) -> None:
        from epochsync_dev.bench.gluster import check_peers
        from epochsync_dev.embedded import SparkConnectServer
        from epochsync_dev.pool import GlusterPool, PoolAgents

        a = self.args
        check_peers()
        self.pool = GlusterPool(nodes=SLAVE_NODE, image_size="3G" if a.size == "full" else "2G", rollover=a.rollover)
        stack.callback(self.pool.stop)
        self.pool.start(progress=say)
        tag = self.pool.id
        self.master = self.pool.create_volume(f"gm{tag}", type="replica", servers=[1, 2, 3], progress=say)
        self.slave = self.pool.create_volume(
            f"gs{tag}", type="distribute", servers=[SLAVE_NODE], options={"changelog.changelog": "off"}, progress=say
        )
        self.mnt = self.master.mount
        self.slave_brick = self.slave.bricks[0].split(":", 1)[1]
        self.slave_mnt = self.slave.mount
        self.agents = PoolAgents(self.pool, self.pool.work_dir / "agents")
        stack.callback(self.agents.stop)
        say(f"agents: one per server, {', '.join(self.agents.urls.values())}")
        # the agents' secret in the environment before the Spark server starts: its workers pull from the agents
        self.agents_conn = "bench_pool_agents"
        os.environ[f"AIRFLOW_CONN_{self.agents_conn.upper()}"] = self.agents.conn_json()
        self.server = SparkConnectServer(
            "local[2]", work_dir=self.work / "spark", event_log=self.work / "spark-events", warm_up=True
        )
        stack.callback(self.server.stop)
        spark = self.background("the Spark Connect server", self.server.start, cancel=self.server.stop)
        self.geo = PoolGeoRep(self.pool, self.master.name, self.slave.name, SLAVE_NODE, self.work / "geo")
        stack.callback(self.geo.stop)
        peers = self.background("geo-replication's set-up", self._setup_geo)
        say(f"Spark Connect server {spark.result()} (warming up)")
        self._setup_epochsync(stack)
        peers.result()
        first = self.driver.call("cycle")
        say(f"epochsync: epoch {first['epoch']} (the empty volume) in {first['t_end'] - first['t0']:.1f} s")

    def _setup_geo(self) -> None:
        self.geo.start(active_timeout=self.args.active_timeout, say=say)
        self.check_geo_workers()
        self.geo_cpu = self.geo.cpu()

    def _setup_epochsync(self, stack) -> None:
        import yaml

        from epochsync.spark import REMOTE_ENV
        from epochsync_dev.btrfs import BtrfsLoop

        a = self.args
        self.es_loop = BtrfsLoop(self.work / "target-btrfs", size="6G" if a.size == "full" else "3G")
        stack.callback(self.es_loop.stop)
        fs = self.es_loop.start()
        self.replica_es = str(fs / "replica-epochsync")
        self.view_es = str(fs / "replica-epochsync.epochs")
        target = {
            "name": "es",
            "source": "vol",
            "kind": "posix",
            "path": self.replica_es,
            "view": {"snapshots": "required", "path": self.view_es, "keep": 3},
        }
        doc = self.master.config(str(self.work / "warehouse"), [target], source="vol", interval=f"{a.rollover}s")
        conn = self.agents_conn
        doc["sources"][0].update(agents=self.agents.urls, agent_conn_id=conn)
        doc["sources"][0]["cut"] = {"barrier": False, "bricks_here": True}
        self.config = self.work / "epochsync.yaml"
        self.config.write_text(yaml.safe_dump(doc, sort_keys=False))
        self.env = dict(os.environ, **{REMOTE_ENV: self.server.url})
        self.server.wait_warm_up(300)
        self.driver = Driver(self.config, "vol", "es", self.env, self.work / "driver.log")
        stack.callback(self.driver.stop)
        self.cutter = Driver(self.config, "vol", "es", self.env, self.work / "cutter.log")
        stack.callback(self.cutter.stop)
        from epochsync_dev.bench.gluster_tools import CpuMeter

        self.es_cpu = CpuMeter(
            lambda procs: (
                {self.driver.proc.pid, self.cutter.proc.pid, self.server.proc.pid}
                | {p.pid for p in self.agents.procs.values() if p.poll() is None}
            )
        )

    def readers(self):
        """epochsync's committed view here; geo-replication's secondary at server 4's brick (read
        here: no traffic on the link whose bytes its rows count)."""
        return {"epochsync": lambda: committed_view(self.view_es), "geo-replication": lambda: self.slave_brick}

    def between_hosts(self) -> dict[str, int]:
        return {
            "epochsync": self.agents.served_bytes(),
            "geo-replication": link_bytes(f"es{self.pool.id}h{SLAVE_NODE}")[1],
        }

    def check_geo_workers(self, files: int = 20, timeout: float = 40, attempts: int = 4) -> None:
        """The Active worker replicates: files written on the master reach server 4's brick. A
        worker that is Active and still never gets a changelog from its brick (seen in 1 of 3
        sessions on a pool, ``../shared/gluster-multinode.md``) is restarted (its worker alone)."""
        sub = "geo-check"
        os.makedirs(os.path.join(self.mnt, sub), exist_ok=True)
        for attempt in range(1, attempts + 1):
            if not self.geo.wait_changelog_crawl(timeout):
                say(f"geo-replication: the Active worker not in Changelog Crawl after {timeout:.0f} s")
            names = [f"{sub}/a{attempt}-{i:03d}" for i in range(files)]
            for n in names:
                with open(os.path.join(self.mnt, n), "wb") as f:
                    f.write(n.encode())
            t0 = time.monotonic()
            while time.monotonic() - t0 < timeout:
                if all(os.path.isfile(os.path.join(self.slave_brick, n)) for n in names):
                    say(f"geo-replication: the Active worker replicates ({time.monotonic() - t0:.0f} s)")
                    return
                time.sleep(1)
            active = [w["brick"] for w in self.geo.workers() if w["state"] == "Active"]
            say(f"geo-replication: nothing reached the secondary in {timeout:.0f} s (attempt {attempt} of {attempts})")
            if attempt < attempts:
                self.geo.restart_workers(active, active_timeout=self.args.active_timeout, say=say)
        raise RuntimeError("geo-replication: the Active worker replicates nothing (see the servers' gsyncd.log)")

    # ------------------------------------------------------------------ the workloads
    def run_workloads(self) -> None:
        """append and small-writes, measured as on one host (``Bench.measure``)."""
        import random

        s = self.size
        t0, load0 = time.monotonic(), load_now()
        os.makedirs(os.path.join(self.mnt, "data/big"), exist_ok=True)
        chunk = os.urandom(1 << 20)
        for i in range(s["append_files"]):
            with open(os.path.join(self.mnt, f"data/big/f{i:02d}"), "wb") as f:
                for m in range(s["append_mib"]):
                    f.write(f"{i:02d}:{m:06d}".encode() + chunk[9:])
        base = os.urandom(8192)
        for d in range((s["small_files"] + 999) // 1000):
            os.makedirs(os.path.join(self.mnt, f"data/small/d{d:03d}"), exist_ok=True)
        from concurrent.futures import ThreadPoolExecutor

        def one(i):
            fd = os.open(
                os.path.join(self.mnt, f"data/small/d{(i // 1000):03d}/f{i:06d}"),
                os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                0o644,
            )
            try:
                os.write(fd, f"{i:08d}".encode() + base[8:])
            finally:
                os.close(fd)

        with ThreadPoolExecutor(8) as ex:
            list(ex.map(one, range(s["small_files"])))
        self.converge_all(["data"], probes=97)
        self.phase("set-up of append and small-writes", t0, load0)
        rnd = random.Random(51)
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

            def write(p):
                fd = os.open(os.path.join(self.mnt, p), os.O_WRONLY)
                try:
                    os.pwrite(fd, block, 4096)
                finally:
                    os.close(fd)

            with ThreadPoolExecutor(4) as ex:
                list(ex.map(write, touched))

        self.measure("small-writes", "data/small", small_writes, probes=touched)

    def write_steady(self, sub: str, k: int) -> None:
        """The writer's step, again after a remount when the FUSE client died (Gluster's client,
        seen after a server kill; the pool mounts it again)."""
        for attempt in range(3):
            try:
                return super().write_steady(sub, k)
            except OSError:
                if attempt == 2:
                    raise
                self.pool.mount_alive(self.master.name)
                time.sleep(0.5)

    def run_server_kill(self) -> None:
        self._steady("server-kill", "kill", fault=self._kill_and_back, seconds=self.size["kill_s"])

    def _kill_and_back(self, t_start: float, events: dict) -> None:
        """``--kill-at`` s into the writer: the server of epochsync's reader and geo-replication's
        Active worker killed whole; ``--down`` s later started again, its agent too."""
        from epochsync.core.config import load_config
        from epochsync.sources.gluster.reader import cut_record
        from epochsync.stages.cut import published_epoch

        a = self.args
        time.sleep(max(0.0, t_start + a.kill_at - time.time()))
        cfg = load_config(self.config)
        epoch = published_epoch(cfg, "vol")
        rec = cut_record(cfg.warehouse, "vol", epoch) or {}
        reader = rec.get("sets", {}).get("set1", {}).get("reader")
        reader_node = self.pool._node_of(self.master.bricks[int(reader[5:]) - 1]) if reader else None
        active = self.geo.active_nodes()
        both = [n for n in active if n == reader_node]
        node = both[0] if both else (reader_node or (active or [1])[0])
        events.update(
            reader_server=reader_node,
            reader_epoch=epoch,
            active_server=active,
            killed_server=node,
            same_server=bool(both),
        )
        say(
            f"server-kill: epochsync's reader (cut {epoch}) on server {reader_node}, geo-replication Active on "
            f"{active}: killing server {node} whole"
        )
        events["t_kill"] = time.time()
        self.pool.stop_node(node)
        events["killed_in_s"] = round(time.time() - events["t_kill"], 2)
        time.sleep(max(0.0, events["t_kill"] + a.down - time.time()))
        say(f"server-kill: starting server {node} again")
        events["t_start_again"] = time.time()
        self.pool.start_node(node)  # returns once its bricks are online: reachable again
        events["t_back"] = time.time()
        self.agents.start(node)
        events["t_agent"] = time.time()
        # the restarted server's worker starts Initializing: who is Active once that settles (30 s at most)
        until = time.time() + 30
        while not (active := self.geo.active_nodes()) and time.time() < until:
            time.sleep(2)
        events["active_after"] = active
        say(
            f"server-kill: server {node}'s bricks online {events['t_back'] - events['t_start_again']:.1f} s after its "
            f"start, its agent {events['t_agent'] - events['t_back']:.1f} s later; geo-replication Active on "
            f"{events['active_after']}"
        )
        # a heal's progress, for the rows: the bricks are reachable before they are healed
        healed = Background("the heal", lambda: self.pool.wait_healed(self.master.name, timeout=300))
        try:
            events["healed_after_back_s"] = round(healed.result(320), 1)
        except (RuntimeError, TimeoutError) as exc:
            events["healed_after_back_s"] = None
            say(f"server-kill: {exc}")

    def fault_figures(self, tool: str, events: dict, written: dict, seen: dict, t_start: float) -> dict:
        if "t_kill" not in events:
            return {"fault": "not injected"}
        roll = self.args.rollover
        t_kill, t_back = events["t_kill"], events.get("t_back")
        after_kill = current_again(written, seen, t_kill)
        after_back = current_again(written, seen, t_back) if t_back else None
        down = [k for k, t in written.items() if t_kill <= t <= (t_back or t_kill)]
        lags = [seen[k] - written[k] for k in down if k in seen]
        return {
            "killed_server": events["killed_server"],
            "reader_server": events["reader_server"],
            "active_server": events["active_server"],
            "same_server": events["same_server"],
            "active_after": events.get("active_after"),
            "kill_at_s": round(t_kill - t_start, 1),
            "down_s": round((t_back or t_kill) - t_kill, 1),
            "healed_after_back_s": events.get("healed_after_back_s"),
            "current_after_kill_s": after_kill,
            "current_after_kill_epochs": None if after_kill is None else round(after_kill / roll, 1),
            "current_after_back_s": after_back,
            "current_after_back_epochs": None if after_back is None else round(after_back / roll, 1),
            "lag_max_down_s": max(lags) if lags else None,
            "target_epochs": 2 if tool == "epochsync" else None,
        }


def load_now() -> float:
    return round(os.getloadavg()[0], 2)
