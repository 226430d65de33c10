"""The sequential oracle: replay canonical records one at a time on an in-memory file system.

It is the reference the Spark merge is checked against (DESIGN section 5: "the result
must equal replaying every record one by one on snapshot E-1"), and the state the
simulator drives. Pure Python, no Spark.

Contract (what the merge must reproduce)::

    rows = replay(root_fid, prev_rows, records)   # snapshot E from snapshot E-1 + records of E

``prev_rows``/``rows`` are snapshot rows: dicts keyed by :data:`epochsync.core.model.SNAPSHOT_FIELDS`
holding plain Python values that ``spark.createDataFrame([tuple(r[f] for f in SNAPSHOT_FIELDS)
for r in rows], snapshot_struct_type())`` accepts, sorted by fid:

- ``links``: sorted list of ``(pfid, name)``; the root has none.
- ``xattrs``: list of ``(name, bytes)`` sorted by name.
- ``layout``: ``(stripe_size, stripe_count, [(ost, oid), ...])`` or ``None``.
- ``objects``: sorted list of ``(ost, oid, version, size)``: the last version a ``WRITE``
  reported per object, and its length as that record gave it (None if it did not).

The replay order (MDT and OST clocks are independent, so a record's ``time_ns`` only decides
where the changelog says nothing else; see ``docs/INTERNALS.md``, "Merge: the replay order"):

- **Causal time** (:func:`causal_times`), per fid (a record is about its ``tfid``, a rename
  about its ``sfid``). ``ctime`` of a record about fid X logged by server S is the highest of:
  the ``time_ns`` (null = 0) of every record about X that S logged up to it, in index order;
  for every operation on X that spans servers (a ``cookie`` shared by records about X of two
  or more servers) with a record on S at or before it, the operation's time, the highest
  ``time_ns`` of its records, plus 1 ns when the record comes after the operation's record
  on S. A fid's records are ranked by ``(ctime, server, index)``: within a server the index
  orders (a clock that steps back changes nothing), an operation's records rank together,
  and what a server logs about the fid after an operation ranks after what the operation's
  other servers logged about it before.
- **Names** (namespace records: ``CREAT MKDIR MKNOD SLINK HLINK UNLNK RMDIR RENME``) are
  replayed in an order that keeps every server's index order and in which every record
  applies. Every such order ends in the same namespace: a fid holds ``(pfid, name)`` at E iff
  it held it at E-1 plus the adds minus the removes of that name for that fid make 1 (in
  any order where each applies, the count goes 0, 1, 0, ... alternately). :func:`replay`
  finds one greedily: among the servers' next namespace records, the first by rank that
  applies goes next. A record also waits when applying it now would delete a fid (remove
  its last link) that a waiting record still links, renames or uses as a parent; when it
  would leave the remaining adds and removes of one of its names with no consistent order;
  or when a rename would overwrite a name the record does not say it overwrites (``tfid``),
  unless no other record can go (Gluster logs no overwritten fid). When no server's next
  record can go, :class:`InconsistentRecord` names every waiting record and why.
- **Values** (every other record) are replayed after the names, by rank; a fid's values
  therefore start from its creator's, then follow its records by rank.

The rules:

- ``CREAT MKDIR MKNOD SLINK`` create ``tfid`` with one link ``(pfid, name)``, the record's
  mode/uid/gid/layout/symlink and the times it carries; size 0. Type: CREAT file, MKDIR
  dir, SLINK symlink, MKNOD from the mode's type bits (``other`` unless regular/dir/link).
- ``HLINK`` adds ``(pfid, name)`` to ``tfid``; ``UNLNK``/``RMDIR`` remove it.
- ``RENME`` moves ``sfid`` from ``(spfid, sname)`` to ``(pfid, name)``; the fid that held
  ``(pfid, name)`` (``tfid``) loses that name. Renaming a name onto itself, or onto
  another name of the same fid, changes nothing (POSIX).
- A fid exists iff it has a link or is the root: losing the last link deletes it.
- ``SATTR`` sets the mode/uid/gid/size/times it carries (a mode without type bits keeps
  the node's); ``TRUNC`` sets size (and times it carries).
- ``MTIME``/``CTIME``/``ATIME`` set that time to the value carried, else to ``time_ns``.
- ``XATTR`` sets ``xattr_name`` to ``xattr_value``; a null value removes it.
- ``WRITE`` with ``object``: extents are object offsets of that object of the file's
  layout (an unstriped file, layout ``None``, has one object whose offsets are file
  offsets); they map to file offsets through RAID-0 (:mod:`epochsync.core.layout`). Size grows
  to the highest written byte; the object's version is recorded. An OST ``WRITE`` with no
  extents only reports a new object version (the simulator emits one when a truncate
  shrinks an object). ``WRITE`` without ``object``: extents are file offsets.
- ``LYOUT`` replaces the layout (versions of objects no longer in it are forgotten).
- ``EPOCH MARK OPEN CLOSE`` and the ignored Lustre types change nothing.

A record that does not fit the model (a create over an existing name, an unlink of a
name that is not there, a rename into its own subtree, a write to a fid never seen...)
raises :class:`InconsistentRecord` naming the server, index, type and what is wrong.
Value records about a fid that this replay deleted (writes or attribute changes reaching
an open-unlinked file) are ignored, as the replica can never hold them.

With ``track_data=True`` every file node also holds its bytes (``Node.data``), kept as
long as the size: truncation cuts or zero-extends it, writes zero-extend it (the
simulator fills in the written bytes; records carry no bytes).
"""

