"""Cutting a live Gluster volume: one consistent, read-only view of every brick per epoch.

The interface (:class:`CutMechanism`): ``take(epoch)`` makes the epoch's cut and says where
each brick's snapshot is and where the brick's directory is inside it; ``root(brick, epoch)``
finds it again; ``drop(epoch)`` deletes it; ``epochs()`` lists what is kept. Built and tested
here: :class:`BtrfsCut`, on the bricks' own host:

1. ``gluster volume barrier VOL enable``: every brick holds namespace operations (its changelog
   translator queues create, mkdir, unlink, rename, link...; the barrier translator holds
   rename, unlink, rmdir, truncate, fsync) and rolls its changelog over, so the changelog
   up to the cut is complete (Gluster's own snapshots work so);
2. ``btrfs subvolume snapshot -r`` of each brick's subvolume (atomic per brick; data writes
   go on meanwhile, and are in a brick's snapshot or not as a whole write);
3. ``gluster volume barrier VOL disable``, always, also when a snapshot failed.

Never ``fsfreeze`` with a btrfs snapshot: the snapshot blocks on a frozen file system until
the thaw (``../shared/gluster.md``). Gluster's native ``gluster snapshot create`` (LVM-thin
bricks) and bricks on other hosts (an agent per server running ``take`` for its bricks) are
the same interface; docs/INTERNALS.md says how they map.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from epochsync.core.gluster import Brick, GlusterCommand, GlusterError, run_gluster
from epochsync.sources.gluster import btrfs


@dataclass
class BrickCut:
    """Where one brick's snapshot of a cut is."""

    brick: str
    snapshot: str  # the snapshot (a read-only subvolume)
    root: str  # the brick's directory inside it
    agent: dict | None = None  # taken by an agent: {"url", "brick" (its path), "snapshot" (its name there)}
    missing: str | None = None  # not taken: why (its agent out of reach; a replicated volume's other bricks hold it)


class CutMechanism(Protocol):
    """Makes, finds and drops a source's cuts (see the module docstring)."""

    def take(self, epoch: int) -> tuple[list[BrickCut], dict]:
        """Cut the volume as epoch ``epoch``; returns each brick's snapshot and the cut's figures."""
        ...

    def root(self, brick: str, epoch: int) -> str:
        """Returns the directory of ``brick`` inside cut ``epoch`` (it may be gone)."""
        ...

    def drop(self, epoch: int) -> None:
        """Deletes cut ``epoch`` (nothing where it is gone already)."""
        ...

    def epochs(self) -> list[int]:
        """Returns the epochs whose cuts are kept, oldest first."""
        ...


_SNAPSHOT_NAME = re.compile(r"epoch-(\d{10})")


def snapshot_name(epoch: int) -> str:
    """Returns the name of an epoch's snapshot in a brick's snapshot folder."""
    return f"epoch-{epoch:010d}"


