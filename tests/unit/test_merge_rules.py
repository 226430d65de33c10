"""Hand-written cases for every net-change rule of the merge (DESIGN section 5).

Every case lives in its own namespace (its own root fid, fids prefixed with the case
name), and all cases of one mode are merged in ONE Spark job: Spark start-up and
scheduling dominate a tiny merge, so batching keeps the suite fast. Each test then
compares the whole snapshot rows and change rows of its case with
``assertDataFrameEqual``.
"""

from __future__ import annotations

import re
import stat

import pytest
from pyspark.testing import assertDataFrameEqual
from support.merge_paths import arrow_inputs, assert_local_equals_merge

from epochsync.core.model import CHANGE_FIELDS, SNAPSHOT_FIELDS
from epochsync.core.schema import Extent, Layout, LayoutObject, ObjectRef, Record

REG = stat.S_IFREG
DIRM = stat.S_IFDIR


class Case:
    """One scenario: snapshot E-1 rows, records of E, expected snapshot E and change rows."""

    def __init__(self, name: str):
        self.name = name
        self.root = f"{name}:R"
        self.prev: list[tuple] = [node(self.root, "dir", mode=DIRM | 0o755, uid=0, gid=0, size=0)]
        self.records: list[Record] = []
        self.t = 0
        self.idx = {}

    def f(self, short: str) -> str:
        """The fid of ``short`` in this case (``R`` is the root)."""
        return self.root if short == "R" else f"{self.name}:{short}"

    def old(self, fid: str, type_: str, links=(), **kw) -> Case:
        self.prev.append(node(self.f(fid), type_, [(self.f(p), n) for p, n in links], **kw))
        return self

    def rec(self, type_: str, server: str = "MDT0000", **kw) -> Case:
        for key in ("tfid", "pfid", "sfid", "spfid"):
            if kw.get(key) is not None:
                kw[key] = self.f(kw[key])
        self.t += 10
        self.idx[server] = self.idx.get(server, 0) + 1
        kw.setdefault("time_ns", self.t)
        if kw.get("cookie") is not None:
            kw["cookie"] = f"{self.name}:{kw['cookie']}"
        # each case is a source of its own: its servers and cookies too
        self.records.append(Record(server=f"{self.name}:{server}", index=self.idx[server], epoch=1, type=type_, **kw))
        return self


def node(fid, type_, links=(), *, mode=None, uid=None, gid=None, size=0, atime=None, mtime=None, ctime=None,
         xattrs=(), symlink=None, layout=None, objects=()):  # fmt: skip
    """A snapshot row as a tuple in SNAPSHOT_FIELDS order."""
    # objects: (ost, oid, version) or (ost, oid, version, size); the size defaults to None
    objects = [(*o, None) if len(o) == 3 else tuple(o) for o in objects]
    return (fid, type_, sorted(links), mode, uid, gid, size, atime, mtime, ctime, sorted(xattrs), symlink,
            layout, sorted(objects, key=repr))  # fmt: skip


def change(fid, type_, *, created=False, deleted=False, links=False, attrs=False, xattrs=False, data=False,
           whole=False, ranges=(), old_size=None, new_size=None):  # fmt: skip
    return (fid, type_, created, deleted, links, attrs, xattrs, data, whole, list(ranges), old_size, new_size)


LAY = Layout(4, 2, (LayoutObject("OST0000", "a"), LayoutObject("OST0001", "b")))
LAY_T = (4, 2, [("OST0000", "a"), ("OST0001", "b")])
F644 = REG | 0o644


