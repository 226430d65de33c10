"""A brick of a cut, read where it is: here, or on its server through the server's agent.

A cut's publish reads each brick's snapshot (and, for the hints, the live brick's changelog):
the changelog after the last cut's position, the files the records name by gfid, the byte
ranges two cuts of a file do not share, the AFR heal index, or the whole tree when the cut is
walked. Everything it needs from a brick is one of the requests of :class:`LocalBrick`, each a
batch, so that a brick on another server costs a request per batch and not per system call:

- :class:`LocalBrick`: the snapshot at a path on this host (every brick of the single-host
  volume, and what an agent runs for each request);
- :class:`AgentBrick`: the same requests sent to the brick's agent (``POST /v1/brick``), which
  runs them with a :class:`LocalBrick` on its own snapshot and answers in JSON
  (:func:`serve_request`). The Airflow worker then needs no access to the bricks, no root and
  no mount: what it reads of a brick comes through the agent, signed, confined to the agent's
  snapshots and its bricks' live changelog folders.

The changelog's own refusals (:class:`~epochsync.sources.gluster.changelog.ChangelogGap`, a
GlusterError, an EpochError or an OSError) cross the agent as what they are, so that a cut
decides on a remote brick as on a local one (walk it, or cover it by the set's other bricks).
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

from epochsync.core.errors import EpochError
from epochsync.core.gluster import GlusterError
from epochsync.core.schema import Record
from epochsync.formats.gluster import scan_records
from epochsync.sources.gluster.backend import BrickView, Node, changed_file, walk_brick
from epochsync.sources.gluster.changelog import (
    CHANGELOG_DIR,
    ChangelogGap,
    Position,
    Slice,
    end_position,
    live_records,
    read_slice,
    rolled_files,
)
from epochsync.sources.gluster.replicas import owed_by, started_s

#: threads that look gfids up in a snapshot, from this many gfids on (a large epoch: a first
#: cut, an untar); below it one thread is quicker than starting a pool
LOOKUP_THREADS = 4
LOOKUP_THREADED_FROM = 512
#: gfids per request to an agent (a request body is at most 1 MiB; a gfid is 39 bytes of JSON)
BATCH = 4000

#: the refusals a request carries back as themselves (anything else is the agent's failure)
_RAISED: dict[str, type[Exception]] = {
    "gap": ChangelogGap,
    "gluster": GlusterError,
    "epoch": EpochError,
    "os": OSError,
}


def _kind_of(exc: Exception) -> str | None:
    for kind, cls in _RAISED.items():
        if isinstance(exc, cls):
            return kind
    return None


class LocalBrick:
    """A brick's directory in a cut (``root``), read here; ``live`` is the live brick (the hints)."""

    remote = False

    def __init__(self, name: str, root: str, live: str | None = None):
        self.name = name
        self.root = root
        self.live = live
        self.view = BrickView(name, root)

    @property
    def changelog_dir(self) -> str:
        """The snapshot's changelog folder."""
        return os.path.join(self.root, CHANGELOG_DIR)

    def exists(self) -> bool:
        """Is the snapshot still there (not purged)?"""
        return os.path.isdir(self.root)

    # ------------------------------------------------------------------ files by gfid
    def lookup_many(self, gfids: list[str], *, full: bool = True) -> list[Node | None]:
        """:meth:`BrickView.lookup` of each gfid, in order (in threads when there are many: a look-up is
        a dozen system calls, which release the GIL)."""
        if len(gfids) < LOOKUP_THREADED_FROM:
            return [self.view.lookup(g, full=full) for g in gfids]
        chunks = [gfids[i : i + 256] for i in range(0, len(gfids), 256)]
        with ThreadPoolExecutor(LOOKUP_THREADS, thread_name_prefix="epochsync-lookup") as pool:
            parts = pool.map(lambda c: [self.view.lookup(g, full=full) for g in c], chunks)
            return [n for part in parts for n in part]

    def changed_files(self, old: LocalBrick | AgentBrick, items: list[tuple[str, int]]) -> list[list | None]:
        """For each ``(gfid, size at this cut)`` of a file that is not sharded, the ranges whose bytes
        may differ from ``old`` (the same brick's last cut): ``[(offset, length), ...]``, or None when
        the two could not be compared (absent there, a linkto file, sharded, unreadable: read it whole)."""
        assert isinstance(old, LocalBrick)
        return [changed_file(old.view.handle(g), self.view.handle(g), size) for g, size in items]

    def gfids(self) -> list[str]:
        """Every gfid of the volume this brick holds (a walk)."""
        return [g for g, _p, _n, _d in walk_brick(self.view)]

    # ------------------------------------------------------------------ the changelog
    def changelog_end(self) -> tuple[Position, list[Record]]:
        """The position at the end of the snapshot's changelog, and its live file's records (a first cut)."""
        return end_position(self.changelog_dir), live_records(self.changelog_dir)

    def changelog_slice(self, at: Position) -> Slice:
        """:func:`~epochsync.sources.gluster.changelog.read_slice` of the snapshot after ``at``."""
        return read_slice(self.changelog_dir, at)

    def changelog_readable(self, at: dict | None) -> list[Record]:
        """The records of the snapshot's changelog a walk still reads (the slice's, short of its checks):
        they name what the walk must look at anyway, and feed the half-way rename check."""
        after = (at or {}).get("rolled")
        cdir = self.changelog_dir
        paths = [p for ts, p in rolled_files(cdir) if after is None or ts >= after]
        paths.append(os.path.join(cdir, "CHANGELOG"))
        out: list[Record] = []
        for p in paths:
            try:
                with open(p, "rb") as f:
                    out.extend(r for _, r in scan_records(f.read())[0])
            except (OSError, ValueError):
                continue
        return out

    def hints(self) -> list[Record]:
        """What the live brick's changelog logged after the snapshot's end (see ``stages.cut``)."""
        if not self.live:
            raise EpochError(f"brick {self.name}: no live brick to read the hints from")
        return read_slice(os.path.join(self.live, CHANGELOG_DIR), end_position(self.changelog_dir)).records

    def owed(self, volume: str, index_of: dict[str, int]) -> dict[str, int]:
        """``{peer brick: gfids this brick's heal index says it is owed}`` (see ``replicas.owed_by``)."""
        return {b: len(g) for b, g in owed_by(self.name, self.root, volume, index_of).items()}

    def started(self) -> int | None:
        """When the brick's changelog last (re)started (``replicas.started_s``)."""
        return started_s(self.changelog_dir)