from __future__ import annotations

import base64
import stat
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from epochsync.core.errors import EpochsyncError
from epochsync.core.layout import layout_object_range_to_file
from epochsync.core.model import DIR, FILE, OTHER, SNAPSHOT_FIELDS, SYMLINK
from epochsync.core.schema import Layout, LayoutObject, Record

#: mode of the root when no snapshot row describes it
ROOT_MODE = stat.S_IFDIR | 0o755

#: record types that change nothing in the model
NO_OP_TYPES = frozenset({"EPOCH", "MARK", "OPEN", "CLOSE"})

_CREATE_TYPES = {"CREAT": FILE, "MKDIR": DIR, "SLINK": SYMLINK, "MKNOD": None}
_TIME_TYPES = {"MTIME": "mtime_ns", "CTIME": "ctime_ns", "ATIME": "atime_ns"}


class InconsistentRecord(EpochsyncError):
    """A record that cannot apply to the namespace as replayed so far."""

    def __init__(self, record: Record, reason: str):
        self.record = record
        self.reason = reason
        super().__init__(
            f"{record.server} index {record.index} ({record.type}, epoch {record.epoch}): {reason}; "
            "the changelog does not match the namespace (missing or reordered records?)"
        )


def type_of_mode(mode: int | None) -> str:
    """Snapshot type of a mode's file-type bits."""
    if mode is None:
        return OTHER
    if stat.S_ISREG(mode):
        return FILE
    if stat.S_ISDIR(mode):
        return DIR
    if stat.S_ISLNK(mode):
        return SYMLINK
    return OTHER


@dataclass(slots=True)
class Node:
    """One fid of the model."""

    fid: str
    type: str
    links: set[tuple[str, str]] = field(default_factory=set)
    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    size: int | None = 0
    atime_ns: int | None = None
    mtime_ns: int | None = None
    ctime_ns: int | None = None
    xattrs: dict[str, bytes] = field(default_factory=dict)
    symlink: str | None = None
    layout: Layout | None = None
    #: (ost, oid) -> (last reported version, its length as the record gave it)
    objects: dict[tuple[str, str], tuple[str | None, int | None]] = field(default_factory=dict)
    #: the file's bytes when the model tracks data, else None
    data: bytearray | None = None

    def row(self) -> dict[str, Any]:
        """This node as a snapshot row (see the module docstring)."""
        lay = None
        if self.layout is not None:
            lay = (self.layout.stripe_size, self.layout.stripe_count, [(o.ost, o.oid) for o in self.layout.objects])
        return {
            "fid": self.fid,
            "type": self.type,
            "links": sorted(self.links),
            "mode": self.mode,
            "uid": self.uid,
            "gid": self.gid,
            "size": self.size,
            "atime_ns": self.atime_ns,
            "mtime_ns": self.mtime_ns,
            "ctime_ns": self.ctime_ns,
            "xattrs": sorted(self.xattrs.items()),
            "symlink": self.symlink,
            "layout": lay,
            "objects": sorted((ost, oid, v, n) for (ost, oid), (v, n) in self.objects.items()),
        }