def build_cases() -> dict[str, tuple[Case, list, list]]:
    """name → (case, expected snapshot rows of the case, expected change rows)."""
    out = {}

    def add(case, snap, changes):
        out[case.name] = (case, snap, changes)

    c = Case("create_unlink")
    c.rec("CREAT", tfid="x", pfid="R", name="tmp", mode=F644, uid=1, gid=1, layout=LAY)
    c.rec("WRITE", "OST0000", tfid="x", object=ObjectRef("OST0000", "a", "v1"), extents=(Extent(0, 100),))
    c.rec("UNLNK", tfid="x", pfid="R", name="tmp")
    add(c, [c.prev[0]], [])

    c = Case("rename_chain")
    c.old("x", "file", [("R", "a")], mode=F644, uid=1, gid=1, size=5)
    c.rec("RENME", sfid="x", spfid="R", sname="a", pfid="R", name="b")
    c.rec("RENME", sfid="x", spfid="R", sname="b", pfid="R", name="c")
    add(c, [c.prev[0], node(c.f("x"), "file", [(c.f("R"), "c")], mode=F644, uid=1, gid=1, size=5)],
        [change(c.f("x"), "file", links=True, old_size=5, new_size=5)])  # fmt: skip

    c = Case("rename_back")
    c.old("x", "file", [("R", "a")], mode=F644, uid=1, gid=1, size=5)
    c.rec("RENME", sfid="x", spfid="R", sname="a", pfid="R", name="tmp")
    c.rec("RENME", sfid="x", spfid="R", sname="tmp", pfid="R", name="a")
    add(c, c.prev, [])

    c = Case("rename_over")
    c.old("x", "file", [("R", "x")], mode=F644, uid=1, gid=1, size=1)
    c.old("y", "file", [("R", "y")], mode=F644, uid=1, gid=1, size=2)
    c.rec("RENME", sfid="x", spfid="R", sname="x", pfid="R", name="y", tfid="y", flags=1)
    add(c, [c.prev[0], node(c.f("x"), "file", [(c.f("R"), "y")], mode=F644, uid=1, gid=1, size=1)],
        [change(c.f("x"), "file", links=True, old_size=1, new_size=1),
         change(c.f("y"), "file", deleted=True, links=True, old_size=2)])  # fmt: skip

    c = Case("rename_over_hardlinked")
    c.old("x", "file", [("R", "x")], mode=F644, uid=1, gid=1, size=1)
    c.old("y", "file", [("R", "y"), ("R", "y2")], mode=F644, uid=1, gid=1, size=2)
    c.rec("RENME", sfid="x", spfid="R", sname="x", pfid="R", name="y", tfid="y")
    add(c, [c.prev[0], node(c.f("x"), "file", [(c.f("R"), "y")], mode=F644, uid=1, gid=1, size=1),
            node(c.f("y"), "file", [(c.f("R"), "y2")], mode=F644, uid=1, gid=1, size=2)],
        [change(c.f("x"), "file", links=True, old_size=1, new_size=1),
         change(c.f("y"), "file", links=True, old_size=2, new_size=2)])  # fmt: skip

    c = Case("hard_links")
    c.old("d", "dir", [("R", "d")], mode=DIRM | 0o755, uid=0, gid=0)
    c.old("x", "file", [("R", "a")], mode=F644, uid=1, gid=1, size=3)
    c.rec("HLINK", tfid="x", pfid="d", name="b")
    c.rec("HLINK", tfid="x", pfid="R", name="c")
    c.rec("UNLNK", tfid="x", pfid="R", name="a")
    c.rec("UNLNK", tfid="x", pfid="R", name="c")
    add(c, [c.prev[0], c.prev[1], node(c.f("x"), "file", [(c.f("d"), "b")], mode=F644, uid=1, gid=1, size=3)],
        [change(c.f("x"), "file", links=True, old_size=3, new_size=3)])  # fmt: skip

    c = Case("rename_onto_own_link")  # POSIX: renaming a name onto another name of the same file does nothing
    c.old("x", "file", [("R", "a"), ("R", "b")], mode=F644, uid=1, gid=1, size=3)
    c.rec("RENME", sfid="x", spfid="R", sname="a", pfid="R", name="b", tfid="x")
    add(c, c.prev, [])

    c = Case("dir_rename")
    c.old("d", "dir", [("R", "d")], mode=DIRM | 0o755, uid=0, gid=0)
    c.old("e", "dir", [("d", "e")], mode=DIRM | 0o755, uid=0, gid=0)
    c.old("x", "file", [("e", "x")], mode=F644, uid=1, gid=1, size=3)
    c.rec("RENME", sfid="d", spfid="R", sname="d", pfid="R", name="moved")
    add(c, [c.prev[0], node(c.f("d"), "dir", [(c.f("R"), "moved")], mode=DIRM | 0o755, uid=0, gid=0), c.prev[2], c.prev[3]],
        [change(c.f("d"), "dir", links=True, old_size=0, new_size=0)])  # fmt: skip

    c = Case("attrs_last_wins")
    c.old("x", "file", [("R", "x")], mode=F644, uid=1, gid=1, size=3, mtime=5)
    c.rec("SATTR", tfid="x", mode=0o600, uid=7)  # no type bits: keeps the file's
    c.rec("SATTR", tfid="x", uid=8, gid=9, ctime_ns=123)
    c.rec("MTIME", tfid="x", time_ns=777)  # no value: time of the record
    c.rec("ATIME", tfid="x", atime_ns=55)
    add(c, [c.prev[0], node(c.f("x"), "file", [(c.f("R"), "x")], mode=REG | 0o600, uid=8, gid=9, size=3, atime=55,
                            mtime=777, ctime=123)],
        [change(c.f("x"), "file", attrs=True, old_size=3, new_size=3)])  # fmt: skip

    c = Case("attrs_same_value")  # set to what it was: no change row
    c.old("x", "file", [("R", "x")], mode=F644, uid=1, gid=1, size=3)
    c.rec("SATTR", tfid="x", mode=F644, uid=1)
    add(c, c.prev, [])

    c = Case("xattrs")
    c.old("x", "file", [("R", "x")], mode=F644, uid=1, gid=1, size=3, xattrs=[("user.keep", b"k"), ("user.old", b"o")])
    c.old("y", "file", [("R", "y")], mode=F644, uid=1, gid=1, size=3)
    c.rec("XATTR", tfid="x", xattr_name="user.old", xattr_value=None)  # removed
    c.rec("XATTR", tfid="x", xattr_name="user.new", xattr_value=b"1")
    c.rec("XATTR", tfid="x", xattr_name="user.new", xattr_value=b"2")  # last value wins
    c.rec("XATTR", tfid="y", xattr_name="user.tmp", xattr_value=b"t")  # set then removed: nothing
    c.rec("XATTR", tfid="y", xattr_name="user.tmp", xattr_value=None)
    add(c, [c.prev[0], node(c.f("x"), "file", [(c.f("R"), "x")], mode=F644, uid=1, gid=1, size=3,
                            xattrs=[("user.keep", b"k"), ("user.new", b"2")]), c.prev[2]],
        [change(c.f("x"), "file", xattrs=True, old_size=3, new_size=3)])  # fmt: skip

    c = Case("striped_writes")  # object offsets → file offsets; union; adjacent joined
    c.rec("CREAT", tfid="x", pfid="R", name="x", mode=F644, uid=1, gid=1, layout=LAY)
    # object b bytes [2,7): file [6,8) and [12,15)
    c.rec("WRITE", "OST0001", tfid="x", object=ObjectRef("OST0001", "b", "b1"), extents=(Extent(2, 5),))
    # object a bytes [0,2): file [0,2); bytes [4,6): file [8,10) (adjacent to [6,8))
    c.rec("WRITE", "OST0000", tfid="x", object=ObjectRef("OST0000", "a", "a1"), extents=(Extent(0, 2), Extent(4, 2)))
    c.rec("WRITE", "OST0000", tfid="x", object=ObjectRef("OST0000", "a", "a2"), extents=(Extent(1, 0),))  # no bytes
    add(c, [c.prev[0], node(c.f("x"), "file", [(c.f("R"), "x")], mode=F644, uid=1, gid=1, size=15, layout=LAY_T,
                            objects=[("OST0000", "a", "a2"), ("OST0001", "b", "b1")])],
        [change(c.f("x"), "file", created=True, links=True, attrs=True, data=True,
                ranges=[(0, 2), (6, 4), (12, 3)], new_size=15)])  # fmt: skip

    c = Case("writes_layout_from_prev")  # layout and object versions of snapshot E-1
    c.old("x", "file", [("R", "x")], mode=F644, uid=1, gid=1, size=40, layout=LAY_T,
          objects=[("OST0000", "a", "a0"), ("OST0001", "b", "b0")])  # fmt: skip
    c.rec("WRITE", "OST0001", tfid="x", object=ObjectRef("OST0001", "b", "b1"), extents=(Extent(0, 4),), mtime_ns=99)
    add(c, [c.prev[0], node(c.f("x"), "file", [(c.f("R"), "x")], mode=F644, uid=1, gid=1, size=40, layout=LAY_T,
                            mtime=99, objects=[("OST0000", "a", "a0"), ("OST0001", "b", "b1")])],
        [change(c.f("x"), "file", attrs=True, data=True, ranges=[(4, 4)], old_size=40, new_size=40)])  # fmt: skip

    c = Case("clip_to_final_size")  # MDT file writes (file offsets), then truncated below them
    c.old("x", "file", [("R", "x")], mode=F644, uid=1, gid=1, size=100)
    c.rec("WRITE", tfid="x", extents=(Extent(50, 100),))  # size 150
    c.rec("TRUNC", tfid="x", size=120)
    add(c, [c.prev[0], node(c.f("x"), "file", [(c.f("R"), "x")], mode=F644, uid=1, gid=1, size=120)],
        [change(c.f("x"), "file", data=True, ranges=[(50, 70)], old_size=100, new_size=120)])  # fmt: skip

    c = Case("truncate_down_then_extend")
    c.old("x", "file", [("R", "x")], mode=F644, uid=1, gid=1, size=100)
    c.rec("WRITE", tfid="x", extents=(Extent(0, 2),))
    c.rec("TRUNC", tfid="x", size=10)
    c.rec("WRITE", tfid="x", extents=(Extent(20, 10),))  # size 30
    c.rec("TRUNC", tfid="x", size=80)
    add(c, [c.prev[0], node(c.f("x"), "file", [(c.f("R"), "x")], mode=F644, uid=1, gid=1, size=80)],
        [change(c.f("x"), "file", data=True, ranges=[(0, 2), (10, 70)], old_size=100, new_size=80)])  # fmt: skip

    c = Case("truncate_only_down")  # size changed, no byte to pull
    c.old("x", "file", [("R", "x")], mode=F644, uid=1, gid=1, size=100)
    c.rec("TRUNC", tfid="x", size=40)
    add(c, [c.prev[0], node(c.f("x"), "file", [(c.f("R"), "x")], mode=F644, uid=1, gid=1, size=40)],
        [change(c.f("x"), "file", data=True, old_size=100, new_size=40)])  # fmt: skip

    c = Case("write_then_delete")  # writes to a file deleted later are dropped
    c.old("x", "file", [("R", "x")], mode=F644, uid=1, gid=1, size=10)
    c.rec("WRITE", tfid="x", extents=(Extent(0, 1000),))
    c.rec("UNLNK", tfid="x", pfid="R", name="x", flags=1)
    add(c, [c.prev[0]], [change(c.f("x"), "file", deleted=True, links=True, old_size=10)])

    c = Case("late_record_of_deleted_fid")  # a WRITE/CLOSE of a fid gone before E-1 changes nothing
    c.rec("WRITE", tfid="gone", extents=(Extent(0, 10),))
    c.rec("SATTR", tfid="gone", mode=0o600)
    add(c, [c.prev[0]], [])

    c = Case("whole_file")
    c.old("x", "file", [("R", "x")], mode=F644, uid=1, gid=1, size=10)
    c.old("y", "file", [("R", "y")], mode=F644, uid=1, gid=1, size=10, layout=LAY_T)
    c.rec("WRITE", tfid="x")  # neither extents nor object: bytes unknown
    c.rec("LYOUT", tfid="y", layout=Layout(8, 1, (LayoutObject("OST0000", "c"),)))
    add(c, [c.prev[0], c.prev[1],
            node(c.f("y"), "file", [(c.f("R"), "y")], mode=F644, uid=1, gid=1, size=10, layout=(8, 1, [("OST0000", "c")]))],
        [change(c.f("x"), "file", data=True, whole=True, old_size=10, new_size=10),
         change(c.f("y"), "file", data=True, whole=True, old_size=10, new_size=10)])  # fmt: skip

    c = Case("node_types")
    c.rec("MKDIR", tfid="d", pfid="R", name="d", mode=DIRM | 0o700, uid=2, gid=2, mtime_ns=1)
    c.rec("SLINK", tfid="s", pfid="d", name="s", mode=stat.S_IFLNK | 0o777, uid=2, gid=2, symlink="../t")
    c.rec("MKNOD", tfid="p", pfid="d", name="p", mode=stat.S_IFIFO | 0o644, uid=2, gid=2)
    add(c, [c.prev[0],
            node(c.f("d"), "dir", [(c.f("R"), "d")], mode=DIRM | 0o700, uid=2, gid=2, mtime=1),
            node(c.f("p"), "other", [(c.f("d"), "p")], mode=stat.S_IFIFO | 0o644, uid=2, gid=2),
            node(c.f("s"), "symlink", [(c.f("d"), "s")], mode=stat.S_IFLNK | 0o777, uid=2, gid=2, symlink="../t")],
        [change(c.f("d"), "dir", created=True, links=True, attrs=True, new_size=0),
         change(c.f("p"), "other", created=True, links=True, attrs=True, new_size=0),
         change(c.f("s"), "symlink", created=True, links=True, attrs=True, new_size=0)])  # fmt: skip

    c = Case("root_attrs")
    c.rec("SATTR", tfid="R", mode=0o700)
    add(c, [node(c.root, "dir", mode=DIRM | 0o700, uid=0, gid=0, size=0)],
        [change(c.root, "dir", attrs=True, old_size=0, new_size=0)])  # fmt: skip

    c = Case("ordering_across_servers")  # unrelated records of two servers, same time: the server decides
    c.old("x", "file", [("R", "x")], mode=F644, uid=1, gid=1, size=3)
    c.rec("SATTR", "MDT0001", tfid="x", uid=5, time_ns=1000)
    c.rec("SATTR", "MDT0000", tfid="x", uid=6, time_ns=1000)
    add(c, [c.prev[0], node(c.f("x"), "file", [(c.f("R"), "x")], mode=F644, uid=5, gid=1, size=3)],
        [change(c.f("x"), "file", attrs=True, old_size=3, new_size=3)])  # fmt: skip

    # Issue 16: MDT0001 creates f in its directory m1, MDT0000 moves it to m0 (one cookie). Same
    # time, or MDT0001's clock ahead: the replica must not keep m1/f (a phantom hard link).
    for name, t_create, t_rename in (("cross_mdt_move_same_time", 1000, 1000), ("cross_mdt_move_skewed", 1005, 1002)):
        c = Case(name)
        c.old("m0", "dir", [("R", "m0")], mode=DIRM | 0o755, uid=0, gid=0)
        c.old("m1", "dir", [("R", "m1")], mode=DIRM | 0o755, uid=0, gid=0)
        c.rec("CREAT", "MDT0001", tfid="f", pfid="m1", name="f", mode=F644, uid=1, gid=1, time_ns=t_create, cookie="op")
        c.rec("RENME", sfid="f", spfid="m1", sname="f", pfid="m0", name="f", time_ns=t_rename, cookie="op")
        add(c, [*c.prev, node(c.f("f"), "file", [(c.f("m0"), "f")], mode=F644, uid=1, gid=1, size=0)],
            [change(c.f("f"), "file", created=True, links=True, attrs=True, new_size=0)])  # fmt: skip

    c = Case("clock_steps_back")  # one server: the index orders, not the time
    c.old("x", "file", [("R", "x")], mode=F644, uid=1, gid=1, size=3)
    c.rec("SATTR", tfid="x", uid=5, time_ns=1000)
    c.rec("SATTR", tfid="x", uid=6, time_ns=500)
    add(c, [c.prev[0], node(c.f("x"), "file", [(c.f("R"), "x")], mode=F644, uid=6, gid=1, size=3)],
        [change(c.f("x"), "file", attrs=True, old_size=3, new_size=3)])  # fmt: skip

    c = Case("creator_first")  # a directory's mode set on its own MDT, whose clock is behind its parent's
    c.rec("MKDIR", tfid="d", pfid="R", name="d", mode=DIRM | 0o755, uid=0, gid=0, time_ns=1000)
    c.rec("SATTR", "MDT0001", tfid="d", mode=0o700, time_ns=10)
    add(c, [c.prev[0], node(c.f("d"), "dir", [(c.f("R"), "d")], mode=DIRM | 0o700, uid=0, gid=0)],
        [change(c.f("d"), "dir", created=True, links=True, attrs=True, new_size=0)])  # fmt: skip

    c = Case("operation_orders_servers")  # write + MTIME (one cookie), then a truncate on the MDT, behind
    c.old("x", "file", [("R", "x")], mode=F644, uid=1, gid=1, size=0)
    c.rec("WRITE", "OST0000", tfid="x", extents=(Extent(0, 100),), time_ns=5000, cookie="w")
    c.rec("MTIME", tfid="x", time_ns=1200, cookie="w")
    c.rec("TRUNC", tfid="x", size=10, time_ns=1300)
    add(c, [c.prev[0], node(c.f("x"), "file", [(c.f("R"), "x")], mode=F644, uid=1, gid=1, size=10, mtime=1200)],
        [change(c.f("x"), "file", attrs=True, data=True, ranges=[(0, 10)], old_size=0, new_size=10)])  # fmt: skip
    return out


