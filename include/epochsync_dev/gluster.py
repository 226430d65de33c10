"""A GlusterFS volume the project starts itself: for tests, ``make gluster`` and ``make demo SOURCE=gluster``.

:class:`GlusterStack` makes a distribute volume of ``bricks`` bricks, each a directory inside
a btrfs subvolume on its own loop image (so a cut can snapshot it), with changelogs on, and
mounts it with FUSE. ``stop()`` unmounts, stops and deletes the volume, deletes its
snapshots, unmounts and detaches the images and removes them; a stack whose owner died (a
``kill -9``) is torn down by the next stack that starts (:func:`cleanup_stale`).

glusterd is one daemon per machine: a running one is reused; one this stack started is stopped
with it when no other volume is left. Volumes are named ``es-<8 hex>``; only the stack's own
are ever removed.

Needs root, FUSE, and Debian's ``glusterfs-server``, ``glusterfs-client`` and ``btrfs-progs``
(installed with ``apt-get`` when missing, as ``.ci/run`` installs chromium).
:class:`GlusterUnavailable` says in one line why the stack cannot run here.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from epochsync.core.shutdown import process_running

#: command -> Debian package
PACKAGES = {
    "gluster": "glusterfs-server",
    "glusterd": "glusterfs-server",
    "mount.glusterfs": "glusterfs-client",
    "btrfs": "btrfs-progs",
    "mkfs.btrfs": "btrfs-progs",
}
#: where running stacks register themselves (for the cleanup of a stack whose owner died)
REGISTRY = Path(os.environ.get("EPOCHSYNC_GLUSTER_REGISTRY", "/var/lib/epochsync-gluster"))
#: ``EPOCHSYNC_REQUIRE_GLUSTER=1`` (CI): a test that cannot start a stack fails instead of skipping
REQUIRE_ENV = "EPOCHSYNC_REQUIRE_GLUSTER"


class GlusterUnavailable(RuntimeError):
    """This machine cannot run a Gluster stack; the message is the one line that says why."""


def _which(cmd: str) -> str | None:
    return shutil.which(cmd) or next((p for p in (f"/usr/sbin/{cmd}", f"/sbin/{cmd}") if os.path.exists(p)), None)


def missing_packages(packages: dict[str, str] | None = None) -> list[str]:
    """Returns the Debian packages whose commands are not installed (``packages``: command ->
    package, :data:`PACKAGES` by default)."""
    return sorted({pkg for cmd, pkg in (packages or PACKAGES).items() if _which(cmd) is None})


def check_machine(*, install: bool = True, packages: dict[str, str] | None = None) -> None:
    """Raises :class:`GlusterUnavailable` unless this machine can run a stack (root, FUSE, btrfs,
    the packages, installing them with apt-get when ``install`` and they are missing).
    ``packages``: more command -> package pairs a caller needs beside the stack's."""
    packages = {**PACKAGES, **(packages or {})}
    if os.geteuid() != 0:
        raise GlusterUnavailable("a Gluster volume needs root (glusterd, loop devices, mounts): run as root")
    if not os.path.exists("/dev/fuse"):
        raise GlusterUnavailable("no /dev/fuse: this machine cannot mount a Gluster volume with FUSE")
    if not os.path.exists("/dev/loop-control"):
        raise GlusterUnavailable("no loop devices (/dev/loop-control): bricks need btrfs loop images")
    missing = missing_packages(packages)
    if missing and install:
        if _which("apt-get") is None:
            raise GlusterUnavailable(f"missing {', '.join(missing)} and no apt-get to install them")
        print(f"gluster: installing {' '.join(missing)} with apt-get (a minute or two)", flush=True)
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        done = subprocess.run(
            f"apt-get update -qq && apt-get install -y -qq --no-install-recommends {' '.join(missing)}",
            shell=True,
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        if done.returncode != 0:
            said = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["no output"]
            raise GlusterUnavailable(f"apt-get could not install {', '.join(missing)}: {said[0]}")
        missing = missing_packages(packages)
    if missing:
        raise GlusterUnavailable(f"missing Debian packages: {', '.join(missing)} (apt-get install {' '.join(missing)})")


def run(cmd: list[str], *, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    """Runs a command; a failure raises RuntimeError with its last line of output."""
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip() or f"exit {done.returncode}").splitlines()[-1]
        raise RuntimeError(f"{' '.join(cmd)}: {said}")
    return done


def gluster(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    """``gluster --mode=script ARGS``."""
    return run([_which("gluster") or "gluster", "--mode=script", *args], timeout=timeout, check=check)


def glusterd_running() -> bool:
    """Is a glusterd running in this process's network and mount namespaces (the one the
    ``gluster`` CLI here talks to)? A glusterd of a pool in its own namespaces is not counted:
    processes are told apart by /proc, never matched by name across namespaces."""
    return bool(host_glusterd_pids())


def host_glusterd_pids() -> list[int]:
    """PIDs of the live glusterd processes that share this process's net and mount namespaces."""
    try:
        mine = (os.readlink("/proc/self/ns/net"), os.readlink("/proc/self/ns/mnt"))
    except OSError:
        mine = None
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() != "glusterd":
                continue
            ns = (os.readlink(f"/proc/{pid}/ns/net"), os.readlink(f"/proc/{pid}/ns/mnt"))
        except OSError:
            continue
        if (mine is None or ns == mine) and _alive(pid):
            pids.append(pid)
    return pids


class VolumeConfig:
    """A config for a volume of the dev stacks (``source_keys()``: how the source reaches it)."""

    def source_keys(self) -> dict:
        """The gluster source's keys of this volume."""
        raise NotImplementedError

    def config(
        self,
        warehouse: str,
        targets: list[dict],
        *,
        source: str = "vol",
        interval: str = "10s",
        start: str = "2026-01-01T00:00:00Z",
    ) -> dict:
        """An epochsync config (as a dict) for this volume as source ``source`` and the given targets."""
        return volume_config(warehouse, targets, self.source_keys(), source, interval, start)


@dataclass
class GlusterVolume(VolumeConfig):
    """A running volume of the stack: its name, bricks (``host:/path``), mount point and folder."""

    name: str
    bricks: list[str]
    mount: str
    work_dir: str
    host: str
    options: dict[str, str] = field(default_factory=dict)

    def source_keys(self) -> dict:
        """The source's keys for this volume: its name and bricks."""
        return {"volume": self.name, "bricks": list(self.bricks)}


def volume_config(warehouse: str, targets: list[dict], keys: dict, source: str, interval: str, start: str) -> dict:
    """An epochsync config (as a dict) with one gluster source ``source`` (``keys``: its volume and
    how it is reached) and the given targets."""
    return {
        "warehouse": warehouse,
        "sources": [{"name": source, "kind": "gluster", **keys, "epoch": {"interval": interval, "start": start}}],
        "targets": targets,
    }


class GlusterStack:
    """glusterd (reused or started), a distribute volume on btrfs loop bricks, a FUSE mount."""

    def __init__(
        self,
        work_dir: str | os.PathLike | None = None,
        *,
        bricks: int = 2,
        brick_size: str = "2G",
        rollover: int = 5,
        shard_block: str | None = None,
        encoding: str = "ascii",
        name: str | None = None,
        options: dict[str, str] | None = None,
    ):
        self._own_dir = work_dir is None
        self.work_dir = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="epochsync-gluster-"))
        self.bricks = bricks
        self.brick_size = brick_size
        self.rollover = rollover
        self.shard_block = shard_block
        self.encoding = encoding
        self.name = name or f"es-{secrets.token_hex(4)}"
        self.extra_options = dict(options or {})
        self.host = socket.gethostname()
        self.volume: GlusterVolume | None = None
        self._loops: list[str] = []
        self._mounts: list[str] = []
        #: the PID of the glusterd this stack started (None: it reused a running one)
        self._started_glusterd: int | None = None
        self._created = False

    # ------------------------------------------------------------------ start
    def start(self, *, install: bool = True, progress=None) -> GlusterVolume:
        """Brings the stack up; returns the volume (see the class docstring)."""
        say = progress or (lambda _l: None)
        check_machine(install=install)
        cleanup_stale(progress=say)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._register()
            self._glusterd(say)
            say(f"gluster: {self.bricks} btrfs bricks of {self.brick_size} (loop images) in {self.work_dir}")
            specs = [self._brick(i) for i in range(1, self.bricks + 1)]
            gluster("volume", "create", self.name, "transport", "tcp", *specs, "force")
            self._created = True
            self._register()
            options = {
                "changelog.changelog": "on",
                "changelog.rollover-time": str(self.rollover),
                "changelog.encoding": self.encoding,
            }
            if self.shard_block:
                options.update({"features.shard": "on", "features.shard-block-size": self.shard_block})
            options.update(self.extra_options)
            for k, v in options.items():
                gluster("volume", "set", self.name, k, v)
            gluster("volume", "start", self.name)
            mount = self.work_dir / "mnt"
            mount.mkdir(exist_ok=True)
            self._mount(str(mount))
            say(
                f"gluster: volume {self.name} ({self.bricks} bricks, changelog on, rollover {self.rollover} s) mounted at {mount}"
            )
            self.volume = GlusterVolume(
                name=self.name,
                bricks=specs,
                mount=str(mount),
                work_dir=str(self.work_dir),
                host=self.host,
                options=options,
            )
            return self.volume
        except BaseException:
            self.stop()
            raise

    def _glusterd(self, say) -> None:
        if glusterd_running():
            # a running glusterd is reused once it answers; one that is on its way out (another
            # stack's, just sent SIGTERM) is waited for, and then this stack starts its own
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and glusterd_running():
                if gluster("volume", "list", check=False, timeout=20).returncode == 0:
                    return
                time.sleep(0.5)
            if glusterd_running():
                raise RuntimeError("a glusterd is running on this machine but did not answer within 30 s")
        say("gluster: starting glusterd")
        log = self.work_dir / "glusterd.log"
        pid_file = self.work_dir / "glusterd.pid"
        run([_which("glusterd") or "glusterd", f"--log-file={log}", f"--pid-file={pid_file}"])
        # the daemon's PID (it forks): teardown ends this process and no other glusterd
        self._started_glusterd = _read_pid(pid_file)
        self._register()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if gluster("volume", "list", check=False, timeout=20).returncode == 0:
                return
            time.sleep(0.5)
        raise RuntimeError(f"glusterd did not answer within 60 s (log: {log})")

    def _brick(self, i: int) -> str:
        fs = self.work_dir / f"b{i}"
        btrfs_image(self.work_dir / f"brick{i}.img", self.brick_size, fs, self._loops, self._mounts, self._register)
        run(["btrfs", "subvolume", "create", str(fs / "vol")])
        (fs / "vol" / "brick").mkdir()
        return f"{self.host}:{fs / 'vol' / 'brick'}"

    def _mount(self, mount: str) -> None:
        deadline = time.monotonic() + 60
        while True:
            done = run(["mount", "-t", "glusterfs", f"{self.host}:/{self.name}", mount], check=False)
            if done.returncode == 0 and os.path.ismount(mount):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"cannot mount {self.name}: {(done.stderr or done.stdout).strip()}")
            time.sleep(1)
        self._mounts.insert(0, mount)
        self._register()

    def mount_client(self, path: str | os.PathLike) -> str:
        """Another FUSE client of the volume at ``path`` (one client's requests go through one FUSE
        channel: a second one adds round trips in flight); unmounted by :meth:`unmount_client` or
        the teardown."""
        os.makedirs(path, exist_ok=True)
        self._mount(str(path))
        return str(path)

    def unmount_client(self, path: str | os.PathLike) -> None:
        _umount(str(path))
        with contextlib.suppress(ValueError):
            self._mounts.remove(str(path))
        self._register()

    # ------------------------------------------------------------------ stop
    def stop(self) -> None:
        """Tears down what this stack made (idempotent; also after a failed start)."""
        teardown(
            {
                "volume": self.name if self._created else None,
                "mounts": list(self._mounts),
                "loops": list(self._loops),
                "work_dir": str(self.work_dir),
                "own_dir": self._own_dir,
                "started_glusterd": self._started_glusterd,
            }
        )
        self._mounts, self._loops, self._created = [], [], False
        with contextlib.suppress(FileNotFoundError):
            (REGISTRY / f"{self.name}.json").unlink()
        self.volume = None

    def __enter__(self) -> GlusterVolume:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _register(self) -> None:
        register(
            self.name,
            volume=self.name if self._created else None,
            mounts=self._mounts,
            loops=self._loops,
            work_dir=self.work_dir,
            own_dir=self._own_dir,
            started_glusterd=self._started_glusterd,
        )