class FsModel:
    """An in-memory file system: fid → :class:`Node`, plus the directory entries."""

    def __init__(self, root_fid: str, *, track_data: bool = False):
        self.root_fid = root_fid
        self.track_data = track_data
        self.nodes: dict[str, Node] = {root_fid: Node(root_fid, DIR, mode=ROOT_MODE, uid=0, gid=0)}
        #: directory fid -> {name: fid}: the entries of every non-empty directory
        self.dirents: dict[str, dict[str, str]] = {}
        #: fids this model deleted; later records about them are ignored
        self.deleted: set[str] = set()

    # ------------------------------------------------------------------ loading and dumping

    @classmethod
    def from_snapshot_rows(
        cls, root_fid: str, rows: Iterable[Mapping[str, Any]], *, track_data: bool = False
    ) -> FsModel:
        """A model holding the namespace of snapshot rows (dicts, or Spark ``Row``s).

        Without a row for ``root_fid`` the root gets default attributes.
        """
        model = cls(root_fid, track_data=track_data)
        for r in rows:
            node = _node_from_row(r)
            if node.fid in model.nodes and node.fid != root_fid:
                raise EpochsyncError(f"snapshot has two rows for fid {node.fid}")
            if track_data and node.type == FILE:
                node.data = bytearray(node.size or 0)
            model.nodes[node.fid] = node
        for node in model.nodes.values():
            for pfid, name in node.links:
                names = model.dirents.setdefault(pfid, {})
                if name in names:
                    raise EpochsyncError(f"snapshot: entry {name!r} in {pfid} is held by {names[name]} and {node.fid}")
                names[name] = node.fid
        return model

    def snapshot_rows(self) -> list[dict[str, Any]]:
        """Every existing fid as a snapshot row, sorted by fid."""
        return list(self.iter_snapshot_rows())

    def iter_snapshot_rows(self) -> Iterator[dict[str, Any]]:
        """:meth:`snapshot_rows` one at a time (large namespaces)."""
        for f in sorted(self.nodes):
            yield self.nodes[f].row()

    # ------------------------------------------------------------------ queries

    def lookup(self, pfid: str, name: str) -> str | None:
        """The fid named ``name`` in directory ``pfid``, or None."""
        names = self.dirents.get(pfid)
        return None if names is None else names.get(name)

    def children(self, pfid: str) -> int:
        """How many entries directory ``pfid`` holds."""
        return len(self.dirents.get(pfid, ()))

    def entries_of(self, pfid: str) -> dict[str, str]:
        """``{name: fid}`` of directory ``pfid`` (do not mutate)."""
        return self.dirents.get(pfid, {})

    def is_ancestor(self, ancestor: str, fid: str) -> bool:
        """True when ``ancestor`` is ``fid`` or a directory above it."""
        cur = fid
        while True:
            if cur == ancestor:
                return True
            node = self.nodes.get(cur)
            if node is None or not node.links or node.type != DIR:
                return False
            cur = next(iter(node.links))[0]

    def paths(self) -> dict[str, str]:
        """Every path (relative to the root, no leading ``/``) → fid. Hard links give several paths."""
        dir_path: dict[str, str] = {self.root_fid: ""}

        def path_of_dir(fid: str) -> str:
            chain = []
            cur = fid
            while cur not in dir_path:
                pfid, name = next(iter(self.nodes[cur].links))
                chain.append((cur, name))
                cur = pfid
            base = dir_path[cur]
            for f, name in reversed(chain):
                base = f"{base}/{name}" if base else name
                dir_path[f] = base
            return base

        out = {}
        for pfid, names in self.dirents.items():
            parent = path_of_dir(pfid)
            for name, fid in names.items():
                out[f"{parent}/{name}" if parent else name] = fid
        return out

    # ------------------------------------------------------------------ applying records

    def apply(self, r: Record) -> None:
        """Apply one canonical record (see the module docstring for the rules)."""
        t = r.type
        if t in NO_OP_TYPES:
            return
        if t in _CREATE_TYPES:
            self._create(r)
        elif t == "HLINK":
            node = self._node(r, r.tfid)
            if node is None:
                return
            if node.type == DIR:
                raise InconsistentRecord(r, f"hard link to directory {r.tfid}")
            self._add_link(r, node, r.pfid, r.name)
        elif t in ("UNLNK", "RMDIR"):
            self._unlink(r)
        elif t == "RENME":
            self._rename(r)
        elif t == "SATTR":
            node = self._node(r, r.tfid)
            if node is None:
                return
            if r.mode is not None:
                node.mode = r.mode if stat.S_IFMT(r.mode) else stat.S_IFMT(node.mode or 0) | r.mode
            if r.uid is not None:
                node.uid = r.uid
            if r.gid is not None:
                node.gid = r.gid
            if r.size is not None:
                self._resize(node, r.size)
            self._set_times(node, r)
        elif t == "TRUNC":
            node = self._node(r, r.tfid)
            if node is None:
                return
            if r.size is None:
                raise InconsistentRecord(r, "TRUNC without a size")
            self._resize(node, r.size)
            self._set_times(node, r)
        elif t in _TIME_TYPES:
            node = self._node(r, r.tfid)
            if node is None:
                return
            self._set_times(node, r)
            attr = _TIME_TYPES[t]
            if getattr(r, attr) is None:
                if r.time_ns is None:
                    raise InconsistentRecord(r, f"{t} with neither {attr} nor time_ns")
                setattr(node, attr, r.time_ns)
        elif t == "XATTR":
            node = self._node(r, r.tfid)
            if node is None:
                return
            if not r.xattr_name:
                raise InconsistentRecord(r, "XATTR without xattr_name")
            if r.xattr_value is None:
                node.xattrs.pop(r.xattr_name, None)
            else:
                node.xattrs[r.xattr_name] = bytes(r.xattr_value)
        elif t == "WRITE":
            self._write(r)
        elif t == "LYOUT":
            node = self._node(r, r.tfid)
            if node is None:
                return
            node.layout = r.layout
            if r.layout is not None:
                keep = {(o.ost, o.oid) for o in r.layout.objects}
                node.objects = {k: v for k, v in node.objects.items() if k in keep}
        # other Lustre types (HSM, MIGRT, ...) are kept in the changelog and ignored

    def _node(self, r: Record, fid: str | None) -> Node | None:
        """The node ``fid`` names; None (ignore the record) when this model deleted it."""
        if not fid:
            raise InconsistentRecord(r, "no target fid (tfid)")
        node = self.nodes.get(fid)
        if node is None:
            if fid in self.deleted:
                return None
            raise InconsistentRecord(r, f"fid {fid} does not exist")
        return node

    def _dir(self, r: Record, pfid: str | None) -> Node:
        if not pfid:
            raise InconsistentRecord(r, "no parent fid (pfid)")
        node = self.nodes.get(pfid)
        if node is None:
            raise InconsistentRecord(r, f"parent {pfid} does not exist")
        if node.type != DIR:
            raise InconsistentRecord(r, f"parent {pfid} is a {node.type}, not a directory")
        return node

    def _add_link(self, r: Record, node: Node, pfid: str | None, name: str | None) -> None:
        self._dir(r, pfid)
        if not name:
            raise InconsistentRecord(r, "no entry name")
        names = self.dirents.setdefault(pfid, {})
        held = names.get(name)
        if held is not None:
            raise InconsistentRecord(r, f"name {name!r} in {pfid} already names {held}")
        names[name] = node.fid
        node.links.add((pfid, name))

    def _remove_entry(self, node: Node, link: tuple[str, str]) -> None:
        node.links.discard(link)
        names = self.dirents[link[0]]
        del names[link[1]]
        if not names:
            del self.dirents[link[0]]

    def _drop_link(self, node: Node, link: tuple[str, str]) -> None:
        self._remove_entry(node, link)
        if not node.links and node.fid != self.root_fid:
            del self.nodes[node.fid]
            self.deleted.add(node.fid)

    def _create(self, r: Record) -> None:
        if not r.tfid:
            raise InconsistentRecord(r, "no fid to create (tfid)")
        if r.tfid in self.nodes or r.tfid in self.deleted:
            raise InconsistentRecord(r, f"fid {r.tfid} already exists (fids are never reused)")
        kind = _CREATE_TYPES[r.type] or type_of_mode(r.mode)
        node = Node(
            r.tfid,
            kind,
            mode=r.mode,
            uid=r.uid,
            gid=r.gid,
            size=0,
            symlink=r.symlink if kind == SYMLINK else None,
            layout=r.layout,
        )
        if self.track_data and kind == FILE:
            node.data = bytearray()
        self._add_link(r, node, r.pfid, r.name)
        self.nodes[node.fid] = node
        self._set_times(node, r)

    def _unlink(self, r: Record) -> None:
        link = (r.pfid, r.name)
        held = self.lookup(*link)
        if held is None:
            raise InconsistentRecord(r, f"no entry {r.name!r} in {r.pfid} to remove")
        if r.tfid and held != r.tfid:
            raise InconsistentRecord(r, f"entry {r.name!r} in {r.pfid} names {held}, not {r.tfid}")
        node = self.nodes[held]
        if r.type == "RMDIR":
            if node.type != DIR:
                raise InconsistentRecord(r, f"RMDIR of {held}, which is a {node.type}")
            if self.children(held):
                raise InconsistentRecord(r, f"RMDIR of non-empty directory {held}")
        elif node.type == DIR:
            raise InconsistentRecord(r, f"UNLNK of directory {held} (directories go with RMDIR)")
        self._drop_link(node, link)

    def _rename(self, r: Record) -> None:
        if not r.sfid:
            raise InconsistentRecord(r, "RENME without the renamed fid (sfid)")
        old = (r.spfid, r.sname)
        new = (r.pfid, r.name)
        held = self.lookup(*old)
        if held is None:
            if r.sfid in self.deleted:
                return
            raise InconsistentRecord(r, f"no entry {r.sname!r} in {r.spfid} to rename")
        if held != r.sfid:
            raise InconsistentRecord(r, f"entry {r.sname!r} in {r.spfid} names {held}, not {r.sfid}")
        node = self.nodes[held]
        self._dir(r, r.pfid)
        if not r.name:
            raise InconsistentRecord(r, "RENME without a new name")
        target = self.lookup(*new)
        if target == node.fid:
            # onto itself, or onto another hard link of the same file: POSIX does nothing
            return
        if target is None and r.tfid and r.tfid not in self.deleted and r.tfid in self.nodes:
            raise InconsistentRecord(r, f"overwritten fid {r.tfid} does not hold {r.name!r} in {r.pfid}")
        if target is not None and r.tfid and target != r.tfid:
            raise InconsistentRecord(r, f"{r.name!r} in {r.pfid} names {target}, not the overwritten {r.tfid}")
        if node.type == DIR and self.is_ancestor(node.fid, r.pfid):
            raise InconsistentRecord(r, f"rename of directory {node.fid} into its own subtree")
        if target is not None:
            victim = self.nodes[target]
            if (victim.type == DIR) != (node.type == DIR):
                raise InconsistentRecord(r, f"rename of a {node.type} over a {victim.type} ({target})")
            if victim.type == DIR and self.children(target):
                raise InconsistentRecord(r, f"rename over non-empty directory {target}")
            self._drop_link(victim, new)
        # move the entry: drop first so the new entry never collides with the old one
        self._remove_entry(node, old)
        self._add_link(r, node, *new)

    def _resize(self, node: Node, size: int) -> None:
        node.size = size
        if node.data is not None:
            if size < len(node.data):
                del node.data[size:]
            else:
                node.data.extend(bytes(size - len(node.data)))

    def _set_times(self, node: Node, r: Record) -> None:
        if r.atime_ns is not None:
            node.atime_ns = r.atime_ns
        if r.mtime_ns is not None:
            node.mtime_ns = r.mtime_ns
        if r.ctime_ns is not None:
            node.ctime_ns = r.ctime_ns

    def _write(self, r: Record) -> None:
        node = self._node(r, r.tfid)
        if node is None:
            return
        if node.type != FILE:
            raise InconsistentRecord(r, f"WRITE to {node.fid}, which is a {node.type}")
        extents = r.extents or ()
        if r.object is not None:
            key = (r.object.ost, r.object.oid)
            if node.layout is None:
                index = 0  # unstriped: one object, file offsets
            else:
                try:
                    index = node.layout.objects.index(LayoutObject(*key))
                except ValueError:
                    raise InconsistentRecord(
                        r, f"object {key[0]}/{key[1]} is not in the layout of {node.fid}"
                    ) from None
            end = 0
            for e in extents:
                for fo, n in layout_object_range_to_file(node.layout, index, e.offset, e.length):
                    end = max(end, fo + n)
            node.objects[key] = (r.object.version, r.object.size)
        else:
            end = max((e.offset + e.length for e in extents if e.length > 0), default=0)
        if end > (node.size or 0):
            self._resize(node, end)
        self._set_times(node, r)


