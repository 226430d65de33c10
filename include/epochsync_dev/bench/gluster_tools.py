"""The pieces of ``make bench-gluster`` that are not epochsync: process accounting, tree manifests,
our own sshd, a geo-replication session, rsync (see :mod:`epochsync_dev.bench.gluster`).

Everything here starts only what it stops: :class:`Sshd` runs on a free loopback port with its own
host key and config; :class:`GeoRep` creates, starts, stops and deletes one session between two
volumes of ours and restores root's ``~/.ssh`` as it found it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import signal
import socket
import stat as st
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from epochsync_dev.gluster import gluster, run

CLK = os.sysconf("SC_CLK_TCK")

# --------------------------------------------------------------------------- processes


def processes() -> dict[int, tuple[int, int, str, int]]:
    """``pid -> (ppid, CPU ticks, command line, waited-for children's ticks)``; the CPU ticks are
    utime + stime + cutime + cstime (a process's own time and that of the children it has waited
    for), the last cutime + cstime alone."""
    out: dict[int, tuple[int, int, str, int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                raw = f.read()
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        own, waited = sum(int(x) for x in fields[11:13]), sum(int(x) for x in fields[13:15])
        out[int(d)] = (int(fields[1]), own + waited, cmd, waited)
    return out


def tree(procs: dict[int, tuple[int, int, str, int]], roots: set[int]) -> set[int]:
    """``roots`` and every descendant of them in ``procs``."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _t, _c, _w) in procs.items():
        children.setdefault(ppid, []).append(pid)
    seen: set[int] = set()
    todo = [r for r in roots if r in procs]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        todo.extend(children.get(p, []))
    return seen


class CpuReading(dict):
    """``pid -> (ppid, CPU ticks, waited-for children's ticks)`` of a set of process trees at one
    moment; ``later - earlier`` is the CPU-seconds between the two readings."""

    def __sub__(self, earlier: CpuReading) -> float:  # type: ignore[override]
        ticks = 0
        for pid, (_ppid, t, _w) in self.items():
            ticks += t - earlier[pid][1] if pid in earlier else t
        for pid, (ppid, t, _w) in earlier.items():
            if pid in self:
                continue
            # gone: a parent that waited for it has its whole life in its children's ticks, so the
            # part before the window goes; one that exited unwaited-for (orphaned, or reaped by a
            # process outside the trees) took its ticks along and nothing is subtracted (a plain
            # sum of the trees' totals went negative here: the Spark server's workers)
            reaped = self[ppid][2] - earlier[ppid][2] if ppid in self and ppid in earlier else 0
            ticks -= min(t, max(0, reaped))
        return ticks / CLK


class CpuMeter:
    """CPU-seconds of a set of process trees: ``read()`` takes every tree process's own and
    waited-for children's ticks now; a window's CPU is ``later - earlier`` (:class:`CpuReading`)."""

    def __init__(self, select):
        self.select = select  # procs -> set of root pids

    def read(self) -> CpuReading:
        procs = processes()
        pids = tree(procs, set(self.select(procs)))
        return CpuReading({p: (procs[p][0], procs[p][1], procs[p][3]) for p in pids})


def cpu_of_pids(*pids: int) -> CpuMeter:
    return CpuMeter(lambda procs: {p for p in pids if p})


def cpu_of_matching(*needles: str, extra=lambda: ()) -> CpuMeter:
    """Processes whose command line holds every needle, and ``extra()`` pids, with their trees."""

    def select(procs):
        found = {p for p, (_pp, _t, cmd, _w) in procs.items() if all(n in cmd for n in needles)}
        return found | set(extra())

    return CpuMeter(select)


def run_measured(cmd: list[str], *, cwd=None, env=None, nice: int = 0) -> tuple[int, float, str, float]:
    """Runs ``cmd``; returns (exit code, wall seconds, stdout+stderr, CPU-seconds of it and its children)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=(lambda: os.nice(nice)) if nice else None,
    )
    out = proc.stdout.read() if proc.stdout else b""
    _pid, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, time.monotonic() - t0, out.decode(errors="replace"), usage.ru_utime + usage.ru_stime


# --------------------------------------------------------------------------- manifests

TAIL = 128 * 1024


def tail_sha(path: str, size: int) -> str | None:
    """sha256 of a file's last 128 KiB (the whole of a smaller file); None when it cannot be read."""
    try:
        with open(path, "rb") as f:
            if size > TAIL:
                f.seek(size - TAIL)
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def walk(root: str, sub: str, *, mtimes: bool = True) -> dict[str, tuple]:
    """The tree under ``root/sub``: ``relpath -> ('d',) | ('f', size, mode, mtime s) | ('l', target)``
    (relative to ``root``; an empty dict when ``root/sub`` is missing). Directory times are left
    out (every tool sets them its own way); file times in whole seconds (tar's precision)."""
    out: dict[str, tuple] = {}
    base = os.path.join(root, sub)
    if not os.path.isdir(base):
        return out
    stack = [base]
    while stack:
        d = stack.pop()
        try:
            entries = list(os.scandir(d))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for e in entries:
            rel = os.path.relpath(e.path, root)
            try:
                s = e.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if st.S_ISDIR(s.st_mode):
                out[rel] = ("d",)
                stack.append(e.path)
            elif st.S_ISLNK(s.st_mode):
                try:
                    out[rel] = ("l", os.readlink(e.path))
                except OSError:
                    continue
            else:
                out[rel] = ("f", s.st_size, s.st_mode & 0o7777, int(s.st_mtime) if mtimes else 0)
    return out


@dataclass
class Expect:
    """What a replica must hold under ``sub`` to equal the source: its tree and, for ``probes``,
    the sha256 of each file's last 128 KiB."""

    sub: str
    entries: dict[str, tuple]
    probes: dict[str, str | None]

    @classmethod
    def of(cls, root: str, sub: str, probe_paths) -> Expect:
        """``probe_paths``: the files whose tails are compared, or a number ``n``: every n-th file
        in path order (from the same walk: the source, a FUSE mount, is walked once)."""
        entries = walk(root, sub)
        if isinstance(probe_paths, int):
            probe_paths = sorted(p for p, v in entries.items() if v[0] == "f")[::probe_paths]
        probes = {p: tail_sha(os.path.join(root, p), entries[p][1]) for p in probe_paths if p in entries}
        return cls(sub, entries, probes)

    def lost(self, root: str, *, mtimes: bool = True) -> int:
        """How many files (anything but a directory) the tree at ``root`` lacks or has wrong
        (:func:`files_lost`): 0 when it equals the source."""
        have = walk(root, self.sub, mtimes=mtimes)
        want = self.entries if mtimes else {k: (v[:3] + (0,) if v[0] == "f" else v) for k, v in self.entries.items()}
        bad = {p for p, sha in self.probes.items() if tail_sha(os.path.join(root, p), self.entries[p][1]) != sha}
        return files_lost(want, have, bad)

    def differences(self, root: str, *, mtimes: bool = True, limit: int = 5) -> list[str]:
        """How the tree at ``root`` differs (empty: equal)."""
        have = walk(root, self.sub, mtimes=mtimes)
        want = self.entries if mtimes else {k: (v[:3] + (0,) if v[0] == "f" else v) for k, v in self.entries.items()}
        out = []
        for p in sorted(set(want) | set(have)):
            if want.get(p) != have.get(p):
                out.append(f"{p}: {have.get(p)} (source {want.get(p)})")
                if len(out) >= limit:
                    return out
        for p, sha in self.probes.items():
            if tail_sha(os.path.join(root, p), self.entries[p][1]) != sha:
                out.append(f"{p}: other bytes than the source's")
                if len(out) >= limit:
                    break
        return out


def files_lost(want: dict[str, tuple], have: dict[str, tuple], bad_bytes=()) -> int:
    """The files of a replica that are lost or wrong: every path, other than a directory on both
    sides, whose entry (:func:`walk`'s) differs between the source's tree ``want`` and the
    replica's ``have`` (missing, left over, another type, size, mode or mtime), plus the paths of
    ``bad_bytes`` (files whose bytes differ, by their probed tails). A directory missing or left
    over counts through the files in it, not itself."""
    wrong = set(bad_bytes)
    for p in set(want) | set(have):
        a, b = want.get(p), have.get(p)
        if a != b and not (a in (("d",), None) and b in (("d",), None)):
            wrong.add(p)
    return len(wrong)


def current_again(written: dict[int, float], seen: dict[int, float], at: float) -> float | None:
    """Seconds from ``at`` until the replica was current again: every file written up to ``at``
    (``written``: file -> its write time) was whole on it (``seen``: file -> the first moment it
    was); None when one never was. 0 when nothing was written before ``at``."""
    due = [k for k, t in written.items() if t <= at]
    if any(k not in seen for k in due):
        return None
    return max((max(0.0, seen[k] - at) for k in due), default=0.0)


def link_bytes(link: str) -> tuple[int, int]:
    """``(received, sent)`` bytes of network interface ``link`` of this namespace (its counters)."""
    base = Path("/sys/class/net") / link / "statistics"
    return int((base / "rx_bytes").read_text()), int((base / "tx_bytes").read_text())


# --------------------------------------------------------------------------- sshd


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Sshd:
    """An sshd of our own (root logs in with a key), for geo-replication: by default on a free
    loopback port here; on a server of a pool, ``listen`` is its address, ``prefix`` the command
    that enters its namespaces and ``run_dir`` its privilege-separation folder as seen from here."""

    def __init__(
        self,
        work: Path,
        *,
        listen: str = "127.0.0.1",
        port: int | None = None,
        prefix: list[str] | tuple[str, ...] = (),
        run_dir: str | os.PathLike = "/run/sshd",
    ):
        self.work = Path(work)
        self.listen, self.fixed_port, self.prefix, self.run_dir = listen, port, list(prefix), Path(run_dir)
        self.port = 0
        self.proc: subprocess.Popen | None = None

    def start(self) -> int:
        self.work.mkdir(parents=True, exist_ok=True)
        key = self.work / "host_ed25519"
        if not key.exists():
            run(["ssh-keygen", "-q", "-N", "", "-t", "ed25519", "-f", str(key)])
        self.port = self.fixed_port or free_port()
        sftp = next(
            (p for p in ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server") if os.path.exists(p)),
            "internal-sftp",
        )
        conf = self.work / "sshd_config"
        conf.write_text(
            "\n".join(
                [
                    f"ListenAddress {self.listen}",
                    f"Port {self.port}",
                    f"HostKey {key}",
                    f"PidFile {self.work / 'sshd.pid'}",
                    "PermitRootLogin prohibit-password",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "AuthorizedKeysFile .ssh/authorized_keys",
                    "StrictModes no",
                    "MaxStartups 200:30:400",
                    "MaxSessions 200",
                    "LogLevel ERROR",
                    f"Subsystem sftp {sftp}",
                    "",
                ]
            )
        )
        os.makedirs(self.run_dir, exist_ok=True)
        sshd = shutil.which("sshd") or "/usr/sbin/sshd"
        self.proc = subprocess.Popen(
            [*self.prefix, sshd, "-D", "-f", str(conf), "-E", str(self.work / "sshd.log")], start_new_session=True
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited with {self.proc.returncode}: {_tail(self.work / 'sshd.log')}")
            with socket.socket() as s:
                if s.connect_ex((self.listen, self.port)) == 0:
                    return self.port
            time.sleep(0.2)
        raise RuntimeError(f"sshd did not listen on {self.listen}:{self.port} within 20 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, 15)
                self.proc.wait(10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, 9)
                except ProcessLookupError:
                    pass
        self.proc = None


def _tail(path: Path, n: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-n:])
    except OSError:
        return "(no log)"


# --------------------------------------------------------------------------- geo-replication

GEO_DIR = Path("/var/lib/glusterd/geo-replication")
TOTALS = re.compile(r"Total bytes read: (\d+)")


class GeoRep:
    """A geo-replication session ``master -> host::slave`` (gsyncd, tarssh, change_interval 1) over
    our own :class:`Sshd`. The slave's tar runs with ``--totals`` into ``totals_log``: the bytes
    of every tar stream sent (:meth:`bytes_sent`)."""

    def __init__(self, master: str, slave: str, host: str, work: Path):
        self.master, self.slave, self.host = master, slave, host
        self.work = Path(work)
        self.sshd = Sshd(self.work / "sshd")
        self.totals_log = self.work / "tar-totals.log"
        self.created = False
        self.session = f"{master} {host}::{slave}"
        self._ssh_before: dict[str, bytes | None] = {}
        self._ssh_dir_existed = True
        self._gsec_existed = True

    # -- root's ~/.ssh, restored by stop()
    def _keys(self) -> None:
        home = Path("/root/.ssh")
        self._ssh_dir_existed = home.is_dir()
        home.mkdir(mode=0o700, exist_ok=True)
        for name in ("authorized_keys", "known_hosts", "id_ed25519", "id_ed25519.pub"):
            p = home / name
            self._ssh_before[name] = p.read_bytes() if p.exists() else None
        identity = next((home / n for n in ("id_ed25519", "id_rsa", "id_ecdsa") if (home / n).exists()), None)
        if identity is None:
            identity = home / "id_ed25519"
            run(["ssh-keygen", "-q", "-N", "", "-t", "ed25519", "-f", str(identity)])
        pub = Path(str(identity) + ".pub").read_text().strip()
        auth = home / "authorized_keys"
        lines = auth.read_text().splitlines() if auth.exists() else []
        if pub not in lines:
            auth.write_text("\n".join([*lines, pub]) + "\n")
        auth.chmod(0o600)

    def _restore_keys(self) -> None:
        home = Path("/root/.ssh")
        if not self._ssh_before:
            return
        if not self._ssh_dir_existed:
            shutil.rmtree(home, ignore_errors=True)
            return
        for name, data in self._ssh_before.items():
            p = home / name
            if data is None:
                p.unlink(missing_ok=True)
            else:
                p.write_bytes(data)

    def geo(self, *args: str, timeout: float = 180, check: bool = True):
        return gluster(
            "volume", "geo-replication", self.master, f"{self.host}::{self.slave}", *args, timeout=timeout, check=check
        )

    def start(self, *, active_timeout: float = 180, say=print) -> None:
        self._gsec_existed = (GEO_DIR / "common_secret.pem.pub").exists()
        self._keys()
        port = self.sshd.start()
        say(f"geo-replication: sshd on 127.0.0.1:{port}; session {self.session}")
        check = subprocess.run(
            ["ssh", "-p", str(port), "-oBatchMode=yes", "-oStrictHostKeyChecking=no", self.host, "true"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if check.returncode != 0:
            raise RuntimeError(f"root cannot ssh into {self.host}:{port} with its key: {check.stderr.strip()[-300:]}")
        gluster("system::", "execute", "gsec_create", timeout=120)
        self.geo("create", "ssh-port", str(port), "push-pem", "force")
        self.created = True
        # the create hook copies the keys over scp and adds them to root's authorized_keys; do
        # that step ourselves too (idempotent), then make the slave's tar report its totals
        name = f"{self.master}_{self.slave}_common_secret.pem.pub"
        shutil.copyfile(GEO_DIR / "common_secret.pem.pub", GEO_DIR / name)
        gluster("system::", "execute", "add_secret_pub", "root", f"geo-replication/{name}")
        # the slave's tar key: one line of ours (an earlier line for the same key would win)
        kind, key = (GEO_DIR / "tar_ssh.pem.pub").read_text().split()[:2]
        auth = Path("/root/.ssh/authorized_keys")
        lines = [x for x in auth.read_text().splitlines() if key not in x]
        lines.append(f'command="tar --totals ${{SSH_ORIGINAL_COMMAND#* }} 2>>{self.totals_log}" {kind} {key}')
        auth.write_text("\n".join(lines) + "\n")
        for k, v in (("ssh_port", str(port)), ("sync_method", "tarssh"), ("change_interval", "1")):
            self.geo("config", k, v)
        self.geo("start")
        self.wait_active(active_timeout, say)

    def restart(self, *, active_timeout: float = 180, say=print) -> None:
        """Stops the session's workers and starts them again (they register with the bricks anew)."""
        self.geo("stop", "force")
        self.geo("start")
        self.wait_active(active_timeout, say)

    def worker_pids(self, brick: str) -> list[int]:
        """The gsyncd worker processes of ``brick`` (``gsyncd.py worker ... --local-path BRICK``)."""
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                args = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"worker" in args and b"--local-path" in args:
                i = args.index(b"--local-path")
                if i + 1 < len(args) and args[i + 1].decode(errors="replace") == brick:
                    pids.append(int(entry.name))
        return pids

    def restart_workers(self, bricks: list[str], *, active_timeout: float = 180, say=print) -> None:
        """Ends the workers of ``bricks`` alone (SIGTERM: gsyncd's own clean-up); the session's
        monitor starts each again 10 s later, and it registers with its brick anew, while the
        other bricks' workers go on. A whole :meth:`restart` when a worker is not found."""
        pids = [pid for b in bricks for pid in self.worker_pids(b)]
        if not pids:
            say("geo-replication: no worker process found for the silent bricks; restarting the session")
            self.restart(active_timeout=active_timeout, say=say)
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 60
        while any(self.worker_pids(b) == [] or set(self.worker_pids(b)) & set(pids) for b in bricks):
            if time.monotonic() > deadline:
                say("geo-replication: the silent bricks' workers did not come back in 60 s; restarting the session")
                self.restart(active_timeout=active_timeout, say=say)
                return
            time.sleep(1)
        self.wait_active(active_timeout, say)

    def wait_active(self, active_timeout: float, say) -> None:
        """Until every worker is Active; a RuntimeError naming the workers' states after ``active_timeout``."""
        t0 = time.monotonic()
        while True:
            status = self.geo("status", check=False).stdout
            rows = [line for line in status.splitlines() if self.master in line and "::" in line]
            if rows and all(" Active " in r for r in rows):
                say(f"geo-replication: {len(rows)} workers Active after {time.monotonic() - t0:.0f} s")
                return
            if time.monotonic() - t0 > active_timeout:
                states = sorted(
                    {
                        w
                        for r in rows
                        for w in r.split()
                        if w in ("Created", "Initializing...", "Passive", "Faulty", "Stopped", "Active")
                    }
                )
                raise RuntimeError(
                    f"geo-replication {self.session} did not reach Active within {active_timeout:.0f} s "
                    f"(workers: {', '.join(states) or 'none listed'}; log /var/log/glusterfs/geo-replication/)"
                )
            time.sleep(2)

    def wait_changelog_crawl(self, timeout: float) -> bool:
        """Until every worker's crawl status is ``Changelog Crawl`` (its first crawls, xsync and
        history, are over: what is written from now on reaches it only through live changelogs);
        False after ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.geo("status", check=False).stdout
            rows = [line for line in status.splitlines() if self.master in line and "::" in line]
            if rows and all("Changelog Crawl" in r for r in rows):
                return True
            time.sleep(2)
        return False

    def cpu(self) -> CpuMeter:
        """gsyncd (monitor, workers, the slave's side), its ssh and tar, the session's aux mounts, our sshd."""
        return cpu_of_matching(self.master, self.slave, extra=lambda: [self.sshd.proc.pid] if self.sshd.proc else [])

    def bytes_sent(self) -> int:
        """Bytes of every tar stream the slave has extracted so far."""
        try:
            return sum(int(m) for m in TOTALS.findall(self.totals_log.read_text(errors="replace")))
        except OSError:
            return 0

    def stop(self) -> None:
        """Stops and deletes the session, stops sshd, restores root's ~/.ssh (idempotent)."""
        if self.created:
            self.geo("stop", "force", check=False, timeout=120)
            self.geo("delete", "reset-sync-time", check=False, timeout=120)
            self.created = False
            (GEO_DIR / f"{self.master}_{self.slave}_common_secret.pem.pub").unlink(missing_ok=True)
        self.sshd.stop()
        self._restore_keys()
        self._ssh_before = {}
        if not self._gsec_existed:
            for n in ("common_secret.pem.pub", "secret.pem", "secret.pem.pub", "tar_ssh.pem", "tar_ssh.pem.pub"):
                (GEO_DIR / n).unlink(missing_ok=True)


#: a worker's states in ``gluster volume geo-replication ... status``
WORKER_STATES = ("Active", "Passive", "Faulty", "Initializing...", "Created", "Stopped")


def geo_workers(status: str, master: str) -> list[dict]:
    """The worker rows of a ``gluster volume geo-replication MASTER HOST::SLAVE status`` answer:
    ``{"node", "brick", "state", "crawl"}`` each (the master node's address, the brick's path,
    one of :data:`WORKER_STATES` or ``?``, the crawl status or ``N/A``)."""
    out = []
    for line in status.splitlines():
        words = line.split()
        if len(words) < 3 or master not in words or not any("::" in w for w in words):
            continue
        state = next((w for w in words if w in WORKER_STATES), "?")
        crawl = next((c for c in ("Changelog Crawl", "History Crawl", "Hybrid Crawl") if c in line), "N/A")
        out.append({"node": words[0], "brick": words[2], "state": state, "crawl": crawl})
    return out


class PoolGeoRep(GeoRep):
    """A geo-replication session from a volume of a :class:`epochsync_dev.pool.GlusterPool` to a
    volume on another server of the same pool (the secondary's server: ``slave_node``), as
    ``../shared/gluster-multinode.md`` verified it: an sshd of ours in that server's namespaces
    (port 22 of its own address), the pool's ``gluster`` on a master server that is up, the keys
    that ``push-pem`` spreads added to root's ``authorized_keys`` (the servers share this host's
    ``/root``; :meth:`stop` restores it). One worker per master brick: one Active per replica set,
    the others Passive."""

    def __init__(self, pool, master: str, slave: str, slave_node: int, work: Path):
        super().__init__(master, slave, pool.address(slave_node), work)
        self.pool = pool
        self.slave_node = slave_node
        self.masters = sorted({pool._node_of(b) for b in pool.volumes[master].bricks})
        self.sshd = Sshd(
            self.work / "sshd",
            listen=pool.address(slave_node),
            port=22,
            prefix=pool.nsenter(slave_node),
            run_dir=pool.node_dir(slave_node) / "run" / "sshd",
        )

    def geo_dir(self, node: int) -> Path:
        """Server ``node``'s ``/var/lib/glusterd/geo-replication``, as seen from here."""
        return self.pool.node_dir(node) / "lib" / "geo-replication"

    def node(self) -> int:
        """A master server whose glusterd runs (the one the session's commands go to)."""
        up = [n for n in self.masters if n in self.pool.up_nodes()]
        if not up:
            raise RuntimeError(f"geo-replication {self.session}: no master server is up")
        return up[0]

    def geo(self, *args: str, timeout: float = 180, check: bool = True):
        return self.pool.gluster(
            self.node(),
            "volume",
            "geo-replication",
            self.master,
            f"{self.host}::{self.slave}",
            *args,
            timeout=timeout,
            check=check,
        )

    def workers(self) -> list[dict]:
        """The session's workers now (:func:`geo_workers`); empty when the status cannot be read."""
        try:
            return geo_workers(self.geo("status", check=False, timeout=60).stdout, self.master)
        except (RuntimeError, subprocess.TimeoutExpired):
            return []

    def active_nodes(self) -> list[int]:
        """The servers whose worker is Active now."""
        return sorted({n for w in self.workers() if w["state"] == "Active" and (n := self.node_of_brick(w["brick"]))})

    def node_of_brick(self, brick: str) -> int | None:
        """The server whose file system holds ``brick`` (a path: the pool's are unique per server)."""
        return next((n for n in range(1, self.pool.nodes + 1) if brick.startswith(f"{self.pool.node_dir(n)}/")), None)

    def start(self, *, active_timeout: float = 180, say=print) -> None:
        pool, first = self.pool, self.masters[0]
        self._keys()
        port = self.sshd.start()
        say(f"geo-replication: sshd on {self.host}:{port} (server {self.slave_node}); session {self.session}")
        check = pool.sh(
            first,
            "ssh",
            "-p",
            str(port),
            "-oBatchMode=yes",
            "-oStrictHostKeyChecking=no",
            self.host,
            "true",
            check=False,
            timeout=60,
        )
        if check.returncode != 0:
            raise RuntimeError(
                f"root cannot ssh from server {first} into {self.host}:{port}: {check.stderr.strip()[-300:]}"
            )
        self._retried(first, "system::", "execute", "gsec_create", timeout=120)
        self._retried(
            self.node(),
            "volume",
            "geo-replication",
            self.master,
            f"{self.host}::{self.slave}",
            "create",
            "ssh-port",
            str(port),
            "push-pem",
            "force",
        )
        self.created = True
        # the create hook copies the keys to the secondary and adds them to root's authorized_keys
        # there; do that step ourselves too (idempotent)
        name = f"{self.master}_{self.slave}_common_secret.pem.pub"
        shutil.copyfile(self.geo_dir(first) / "common_secret.pem.pub", self.geo_dir(first) / name)
        self._retried(first, "system::", "copy", "file", f"/geo-replication/{name}")
        self._retried(first, "system::", "execute", "add_secret_pub", "root", f"geo-replication/{name}")
        # every master server's tar key: the secondary's tar reports its totals (bytes_sent)
        auth = Path("/root/.ssh/authorized_keys")
        plain = 'command="tar ${SSH_ORIGINAL_COMMAND#* }" '
        counted = f'command="tar --totals ${{SSH_ORIGINAL_COMMAND#* }} 2>>{self.totals_log}" '
        lines: list[str] = []
        for line in auth.read_text().splitlines():
            line = line.replace(plain, counted)
            if line not in lines:
                lines.append(line)
        auth.write_text("\n".join(lines) + "\n")
        for k, v in (("ssh_port", str(port)), ("sync_method", "tarssh"), ("change_interval", "1")):
            self._retried(
                self.node(), "volume", "geo-replication", self.master, f"{self.host}::{self.slave}", "config", k, v
            )
        self._retried(self.node(), "volume", "geo-replication", self.master, f"{self.host}::{self.slave}", "start")
        self.wait_active(active_timeout, say)

    def _retried(self, node: int, *args: str, timeout: float = 180, attempts: int = 30):
        """``gluster ARGS`` on server ``node``, again while glusterd says another transaction is in
        progress (the create hook's own ``system::`` commands run on after ``create`` returns)."""
        for attempt in range(attempts):
            try:
                return self.pool.gluster(node, *args, timeout=timeout)
            except RuntimeError as exc:
                if "Another transaction is in progress" not in str(exc) or attempt == attempts - 1:
                    raise
                time.sleep(2)

    def wait_active(self, active_timeout: float, say) -> None:
        """Until every worker is Active or Passive and one is Active (one replica set); a
        RuntimeError naming the workers' states after ``active_timeout``."""
        t0 = time.monotonic()
        while True:
            rows = self.workers()
            if (
                rows
                and all(w["state"] in ("Active", "Passive") for w in rows)
                and any(w["state"] == "Active" for w in rows)
            ):
                say(f"geo-replication: Active on server(s) {self.active_nodes()} after {time.monotonic() - t0:.0f} s")
                return
            if time.monotonic() - t0 > active_timeout:
                states = sorted({w["state"] for w in rows})
                raise RuntimeError(
                    f"geo-replication {self.session} had no Active worker within {active_timeout:.0f} s "
                    f"(workers: {', '.join(states) or 'none listed'}; logs in each server's log/geo-replication/)"
                )
            time.sleep(2)

    def wait_changelog_crawl(self, timeout: float) -> bool:
        """Until the Active workers are in ``Changelog Crawl``; False after ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            active = [w for w in self.workers() if w["state"] == "Active"]
            if active and all(w["crawl"] == "Changelog Crawl" for w in active):
                return True
            time.sleep(2)
        return False

    def stop(self) -> None:
        """Stops and deletes the session (when a master server still answers), stops sshd,
        restores root's ~/.ssh; the pool's teardown removes the rest (idempotent)."""
        if self.created:
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self.geo("stop", "force", check=False, timeout=120)
                self.geo("delete", "reset-sync-time", check=False, timeout=120)
            self.created = False
        self.sshd.stop()
        self._restore_keys()
        self._ssh_before = {}


# --------------------------------------------------------------------------- rsync

RSYNC_STATS = {
    "transferred": re.compile(r"Total transferred file size: ([\d,]+)"),
    "literal": re.compile(r"Literal data: ([\d,]+)"),
}


def rsync(src: str, dst: str, *, nice: int = 0) -> dict:
    """``rsync -a --delete --stats src/ dst/``; returns seconds, CPU-seconds, bytes read and written."""
    os.makedirs(dst, exist_ok=True)
    code, seconds, out, cpu = run_measured(
        ["rsync", "-a", "--delete", "--stats", src.rstrip("/") + "/", dst.rstrip("/") + "/"], nice=nice
    )
    if code not in (0, 24):  # 24: a source file vanished during the run (a writer is going on)
        raise RuntimeError(f"rsync exited {code}: {out.strip()[-300:]}")
    got = {k: int(m.group(1).replace(",", "")) if (m := rx.search(out)) else 0 for k, rx in RSYNC_STATS.items()}
    # a local rsync copies whole files: it reads what it transfers and writes it
    return {"seconds": seconds, "cpu_s": cpu, "bytes_read": got["transferred"], "bytes_written": got["literal"]}