class BtrfsCut:
    """Gluster's barrier and a read-only btrfs snapshot of every brick (see the module docstring)."""

    def __init__(
        self,
        source: str,
        volume: str,
        bricks: list[Brick],
        template: str,
        *,
        barrier: bool = False,
        timeout: float = 120.0,
        bricks_here: bool = False,
        command: GlusterCommand | None = None,
        agents: dict | None = None,
    ):
        self.source = source
        self.volume = volume
        self.bricks = bricks
        self.template = template
        self.barrier = barrier
        self.timeout = timeout
        self.bricks_here = bricks_here
        self.command = command
        #: brick name -> the AgentClient of its server: that brick's snapshots are the agent's
        self.agents = dict(agents or {})
        self._layout: dict[str, tuple[str, str, str]] | None = None
        #: brick name -> why its agent could not be reached for the layout (``take(may_miss=True)``)
        self._unreachable: dict[str, str] = {}

    def name(self, epoch: int) -> str:
        """The snapshot's name: ``epoch-E`` in this source's own folder; ``<source>.epoch-E`` in an
        agent's, which every source of that brick shares."""
        return f"{self.source}.{snapshot_name(epoch)}" if self.agents else snapshot_name(epoch)

    def layout(self, *, may_miss: bool = False) -> dict[str, tuple[str, str, str]]:
        """Returns ``{brick: (subvolume, the brick's path inside it, snapshot folder)}``; checks that every
        brick is here, on btrfs, and that its snapshot folder is on the same file system. ``may_miss``:
        a brick whose agent is out of reach is left out (why: ``self._unreachable``) instead of failing."""
        from epochsync.agent.protocol import AgentUnreachable

        if self._layout is not None and (may_miss or not self._unreachable):
            return self._layout
        out = {}
        self._unreachable = {}
        for b in self.bricks:
            agent = self.agents.get(b.name)
            if agent is not None:
                try:
                    doc = agent.where(b.path)  # the agent's folder for the brick, on the brick's server
                except AgentUnreachable as exc:
                    if not may_miss:
                        raise
                    self._unreachable[b.name] = str(exc)
                    continue
                out[b.name] = ("", doc["rel"], doc["folder"])
                continue
            if not self.bricks_here and not b.is_local():
                raise GlusterError(
                    f"{b.name} ({b.spec}) is on another host: the btrfs cut snapshots bricks where it runs; run it on "
                    "the bricks' host (remote bricks need an agent per server: docs, GlusterFS source), or set "
                    "cut.bricks_here when their file systems are mounted here at the same paths"
                )
            if not os.path.isdir(b.path):
                raise GlusterError(f"{b.name}: brick directory {b.path} does not exist here")
            sub = btrfs.subvolume_of(b.path)
            if os.path.realpath(sub) == os.path.realpath(b.path):
                raise GlusterError(f"{b.name}: the brick {b.path} is itself a subvolume; use a directory inside one")
            rel = os.path.relpath(os.path.realpath(b.path), os.path.realpath(sub))
            folder = self.template.format(
                subvolume=sub,
                subvolume_parent=os.path.dirname(sub),
                source=self.source,
                volume=self.volume,
                brick=b.name,
            )
            folder = os.path.normpath(folder)
            os.makedirs(folder, exist_ok=True)
            if btrfs.mount_of(folder)[0] != btrfs.mount_of(sub)[0]:
                raise GlusterError(
                    f"{b.name}: snapshot folder {folder} is not on the brick's btrfs file system ({btrfs.mount_of(sub)[0]}): "
                    "set sources[].cut.snapshots to a folder there"
                )
            out[b.name] = (sub, rel, folder)
        self._layout = out
        return out

    def root(self, brick: str, epoch: int) -> str:
        """Returns the directory of ``brick`` inside cut ``epoch``."""
        _sub, rel, folder = self.layout()[brick]
        return os.path.join(folder, self.name(epoch), rel)

    def take(self, epoch: int, *, may_miss: bool = False) -> tuple[list[BrickCut], dict]:
        """The barrier, a snapshot per brick, the barrier lifted; returns the bricks' cuts and the
        figures (seconds of each step, the instant of the cut). ``may_miss`` (a replicated volume): a
        brick whose agent cannot be reached, for the layout or the snapshot, is cut as missing
        (``BrickCut.missing``) instead of failing the cut; the caller decides whether its set holds."""
        from epochsync.agent.protocol import AgentUnreachable

        layout = self.layout(may_miss=may_miss)
        cuts = []
        for b in self.bricks:
            if b.name not in layout:
                cuts.append(BrickCut(b.name, "", "", None, missing=self._unreachable.get(b.name, "out of reach")))
                continue
            _sub, rel, folder = layout[b.name]
            dest = os.path.join(folder, self.name(epoch))
            agent = self.agents.get(b.name)
            if agent is None and btrfs.is_subvolume(dest):
                btrfs.delete_snapshot(dest)  # a half-made cut of an attempt that died: made again
            info = {"url": agent.url, "brick": b.path, "snapshot": self.name(epoch)} if agent else None
            cuts.append(BrickCut(b.name, dest, os.path.join(dest, rel), info))
        if all(c.missing for c in cuts):
            raise GlusterError(
                f"no brick of volume {self.volume} can be cut: " + "; ".join(f"{c.brick}: {c.missing}" for c in cuts)
            )
        figures: dict = {"barrier": self.barrier}
        wall0 = time.time_ns()
        t0 = time.monotonic()
        if self.barrier:
            run_gluster(
                ["volume", "barrier", self.volume, "enable"],
                timeout=self.timeout,
                what=f"barrier on {self.volume}",
                command=self.command,
            )
        t1 = time.monotonic()
        try:
            # every brick's snapshot at once: each flushes its own brick's dirty data first, and
            # on a pool each brick is another server's disk (no two snapshots wait for each other)
            def one(pair: tuple[Brick, BrickCut]) -> int:
                stamp = time.time_ns()
                agent = self.agents.get(pair[0].name)
                if agent is not None:
                    # the agent's snapshot (one of an attempt that died is made again)
                    try:
                        agent.cut(pair[0].path, self.name(epoch), replace=True)
                    except AgentUnreachable as exc:
                        if not may_miss:
                            raise
                        pair[1].missing, pair[1].agent = str(exc), None
                else:
                    btrfs.snapshot(layout[pair[0].name][0], pair[1].snapshot)
                return stamp

            pairs = [(b, c) for b, c in zip(self.bricks, cuts, strict=True) if not c.missing]
            if len(pairs) > 1:
                with ThreadPoolExecutor(max_workers=min(len(pairs), 16)) as pool:
                    stamps = list(pool.map(one, pairs))
            else:
                stamps = [one(p) for p in pairs]
            stamps.append(time.time_ns())
            t2 = time.monotonic()
        finally:
            if self.barrier:
                run_gluster(
                    ["volume", "barrier", self.volume, "disable"],
                    timeout=self.timeout,
                    what=f"barrier off {self.volume}",
                    command=self.command,
                )
        t3 = time.monotonic()
        figures.update(
            {
                "barrier_on_s": round(t1 - t0, 4),
                "snapshots_s": round(t2 - t1, 4),
                "barrier_off_s": round(t3 - t2, 4),
                "total_s": round(t3 - t0, 4),
                "time_ns": min(stamps[:-1]),
                "snapshot_times_ns": stamps[:-1],
            }
        )
        if self.barrier:
            # how long each brick held namespace operations, from its own log (best effort)
            held = [barrier_hold(brick_log_path(b.path), wall0) for b in self.bricks]
            if held and all(h is not None for h in held):
                figures["held_s"] = round(max(h for h in held if h is not None), 4)
        return cuts, figures

    def drop(self, epoch: int) -> None:
        """Deletes every brick's snapshot of ``epoch`` (of a brick whose agent is out of reach: at a
        later purge, which finds it again once the agent answers)."""
        from epochsync.agent.protocol import AgentGone, AgentUnreachable

        for b in self.bricks:
            agent = self.agents.get(b.name)
            if agent is not None:
                with contextlib.suppress(AgentGone, AgentUnreachable):
                    agent.purge(b.path, self.name(epoch))
                continue
            _sub, _rel, folder = self.layout()[b.name]
            btrfs.delete_snapshot(os.path.join(folder, self.name(epoch)))

    def epochs(self) -> list[int]:
        """The epochs some brick still has a snapshot of (a brick that was down at a cut has none of it;
        a brick whose agent is out of reach is not asked)."""
        from epochsync.agent.protocol import AgentUnreachable

        have: set[int] = set()
        prefix = f"{self.source}." if self.agents else ""
        for b in self.bricks:
            agent = self.agents.get(b.name)
            try:
                if agent is not None:
                    names = agent.snapshots(b.path)
                else:
                    names = os.listdir(self.layout()[b.name][2])
            except (FileNotFoundError, AgentUnreachable):
                names = []
            for name in names:
                m = _SNAPSHOT_NAME.fullmatch(name[len(prefix) :]) if name.startswith(prefix) else None
                if m:
                    have.add(int(m.group(1)))
        return sorted(have)


def barrier_hold(brick_log: str, since_ns: int) -> float | None:
    """Seconds a brick held namespace operations in the last cut, from its log: from ``Enabled
    changelog barrier`` to ``disabled changelog barrier`` (both after ``since_ns``), or None."""
    try:
        with open(brick_log, "rb") as f:
            f.seek(max(0, os.path.getsize(brick_log) - 256 * 1024))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    on = off = None
    for line in lines:
        m = re.match(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+) ([+-]\d{4})\]", line)
        if not m:
            continue
        when = datetime.strptime(m.group(1)[:26], "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=UTC)
        t = int(when.timestamp() * 1e9)
        if t < since_ns:
            continue
        if "Enabled changelog barrier" in line:
            on, off = t, None
        elif "disabled changelog barrier" in line and on is not None:
            off = t
    return None if on is None or off is None else (off - on) / 1e9


def brick_log_path(brick_path: str) -> str:
    """Returns the log file glusterfsd writes for the brick at ``brick_path``."""
    return os.path.join("/var/log/glusterfs/bricks", brick_path.strip("/").replace("/", "-") + ".log")