#: record types that change the namespace; the others change values (or nothing)
NAMESPACE_TYPES = frozenset({*_CREATE_TYPES, "HLINK", "UNLNK", "RMDIR", "RENME"})


def replay(root_fid: str, prev_rows: Iterable[Mapping[str, Any]], records: Iterable[Record]) -> list[dict[str, Any]]:
    """Snapshot rows after applying ``records`` to the snapshot ``prev_rows`` in the replay
    order of the module docstring (names first, in an order where each applies; then values
    by causal rank)."""
    model = FsModel.from_snapshot_rows(root_fid, prev_rows)
    records = list(records)
    rank = _ranks(records)
    _replay_names(model, [(rank[i], r) for i, r in enumerate(records) if r.type in NAMESPACE_TYPES])
    for _, r in sorted((rank[i], r) for i, r in enumerate(records) if r.type not in NAMESPACE_TYPES):
        model.apply(r)
    return model.snapshot_rows()


def record_fid(r: Record) -> str | None:
    """The fid a record is about: ``sfid`` for a rename, ``tfid`` otherwise."""
    return r.sfid if r.type == "RENME" else r.tfid


def causal_times(records: list[Record]) -> list[int]:
    """``ctime`` of each record of ``records`` (same positions): see the module docstring.

    The Spark merge computes the same column (:func:`epochsync.stages.merge.causal_time`).
    """
    times = [r.time_ns if r.time_ns is not None else 0 for r in records]
    servers: dict[tuple, set[str]] = {}
    op_time: dict[tuple, int] = {}
    for r, t in zip(records, times, strict=True):
        if r.cookie is not None:
            op = (record_fid(r), r.cookie)
            servers.setdefault(op, set()).add(r.server)
            op_time[op] = max(op_time.get(op, t), t)
    op_time = {op: t for op, t in op_time.items() if len(servers[op]) > 1}
    chains: dict[tuple, list[int]] = {}  # (fid, server) -> positions
    for i, r in enumerate(records):
        chains.setdefault((record_fid(r), r.server), []).append(i)
    out = [0] * len(records)
    for positions in chains.values():
        positions.sort(key=lambda i: records[i].index)
        high: int | None = None  # the server's clock for this fid so far, raised by operations
        after: int | None = None  # 1 ns past the latest operation on this fid the server took part in
        for i in positions:
            r = records[i]
            op = op_time.get((record_fid(r), r.cookie)) if r.cookie is not None else None
            x = times[i] if op is None else max(times[i], op)
            high = x if high is None else max(high, x)
            out[i] = high if after is None else max(high, after)
            if op is not None:
                after = op + 1 if after is None else max(after, op + 1)
    return out