def register(
    name: str,
    *,
    volume,
    mounts,
    loops,
    work_dir,
    own_dir: bool,
    started_glusterd: int | None,
    extra: dict | None = None,
) -> None:
    """Writes what a stack (or a btrfs loop, or a pool: ``extra``) of this process has made to
    :data:`REGISTRY`, so that :func:`cleanup_stale` can tear it down should the process die."""
    REGISTRY.mkdir(parents=True, exist_ok=True)
    doc = {
        "pid": os.getpid(),
        "volume": volume,
        "mounts": list(mounts),
        "loops": list(loops),
        "work_dir": str(work_dir),
        "own_dir": own_dir,
        "started_glusterd": started_glusterd,
        **(extra or {}),
    }
    tmp = REGISTRY / f".{name}.json.tmp"
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, REGISTRY / f"{name}.json")


def btrfs_image(img: Path, size: str, mount: Path, loops: list[str], mounts: list[str], note) -> None:
    """A sparse image of ``size`` at ``img`` on a loop device, made btrfs and mounted at ``mount``. The
    device and the mount are added to ``loops`` and ``mounts`` (and ``note()`` called, to register
    them) as soon as each exists, so a teardown finds them whatever fails after."""
    with open(img, "wb") as f:
        f.truncate(_bytes(size))
    dev = run(["losetup", "--find", "--show", str(img)]).stdout.strip()
    loops.append(dev)
    note()
    run(["mkfs.btrfs", "-q", "-f", dev])
    mount.mkdir(exist_ok=True)
    run(["mount", dev, str(mount)])
    mounts.append(str(mount))
    note()