class AgentBrick:
    """A brick's snapshot on its server, read through that server's agent (:class:`LocalBrick`'s requests)."""

    remote = True

    def __init__(self, name: str, client, brick: str, snapshot: str):
        self.name = name
        self.client = client  # epochsync.agent.client.AgentClient
        self.brick = brick  # the brick's path on its server
        self.snapshot = snapshot
        self.root = f"{client.url}/{snapshot}"  # what messages name it by

    def _call(self, op: str, **args):
        doc = self.client.brick(op, self.brick, self.snapshot, args)
        if "raise" in doc:
            kind, message = doc["raise"].get("kind"), doc["raise"].get("message", "")
            raise _RAISED.get(kind, EpochError)(f"{message} (on agent {self.client.url})")
        return doc["result"]

    def exists(self) -> bool:
        """Is the snapshot still there, as its agent says? (An agent out of reach: no.)"""
        from epochsync.agent.protocol import AgentError

        try:
            return self.snapshot in self.client.snapshots(self.brick)
        except AgentError:
            return False

    def lookup_many(self, gfids: list[str], *, full: bool = True) -> list[Node | None]:
        """:meth:`LocalBrick.lookup_many` on the agent, in batches."""
        out: list[Node | None] = []
        for i in range(0, len(gfids), BATCH):
            docs = self._call("lookup", gfids=gfids[i : i + BATCH], full=full)
            out.extend(None if d is None else node_from_doc(d) for d in docs)
        return out

    def changed_files(self, old: LocalBrick | AgentBrick, items: list[tuple[str, int]]) -> list[list | None]:
        """:meth:`LocalBrick.changed_files` on the agent: ``old`` is a snapshot of the same brick there."""
        assert isinstance(old, AgentBrick) and old.client.url == self.client.url and old.brick == self.brick
        out: list[list | None] = []
        for i in range(0, len(items), BATCH):
            part = self._call("changed", old=old.snapshot, items=[list(x) for x in items[i : i + BATCH]])
            out.extend(None if r is None else [tuple(x) for x in r] for r in part)
        return out

    def gfids(self) -> list[str]:
        """:meth:`LocalBrick.gfids` on the agent."""
        return self._call("walk")

    def changelog_end(self) -> tuple[Position, list[Record]]:
        """:meth:`LocalBrick.changelog_end` on the agent."""
        doc = self._call("end")
        return Position.from_dict(doc["position"]), [Record.from_dict(r) for r in doc["live"]]

    def changelog_slice(self, at: Position) -> Slice:
        """:meth:`LocalBrick.changelog_slice` on the agent."""
        doc = self._call("slice", at=at.to_dict())
        return Slice(
            records=[Record.from_dict(r) for r in doc["records"]],
            live=[Record.from_dict(r) for r in doc["live"]],
            position=Position.from_dict(doc["position"]),
            files=list(doc["files"]),
        )

    def changelog_readable(self, at: dict | None) -> list[Record]:
        """:meth:`LocalBrick.changelog_readable` on the agent."""
        return [Record.from_dict(r) for r in self._call("readable", at=at)]

    def hints(self) -> list[Record]:
        """:meth:`LocalBrick.hints` on the agent (its live brick)."""
        return [Record.from_dict(r) for r in self._call("hints")]

    def owed(self, volume: str, index_of: dict[str, int]) -> dict[str, int]:
        """:meth:`LocalBrick.owed` on the agent."""
        return self._call("owed", volume=volume, index_of=index_of)

    def started(self) -> int | None:
        """:meth:`LocalBrick.started` on the agent."""
        return self._call("started")


