"""Replicated volumes: each replica set read through one brick, its reader, chosen at every cut.

A ``replica R`` volume (``R x K`` distributed-replicate: K sets) keeps each file on the R bricks
of one set, and each of them logs the set's operations in its own changelog. Gluster's own
geo-replication runs a worker per brick, makes one of each set Active (by node id, or by a lock
on the meta volume) and, when it fails, lets another take over from *its own* changelog. But a
brick that was down and healed logs files it missed as ``MKNOD`` and the deletes it missed not
at all (``../shared/gluster-multinode.md``), so that takeover can miss deletes and renames.
epochsync reads the set from both sides instead:

- **records: every brick's changelog, merged.** A changelog record only tells the resolver which
  gfids and names to look at (the values come from the cut), so the set's records are the union
  of its bricks' slices, each distinct record once (:func:`merge_set_records`). An operation the
  client completed reached at least ``quorum`` bricks of the set (AFR's client quorum), so the
  union holds it as long as fewer than ``quorum`` bricks could not be read (an arbiter counts as
  never read for this: it holds no data, whatever its changelog logs). Otherwise the set is
  walked whole (:func:`covered`).
- **bytes and attributes: one brick, the reader.** Never an arbiter; never a brick that is down at
  the cut or was (re)started since the last one (its changelog index ``HTIME`` is newer than that
  cut); never one that is owed heals, at this cut or the last one: a peer's snapshot has the gfid
  in its ``.glusterfs/indices/xattrop`` index with a nonzero ``trusted.afr.<volume>-client-<k>``
  counter for brick k (AFR's pending data/metadata/entry counts). The previous reader is kept
  while it qualifies, else the first that does in the volume's order. No brick qualifying fails
  the cut with the reason: it is taken again once the set is healed.

Each physical brick keeps its own changelog position, so a takeover reads on from where that
brick's snapshot ended, losing and repeating nothing. A new reader's previous snapshot was not
the one the published state came from (without the barrier two bricks' snapshots differ by the
writes in flight), so the files an epoch touches in a set whose reader changed are read whole
rather than compared with the last cut.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from epochsync.core.errors import EpochError, EpochsyncError
from epochsync.core.gluster import GlusterError
from epochsync.core.schema import Record

_GFID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
#: the fields that say what a raw record points at (two copies with equal ones are one record)
_KEY_FIELDS = ("type", "tfid", "sfid", "pfid", "name", "spfid", "sname", "target")


@dataclass(frozen=True)
class ReplicaSet:
    """One replica set: its server name (``set1`` ...), bricks (``brick1`` ... in volume order) and arbiter."""

    name: str
    bricks: tuple[str, ...]
    arbiter: str | None = None

    @property
    def data_bricks(self) -> tuple[str, ...]:
        """The bricks that hold the set's bytes (not the arbiter)."""
        return tuple(b for b in self.bricks if b != self.arbiter)


def replica_sets(brick_names: list[str], replica: int, arbiter: bool) -> list[ReplicaSet]:
    """The sets of a volume whose bricks are ``brick_names`` in its order (Gluster groups each
    ``replica`` consecutive bricks; with an arbiter, the last of each group is it)."""
    out = []
    for i in range(0, len(brick_names), replica):
        group = tuple(brick_names[i : i + replica])
        out.append(ReplicaSet(f"set{i // replica + 1}", group, group[-1] if arbiter else None))
    return out


def quorum(replica: int, options: dict[str, str] | None) -> int:
    """The fewest bricks of a set an operation that the client saw succeed has reached: AFR's client
    quorum (``cluster.quorum-type``: auto, the default from replica 3 on, is a majority, half with the
    first brick for an even count, taken as half; fixed is ``cluster.quorum-count``; none is 1)."""
    options = options or {}
    kind = (options.get("cluster.quorum-type") or ("auto" if replica >= 3 else "none")).lower()
    if kind == "fixed":
        try:
            return max(1, min(replica, int(options.get("cluster.quorum-count") or 1)))
        except ValueError:
            return 1
    if kind == "auto":
        return replica // 2 + 1 if replica % 2 else max(1, replica // 2)
    return 1


def covered(rset: ReplicaSet, unread: set[str], q: int) -> bool:
    """Does the union of the set's readable changelogs hold every operation of the window? True
    when fewer than ``q`` of its bricks are unread, counting the arbiter as unread."""
    missing = {b for b in rset.bricks if b in unread}
    if rset.arbiter:
        missing.add(rset.arbiter)
    return len(missing) < q


def record_key(r: Record) -> tuple:
    """What a raw record points at: two copies of one operation on two bricks have equal keys."""
    return tuple(getattr(r, f, None) for f in _KEY_FIELDS)


def merge_set_records(per_brick: list[list[Record]]) -> list[Record]:
    """The set's records: the first brick's (the reader's) in its order, then each other brick's
    records that no earlier brick holds as many times (a multiset union: each operation once)."""
    out: list[Record] = []
    have: dict[tuple, int] = {}
    for recs in per_brick:
        seen: dict[tuple, int] = {}
        for r in recs:
            k = record_key(r)
            seen[k] = seen.get(k, 0) + 1
            if seen[k] > have.get(k, 0):
                out.append(r)
        for k, n in seen.items():
            have[k] = max(have.get(k, 0), n)
    return out


