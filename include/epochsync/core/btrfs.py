"""btrfs, as epochsync uses it: which file system holds a path, subvolumes, read-only snapshots.

Two users: a gluster source's cut (a read-only snapshot of every brick's subvolume,
:mod:`epochsync.sources.gluster.btrfs`) and a posix target's committed view (a read-only
snapshot of the replica's subvolume at every commit, :mod:`epochsync.targets.posix`).
Snapshots are made and deleted with the ``btrfs`` command (btrfs-progs); a failure is a
:class:`BtrfsError` whose message is btrfs's last line (:func:`epochsync.core.gluster.run_tool`, which runs
Gluster's commands too).
"""

from __future__ import annotations

import os

from epochsync.core.errors import SourceError
from epochsync.core.gluster import run_tool

#: subvolume roots (and the file system's top level) have this inode number on btrfs
BTRFS_SUBVOLUME_INO = 256


class BtrfsError(SourceError):
    """A btrfs command failed, or btrfs-progs is not installed."""


def mount_of(path: str) -> tuple[str, str]:
    """Returns ``(mount point, file system type)`` of the mount holding ``path``."""
    best = ("/", "")
    real = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            point = left.split()[4].encode().decode("unicode_escape")
            fstype = right.split()[0]
            if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) >= len(best[0]):
                best = (point, fstype)
    return best


def is_subvolume(path: str) -> bool:
    """Is ``path`` the root of a btrfs subvolume (a snapshot, say)?"""
    try:
        return os.lstat(path).st_ino == BTRFS_SUBVOLUME_INO and mount_of(path)[1] == "btrfs"
    except OSError:
        return False


def run_btrfs(args: list[str], what: str, timeout: float = 120.0) -> str:
    """Runs ``btrfs ARGS``; returns its output, or raises :class:`BtrfsError` naming ``what``."""
    return run_tool(
        ["btrfs", *args],
        what,
        timeout=timeout,
        missing="the btrfs command is not installed here (Debian: apt-get install btrfs-progs)",
        error=BtrfsError,
    )


def snapshot(subvolume: str, dest: str) -> None:
    """A read-only snapshot of ``subvolume`` at ``dest`` (its parent must exist, on the same file system)."""
    run_btrfs(["subvolume", "snapshot", "-r", subvolume, dest], f"btrfs snapshot of {subvolume} to {dest}")


def delete_subvolume(dest: str) -> None:
    """Deletes the subvolume (or snapshot) at ``dest`` (nothing when it is gone already)."""
    if os.path.lexists(dest):
        run_btrfs(["subvolume", "delete", dest], f"btrfs subvolume delete {dest}")


def create_subvolume(path: str) -> None:
    """Creates an empty subvolume at ``path`` (its parent must exist, on btrfs)."""
    run_btrfs(["subvolume", "create", path], f"btrfs subvolume create {path}")