def sort_records(records: Iterable[Record]) -> list[Record]:
    """``records`` by causal rank ``(ctime, server, index)`` (see the module docstring)."""
    records = list(records)
    rank = _ranks(records)
    return [r for _, r in sorted((rank[i], r) for i, r in enumerate(records))]


def _ranks(records: list[Record]) -> list[tuple[int, str, int, int]]:
    # the position breaks the tie of a Lustre EPOCH and the MARK it repeats (never compares records)
    return [(t, r.server, r.index, i) for i, (t, r) in enumerate(zip(causal_times(records), records, strict=True))]


def link_events(r: Record) -> list[tuple[str | None, str | None, str | None, int]]:
    """``(fid, pfid, name, +1 add / -1 remove)`` of a namespace record, in the order it applies
    them (the merge explodes the same events)."""
    t = r.type
    if t in _CREATE_TYPES or t == "HLINK":
        return [(r.tfid, r.pfid, r.name, 1)]
    if t in ("UNLNK", "RMDIR"):
        return [(r.tfid, r.pfid, r.name, -1)]
    if t == "RENME" and not (r.tfid is not None and r.tfid == r.sfid):
        out = [(r.sfid, r.spfid, r.sname, -1)]
        if r.tfid is not None:
            out.append((r.tfid, r.pfid, r.name, -1))
        return [*out, (r.sfid, r.pfid, r.name, 1)]
    return []