def _counters_nonzero(value: bytes) -> bool:
    return any(value)


def owed_heals(bricks, volume: str, index_of: dict[str, int]) -> dict[str, int]:
    """``{brick: gfids it is owed}`` at a cut: what the heal index of each brick's snapshot says its
    peers are owed (:func:`owed_by`, through each of ``bricks``' ``owed``: a brick here or through its
    agent), the most any one says; bricks owed nothing are absent. A brick whose index cannot be read
    says nothing: it is down, and so is no reader anyway."""
    owed: dict[str, int] = {}
    for brick in bricks:
        try:
            said = brick.owed(volume, index_of)
        except (GlusterError, EpochsyncError, OSError):
            continue
        for peer, n in said.items():
            if n:
                owed[peer] = max(owed.get(peer, 0), int(n))
    return owed


def owed_by(brick: str, root: str, volume: str, index_of: dict[str, int]) -> dict[str, set[str]]:
    """``{peer: gfids}`` that brick ``brick``'s snapshot (at ``root``) says its peers are owed: every gfid
    in its ``.glusterfs/indices/xattrop`` whose handle there has a nonzero
    ``trusted.afr.<volume>-client-<k>`` counter owes brick k (``index_of``: brick → k, its 0-based place
    in the volume)."""
    names = {index_of[b]: b for b in index_of}
    owed: dict[str, set[str]] = {}
    index = os.path.join(root, ".glusterfs", "indices", "xattrop")
    try:
        entries = [n for n in os.listdir(index) if _GFID.fullmatch(n)]
    except OSError:
        return owed
    prefix = f"trusted.afr.{volume}-client-"
    for gfid in entries:
        handle = os.path.join(root, ".glusterfs", gfid[0:2], gfid[2:4], gfid)
        try:
            keys = os.listxattr(handle)
        except OSError:
            continue
        for key in keys:
            if not key.startswith(prefix):
                continue
            try:
                k = int(key[len(prefix) :])
                value = os.getxattr(handle, key)
            except (ValueError, OSError):
                continue
            peer = names.get(k)
            if peer is not None and peer != brick and _counters_nonzero(value):
                owed.setdefault(peer, set()).add(gfid)
    return owed


def started_s(changelog_dir: str) -> int | None:
    """When the brick's changelog last (re)started, in seconds: the newest ``HTIME.<t>`` index (a brick
    process starts a new one), or None."""
    try:
        found = [int(n[6:]) for n in os.listdir(os.path.join(changelog_dir, "htime")) if re.fullmatch(r"HTIME\.\d+", n)]
    except OSError:
        return None
    return max(found) if found else None


@dataclass
class Verdict:
    """Why each brick of a set may or may not read it at this cut."""

    reader: str
    refused: dict[str, str]  # brick → why not


def choose_reader(
    rset: ReplicaSet,
    *,
    previous: str | None,
    online: dict[str, bool] | None,
    owed_now: dict[str, int],
    owed_before: dict[str, int],
    started: dict[str, int | None],
    last_cut_s: float | None,
    source: str,
    epoch: int,
) -> Verdict:
    """The set's reader at this cut (see the module docstring); an EpochError naming every brick's
    reason when none qualifies. Down at the cut and owed heals now rule a brick out; owed heals at
    the last cut or a restart since (a brick healed meanwhile: its bytes are right, its changelog
    may not be, and the union covers that) only make it the last choice."""
    refused: dict[str, str] = {}
    soft: dict[str, str] = {}
    for b in rset.bricks:
        if b == rset.arbiter:
            refused[b] = "the arbiter (no data)"
        elif online is not None and online.get(b) is not True:
            # a brick of a server glusterd lost is not listed at all: as down as one listed offline
            refused[b] = "down at the cut (gluster volume status: " + ("offline)" if b in online else "not listed)")
        elif owed_now.get(b):
            refused[b] = f"owed heals of {owed_now[b]} gfids at this cut"
        elif owed_before.get(b):
            soft[b] = f"owed heals of {owed_before[b]} gfids at the last cut"
        elif last_cut_s is not None and (started.get(b) or 0) >= int(last_cut_s):
            soft[b] = "its brick process (re)started since the last cut"
    fit = [b for b in rset.data_bricks if b not in refused and b not in soft]
    if not fit:
        fit = [b for b in rset.data_bricks if b not in refused]
    if not fit:
        why = "; ".join(f"{b}: {w}" for b, w in refused.items())
        raise EpochError(
            f"source {source}: cut {epoch}: no brick of {rset.name} can be read ({why}); the cut is taken again "
            f"once a brick of the set is up and healed (gluster volume heal VOLUME info)"
        )
    return Verdict(previous if previous in fit else fit[0], {**soft, **refused})
