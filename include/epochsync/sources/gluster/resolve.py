"""One epoch of a gluster source: its bricks' raw changelog records → canonical records.

Gluster's records say *what* changed and barely how: a ``D`` record names a file whose data
changed (no range), an ``M`` record one whose attributes changed (no value), a rename does not
name the file it overwrote, a directory's entry operations appear on every brick (and at a cut
one brick may hold an operation another does not yet), DHT's linkto files and shards are
internal. So the records only tell this module which gfids and names to look at; what each of
them became is read from the cut (the epoch's brick snapshots) and compared with what the
published records left (:class:`epochsync.sources.gluster.state.SourceState`):

- a gfid the records touch (``tfid``, ``sfid``), a directory that gained or lost an entry (its
  times), the gfid that held a name some record took (an overwritten file), the base file of a
  touched shard, and the gfids carried from the last cut are looked up on every brick;
- a non-directory is what the brick holding its data shows (linkto files are never data); its
  names are its ``trusted.gfid2path`` xattrs;
- a directory is the same on every brick, or it is in the middle of an operation that the cut
  split between bricks (it reached some before their barrier and the others after): then it
  keeps its published state this epoch and is looked at again at the next cut;
- a file with several names one of which no record made (no ``LINK``, creator or finished
  ``RENAME`` names it) is a rename the cut caught half-way: DHT renames a file whose new name
  hashes to another brick by linking the new name on the file's brick (an internal operation,
  never logged), then renaming and unlinking (held by the barrier, logged as the ``RENAME``).
  No client made that link: the file keeps its published state this epoch and is published as
  it is at the next cut (once: a real link whose record was lost is published then);
- anything whose parent is not (yet) published waits with it.

Each touched gfid then gets the records that take the published state to the cut's: a creator
(``CREAT``, ``MKDIR``, ``SLINK`` with its target, ``MKNOD``) and ``HLINK`` for more names; a
``RENME`` for one name changed, ``UNLNK``/``HLINK`` for others; ``UNLNK``/``RMDIR`` for every
name of a gfid that is gone; one ``SATTR`` with every attribute's value; an ``XATTR`` per
``user.*`` xattr (a null value: removed); and for a file whose bytes may differ, one ``WRITE``
whose extents are the byte ranges the two cuts' snapshots do not share (FIEMAP; a sharded
file's blocks mapped to its offsets; up to 64 KiB of them read and compared, since an inline
extent has no address to compare), pinned to this epoch's cut (``object.version``). These
are canonical records with values and extents, so the merge treats the source like JSON Lines.

A gfid's records go to the brick holding its data (directories: the first brick), with that
brick's next indexes, and every brick's file ends with an ``EPOCH`` record.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from epochsync.core.gluster import INTERNAL_GFIDS, ROOT_GFID, SHARD_REMOVE_ME_GFID, SHARD_ROOT_GFID
from epochsync.core.schema import Extent, ObjectRef, Record
from epochsync.sources.gluster.backend import BrickView, Node, shard_base
from epochsync.sources.gluster.bricks import AgentBrick, LocalBrick
from epochsync.sources.gluster.btrfs import changed_ranges, drop_unchanged, fiemap
from epochsync.sources.gluster.state import Known, SourceState

SHARD_DIRS = (SHARD_ROOT_GFID, SHARD_REMOVE_ME_GFID)
NULL_GFID = "00000000-0000-0000-0000-000000000000"


@dataclass
class Resolved:
    """One epoch's canonical records per brick, and what it took."""

    records: dict[str, list[Record]]
    carry: list[str]
    figures: dict = field(default_factory=dict)
    halfway: list[str] = field(default_factory=list)  # renames caught half-way, held back
    repaired: list[str] = field(default_factory=list)  # gfids no record named that differed


@dataclass
class _After:
    """A touched gfid at the cut: present (``node`` and the brick of its data) or absent."""

    node: Node | None
    brick: str | None
    split: bool = False