def _needs(r: Record) -> set[str]:
    """Fids that must still exist when ``r`` applies: the fid it links or renames, its parents."""
    out = {f for f in (r.pfid, r.spfid) if f}
    if r.type == "HLINK" and r.tfid:
        out.add(r.tfid)
    if r.type == "RENME" and r.sfid:
        out.add(r.sfid)
    return out


def _replay_names(model: FsModel, ranked: list[tuple[tuple, Record]]) -> None:
    """Apply namespace records in an order that keeps each server's order and where each
    applies (the greedy search of the module docstring)."""
    queues: dict[str, list[Record]] = {}
    for _, r in sorted(ranked, key=lambda x: (x[1].server, x[1].index, x[0])):
        queues.setdefault(r.server, []).append(r)
    rank_of = {id(r): k for k, r in ranked}
    heads = dict.fromkeys(queues, 0)
    needed: dict[str, int] = {}  # fid -> waiting records that need it
    # (fid, pfid, name) -> server -> (delta, record) of the adds and removes still to come
    remaining: dict[tuple, dict[str, list[tuple[int, Record]]]] = {}
    for r in (r for q in queues.values() for r in q):
        for f in _needs(r):
            needed[f] = needed.get(f, 0) + 1
        for fid, pfid, name, delta in link_events(r):
            remaining.setdefault((fid, pfid, name), {}).setdefault(r.server, []).append((delta, r))

    def holds(link: tuple) -> int:
        node = model.nodes.get(link[0])
        return int(node is not None and (link[1], link[2]) in node.links)

    def waits(r: Record, strict: bool) -> str | None:
        """Why ``r`` cannot go now, or None."""
        if strict and r.type == "RENME":
            held = model.lookup(r.pfid, r.name)
            if held is not None and held not in (r.sfid, r.tfid):
                return f"it would overwrite {held}, which it does not name as overwritten ({r.tfid})"
        own = _needs(r)
        for fid in _deletes(model, r):
            if needed.get(fid, 0) - (fid in own) > 0:
                return f"it would delete {fid}, which a waiting record still links, renames or uses as a parent"
        for link, deltas in _by_link(r).items():
            state = holds(link) + sum(deltas)
            if not 0 <= state <= 1:
                continue  # it does not apply now: FsModel.apply says why
            rest = [e[len(deltas) :] if s == r.server else e for s, e in remaining[link].items()]
            if not _alternates([[d for d, _ in e] for e in rest], state):
                names = ", ".join(
                    f"{o.server} index {o.index} ({o.type})" for e in remaining[link].values() for _, o in e
                )
                return (
                    f"name {link[2]!r} in {link[1]} of {link[0]} is added and removed in no order that applies"
                    f" (records {names})"
                )
        return None

    while any(heads[s] < len(q) for s, q in queues.items()):
        ready = sorted((queues[s][h] for s, h in heads.items() if h < len(queues[s])), key=lambda r: rank_of[id(r)])
        why: dict[int, str] = {}
        chosen = None
        for strict in (True, False):
            for r in ready:
                reason = waits(r, strict)
                if reason is None:
                    try:
                        model.apply(r)
                    except InconsistentRecord as exc:
                        reason = exc.reason
                if reason is None:
                    chosen = r
                    break
                why[id(r)] = reason
            if chosen is not None:
                break
        if chosen is None:
            first, *others = ready
            also = "".join(f"; waiting too: {o.server} index {o.index} ({o.type}): {why[id(o)]}" for o in others)
            raise InconsistentRecord(first, f"{why[id(first)]}{also}; no order of the records applies")
        heads[chosen.server] += 1
        for f in _needs(chosen):
            needed[f] -= 1
        for link, deltas in _by_link(chosen).items():
            del remaining[link][chosen.server][: len(deltas)]