def _bytes(size: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = size.strip().upper().rstrip("B").rstrip("I")
    return int(float(s[:-1]) * units[s[-1]]) if s[-1] in units else int(s)


def teardown(doc: dict) -> None:
    """Removes what a stack's registry entry names: the volume (stopped, deleted), snapshots,
    mounts (the FUSE mount first), loop devices, the folder; glusterd when the stack started it
    and no volume is left."""
    volume = doc.get("volume")
    mounts = list(doc.get("mounts") or [])
    for m in mounts[:1]:
        _umount(m)
    if volume:
        gluster("volume", "stop", volume, "force", check=False, timeout=120)
        gluster("volume", "delete", volume, check=False, timeout=120)
    for m in mounts:
        _umount(m)  # a brick file system: its snapshots go with its image
    for dev in doc.get("loops") or []:
        run(["losetup", "-d", dev], check=False)
    if doc.get("own_dir") and doc.get("work_dir"):
        shutil.rmtree(doc["work_dir"], ignore_errors=True)
    pid = doc.get("started_glusterd")
    if pid:
        listed = gluster("volume", "list", check=False, timeout=20)
        if listed.returncode == 0 and "No volumes present" in (listed.stdout + listed.stderr):
            stop_glusterd(pid)


def _read_pid(pid_file: Path) -> int | None:
    """The PID a daemon wrote (it writes it once it has forked: waits up to 10 s), or None."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            return int(pid_file.read_text().strip())
        except (OSError, ValueError):
            time.sleep(0.1)
    return None


def stop_glusterd(pid) -> bool:
    """SIGTERM to the glusterd this stack started, by its PID, never by name (a glusterd of
    someone else's, or of a pool in its own namespace, is never touched); returns whether it
    was still that glusterd. A registry entry of an older stack (``True``, no PID) is left."""
    if isinstance(pid, bool) or not isinstance(pid, int):
        return False
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return False
    if comm != "glusterd":  # the PID was reused by another process
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    # it is gone before this returns: the next stack must not find it dying and reuse it
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    return True


def _alive(pid: int) -> bool:
    """Is ``pid`` a live process (a zombie, exited but not reaped, is not)?"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _umount(path: str) -> None:
    # a FUSE mount whose client died answers lstat with ENOTCONN, and os.path.ismount then says
    # False: the mount table says it is there (one was left behind that way after a CI run)
    if not (os.path.ismount(path) or _in_mount_table(path)):
        return
    if run(["umount", path], check=False, timeout=60).returncode != 0:
        run(["umount", "-l", path], check=False, timeout=60)


def _in_mount_table(path: str) -> bool:
    """Is ``path`` a mount point in this mount namespace's table (``/proc/self/mountinfo``)?"""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return False
    return any(len(f) > 4 and f[4] == path for f in (line.split() for line in lines))


def cleanup_stale(progress=None) -> list[str]:
    """Tears down every registered stack (or pool) whose owner process is gone; returns their
    volume names (a pool's folder)."""
    say = progress or (lambda _l: None)
    gone = []
    if not REGISTRY.is_dir():
        return gone
    for entry in sorted(REGISTRY.glob("*.json")):
        try:
            doc = json.loads(entry.read_text())
        except (OSError, ValueError):
            continue
        if process_running(int(doc.get("pid") or 0)):
            continue
        if doc.get("kind") == "pool":
            from epochsync_dev.pool import pool_teardown  # the pool module builds on this one

            say(f"gluster: removing the pool of a process that died: {doc.get('work_dir')}")
            pool_teardown(doc)
            name = doc.get("work_dir")
        else:
            say(
                f"gluster: removing the stack of a process that died: volume {doc.get('volume')} in {doc.get('work_dir')}"
            )
            teardown(doc)
            name = doc.get("volume")
        with contextlib.suppress(FileNotFoundError):
            entry.unlink()
        gone.append(str(name))
    return gone


# --------------------------------------------------------------------------- make gluster


def main(argv: list[str] | None = None) -> int:
    """``make gluster``: start a stack for a person, print what to use, stop on Ctrl-C or SIGTERM."""
    import argparse

    import yaml

    parser = argparse.ArgumentParser(prog="python -m epochsync_dev.gluster", description=main.__doc__)
    parser.add_argument("--dir", default="var/gluster", help="where the stack, its config and warehouse live")
    parser.add_argument("--bricks", type=int, default=2)
    parser.add_argument("--brick-size", default="2G")
    parser.add_argument("--rollover", type=int, default=5, help="changelog.rollover-time (seconds)")
    parser.add_argument("--shard-block", default=None, help="turn features.shard on with this block size (4MB...)")
    args = parser.parse_args(argv)
    base = Path(args.dir).resolve()
    base.mkdir(parents=True, exist_ok=True)
    stack = GlusterStack(
        base / "stack",
        bricks=args.bricks,
        brick_size=args.brick_size,
        rollover=args.rollover,
        shard_block=args.shard_block,
    )

    def stop_on(signum, _frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop_on)
    try:
        vol = stack.start(progress=lambda line: print(line, flush=True))
    except GlusterUnavailable as exc:
        print(f"gluster: cannot run here: {exc}", flush=True)
        return 1
    try:
        cfg = vol.config(
            str(base / "warehouse"),
            [{"name": "local", "source": "vol", "kind": "posix", "path": str(base / "replica")}],
        )
        cfg_path = base / "epochsync.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        print(
            f"""
gluster: volume {vol.name} is mounted at {vol.mount}
  bricks:  {", ".join(vol.bricks)}
  config:  {cfg_path}  (source 'vol', a posix target 'local' in {base / "replica"})
  try:     echo hello > {vol.mount}/hello.txt
           .venv/bin/epochsync cut --config {cfg_path} --source vol
           .venv/bin/epochsync replicate --config {cfg_path} --target local --through 1
  stop:    Ctrl-C here (or kill {os.getpid()}): unmounts, deletes the volume and its bricks""",
            flush=True,
        )
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("\ngluster: stopping: unmount, delete the volume, detach the bricks", flush=True)
    finally:
        stack.stop()
    print("gluster: stopped; nothing left running", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