# --------------------------------------------------------------------------- the wire


def node_doc(n: Node) -> dict:
    """A Node as JSON values (xattr values in base64)."""
    d = asdict(n)
    d["xattrs"] = {k: base64.b64encode(v).decode() for k, v in n.xattrs.items()}
    d["names"] = [list(x) for x in n.names]
    return d


def node_from_doc(d: dict) -> Node:
    """The Node :func:`node_doc` wrote."""
    d = dict(d)
    d["xattrs"] = {k: base64.b64decode(v) for k, v in d["xattrs"].items()}
    d["names"] = [tuple(x) for x in d["names"]]
    return Node(**d)


def _records(recs: list[Record]) -> list[dict]:
    return [r.to_dict() for r in recs]


def serve_request(op: str, brick: LocalBrick, args: dict, old: Callable[[str], LocalBrick], check_gfid) -> dict:
    """What the agent answers to ``POST /v1/brick`` op ``op`` on ``brick`` (its snapshot there):
    ``{"result": ...}``, or ``{"raise": {"kind", "message"}}`` for a refusal the caller raises as
    itself. ``old(name)`` is another snapshot of the same brick (checked by the agent);
    ``check_gfid`` refuses a string that is not a gfid. Raises ValueError for a malformed request."""
    try:
        result = _serve(op, brick, args, old, check_gfid)
    except (ChangelogGap, GlusterError, EpochError, OSError) as exc:
        kind = _kind_of(exc)
        return {"raise": {"kind": kind, "message": str(exc)}}
    return {"result": result}


def _serve(op: str, brick: LocalBrick, args: dict, old: Callable[[str], LocalBrick], check_gfid):
    if op == "lookup":
        gfids = args.get("gfids")
        if not isinstance(gfids, list) or len(gfids) > BATCH:
            raise ValueError(f"lookup: gfids is a list of at most {BATCH}")
        for g in gfids:
            check_gfid(g)
        return [None if n is None else node_doc(n) for n in brick.lookup_many(gfids, full=bool(args.get("full", True)))]
    if op == "changed":
        items = args.get("items")
        if not isinstance(items, list) or len(items) > BATCH:
            raise ValueError(f"changed: items is a list of at most {BATCH} [gfid, size]")
        pairs = []
        for it in items:
            if not (isinstance(it, list) and len(it) == 2 and isinstance(it[1], int) and it[1] >= 0):
                raise ValueError("changed: each item is [gfid, size]")
            check_gfid(it[0])
            pairs.append((it[0], it[1]))
        ranges = brick.changed_files(old(str(args.get("old"))), pairs)
        return [None if r is None else [list(x) for x in r] for r in ranges]
    if op == "walk":
        return brick.gfids()
    if op == "end":
        position, live = brick.changelog_end()
        return {"position": position.to_dict(), "live": _records(live)}
    if op == "slice":
        sl = brick.changelog_slice(Position.from_dict(args["at"]))
        return {
            "records": _records(sl.records),
            "live": _records(sl.live),
            "position": sl.position.to_dict(),
            "files": [os.path.basename(f) for f in sl.files],
        }
    if op == "readable":
        return _records(brick.changelog_readable(args.get("at")))
    if op == "hints":
        return _records(brick.hints())
    if op == "owed":
        index_of = args.get("index_of")
        if not isinstance(index_of, dict) or not all(isinstance(v, int) for v in index_of.values()):
            raise ValueError("owed: index_of is {brick: its place in the volume}")
        return brick.owed(str(args.get("volume")), index_of)
    if op == "started":
        return brick.started()
    raise ValueError(f"no such brick request: {op!r}")