def _by_link(r: Record) -> dict[tuple, list[int]]:
    out: dict[tuple, list[int]] = {}
    for fid, pfid, name, delta in link_events(r):
        out.setdefault((fid, pfid, name), []).append(delta)
    return out


def _deletes(model: FsModel, r: Record) -> list[str]:
    """Fids ``r`` would remove the last link of, applied now."""
    if r.type in ("UNLNK", "RMDIR"):
        victims = [model.lookup(r.pfid, r.name)]
    elif r.type == "RENME":
        held = model.lookup(r.pfid, r.name)
        victims = [held] if held != r.sfid else []
    else:
        return []
    return [f for f in victims if f is not None and f in model.nodes and len(model.nodes[f].links) == 1]


def _alternates(sequences: list[list[int]], state: int) -> bool:
    """Can the servers' remaining adds (+1) and removes (-1) of one name interleave, each
    server's in its order, so that the name's count stays 0 or 1 from ``state``?"""
    seqs = tuple(tuple(s) for s in sequences if s)
    if not seqs:
        return True
    seen: set[tuple] = set()
    stack = [((0,) * len(seqs), state)]
    while stack:
        pos, count = stack.pop()
        if all(p == len(s) for p, s in zip(pos, seqs, strict=True)):
            return True
        for k, s in enumerate(seqs):
            if pos[k] < len(s) and 0 <= count + s[pos[k]] <= 1:
                nxt = (pos[:k] + (pos[k] + 1,) + pos[k + 1 :], count + s[pos[k]])
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
    return False