def build_blind_cases() -> dict[str, tuple[Case, list, list]]:
    """extents_known=False (Lustre text, Gluster): data and values come from the source."""
    out = {}
    c = Case("blind_close_write")
    c.old("x", "file", [("R", "x")], mode=F644, uid=1, gid=1, size=10)
    c.old("y", "file", [("R", "y")], mode=F644, uid=1, gid=1, size=10)
    c.old("z", "file", [("R", "z")], mode=F644, uid=1, gid=1, size=10)
    c.rec("CLOSE", tfid="x", flags=0x20000)  # m=-w-
    c.rec("CLOSE", tfid="y", flags=0x10000)  # m=r--: read only
    c.rec("CLOSE", tfid="z", flags=0x2)  # O_RDWR
    out[c.name] = (c, c.prev, [
        change(c.f("x"), "file", data=True, whole=True, old_size=10, new_size=10),
        change(c.f("z"), "file", data=True, whole=True, old_size=10, new_size=10)])  # fmt: skip

    c = Case("blind_values")
    c.old("x", "file", [("R", "x")], mode=F644, uid=1, gid=1, size=10, xattrs=[("user.a", b"1")])
    c.rec("SATTR", tfid="x")  # Gluster M record: which, not the value
    c.rec("XATTR", tfid="x", xattr_name="user.a")  # Lustre: null = "read it from the source"
    c.rec("MTIME", tfid="x", mtime_ns=50)
    c.rec("WRITE", tfid="x")  # Gluster D record
    out[c.name] = (c, [c.prev[0], node(c.f("x"), "file", [(c.f("R"), "x")], mode=F644, uid=1, gid=1, size=10,
                                        mtime=50, xattrs=[("user.a", b"1")])],
                   [change(c.f("x"), "file", attrs=True, xattrs=True, data=True, whole=True, old_size=10,
                           new_size=10)])  # fmt: skip
    return out


