"""The target contract every backend implements, and the path-safety rule they share.

A target holds one replica. The data plane talks to it only through this contract:

- ``read_manifest()`` / ``write_manifest(doc)``: the single source of truth for the
  committed epoch (docs/INTERNALS.md "Target manifest"), written last and atomically.
- ``fence_time_ns()``: the instant of the last commit or rollback, for the write fence.
- ``fence_check(expect)``: which of the paths a plan touches were changed by someone
  else since that instant (DESIGN section 5 "write fence").
- ``run_namespace_op`` / ``run_data_op`` / ``run_post_op``: mutate the replica, each
  mutation preceded by an undo entry made durable in the :class:`UndoJournal` given.
- ``undo(entry)``: reverse one journal entry; idempotent, so a rollback can resume.
- ``undo_all(entries, ...)``: reverse entries given in replay order (the journal reversed),
  each reported done only once its undo has finished; sequential by default (posix undo
  entries restore pre-images and their order matters), the s3 target runs independent keys
  in threads.
- ``walk()``: every entry of the replica with its content hash, excluding
  ``.epochsync/``: what tests and the rollback check compare.
- ``finish_commit(epoch)`` / ``finish_rollback(epoch)``: drop or clean the epoch's
  scratch area (posix moved-aside originals).
- ``publish_view()`` / ``view_status()``: the committed view, where the backend has one
  (posix on btrfs: a read-only snapshot per committed epoch and a ``current`` link);
  published after the manifest, idempotent.

Paths are replica-relative (``a/b/c``). :func:`safe_relpath` refuses anything that
could address something outside the replica, whatever names a changelog holds.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from epochsync.core.errors import EpochsyncError, RecordError
from epochsync.core.names import check_relative_path

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from epochsync.core.config import TargetConfig

#: seconds between two progress lines of a long undo replay (:class:`UndoProgress`)
UNDO_PROGRESS_EVERY_S = 5.0

#: The replica's own area (manifest, scratch) by default (``targets[].control_dir``); never
#: a replicated path.
CONTROL_DIR = ".epochsync"


class UnsafePathError(EpochsyncError):
    """A plan or changelog named a path that could leave the replica."""


class TargetLimitError(EpochsyncError):
    """A source path the target cannot hold (too long a key or path, a reserved name);
    raised by translate, before anything is applied."""


def safe_relpath(path: str, what: str = "path", control_dir: str = CONTROL_DIR) -> str:
    """Return ``path`` if it is a safe replica-relative path, else raise UnsafePathError.

    Every component must be a safe basename (epochsync.core.names) and the first one may
    not be the control directory, so no plan can touch the manifest or the journal.
    """
    try:
        check_relative_path(path, what)
    except RecordError as exc:
        raise UnsafePathError(f"refusing {what} {path!r}: {exc}") from None
    if path.split("/", 1)[0] == control_dir:
        raise UnsafePathError(f"refusing {what} {path!r}: {control_dir}/ belongs to epochsync")
    return path


def drain(written: dict) -> dict:
    """Every item of ``written``, removed from it (threads may still be adding: one atomic
    ``popitem`` at a time); the targets' ``take_written``."""
    out: dict = {}
    while True:
        try:
            k, v = written.popitem()
        except KeyError:
            return out
        out[k] = v


@dataclass
class Entry:
    """One path of a replica as a reader sees it (what replicas are compared on)."""

    path: str
    type: str  # file, dir, symlink, other
    size: int = 0
    mode: int | None = None  # permission bits only (& 0o7777)
    uid: int | None = None
    gid: int | None = None
    symlink: str | None = None
    xattrs: dict[str, bytes] = field(default_factory=dict)
    sha256: str | None = None
    mtime_ns: int | None = None
    fid: str | None = None
    ino: int | None = None  # a posix replica's inode: hard links share it (the audit's identity check)

    def comparable(self, *, owners: bool = True, xattrs: bool = True) -> tuple:
        """The fields replica comparisons use (times are not compared)."""
        return (
            self.path,
            self.type,
            self.size if self.type == "file" else 0,
            self.mode,
            self.uid if owners else None,
            self.gid if owners else None,
            self.symlink,
            tuple(sorted(self.xattrs.items())) if xattrs else (),
            self.sha256 if self.type == "file" else None,
        )


