"""A pool of N GlusterFS servers on this one machine: for tests, ``make gluster NODES=3`` and ``make demo SOURCE=gluster NODES=3``.

Each server is a network namespace of its own (a veth into a private bridge, no route off the
machine) plus a persistent mount namespace in which ``/var/lib/glusterd``, ``/run``,
``/var/log/glusterfs``, ``/var/lib/misc`` and ``/tmp`` are that server's own folders, so every path
Gluster hard-codes (``/var/run/glusterd.socket``, brick PID files, ``glfsheal``) is private to it
and a glusterd of this machine is never touched. Each server has a btrfs loop image mounted on
the host, a subvolume per brick (a cut snapshots it), and its own glusterd; the servers are
probed into one trusted pool, and volumes (``replica N``, ``N x M`` distributed-replicate,
arbiter) are mounted with FUSE on the host through the bridge. ``../shared/gluster-multinode.sh``
is the recipe this follows.

Everything is named after the pool's id (namespaces ``es<id>n<i>``, bridge ``esb<id>``, a /24 of
10.78-99.x no interface here uses) and registered (:data:`epochsync_dev.gluster.REGISTRY`) as soon as
it exists: :meth:`GlusterPool.stop` and, for a pool whose owner died, the next stack or pool that
starts remove exactly that: the processes inside the pool's own namespaces, its mounts, loop
devices, bridge and folder.

Fault helpers (:meth:`kill_brick`, :meth:`stop_node`, :meth:`isolate`, ...) act on one server by
the PIDs inside its namespace.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from epochsync_dev.gluster import (
    REGISTRY,
    GlusterUnavailable,
    VolumeConfig,
    _alive,
    _read_pid,
    _umount,
    btrfs_image,
    check_machine,
    cleanup_stale,
    register,
    run,
)

#: where pools live by default: not under a folder a server's mount namespace replaces (``/tmp``,
#: ``/run``), which would hide the bricks from the server's own glusterd
BASE = Path(os.environ.get("EPOCHSYNC_POOL_BASE", "/var/tmp"))
#: folders each server gets its own copy of (inside its mount namespace)
PRIVATE = {
    "lib": "/var/lib/glusterd",
    "log": "/var/log/glusterfs",
    "run": "/run",
    "misc": "/var/lib/misc",
    "tmp": "/tmp",
}
#: volume layouts :meth:`GlusterPool.create_volume` makes
TYPES = ("replica", "dist-replica", "arbiter", "distribute")


@dataclass
class PoolVolume(VolumeConfig):
    """A volume of the pool: name, layout, bricks (``address:/path``; the path is the brick's
    folder on this host too), its FUSE mount here and the options set."""

    name: str
    type: str
    replica: int
    arbiter: bool
    bricks: list[str]
    mount: str
    work_dir: str
    gluster_command: list[str]
    host: str = ""  # the server a client mounts it from
    options: dict[str, str] = field(default_factory=dict)

    def source_keys(self) -> dict:
        """The source's keys: the volume, read from the pool through ``gluster_command``, the bricks'
        file systems mounted here."""
        return {"volume": self.name, "gluster_command": list(self.gluster_command), "cut": {"bricks_here": True}}


def _free_subnet() -> ipaddress.IPv4Network:
    """A 10.78-99.x.0/24 that no interface or route of this machine uses."""
    used = run(["ip", "-4", "-o", "addr", "show"], check=False).stdout + run(["ip", "-4", "route"], check=False).stdout
    taken = {ipaddress.ip_network(m, strict=False) for m in re.findall(r"(\d+\.\d+\.\d+\.\d+(?:/\d+)?)", used)}
    for second in range(78, 100):
        for third in range(0, 256):
            net = ipaddress.ip_network(f"10.{second}.{third}.0/24")
            if not any(net.overlaps(t) for t in taken) and not _subnet_claimed(net):
                return net
    raise GlusterUnavailable("no free 10.78-99.x.0/24 subnet for the pool's bridge")


def _subnet_claimed(net: ipaddress.IPv4Network) -> bool:
    """Does a registered pool (maybe still coming up) use ``net``?"""
    if not REGISTRY.is_dir():
        return False
    for entry in REGISTRY.glob("pool-*.json"):
        with contextlib.suppress(OSError, ValueError):
            if json.loads(entry.read_text()).get("subnet") == str(net):
                return True
    return False


class GlusterPool:
    """N GlusterFS servers in namespaces of their own, one trusted pool (see the module docstring)."""

    def __init__(
        self,
        work_dir: str | os.PathLike | None = None,
        *,
        nodes: int = 3,
        image_size: str = "2G",
        rollover: int = 1,
    ):
        if nodes < 1 or nodes > 9:
            raise ValueError(f"a pool has 1 to 9 servers, not {nodes}")
        self.id = secrets.token_hex(3)
        self._own_dir = work_dir is None
        self.work_dir = Path(work_dir) if work_dir else BASE / f"epochsync-pool-{self.id}"
        for private in PRIVATE.values():
            if self.work_dir.resolve().is_relative_to(private):
                raise ValueError(
                    f"a pool cannot live under {private} (each server has its own {private}): {self.work_dir}"
                )
        self.nodes = nodes
        self.image_size = image_size
        self.rollover = rollover
        self.bridge = f"esb{self.id}"
        self.subnet: ipaddress.IPv4Network | None = None
        self.netns = [f"es{self.id}n{i}" for i in range(1, nodes + 1)]
        self.nsdir = self.work_dir / "ns"
        self.volumes: dict[str, PoolVolume] = {}
        self._loops: list[str] = []
        self._mounts: list[str] = []  # host mounts: FUSE clients first, then the node file systems
        self._links: list[str] = []
        self._nsmounts: list[str] = []
        self._glusterd: dict[int, int | None] = {}

    # ------------------------------------------------------------------ naming
    def address(self, node: int) -> str:
        """The address of server ``node`` (1-based) on the pool's bridge."""
        assert self.subnet is not None
        return str(self.subnet.network_address + 10 + node)

    @property
    def host_address(self) -> str:
        assert self.subnet is not None
        return str(self.subnet.network_address + 1)

    def node_dir(self, node: int) -> Path:
        return self.work_dir / f"n{node}"

    def nsenter(self, node: int) -> list[str]:
        """The command prefix that runs a program on server ``node`` (its network and mount namespaces)."""
        return ["nsenter", f"--net=/run/netns/{self.netns[node - 1]}", f"--mount={self.nsdir}/n{node}"]

    def sh(self, node: int, *cmd: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        """Runs ``cmd`` on server ``node``."""
        return run([*self.nsenter(node), *cmd], timeout=timeout, check=check)

    def gluster(self, node: int, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        """``gluster --mode=script ARGS`` on server ``node``."""
        return self.sh(node, "gluster", "--mode=script", *args, timeout=timeout, check=check)

    @property
    def gluster_command(self) -> list[str]:
        """The ``gluster_command`` a source uses: a script that runs ``gluster`` on the first server
        whose glusterd answers (a cut still reaches the pool with any one server down)."""
        return [str(self.work_dir / "bin" / "gluster")]

    # ------------------------------------------------------------------ start
    def start(self, *, install: bool = True, progress=None) -> GlusterPool:
        """Brings the pool up: namespaces, bridge, a btrfs image and glusterd per server, peers probed."""
        say = progress or (lambda _l: None)
        check_machine(install=install, packages={"nsenter": "util-linux", "ip": "iproute2"})
        cleanup_stale(progress=say)
        started = time.monotonic()
        try:
            self.work_dir.mkdir(parents=True, exist_ok=True)
            self.subnet = _free_subnet()
            self._register()
            say(
                f"pool: {self.nodes} servers in namespaces {self.netns[0]}..{self.netns[-1]}, bridge {self.bridge} {self.subnet}"
            )
            self._network()
            self._filesystems()
            self._mount_namespaces()
            self._seed_lib()
            self._write_wrapper()
            for node in range(1, self.nodes + 1):
                self._start_glusterd(node)
            for node in range(2, self.nodes + 1):
                self.gluster(1, "peer", "probe", self.address(node))
            self._wait_peers()
            say(f"pool: {self.nodes} glusterd in one trusted pool ({time.monotonic() - started:.0f} s)")
            return self
        except BaseException:
            self.stop()
            raise

    def _network(self) -> None:
        run(["ip", "link", "add", self.bridge, "type", "bridge"])
        self._links.append(self.bridge)
        self._register()
        run(["ip", "addr", "add", f"{self.host_address}/{self.subnet.prefixlen}", "dev", self.bridge])
        run(["ip", "link", "set", self.bridge, "up"])
        for node, ns in enumerate(self.netns, start=1):
            run(["ip", "netns", "add", ns])
            self._register()
            host_end = f"es{self.id}h{node}"
            run(["ip", "link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", ns])
            run(["ip", "link", "set", host_end, "master", self.bridge, "up"])
            run(["ip", "-n", ns, "link", "set", "lo", "up"])
            run(["ip", "-n", ns, "addr", "add", f"{self.address(node)}/{self.subnet.prefixlen}", "dev", "eth0"])
            run(["ip", "-n", ns, "link", "set", "eth0", "up"])

    def _filesystems(self) -> None:
        for node in range(1, self.nodes + 1):
            d = self.node_dir(node)
            for sub in PRIVATE:
                (d / sub).mkdir(parents=True, exist_ok=True)
            (d / "tmp").chmod(0o1777)
            btrfs_image(d / "brick.img", self.image_size, d / "fs", self._loops, self._mounts, self._register)

    def _mount_namespaces(self) -> None:
        self.nsdir.mkdir(exist_ok=True)
        # the handles' folder is a private mount, so a namespace handle bound in it stays here
        run(["mount", "--bind", str(self.nsdir), str(self.nsdir)])
        self._nsmounts.append(str(self.nsdir))
        self._register()
        run(["mount", "--make-private", str(self.nsdir)])
        for node in range(1, self.nodes + 1):
            handle = self.nsdir / f"n{node}"
            handle.touch()
            # host mounts propagate in (slave); the server's own binds stay inside
            run(["unshare", f"--mount={handle}", "--propagation", "slave", "true"])
            self._nsmounts.insert(0, str(handle))
            self._register()
            d = self.node_dir(node)
            binds = " && ".join(f"mount --bind {d / sub} {path}" for sub, path in PRIVATE.items())
            run(["nsenter", f"--mount={handle}", "sh", "-ec", binds])

    def _seed_lib(self) -> None:
        """What the package ships in /var/lib/glusterd (groups, hooks), from the .deb in apt's cache
        or, without one, from the host's copy of those two folders; never the host's live state."""
        seed = self.work_dir / "pkg"
        debs = sorted(Path("/var/cache/apt/archives").glob("glusterfs-server_*.deb"))
        if debs:
            run(["dpkg-deb", "-x", str(debs[-1]), str(seed)])
            src = seed / "var/lib/glusterd"
        else:
            src = Path("/var/lib/glusterd")
        for node in range(1, self.nodes + 1):
            for sub in ("groups", "hooks"):
                if (src / sub).is_dir():
                    shutil.copytree(src / sub, self.node_dir(node) / "lib" / sub, dirs_exist_ok=True, symlinks=True)

    def _write_wrapper(self) -> None:
        bindir = self.work_dir / "bin"
        bindir.mkdir(exist_ok=True)
        tries = "\n".join(
            f'out=$({" ".join(self.nsenter(n))} gluster "$@" 2>&1); rc=$?\n'
            f'case "$out" in *"Connection failed"*|*"No such file or directory"*) ;; '
            f'*) printf "%s\\n" "$out"; exit $rc ;; esac'
            for n in range(1, self.nodes + 1)
        )
        script = bindir / "gluster"
        script.write_text(
            f"#!/bin/bash\n# gluster on the first server of pool {self.id} whose glusterd answers\n{tries}\nprintf '%s\\n' \"$out\" >&2\nexit 1\n"
        )
        script.chmod(0o755)

    def _start_glusterd(self, node: int) -> None:
        pid_file = self.node_dir(node) / "glusterd.pid"
        pid_file.unlink(missing_ok=True)
        self.sh(node, "glusterd", f"--pid-file={pid_file}")
        self._glusterd[node] = _read_pid(pid_file)
        self._register()
        deadline = time.monotonic() + 60
        while self.gluster(node, "pool", "list", check=False, timeout=20).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"glusterd of server {node} did not answer within 60 s")
            time.sleep(0.2)

    def _wait_peers(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while True:
            ok = all(
                self.gluster(n, "pool", "list", check=False, timeout=20).stdout.count("Connected") == self.nodes
                for n in self.up_nodes()
            )
            if ok:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the pool's peers were not all connected within {timeout:g} s")
            time.sleep(0.5)

    def up_nodes(self) -> list[int]:
        """Servers whose glusterd runs."""
        return [n for n, pid in self._glusterd.items() if pid and _alive(pid)]

    # ------------------------------------------------------------------ volumes
    def create_volume(
        self,
        name: str | None = None,
        *,
        type: str = "replica",
        replica: int | None = None,
        sets: int = 1,
        options: dict[str, str] | None = None,
        servers: list[int] | None = None,
        progress=None,
    ) -> PoolVolume:
        """Creates, starts and FUSE-mounts a volume with a brick per server per set: ``replica``
        (one set over every server), ``dist-replica`` (``sets`` sets), ``arbiter`` (``sets`` sets of
        replica 3 arbiter 1), ``distribute`` (one brick per server). Changelog on, rollover as the pool's.
        ``servers`` (1-based): the servers that hold its bricks, in that order (default: every one),
        e.g. a geo-replication secondary on a server of its own."""
        say = progress or (lambda _l: None)
        if type not in TYPES:
            raise ValueError(f"volume type {type!r}: one of {', '.join(TYPES)}")
        name = name or f"es-{self.id}-{len(self.volumes) + 1}"
        on = list(servers or range(1, self.nodes + 1))
        if not on or any(not 1 <= s <= self.nodes for s in on):
            raise ValueError(f"servers {servers}: each one of 1..{self.nodes}")
        n = len(on)
        if type == "replica":
            sets = 1
        if type == "distribute":
            replica, sets = 1, 1
        replica = replica or (3 if type == "arbiter" else n)
        if type == "arbiter" and replica != 3:
            raise ValueError("an arbiter volume here is replica 3 arbiter 1")
        # set k's bricks go on consecutive servers, so every server holds some of every set's copies
        specs = []
        slots = (
            [(k, j) for k in range(sets) for j in range(replica)]
            if type != "distribute"
            else [(j, 0) for j in range(n)]
        )
        for idx, (k, j) in enumerate(slots):
            node = on[idx % n]
            sub = self.node_dir(node) / "fs" / f"{name}-{k}-{j}"
            run(["btrfs", "subvolume", "create", str(sub)])
            (sub / "brick").mkdir()
            specs.append(f"{self.address(node)}:{sub / 'brick'}")
        layout = []
        if type in ("replica", "dist-replica"):
            layout = ["replica", str(replica)]
        elif type == "arbiter":
            layout = ["replica", "3", "arbiter", "1"]
        self.gluster(1, "volume", "create", name, *layout, "transport", "tcp", *specs, "force")
        vol = PoolVolume(
            name=name,
            type=type,
            replica=replica if type != "distribute" else 1,
            arbiter=type == "arbiter",
            bricks=specs,
            mount=str(self.work_dir / "mnt" / name),
            work_dir=str(self.work_dir),
            gluster_command=self.gluster_command,
            host=self.address(1),
        )
        self.volumes[name] = vol
        self._register()
        opts = {"changelog.changelog": "on", "changelog.rollover-time": str(self.rollover), **(options or {})}
        for k, v in opts.items():
            self.gluster(1, "volume", "set", name, k, v)
        vol.options = opts
        self.gluster(1, "volume", "start", name)
        self.wait_bricks(name)
        Path(vol.mount).mkdir(parents=True, exist_ok=True)
        self._fuse(vol)
        say(f"pool: volume {name} ({type}, {len(specs)} bricks over {n} servers) mounted at {vol.mount}")
        return vol

    def _fuse(self, vol: PoolVolume) -> None:
        log = self.work_dir / f"client-{vol.name}.log"
        # the volfile from any server: a client whose one volfile server is down cannot remount
        backups = ":".join(self.address(n) for n in range(2, self.nodes + 1))
        opts = f"log-file={log}" + (f",backup-volfile-servers={backups}" if backups else "")
        deadline = time.monotonic() + 60
        while True:
            up = sorted(self.up_nodes()) or [1]
            done = run(
                ["mount", "-t", "glusterfs", "-o", opts, f"{self.address(up[0])}:/{vol.name}", vol.mount],
                check=False,
            )
            if done.returncode == 0 and os.path.ismount(vol.mount):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"cannot mount {vol.name}: {(done.stderr or done.stdout).strip()}")
            time.sleep(1)
        if vol.mount not in self._mounts:
            self._mounts.insert(0, vol.mount)
        self._register()

    def mount_alive(self, volume: str) -> bool:
        """Is ``volume``'s FUSE mount answering? When its client died ("Transport endpoint is not
        connected", seen once in a CI run after a server stopped during a cut and a brick killed),
        it is unmounted and mounted again, and False is returned (the caller may say so)."""
        vol = self.volumes[volume]
        try:
            os.listdir(vol.mount)
            return True
        except OSError as exc:
            if exc.errno != errno.ENOTCONN:
                raise
        run(["umount", "-l", vol.mount], check=False)
        self._fuse(vol)
        return False

    def status(self, volume: str, node: int | None = None) -> dict[str, bool]:
        """``{brick spec: online}`` as the pool (server ``node``, default any that is up) sees it."""
        node = node or self.up_nodes()[0]
        out = self.gluster(node, "volume", "status", volume, "--xml", check=False, timeout=60).stdout
        online = {}
        for m in re.finditer(r"<node>(.*?)</node>", out, re.S):
            block = m.group(1)
            host = re.search(r"<hostname>(.*?)</hostname>", block)
            path = re.search(r"<path>(.*?)</path>", block)
            st = re.search(r"<status>(\d)</status>", block)
            if host and path and st and path.group(1).startswith("/"):
                online[f"{host.group(1)}:{path.group(1)}"] = st.group(1) == "1"
        return online

    def wait_bricks(self, volume: str, timeout: float = 60) -> None:
        """Waits until every brick of ``volume`` on an up server is online."""
        deadline = time.monotonic() + timeout
        want = {b for b in self.volumes[volume].bricks if self._node_of(b) in self.up_nodes()}
        while True:
            online = self.status(volume)
            if want and all(online.get(b) for b in want):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"bricks of {volume} not online within {timeout:g} s: {online}")
            time.sleep(0.5)

    def _node_of(self, spec: str) -> int:
        addr = spec.split(":", 1)[0]
        return next(n for n in range(1, self.nodes + 1) if self.address(n) == addr)

    # ------------------------------------------------------------------ faults
    def brick_pids(self, volume: str, node: int) -> dict[str, int]:
        """``{brick spec: PID}`` of ``volume``'s brick processes on server ``node``."""
        out = {}
        vols = self.node_dir(node) / "run" / "gluster" / "vols" / volume
        for spec in self.volumes[volume].bricks:
            if self._node_of(spec) != node:
                continue
            addr, path = spec.split(":", 1)
            pid = _read_pid_now(vols / f"{addr}{path.replace('/', '-')}.pid")
            if pid and _alive(pid) and _in_netns(pid, self.netns[node - 1]):
                out[spec] = pid
        return out

    def kill_brick(self, volume: str, node: int, spec: str | None = None) -> list[str]:
        """``kill -9`` of ``volume``'s brick processes on server ``node`` (or of brick ``spec``); returns the bricks killed."""
        killed = {s: pid for s, pid in self.brick_pids(volume, node).items() if spec is None or s == spec}
        for pid in killed.values():
            os.kill(pid, signal.SIGKILL)
        for pid in killed.values():
            _wait_gone(pid)
        return list(killed)

    def start_volume_force(self, volume: str) -> None:
        """``gluster volume start VOLUME force``: restarts its dead bricks."""
        self.gluster(self.up_nodes()[0], "volume", "start", volume, "force")
        self.wait_bricks(volume)

    def stop_node(self, node: int) -> None:
        """``kill -9`` of everything running on server ``node``: glusterd, bricks, self-heal daemon."""
        for pid in _netns_pids(self.netns[node - 1]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in _netns_pids(self.netns[node - 1]):
            _wait_gone(pid)
        self._glusterd[node] = None
        self._register()

    def start_node(self, node: int) -> None:
        """Starts server ``node``'s glusterd again (it restarts its bricks) and waits for its peers and bricks."""
        self._start_glusterd(node)
        self._wait_peers()
        for name in self.volumes:
            self.wait_bricks(name, timeout=90)

    def isolate(self, node: int) -> None:
        """A network partition: server ``node``'s link goes down (its processes keep running)."""
        run(["ip", "-n", self.netns[node - 1], "link", "set", "eth0", "down"])

    def rejoin(self, node: int) -> None:
        """Server ``node``'s link comes back up; waits until its peers and bricks are seen again."""
        run(["ip", "-n", self.netns[node - 1], "link", "set", "eth0", "up"])
        self._wait_peers()
        for name in self.volumes:
            self.wait_bricks(name, timeout=90)

    def heal_pending(self, volume: str) -> int | None:
        """Entries still to heal, summed over the bricks (``gluster volume heal VOLUME info``), or None when it cannot say."""
        node = self.up_nodes()[0]
        out = self.gluster(node, "volume", "heal", volume, "info", check=False, timeout=60).stdout
        counts = re.findall(r"Number of entries:\s*(\S+)", out)
        if not counts or any(not c.isdigit() for c in counts):
            return None
        return sum(int(c) for c in counts)

    def wait_healed(self, volume: str, timeout: float = 180) -> float:
        """Waits until nothing is left to heal; returns the seconds it took."""
        started = time.monotonic()
        while True:
            if self.heal_pending(volume) == 0:
                return time.monotonic() - started
            if time.monotonic() - started > timeout:
                raise RuntimeError(f"{volume} not healed within {timeout:g} s")
            time.sleep(1)

    # ------------------------------------------------------------------ stop
    def stop(self) -> None:
        """Removes everything the pool made (idempotent; also after a failed start)."""
        pool_teardown(
            {
                "mounts": list(self._mounts),
                "loops": list(self._loops),
                "work_dir": str(self.work_dir),
                "own_dir": self._own_dir,
                **self._doc(),
            }
        )
        self._mounts, self._loops, self._links, self._nsmounts, self.volumes = [], [], [], [], {}
        self._glusterd = {}
        with contextlib.suppress(FileNotFoundError):
            (REGISTRY / f"pool-{self.id}.json").unlink()

    def __enter__(self) -> GlusterPool:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _doc(self) -> dict:
        return {
            "kind": "pool",
            "netns": list(self.netns),
            "bridge_links": list(self._links),
            "subnet": str(self.subnet) if self.subnet else None,
            "nsmounts": list(self._nsmounts),
        }

    def _register(self) -> None:
        register(
            f"pool-{self.id}",
            volume=None,
            mounts=self._mounts,
            loops=self._loops,
            work_dir=self.work_dir,
            own_dir=self._own_dir,
            started_glusterd=None,
            extra=self._doc(),
        )


class PoolAgents:
    """An ``epochsync agent serve`` on every server of ``pool``, each in its server's namespaces,
    serving that server's bricks of every volume, signed with one secret; stopped by the PIDs this
    started (the pool's teardown ends whatever runs in its namespaces too). ``folder`` is not under
    /tmp, which each server has its own of."""

    PORT = 7411

    def __init__(self, pool: GlusterPool, folder: str | os.PathLike):
        import sys

        import yaml

        self.pool = pool
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.python = sys.executable
        self.secret = secrets.token_hex(16)
        secret = self.folder / "secret"
        secret.write_text(self.secret)
        secret.chmod(0o600)
        #: what a source's ``agents`` key takes: the host its bricks name -> the agent's URL
        self.urls = {pool.address(n): f"http://{pool.address(n)}:{self.PORT}" for n in range(1, pool.nodes + 1)}
        self.procs: dict[int, subprocess.Popen] = {}
        for n in range(1, pool.nodes + 1):
            mine = [
                b.split(":", 1)[1]
                for v in pool.volumes.values()
                for b in v.bricks
                if b.startswith(pool.address(n) + ":")
            ]
            doc = {
                "listen": f"{pool.address(n)}:{self.PORT}",
                "secret_file": str(secret),
                "bricks": mine,
                "log": str(self.log(n)),
            }
            (self.folder / f"agent{n}.yaml").write_text(yaml.safe_dump(doc))
            self.start(n)

    def conn_json(self) -> str:
        """An ``AIRFLOW_CONN_<ID>`` value whose password is the agents' secret (plain HTTP)."""
        return json.dumps({"conn_type": "generic", "password": self.secret})

    def log(self, n: int) -> Path:
        """Server ``n``'s agent's log: one line per request."""
        return self.folder / f"agent{n}.log"

    def start(self, n: int) -> None:
        """Starts server ``n``'s agent and waits until it answers (60 s at most)."""
        from epochsync.agent.client import AgentClient

        cmd = [*self.pool.nsenter(n), self.python, "-m", "epochsync.cli", "agent", "serve", "--config"]
        cmd.append(str(self.folder / f"agent{n}.yaml"))
        with open(self.folder / f"agent{n}.err", "ab") as err:
            self.procs[n] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        client = AgentClient(self.urls[self.pool.address(n)], self.secret, timeout=5)
        deadline = time.monotonic() + 60
        while True:
            try:
                client.info()
                return
            except Exception:
                if time.monotonic() > deadline or self.procs[n].poll() is not None:
                    tail = (self.folder / f"agent{n}.err").read_text()[-2000:]
                    raise RuntimeError(f"agent {n} did not start: {tail}") from None
                time.sleep(0.3)

    def kill(self, n: int) -> None:
        """kill -9 of server ``n``'s agent alone."""
        self.procs[n].kill()
        self.procs[n].wait(timeout=30)

    def served_bytes(self) -> int:
        """The bytes every agent has answered so far (what crossed from the servers), from their logs."""
        total = 0
        for n in self.procs:
            if self.log(n).exists():
                total += sum(int(m.group(1)) for m in re.finditer(r" -> \d+ (\d+)B ", self.log(n).read_text()))
        return total

    def stop(self) -> None:
        """Stops every agent this started (SIGTERM, then SIGKILL after 20 s)."""
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()


def _mounted(path: str) -> bool:
    """Is ``path`` a mount point of this mount namespace (by /proc/self/mountinfo)?"""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return False
    return any(line.split()[4] == path for line in lines if len(line.split()) > 4)


def _read_pid_now(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _netns_pids(ns: str) -> list[int]:
    """PIDs of the processes inside network namespace ``ns`` (the pool's own)."""
    if not os.path.exists(f"/run/netns/{ns}"):
        return []
    out = run(["ip", "netns", "pids", ns], check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def _in_netns(pid: int, ns: str) -> bool:
    try:
        return os.stat(f"/run/netns/{ns}").st_ino == os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return False


def _wait_gone(pid: int, timeout: float = 20) -> None:
    """Waits until ``pid`` is reaped, not only dead: glusterd takes a brick whose PID file names a
    zombie for running, and would not restart it."""
    deadline = time.monotonic() + timeout
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)


def pool_teardown(doc: dict) -> None:
    """Removes a pool a registry entry names: FUSE mounts, the processes in its namespaces (by PID),
    the namespaces, its server file systems and loop devices, the bridge and the folder."""
    mounts = list(doc.get("mounts") or [])
    fuse = [m for m in mounts if "/mnt/" in m]
    for m in fuse:
        _umount(m)
    netns = list(doc.get("netns") or [])
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = [p for ns in netns for p in _netns_pids(ns)]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 5
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
    for m in doc.get("nsmounts") or []:
        # a bind of a folder onto itself is on its parent's device, where os.path.ismount cannot see it
        if _mounted(m) and run(["umount", m], check=False, timeout=60).returncode != 0:
            run(["umount", "-l", m], check=False, timeout=60)
    for ns in netns:
        if os.path.exists(f"/run/netns/{ns}"):
            run(["ip", "netns", "del", ns], check=False)
    for m in mounts:
        if m not in fuse:
            _umount(m)
    for dev in doc.get("loops") or []:
        run(["losetup", "-d", dev], check=False)
    for link in doc.get("bridge_links") or []:
        run(["ip", "link", "del", link], check=False)
    if doc.get("own_dir") and doc.get("work_dir"):
        shutil.rmtree(doc["work_dir"], ignore_errors=True)


# --------------------------------------------------------------------------- make gluster NODES=3


def main(argv: list[str] | None = None) -> int:
    """``make gluster NODES=3 TYPE=replica``: a pool for a person; prints what to use, stops on Ctrl-C or SIGTERM."""
    import argparse

    import yaml

    parser = argparse.ArgumentParser(prog="python -m epochsync_dev.pool", description=main.__doc__)
    parser.add_argument("--dir", default="var/pool", help="where the config and warehouse live")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--type", default="replica", choices=TYPES)
    parser.add_argument("--sets", type=int, default=2, help="replica sets of a dist-replica or arbiter volume")
    parser.add_argument("--rollover", type=int, default=1, help="changelog.rollover-time (seconds)")
    args = parser.parse_args(argv)
    base = Path(args.dir).resolve()
    base.mkdir(parents=True, exist_ok=True)
    pool = GlusterPool(nodes=args.nodes, rollover=args.rollover)

    def stop_on(signum, _frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop_on)
    say = lambda line: print(line, flush=True)  # noqa: E731
    try:
        try:
            pool.start(progress=say)
            vol = pool.create_volume(type=args.type, sets=args.sets, progress=say)
        except GlusterUnavailable as exc:
            print(f"pool: cannot run here: {exc}", flush=True)
            return 1
        cfg = vol.config(
            str(base / "warehouse"),
            [{"name": "local", "source": "vol", "kind": "posix", "path": str(base / "replica")}],
        )
        cfg_path = base / "epochsync.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        servers = "\n".join(
            f"           server {n}: {pool.address(n)}   {' '.join(pool.nsenter(n))} gluster volume status"
            for n in range(1, pool.nodes + 1)
        )
        print(
            f"""
pool: volume {vol.name} ({vol.type}, {len(vol.bricks)} bricks) is mounted at {vol.mount}
  servers:
{servers}
  config:  {cfg_path}  (source 'vol', a posix target 'local' in {base / "replica"})
  try:     echo hello > {vol.mount}/hello.txt
           .venv/bin/epochsync cut --config {cfg_path} --source vol
           .venv/bin/epochsync replicate --config {cfg_path} --target local --through 1
           .venv/bin/epochsync status --config {cfg_path}
  stop:    Ctrl-C here (or kill {os.getpid()}): unmounts, stops the servers, removes the pool""",
            flush=True,
        )
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("\npool: stopping: unmount, stop the servers, remove the namespaces and images", flush=True)
    finally:
        # a second Ctrl-C or SIGTERM (make and the shell send theirs too) must not cut the teardown short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        pool.stop()
    print("pool: stopped; nothing left running", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