def _run(spark, cases, extents_known):
    from epochsync.core.model import snapshot_struct_type
    from epochsync.core.schema import record_struct_type
    from epochsync.stages.merge import merge_epoch

    prev_rows = [r for c, _, _ in cases.values() for r in c.prev]
    records = [r for c, _, _ in cases.values() for r in c.records]
    prev = spark.createDataFrame(prev_rows, snapshot_struct_type())
    recs = spark.createDataFrame([r.to_row() for r in records], record_struct_type())
    roots = [c.root for c, _, _ in cases.values()]
    snap, changes = merge_epoch(prev, recs, roots, extents_known, cache=True)
    snap_rows, change_rows = snap.collect(), changes.collect()
    # the in-process path (run_merge's "local") computes the same tables on every rule
    assert_local_equals_merge(prev_rows, records, roots, extents_known, snap_rows, change_rows)
    return snap_rows, change_rows


@pytest.fixture(scope="module")
def merged(spark):
    cases = build_cases()
    return cases, *_run(spark, cases, True)


@pytest.fixture(scope="module")
def merged_blind(spark):
    cases = build_blind_cases()
    return cases, *_run(spark, cases, False)


def _check(spark, result, name):
    from epochsync.core.model import change_struct_type, snapshot_struct_type

    cases, snap, changes = result
    case, want_snap, want_changes = cases[name]
    prefix = case.name + ":"
    got_snap = [r for r in snap if r.fid.startswith(prefix)]
    got_changes = [r for r in changes if r.fid.startswith(prefix)]
    assertDataFrameEqual(
        spark.createDataFrame(got_snap, snapshot_struct_type()),
        spark.createDataFrame(want_snap, snapshot_struct_type()),
    )
    assertDataFrameEqual(
        spark.createDataFrame(got_changes, change_struct_type()),
        spark.createDataFrame(want_changes, change_struct_type()),
    )