class Target:
    """Base class of the backends. See the module docstring for the contract."""

    kind = "?"

    def __init__(self, cfg: TargetConfig):
        self.cfg = cfg
        self.name = cfg.name
        self.control_dir = getattr(cfg, "control_dir", None) or CONTROL_DIR

    # -- identity and manifest
    def describe(self) -> str:
        """Returns the target's place for messages (``posix:/path``, ``s3://bucket/prefix``)."""
        raise NotImplementedError

    def read_manifest(self) -> dict | None:
        """Returns the manifest document (the committed epoch and its facts), or None for a target never committed."""
        raise NotImplementedError

    def write_manifest(self, doc: dict) -> None:
        """Replace the manifest with ``doc`` atomically: the commit point of an epoch."""
        raise NotImplementedError

    def fence_time_ns(self) -> int | None:
        """Returns the fence instant (ns): the later of the last commit and the last rollback, None if
        neither happened."""
        raise NotImplementedError

    def mark_rollback(self, epoch: int) -> None:
        """Record that a rollback finished now (it moves the fence instant forward)."""
        raise NotImplementedError

    def now_ns(self) -> int:
        """The target's clock now (ns), as its change times read it: what a fence instant taken now is."""
        import time

        return time.time_ns()

    # -- reading
    def walk(self, *, hashes: bool = True) -> Iterator[Entry]:
        """Returns an iterator over every entry of the replica (the control directory left out);
        ``hashes``: with content hashes."""
        raise NotImplementedError

    def read_file(self, path: str) -> bytes:
        """Returns the whole contents of the file at replica path ``path``."""
        raise NotImplementedError

    def stat(self, path: str, type_hint: str | None = None) -> Entry | None:
        """Returns the entry at replica path ``path``, or None when there is none."""
        raise NotImplementedError

    # -- write fence
    def fence_check(self, expect: list[dict], since_ns: int | None) -> tuple[list[str], dict[str, Any]]:
        """Problems (one line per foreign change) and per-path state the apply needs."""
        raise NotImplementedError

    # -- mutations
    def prepare(self, epoch: int) -> None:
        """Create what an apply of ``epoch`` needs (scratch area, parents of the fileset)."""

    def run_namespace_op(self, op: dict, journal, state: dict) -> None:
        """Run one namespace operation of a plan, its undo entry journaled before the change."""
        raise NotImplementedError

    def run_post_op(self, op: dict, journal, state: dict) -> None:
        """Run one post operation of a plan (links, attributes, deletes), its undo entry journaled before the change."""
        raise NotImplementedError

    def undo(self, entry: dict, journal_dir: str) -> None:
        """Reverse one undo journal entry (idempotent: an entry already undone changes nothing)."""
        raise NotImplementedError

    def undo_all(
        self,
        entries: Sequence[dict],
        journal_dir: str,
        on_done: Callable[[dict], None],
        before: Callable[[dict], None] | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> int:
        """Reverse ``entries`` one at a time in the order given (a journal reversed), calling
        ``before(entry)`` (the fault-injection hook) before each undo and ``on_done(entry)`` after
        it; returns how many were undone. ``progress`` gets a line every few seconds.

        The first error stops the replay there: the entry that failed is not reported done.
        """
        tracker = UndoProgress(len(entries), progress)
        for entry in entries:
            if before is not None:
                before(entry)
            self.undo(entry, journal_dir)
            on_done(entry)
            tracker.step()
        return len(entries)

    def move_control_dir(self, old: str) -> str:
        """Move the control directory from ``old`` to this target's ``control_dir`` (no epoch in
        flight; resumable); returns a line saying what was moved."""
        raise NotImplementedError

    def finish_commit(self, epoch: int) -> None:
        """Make the epoch's deletes final (drop moved-aside originals)."""

    def finish_rollback(self, epoch: int) -> None:
        """Remove what is left of the epoch's scratch area after a rollback."""

    def publish_view(self) -> dict | None:
        """Publish the committed epoch as a view readers can trust; returns what was done, or None
        (the default: this backend has no committed view)."""
        return None

    def view_status(self) -> dict | None:
        """The committed view for ``epochsync status``: ``available``, and ``reason`` when it is not
        (the default: objects are changed in place during apply)."""
        return {
            "available": False,
            "reason": f"{self.kind} targets have no snapshots: objects change in place while an epoch applies",
        }


class UndoProgress:
    """Counts undone entries (from any thread) and passes ``progress`` a line at most every
    :data:`UNDO_PROGRESS_EVERY_S` seconds; silent without a callback or for a quick replay."""

    def __init__(self, total: int, progress: Callable[[str], None] | None, every_s: float | None = None):
        self.total = total
        self.progress = progress
        self.every_s = UNDO_PROGRESS_EVERY_S if every_s is None else every_s
        self.done = 0
        self.t0 = self.last = time.monotonic()
        self._lock = threading.Lock()

    def step(self) -> None:
        """One more entry undone; prints a line when the interval has passed."""
        with self._lock:
            self.done += 1
            now = time.monotonic()
            if self.progress is None or now - self.last < self.every_s or self.done == self.total:
                return
            self.last = now
            rate = self.done / max(now - self.t0, 1e-9)
            self.progress(f"{self.done} of {self.total} journal entries undone ({rate:.0f}/s)")


class HeldControl:
    """What this process knows of a target's control area while it holds the target's lease.

    :func:`epochsync.journal.lease.target_lease` registers one per lease (:func:`hold_control`)
    and drops it at release. Under the lease no other writer changes the control area (the
    manifest, the rollback marker), so what this process read or wrote of it there is what
    the store holds, and the stages of one run need not ask the store again
    (``S3Target.read_manifest``, ``fence_time_ns``, ``ensure_bucket``). ``facts`` is the
    backend's. Nothing is answered from it in another process (a fork) or once the lease
    says it was lost (``lease.lost``: an s3 lease that could not be renewed).
    """

    def __init__(self, lease) -> None:
        self.lease = lease
        self.pid = os.getpid()
        self.facts: dict[str, Any] = {}

    def usable(self) -> bool:
        """Is this the holder's process, with the lease still held?"""
        return self.pid == os.getpid() and not getattr(self.lease, "lost", None)


_held_control: dict[str, HeldControl] = {}


def hold_control(place: str, lease) -> None:
    """Start keeping facts of the control area at ``place`` (the lease's place), ``lease`` just taken."""
    _held_control[place] = HeldControl(lease)


def drop_control(place: str) -> None:
    """Forget the facts of ``place`` (its lease is being released)."""
    _held_control.pop(place, None)


def held_control(place: str) -> dict[str, Any] | None:
    """The facts this process keeps of the control area at ``place`` while it holds its lease, else None."""
    held = _held_control.get(place)
    return held.facts if held is not None and held.usable() else None


def moved_control_dir_error(target: Target, move_hint: str) -> EpochsyncError:
    """A target whose ``control_dir`` was changed while its manifest is still at the default place."""
    from epochsync.core.errors import EpochError

    return EpochError(
        f"target {target.name}: control_dir is {target.control_dir!r} but the manifest is still under "
        f"{CONTROL_DIR!r}; move that directory first ({move_hint}), with no epoch in flight, then run again"
    )