# --------------------------------------------------------------------------- row conversion


def _get(row: Any, name: str) -> Any:
    try:
        return row[name]
    except (KeyError, IndexError, ValueError):
        return None


def _pair(item: Any, a: str, b: str) -> tuple:
    if isinstance(item, Mapping):
        return item[a], item[b]
    return item[0], item[1]


def _node_from_row(r: Mapping[str, Any]) -> Node:
    lay = _get(r, "layout")
    layout = None
    if lay is not None:
        if isinstance(lay, Mapping):
            ss, sc, objs = lay["stripe_size"], lay["stripe_count"], lay["objects"]
        else:
            ss, sc, objs = lay
        layout = Layout(int(ss), int(sc), tuple(LayoutObject(*_pair(o, "ost", "oid")) for o in objs or ()))
    objects = {}
    for o in _get(r, "objects") or ():
        if isinstance(o, Mapping):
            objects[(o["ost"], o["oid"])] = (o.get("version"), o.get("size"))
        else:
            objects[(o[0], o[1])] = (o[2], o[3] if len(o) > 3 else None)
    xattrs = {}
    for x in _get(r, "xattrs") or ():
        name, value = _pair(x, "name", "value")
        xattrs[name] = None if value is None else bytes(value)
    return Node(
        fid=r["fid"],
        type=r["type"],
        links={tuple(_pair(link, "pfid", "name")) for link in _get(r, "links") or ()},
        mode=_get(r, "mode"),
        uid=_get(r, "uid"),
        gid=_get(r, "gid"),
        size=_get(r, "size"),
        atime_ns=_get(r, "atime_ns"),
        mtime_ns=_get(r, "mtime_ns"),
        ctime_ns=_get(r, "ctime_ns"),
        xattrs=xattrs,
        symlink=_get(r, "symlink"),
        layout=layout,
        objects=objects,
    )


def snapshot_row_to_json(row: Mapping[str, Any]) -> dict[str, Any]:
    """A snapshot row as a JSON-ready dict (the ``snapshot/epoch=E/`` dump the simulator writes).

    Structs become objects (``links: [{pfid, name}]``, ``xattrs: [{name, value}]`` with the
    value base64, ``layout: {stripe_size, stripe_count, objects: [{ost, oid}]}``,
    ``objects: [{ost, oid, version, size}]``), matching the snapshot ``StructType`` field names
    so ``spark.read.schema(snapshot_struct_type()).json(dir)`` reads it (binary as base64).
    """
    lay = row["layout"]
    return {
        "fid": row["fid"],
        "type": row["type"],
        "links": [{"pfid": p, "name": n} for p, n in row["links"]],
        "mode": row["mode"],
        "uid": row["uid"],
        "gid": row["gid"],
        "size": row["size"],
        "atime_ns": row["atime_ns"],
        "mtime_ns": row["mtime_ns"],
        "ctime_ns": row["ctime_ns"],
        "xattrs": [
            {"name": n, "value": None if v is None else base64.b64encode(v).decode("ascii")} for n, v in row["xattrs"]
        ],
        "symlink": row["symlink"],
        "layout": None
        if lay is None
        else {"stripe_size": lay[0], "stripe_count": lay[1], "objects": [{"ost": o, "oid": i} for o, i in lay[2]]},
        "objects": [{"ost": o, "oid": i, "version": v, "size": n} for o, i, v, n in row["objects"]],
    }


def snapshot_row_from_json(data: Mapping[str, Any]) -> dict[str, Any]:
    """Inverse of :func:`snapshot_row_to_json`: a snapshot row of plain Python values."""
    node = _node_from_row(
        {
            **data,
            "xattrs": [
                {"name": x["name"], "value": None if x.get("value") is None else base64.b64decode(x["value"])}
                for x in data.get("xattrs") or ()
            ],
        }
    )
    row = node.row()
    return {f: row[f] for f in SNAPSHOT_FIELDS}
