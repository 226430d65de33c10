"""A btrfs file system the project makes itself, on a loop image: for the tests of a posix target's
committed view (read-only snapshots need btrfs) and the benchmarks that replicate onto one.

:class:`BtrfsLoop` makes a sparse image, attaches it to a loop device, makes a btrfs file system
on it and mounts it; ``stop()`` unmounts, detaches and removes the image. It registers itself as
the Gluster dev stack does (:data:`epochsync_dev.gluster.REGISTRY`), so a loop whose owner died
(a ``kill -9``) is torn down by the next stack or loop that starts.

Needs root, loop devices and btrfs-progs; :class:`BtrfsUnavailable` says in one line why not.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from pathlib import Path

from epochsync_dev.gluster import REGISTRY, _which, btrfs_image, cleanup_stale, register, teardown

#: ``EPOCHSYNC_REQUIRE_BTRFS=1`` (CI): a test that cannot make a btrfs loop fails instead of skipping
REQUIRE_ENV = "EPOCHSYNC_REQUIRE_BTRFS"


class BtrfsUnavailable(RuntimeError):
    """This machine cannot make a btrfs loop; the message is the one line that says why."""


def check_machine() -> None:
    """Raises :class:`BtrfsUnavailable` unless this machine can make a btrfs loop (root, loop
    devices, btrfs-progs)."""
    if os.geteuid() != 0:
        raise BtrfsUnavailable("a btrfs loop image needs root (losetup, mount): run as root")
    if not os.path.exists("/dev/loop-control"):
        raise BtrfsUnavailable("no loop devices (/dev/loop-control) on this machine")
    missing = [c for c in ("mkfs.btrfs", "btrfs", "losetup") if _which(c) is None]
    if missing:
        raise BtrfsUnavailable(f"missing {', '.join(missing)} (Debian: apt-get install btrfs-progs)")


class BtrfsLoop:
    """A btrfs file system on a loop image in ``work_dir``, mounted at ``work_dir/mnt``."""

    def __init__(self, work_dir: str | os.PathLike | None = None, *, size: str = "1G"):
        self._own_dir = work_dir is None
        self.work_dir = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="epochsync-btrfs-"))
        self.size = size
        self.name = f"btrfs-{secrets.token_hex(4)}"
        self.mount = self.work_dir / "mnt"
        self._loops: list[str] = []
        self._mounts: list[str] = []

    def start(self) -> Path:
        """Makes and mounts the file system; returns its mount point."""
        check_machine()
        cleanup_stale()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._register()
            btrfs_image(self.work_dir / "btrfs.img", self.size, self.mount, self._loops, self._mounts, self._register)
            return self.mount
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Unmounts, detaches and removes what :meth:`start` made (idempotent)."""
        teardown(self._made())
        if not self._own_dir:
            with contextlib.suppress(FileNotFoundError):
                (self.work_dir / "btrfs.img").unlink()
        self._mounts, self._loops = [], []
        with contextlib.suppress(FileNotFoundError):
            (REGISTRY / f"{self.name}.json").unlink()

    def __enter__(self) -> Path:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _made(self) -> dict:
        return {
            "volume": None,
            "mounts": list(self._mounts),
            "loops": list(self._loops),
            "work_dir": str(self.work_dir),
            "own_dir": self._own_dir,
            "started_glusterd": False,
        }

    def _register(self) -> None:
        register(self.name, **self._made())