def touched_by(records: Iterable[Record]) -> tuple[set[str], set[tuple[str, str]], set[str]]:
    """Returns ``(gfids, names, shard bases)`` the records of an epoch point at.

    Names in Gluster's shard directories are blocks of a sharded file: they touch its base
    file, never a name of the volume.
    """
    gfids: set[str] = set()
    names: set[tuple[str, str]] = set()
    bases: set[str] = set()
    internal: set[str] = set()
    for r in records:
        for p, n, g in ((r.pfid, r.name, r.sfid or r.tfid), (r.spfid, r.sname, r.sfid or r.tfid)):
            if not p or not n:
                continue
            if p == NULL_GFID:
                continue  # Gluster leaves a rename's new parent null at times: the cut tells the name
            if p in SHARD_DIRS:
                b = shard_base(n)
                if b:
                    bases.add(b[0])
                if g:
                    internal.add(g)
                continue
            names.add((p, n))
            gfids.add(p)
        for g in (r.tfid, r.sfid):
            if g:
                gfids.add(g)
    gfids -= internal
    gfids -= INTERNAL_GFIDS
    gfids.discard(NULL_GFID)
    return gfids, names, bases


class Resolver:
    """Resolves epochs of one source against its cuts (see the module docstring)."""

    def __init__(
        self,
        state: SourceState,
        bricks: list[LocalBrick | AgentBrick],
        prev: list[LocalBrick | AgentBrick] | None,
        epoch: int,
        time_ns: int,
    ):
        self.state = state
        self.bricks = bricks
        self.prev = {b.name: b for b in prev} if prev else None
        self.epoch = epoch
        self.time_ns = time_ns
        self.first = bricks[0].name
        self._ranges: dict[str, list[tuple[int, int]]] = {}
        self.figures: dict = {
            "looked_up": 0,
            "split_dirs": 0,
            "deferred": 0,
            "fiemap_files": 0,
            "whole_files": 0,
            "halfway_renames": 0,
        }

    # ------------------------------------------------------------------ the cut's view
    def look_all(self, gfids: list[str], known: dict[str, Known]) -> list[_After]:
        """Each gfid at the cut, in order (see the module docstring): a file's data is on one brick
        (the others hold at most a linkto file), the one it was on before first, and the first found
        is it; a directory is on every brick. Each brick is asked for a batch at a time (one request
        of a brick on another server): first every gfid on the brick it was on, then the ones not
        found there as a file on the others."""
        self.figures["looked_up"] += len(gfids)
        names = [b.name for b in self.bricks]
        pref: dict[str, str] = {}
        for g in gfids:
            was = known[g].brick if g in known else None
            pref[g] = was if was is not None and was in names else names[0]
        found: dict[str, dict[str, Node | None]] = {g: {} for g in gfids}
        for b in self.bricks:
            mine = [g for g in gfids if pref[g] == b.name]
            for g, n in zip(mine, b.lookup_many(mine) if mine else []):
                found[g][b.name] = n
        rest = [g for g in gfids if (n := found[g][pref[g]]) is None or n.type == "dir"]
        for b in self.bricks:
            mine = [g for g in rest if pref[g] != b.name]
            for g, n in zip(mine, b.lookup_many(mine) if mine else []):
                found[g][b.name] = n
        # a gfid found as a file where it was is not asked elsewhere: the others are not in ``found``
        order = {g: [pref[g], *(x for x in names if x != pref[g])] for g in gfids}
        return [self._after(g, [(x, found[g][x]) for x in order[g] if x in found[g]]) for g in gfids]

    def _after(self, gfid: str, seen: list[tuple[str, Node | None]]) -> _After:
        """``gfid`` at the cut from what each brick holds of it, the brick it was on first."""
        for name, n in seen:
            if n is not None and n.type != "dir":
                return _After(n, name)
        dirs = [(name, n) for name, n in seen if n is not None]
        if not dirs:
            return _After(None, None)
        if gfid == ROOT_GFID:
            return _After(_merged_dir(dirs), self.first)
        views = {tuple(n.names) for _, n in dirs}
        if len(dirs) != len(self.bricks) or len(views) != 1:
            return _After(None, None, split=True)
        return _After(_merged_dir(dirs), self.first)

    # ------------------------------------------------------------------ one epoch
    def resolve(
        self,
        records: Iterable[Record],
        carry: Iterable[str],
        everything: Iterable[str] = (),
        *,
        check_links: bool = True,
    ) -> Resolved:
        """The epoch's canonical records: ``records`` are the raw ones of every brick (the epoch's and
        the hints read after the cut), ``carry`` the gfids the last cut asked to look at again,
        ``everything`` every gfid of the volume (a source's first cut, or a cut walked whole: the
        bricks walked and the published gfids). ``check_links``: hold back a rename caught half-way
        (not at a first cut, which has no records to tell)."""
        records = list(records)
        touched, names, bases = touched_by(records)
        touched |= set(carry)
        holders = self.state.holders(names)
        touched |= set(holders.values())
        named = set(touched)  # what the records and the carry name (a walk's repairs are the rest)
        touched |= set(everything)
        touched -= INTERNAL_GFIDS
        known = self.state.known(touched)
        after: dict[str, _After] = {}
        pending = sorted(touched)
        parents: set[str] = set()
        while pending:
            gained: set[tuple[str, str]] = set()
            for g, a in zip(pending, self.look_all(pending, known)):
                if (
                    a.node is not None
                    and a.node.type != "dir"
                    and a.node.names
                    and all(p in SHARD_DIRS for p, _ in a.node.names)
                ):
                    # a block of a sharded file: its base file is what changed
                    b = shard_base(a.node.names[0][1])
                    if b:
                        bases.add(b[0])
                    continue
                after[g] = a
                had = set(known[g].names) if g in known else set()
                now = set(a.node.names) if a.node is not None else set()
                gained.update(now - had)
                # a directory that gains or loses an entry changes its times, with or without a record
                # of its own (a carried operation published at a later cut has none)
                parents.update(p for p, _ in had ^ now)
            # a name a gfid took at the cut was held by another before (a rename onto it): that one
            # lost it. Records do not say so (and Gluster may log the new parent of such a rename
            # as the null gfid), so the published state does.
            taken = {h for h in self.state.holders(gained).values() if h not in after}
            more = taken | bases | {p for p in parents if p != NULL_GFID}
            pending = sorted({g for g in more if g not in after} - INTERNAL_GFIDS)
            parents = set()
            bases = set()
            known.update(self.state.known(pending))
        carry_next: set[str] = set()
        for g, a in after.items():
            if a.split:
                carry_next.add(g)
                self.figures["split_dirs"] += 1
        halfway = self._halfway_renames(records, after, known, carry_next) if check_links else set()
        carry_next |= halfway
        self._defer_orphans(after, known, carry_next)
        out: dict[str, list[Record]] = {b.name: [] for b in self.bricks}
        self._ranges = self._changes(
            [
                (g, known.get(g), a)
                for g, a in sorted(after.items())
                if g not in carry_next and a.node is not None and a.node.type == "file"
            ]
        )
        published: list[Known] = []
        dropped: list[str] = []
        repaired: list[str] = []
        for g in sorted(after):
            a = after[g]
            if g in carry_next:
                continue
            k = known.get(g)
            recs, brick = self._records(g, k, a)
            out[brick].extend(recs)
            if g not in named and _differs(k, a, recs):
                repaired.append(g)
            if a.node is None:
                if k is not None:
                    dropped.append(g)
            else:
                published.append(
                    Known(
                        gfid=g,
                        type=a.node.type,
                        brick=a.brick,
                        size=a.node.size if a.node.type == "file" else None,
                        xattrs=sorted(a.node.xattrs),
                        names=list(a.node.names),
                    )
                )
        self.state.update(published, dropped)
        self.figures["touched"] = len(after)
        return Resolved(
            records=out,
            carry=sorted(carry_next),
            figures=self.figures,
            halfway=sorted(halfway),
            repaired=repaired,
        )

    def _halfway_renames(
        self, records: list[Record], after: dict[str, _After], known: dict[str, Known], carry: set[str]
    ) -> set[str]:
        """The files with a name no record made while they keep another (see the module docstring);
        not the ones the last cut held back already."""
        made: dict[tuple[str, str, str], list[Record]] = {}
        for r in records:
            g = r.sfid or r.tfid
            if g and r.pfid and r.name:
                made.setdefault((g, r.pfid, r.name), []).append(r)
        held = set(self.state.halfway)
        out: set[str] = set()
        for g, a in after.items():
            node = a.node
            if node is None or node.type == "dir" or len(node.names) < 2 or g in carry or g in held:
                continue
            now = set(node.names)
            had = set(known[g].names) if g in known else set()
            for p, n in sorted(now - had):
                if not any(_makes_name(r, now) for r in made.get((g, p, n), ())):
                    out.add(g)
                    self.figures["halfway_renames"] += 1
                    break
        return out

    def _defer_orphans(self, after: dict[str, _After], known: dict[str, Known], carry: set[str]) -> None:
        """Keeps back whatever would be published under a directory that is not published (a split
        one, or one whose creation the cut has not got yet): it waits for the next cut."""
        outside = {p for a in after.values() if a.node is not None for p, _ in a.node.names if p not in after}
        known.update(self.state.known(outside - set(known)))

        def published(p: str) -> bool:
            if p == ROOT_GFID:
                return True
            a = after.get(p)
            if a is not None and p not in carry:
                return a.node is not None
            return p in known and known[p].type == "dir"

        changed = True
        while changed:
            changed = False
            for g, a in after.items():
                if g in carry or a.node is None:
                    continue
                if not all(published(p) for p, _ in a.node.names):
                    carry.add(g)
                    self.figures["deferred"] += 1
                    changed = True

    # ------------------------------------------------------------------ records
    def _rec(self, brick: str, type_: str, gfid: str, **kw) -> Record:
        return Record(server=brick, index=0, epoch=self.epoch, type=type_, time_ns=self.time_ns, tfid=gfid, **kw)

    def _records(self, g: str, k: Known | None, a: _After) -> tuple[list[Record], str]:
        node = a.node
        if node is None:
            brick = (k.brick if k and k.type != "dir" else None) or self.first
            if k is None:
                return [], brick
            kind = "RMDIR" if k.type == "dir" else "UNLNK"
            return [self._rec(brick, kind, g, pfid=p, name=n) for p, n in k.names], brick
        brick = (a.brick if node.type != "dir" else None) or self.first
        out: list[Record] = []
        before = set(k.names) if k else set()
        now = set(node.names)
        if k is None:
            names = sorted(now)
            if names or g == ROOT_GFID:
                if g != ROOT_GFID:
                    out.append(self._creator(brick, g, node, names[0]))
                out.extend(self._rec(brick, "HLINK", g, pfid=p, name=n) for p, n in names[1:])
        else:
            gone, new = sorted(before - now), sorted(now - before)
            if len(gone) == 1 and len(new) == 1:
                (op, on), (np_, nn) = gone[0], new[0]
                out.append(
                    Record(
                        server=brick,
                        index=0,
                        epoch=self.epoch,
                        type="RENME",
                        time_ns=self.time_ns,
                        sfid=g,
                        spfid=op,
                        sname=on,
                        pfid=np_,
                        name=nn,
                    )
                )
            else:
                kind = "RMDIR" if node.type == "dir" else "UNLNK"
                out.extend(self._rec(brick, kind, g, pfid=p, name=n) for p, n in gone)
                out.extend(self._rec(brick, "HLINK", g, pfid=p, name=n) for p, n in new)
        out.append(
            self._rec(
                brick,
                "SATTR",
                g,
                mode=node.mode,
                uid=node.uid,
                gid=node.gid,
                size=node.size if node.type == "file" else None,
                atime_ns=node.atime_ns,
                mtime_ns=node.mtime_ns,
                ctime_ns=node.ctime_ns,
            )
        )
        for name in sorted(node.xattrs):
            out.append(self._rec(brick, "XATTR", g, xattr_name=name, xattr_value=node.xattrs[name]))
        for name in sorted(set(k.xattrs if k else ()) - set(node.xattrs)):
            out.append(self._rec(brick, "XATTR", g, xattr_name=name, xattr_value=None))
        if node.type == "file":
            ranges = self._ranges.get(g)
            if ranges:
                out.append(
                    self._rec(
                        brick,
                        "WRITE",
                        g,
                        object=ObjectRef(ost=brick, oid=g, version=str(self.epoch)),
                        extents=tuple(Extent(o, n) for o, n in ranges),
                    )
                )
        return out, brick

    def _creator(self, brick: str, g: str, node: Node, name: tuple[str, str]) -> Record:
        p, n = name
        if node.type == "dir":
            return self._rec(brick, "MKDIR", g, pfid=p, name=n, mode=node.mode, uid=node.uid, gid=node.gid)
        if node.type == "symlink":
            return self._rec(
                brick, "SLINK", g, pfid=p, name=n, symlink=node.symlink, mode=node.mode, uid=node.uid, gid=node.gid
            )
        if node.type == "file":
            return self._rec(brick, "CREAT", g, pfid=p, name=n, mode=node.mode, uid=node.uid, gid=node.gid)
        return self._rec(brick, "MKNOD", g, pfid=p, name=n, mode=node.mode, uid=node.uid, gid=node.gid)

    # ------------------------------------------------------------------ data
    def _changes(self, items: list[tuple[str, Known | None, _After]]) -> dict[str, list[tuple[int, int]]]:
        """For each ``(gfid, published, at the cut)`` of a file, the ranges whose bytes may differ from
        what the last cut published: its FIEMAP against the same brick's last cut (a brick asked once
        for all of its files), the whole file when it has no last cut to compare with."""
        out: dict[str, list[tuple[int, int]]] = {}
        batches: dict[str, list[tuple[str, int]]] = {}
        for g, k, a in items:
            node = a.node
            assert node is not None and node.type == "file"
            old_view = (
                self.prev.get(a.brick)
                if (self.prev and a.brick and k is not None and k.type == "file" and k.brick == a.brick)
                else None
            )
            if node.size <= 0:
                out[g] = []
            elif old_view is None:
                self.figures["whole_files"] += 1
                out[g] = [(0, node.size)]
            elif node.shard_block:
                out[g] = self._changed_sharded(g, node, old_view)
            else:
                batches.setdefault(old_view.name, []).append((g, node.size))
        for brick, pairs in batches.items():
            assert self.prev is not None
            new = next(b for b in self.bricks if b.name == brick)
            for (g, size), ranges in zip(pairs, new.changed_files(self.prev[brick], pairs)):
                if ranges is None:
                    self.figures["whole_files"] += 1
                    out[g] = [(0, size)]
                else:
                    self.figures["fiemap_files"] += 1
                    out[g] = [(int(o), int(n)) for o, n in ranges]
        return out

    def _changed_sharded(self, g: str, node: Node, old_brick: LocalBrick | AgentBrick) -> list[tuple[int, int]]:
        """:meth:`_changes` of a sharded file: its blocks are on the bricks their names hash to, each
        compared with the last cut's. Read whole when a brick is on another server (its agent serves
        no block-by-block comparison)."""
        size = node.size
        if any(b.remote for b in self.bricks) or old_brick.remote:
            self.figures["whole_files"] += 1
            return [(0, size)]
        assert isinstance(old_brick, LocalBrick)
        old = old_brick.view.lookup(g, full=False)
        if old is None or old.type != "file" or (old.shard_block or 0) != (node.shard_block or 0):
            self.figures["whole_files"] += 1
            return [(0, size)]
        self.figures["fiemap_files"] += 1
        try:
            return self._changed_shards(g, old, node)
        except OSError:
            self.figures["whole_files"] += 1
            return [(0, size)]

    def _changed_shards(self, g: str, old: Node, node: Node) -> list[tuple[int, int]]:
        block = int(node.shard_block or 0)
        blocks = max(-(-old.size // block), -(-node.size // block), 1)
        new_views = [b.view for b in self.bricks if isinstance(b, LocalBrick)]
        old_views = [b.view for b in (self.prev or {}).values() if isinstance(b, LocalBrick)]
        out: list[tuple[int, int]] = []
        for i in range(blocks):
            lo = i * block
            n_new = max(0, min(block, node.size - lo))
            n_old = max(0, min(block, old.size - lo))
            if n_new == 0:
                continue
            old_path: str | None
            new_path: str | None
            if i == 0:
                old_path, new_path = old.path, node.path
            else:
                old_path = _shard_on(old_views, g, i)
                new_path = _shard_on(new_views, g, i)
            old_ext = fiemap(old_path) if old_path else []
            new_ext = fiemap(new_path) if new_path else []
            ranges = changed_ranges(old_ext, new_ext, n_old, n_new)
            if old_path and new_path:
                ranges = drop_unchanged(old_path, new_path, ranges, n_old)
            for o, n in ranges:
                if out and out[-1][0] + out[-1][1] == lo + o:
                    out[-1] = (out[-1][0], out[-1][1] + n)
                else:
                    out.append((lo + o, n))
        return out


def _makes_name(r: Record, now: set[tuple[str, str]]) -> bool:
    """Did raw record ``r`` (naming a gfid's name) give the gfid that name as a client sees it: a
    link, a creation, or a rename finished (its old name gone)? A hint of an older cut record
    (no type kept) counts, as before types were kept."""
    if r.type == "RENME":
        return (r.spfid, r.sname) not in now
    return r.type in ("HLINK", "CREAT", "MKNOD", "SLINK", "MKDIR", "HINT")


def _differs(k: Known | None, a: _After, recs: list[Record]) -> bool:
    """Does a gfid's published state differ from the cut's in what the records must say (it exists,
    its names, its size, its bytes)? Times and modes are republished by a walk whatever they are."""
    if a.node is None:
        return k is not None
    if k is None:
        return True
    if sorted(k.names) != sorted(a.node.names) or (a.node.type == "file" and k.size != a.node.size):
        return True
    return any(r.type == "WRITE" for r in recs)


def _shard_on(views: Iterable[BrickView], base: str, index: int) -> str | None:
    for v in views:
        p = v.shard_path(base, index)
        if p:
            return p
    return None


def _merged_dir(dirs: list[tuple[str, Node]]) -> Node:
    """A directory as a client sees it over the bricks: the newest copy's mode, owner and xattrs,
    the latest of each time (DHT merges directory times so)."""
    newest = max((n for _, n in dirs), key=lambda n: (n.ctime_ns, n.mtime_ns))
    return Node(
        gfid=newest.gfid,
        type="dir",
        mode=newest.mode,
        uid=newest.uid,
        gid=newest.gid,
        size=0,
        atime_ns=max(n.atime_ns for _, n in dirs),
        mtime_ns=max(n.mtime_ns for _, n in dirs),
        ctime_ns=max(n.ctime_ns for _, n in dirs),
        names=list(newest.names),
        xattrs=dict(newest.xattrs),
        path=newest.path,
    )


def walk_gfids(bricks: list[LocalBrick | AgentBrick]) -> list[str]:
    """Every gfid of the volume the bricks hold, the root's included (a first cut publishes them all)."""
    seen: set[str] = {ROOT_GFID}
    for b in bricks:
        seen.update(b.gfids())
    return sorted(seen)