@pytest.mark.parametrize("name", list(build_cases()))
def test_rule(spark, merged, name):
    _check(spark, merged, name)


@pytest.mark.parametrize("name", list(build_blind_cases()))
def test_rule_without_extents(spark, merged_blind, name):
    _check(spark, merged_blind, name)


def test_columns_follow_the_model(merged):
    _, snap, changes = merged
    assert tuple(snap[0].asDict()) == SNAPSHOT_FIELDS
    assert tuple(changes[0].asDict()) == CHANGE_FIELDS


@pytest.mark.parametrize(
    "records, named",
    [
        # MDT0000 renames x away from a name nobody gave it (issue 16: refused, not silently merged)
        (
            [("RENME", "MDT0000", dict(sfid="x", spfid="m1", sname="f", pfid="R", name="g"))],
            r"fid bad:x: name f in bad:m1 is added and removed in no order that applies \(not held at E-1; records"
            r" bad:MDT0000 index 1 \(RENME\)\)",
        ),
        # held at E-1, removed by two servers, added back by none
        (
            [
                ("UNLNK", "MDT0000", dict(tfid="x", pfid="R", name="x")),
                ("UNLNK", "MDT0001", dict(tfid="x", pfid="R", name="x")),
            ],
            r"fid bad:x: name x in bad:R is added and removed in no order that applies \(held at E-1; records"
            r" bad:MDT0000 index 1 \(UNLNK\), bad:MDT0001 index 1 \(UNLNK\)\)",
        ),
    ],
    ids=["never-created", "removed-twice"],
)
def test_names_in_no_consistent_order_fail_naming_the_records(spark, records, named):
    from epochsync.core.errors import EpochError
    from epochsync.core.model import snapshot_struct_type
    from epochsync.core.schema import record_struct_type
    from epochsync.stages.merge import _clean_error, merge_epoch

    c = Case("bad")
    c.old("m1", "dir", [("R", "m1")], mode=DIRM | 0o755, uid=0, gid=0)
    c.old("x", "file", [("R", "x")], mode=F644, uid=1, gid=1, size=3)
    for type_, server, kw in records:
        c.rec(type_, server, **kw)
    prev = spark.createDataFrame(c.prev, snapshot_struct_type())
    records = spark.createDataFrame([r.to_row() for r in c.records], record_struct_type())
    snap, _ = merge_epoch(prev, records, c.root)
    with pytest.raises(Exception, match=named) as err:
        snap.collect()
    # the stage turns it into one line a person can act on
    clean = _clean_error(err.value, "t", 3, 3)
    assert isinstance(clean, EpochError)
    assert re.fullmatch(
        r"merge of target 't' epochs 3\.\.3: " + named + r".*\(missing or reordered records\?\)", str(clean)
    )
    assert _local_error(c.prev, c.records, c.root) == str(clean)


def _local_error(prev: list, records: list, root: str) -> str:
    """The message ``run_merge`` gives when its in-process path fails on these inputs."""
    from support.merge_paths import outcomes

    from epochsync.stages.merge import _clean_error

    messages = []
    for outcome in outcomes():
        with pytest.raises(Exception) as err:  # noqa: PT011 (the message is checked by the caller)
            outcome(*arrow_inputs(prev, records), root)
        messages.append(str(_clean_error(err.value, "t", 3, 3)))
    assert len(set(messages)) == 1, messages
    return messages[0]


def test_nameless_link_record_fails_naming_it(spark):
    from epochsync.core.schema import record_struct_type
    from epochsync.stages.merge import _clean_error, merge_epoch
    from epochsync.warehouse.snapshots import empty_snapshot

    c = Case("bad").rec("UNLNK", tfid="x", pfid="R", name=None)
    records = spark.createDataFrame([r.to_row() for r in c.records], record_struct_type())
    snap, _ = merge_epoch(empty_snapshot(spark, c.root), records, c.root)
    with pytest.raises(Exception, match=r"record bad:MDT0000:1 \(UNLNK\) has no fid, parent fid or name") as err:
        snap.collect()
    sentence = "record bad:MDT0000:1 (UNLNK) has no fid, parent fid or name; fix the importer or quarantine the record"
    assert str(_clean_error(err.value, "t", 2, 2)) == "merge of target 't' epochs 2..2: " + sentence
    assert _local_error([], c.records, c.root) == "merge of target 't' epochs 3..3: " + sentence


def test_name_for_unknown_fid_fails_naming_it(spark):
    from epochsync.core.schema import record_struct_type
    from epochsync.stages.merge import _clean_error, merge_epoch
    from epochsync.warehouse.snapshots import empty_snapshot

    c = Case("bad").rec("HLINK", tfid="ghost", pfid="R", name="boo")
    records = spark.createDataFrame([r.to_row() for r in c.records], record_struct_type())
    snap, _ = merge_epoch(empty_snapshot(spark, c.root), records, c.root)
    with pytest.raises(Exception, match=r"fid bad:ghost gains a name") as err:
        snap.collect()
    assert _local_error([], c.records, c.root) == str(_clean_error(err.value, "t", 3, 3))
