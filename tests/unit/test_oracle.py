"""The sequential oracle: every net-change rule of DESIGN section 5 on hand-written records."""

from __future__ import annotations

import random
import re
import stat

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epochsync.core.model import SNAPSHOT_FIELDS
from epochsync.core.schema import Extent, Layout, LayoutObject, ObjectRef, Record
from epochsync_dev.oracle import (
    FsModel,
    InconsistentRecord,
    replay,
    snapshot_row_from_json,
    snapshot_row_to_json,
    sort_records,
)

ROOT = "[0x200000007:0x1:0x0]"
REG = stat.S_IFREG | 0o644
DIRM = stat.S_IFDIR | 0o755


class Log:
    """Builds records of one MDT with increasing index and time."""

    def __init__(self, server: str = "MDT0000", epoch: int = 1, start: int = 1000):
        self.server, self.epoch, self.t, self.i = server, epoch, start, 0

    def __call__(self, type_: str, **kw) -> Record:
        self.t += 10
        self.i += 1
        return Record(
            server=kw.pop("server", self.server), index=self.i, epoch=self.epoch, type=type_, time_ns=self.t, **kw
        )


def mkfile(log: Log, fid: str, name: str, parent: str = ROOT, **kw) -> Record:
    return log("CREAT", tfid=fid, pfid=parent, name=name, mode=REG, uid=1000, gid=100, **kw)


def mkdir(log: Log, fid: str, name: str, parent: str = ROOT) -> Record:
    return log("MKDIR", tfid=fid, pfid=parent, name=name, mode=DIRM, uid=0, gid=0)


def run(records, prev=(), track_data=False) -> FsModel:
    model = FsModel.from_snapshot_rows(ROOT, prev, track_data=track_data)
    for r in sort_records(records):
        model.apply(r)
    return model


def rows_by_fid(rows):
    return {r["fid"]: r for r in rows}


# --------------------------------------------------------------------------- creation and rows


def test_create_records_make_exact_snapshot_rows():
    log = Log()
    lay = Layout(65536, 2, (LayoutObject("OST0000", "0x1"), LayoutObject("OST0001", "0x1")))
    recs = [
        mkdir(log, "D", "dir"),
        mkfile(log, "F", "a file", parent="D", layout=lay, atime_ns=5, mtime_ns=6, ctime_ns=7),
        log("SLINK", tfid="S", pfid=ROOT, name="ln", symlink="dir/a file", mode=stat.S_IFLNK | 0o777, uid=1, gid=2),
        log("MKNOD", tfid="P", pfid="D", name="pipe", mode=stat.S_IFIFO | 0o600, uid=3, gid=4),
    ]
    rows = rows_by_fid(replay(ROOT, [], recs))
    assert list(rows) == sorted(rows)  # sorted by fid, root included
    assert rows[ROOT]["links"] == [] and rows[ROOT]["type"] == "dir"
    assert rows["F"] == {
        "fid": "F",
        "type": "file",
        "links": [("D", "a file")],
        "mode": REG,
        "uid": 1000,
        "gid": 100,
        "size": 0,
        "atime_ns": 5,
        "mtime_ns": 6,
        "ctime_ns": 7,
        "xattrs": [],
        "symlink": None,
        "layout": (65536, 2, [("OST0000", "0x1"), ("OST0001", "0x1")]),
        "objects": [],
    }
    assert (rows["S"]["type"], rows["S"]["symlink"], rows["S"]["mtime_ns"]) == ("symlink", "dir/a file", None)
    assert (rows["P"]["type"], rows["P"]["links"]) == ("other", [("D", "pipe")])
    assert rows["D"]["type"] == "dir"
    assert run(recs).paths() == {"dir": "D", "dir/a file": "F", "ln": "S", "dir/pipe": "P"}


def test_rows_are_accepted_by_spark_with_the_snapshot_schema(spark):
    from epochsync.core.model import snapshot_struct_type

    log = Log()
    lay = Layout(4096, 1, (LayoutObject("OST0000", "0x1"),))
    recs = [
        mkfile(log, "F", "f", layout=lay),
        log("XATTR", tfid="F", xattr_name="user.k", xattr_value=b"\x00v"),
        log("WRITE", server="OST0000", tfid="F", object=ObjectRef("OST0000", "0x1", "v1"), extents=(Extent(0, 9),)),
    ]
    rows = replay(ROOT, [], recs)
    df = spark.createDataFrame([tuple(r[f] for f in SNAPSHOT_FIELDS) for r in rows], snapshot_struct_type())
    back = {r["fid"]: r for r in df.collect()}
    assert back["F"]["xattrs"][0]["value"] == bytearray(b"\x00v")
    assert back["F"]["objects"][0]["version"] == "v1"
    assert back["F"]["layout"]["objects"][0]["oid"] == "0x1"
    # Spark rows load back into the model unchanged
    assert FsModel.from_snapshot_rows(ROOT, df.collect()).snapshot_rows() == rows


def test_snapshot_json_round_trip_and_model_round_trip():
    log = Log()
    lay = Layout(4096, 2, (LayoutObject("OST0000", "0x1"), LayoutObject("OST0001", "0x7")))
    recs = [
        mkdir(log, "D", "d"),
        mkfile(log, "F", "f", parent="D", layout=lay),
        log("HLINK", tfid="F", pfid=ROOT, name="g"),
        log("XATTR", tfid="F", xattr_name="user.a", xattr_value=b"\xff\x00"),
        log("WRITE", server="OST0001", tfid="F", object=ObjectRef("OST0001", "0x7", "x"), extents=(Extent(0, 10),)),
    ]
    rows = replay(ROOT, [], recs)
    assert [snapshot_row_from_json(snapshot_row_to_json(r)) for r in rows] == rows
    assert FsModel.from_snapshot_rows(ROOT, rows).snapshot_rows() == rows


# --------------------------------------------------------------------------- links


def test_create_then_unlink_in_one_epoch_leaves_nothing():
    prev = replay(ROOT, [], [mkfile(Log(epoch=1), "A", "keep")])
    log = Log(epoch=2, start=10_000)
    recs = [
        mkfile(log, "T", "tmp"),
        log("WRITE", tfid="T", extents=(Extent(0, 100),)),
        log("RENME", pfid=ROOT, name="tmp2", sfid="T", spfid=ROOT, sname="tmp"),
        log("UNLNK", tfid="T", pfid=ROOT, name="tmp2", flags=1),
        # a late write to the deleted file (open-unlinked) changes nothing
        log("WRITE", tfid="T", extents=(Extent(0, 500),)),
    ]
    assert replay(ROOT, prev, recs) == prev


def test_rename_over_existing_file_deletes_its_last_link():
    log = Log()
    prev = replay(ROOT, [], [mkfile(log, "A", "a"), mkfile(log, "B", "b")])
    rows = rows_by_fid(
        replay(ROOT, prev, [log("RENME", tfid="B", pfid=ROOT, name="b", sfid="A", spfid=ROOT, sname="a")])
    )
    assert "B" not in rows
    assert rows["A"]["links"] == [(ROOT, "b")]


def test_rename_over_a_hard_linked_file_keeps_its_other_name():
    log = Log()
    prev = replay(
        ROOT, [], [mkfile(log, "A", "a"), mkfile(log, "B", "b"), log("HLINK", tfid="B", pfid=ROOT, name="b2")]
    )
    rows = rows_by_fid(
        replay(ROOT, prev, [log("RENME", tfid="B", pfid=ROOT, name="b", sfid="A", spfid=ROOT, sname="a")])
    )
    assert rows["B"]["links"] == [(ROOT, "b2")]
    assert rows["A"]["links"] == [(ROOT, "b")]


def test_rename_chain_back_to_the_original_name_is_a_no_op():
    log = Log()
    prev = replay(ROOT, [], [mkdir(log, "D", "d"), mkfile(log, "A", "a")])
    recs = [
        log("RENME", pfid="D", name="x", sfid="A", spfid=ROOT, sname="a"),
        log("RENME", pfid=ROOT, name="y", sfid="A", spfid="D", sname="x"),
        log("RENME", pfid=ROOT, name="a", sfid="A", spfid=ROOT, sname="y"),
    ]
    assert replay(ROOT, prev, recs) == prev


def test_swap_through_a_temp_name():
    log = Log()
    prev = replay(ROOT, [], [mkfile(log, "A", "a"), mkfile(log, "B", "b")])
    recs = [
        log("RENME", pfid=ROOT, name="tmp", sfid="A", spfid=ROOT, sname="a"),
        log("RENME", pfid=ROOT, name="a", sfid="B", spfid=ROOT, sname="b"),
        log("RENME", pfid=ROOT, name="b", sfid="A", spfid=ROOT, sname="tmp"),
    ]
    rows = rows_by_fid(replay(ROOT, prev, recs))
    assert (rows["A"]["links"], rows["B"]["links"]) == ([(ROOT, "b")], [(ROOT, "a")])


def test_hard_links_file_survives_while_one_name_remains():
    log = Log()
    recs = [mkdir(log, "D", "d"), mkfile(log, "F", "one"), log("HLINK", tfid="F", pfid="D", name="two")]
    rows = rows_by_fid(replay(ROOT, [], recs))
    assert rows["F"]["links"] == [("D", "two"), (ROOT, "one")]
    recs.append(log("UNLNK", tfid="F", pfid=ROOT, name="one"))
    assert rows_by_fid(replay(ROOT, [], recs))["F"]["links"] == [("D", "two")]
    recs.append(log("UNLNK", tfid="F", pfid="D", name="two", flags=1))
    assert "F" not in rows_by_fid(replay(ROOT, [], recs))


def test_rename_onto_another_name_of_the_same_file_changes_nothing():
    log = Log()
    prev = replay(ROOT, [], [mkfile(log, "F", "a"), log("HLINK", tfid="F", pfid=ROOT, name="b")])
    assert replay(ROOT, prev, [log("RENME", tfid="F", pfid=ROOT, name="b", sfid="F", spfid=ROOT, sname="a")]) == prev


def test_directory_rename_moves_every_descendant_path():
    log = Log()
    model = run(
        [
            mkdir(log, "D", "d"),
            mkdir(log, "E", "e", parent="D"),
            mkfile(log, "F", "f", parent="E"),
            mkdir(log, "X", "x"),
            log("RENME", pfid="X", name="moved", sfid="D", spfid=ROOT, sname="d"),
        ]
    )
    assert model.paths() == {"x": "X", "x/moved": "D", "x/moved/e": "E", "x/moved/e/f": "F"}


def test_rename_over_an_empty_directory_replaces_it():
    log = Log()
    model = run([mkdir(log, "D", "d"), mkdir(log, "E", "e"), mkfile(log, "F", "f", parent="D")])
    model.apply(log("RENME", tfid="E", pfid=ROOT, name="e", sfid="D", spfid=ROOT, sname="d"))
    assert model.paths() == {"e": "D", "e/f": "F"}
    assert "E" not in model.nodes


def test_rmdir_and_root_survives_everything():
    log = Log()
    rows = replay(ROOT, [], [mkdir(log, "D", "d"), log("RMDIR", tfid="D", pfid=ROOT, name="d")])
    assert [r["fid"] for r in rows] == [ROOT]


# --------------------------------------------------------------------------- attributes and xattrs


def test_set_then_remove_xattr_is_nothing_and_remove_of_an_old_one_sticks():
    log = Log()
    prev = replay(ROOT, [], [mkfile(log, "F", "f"), log("XATTR", tfid="F", xattr_name="user.old", xattr_value=b"1")])
    recs = [
        log("XATTR", tfid="F", xattr_name="user.new", xattr_value=b"2"),
        log("XATTR", tfid="F", xattr_name="user.new", xattr_value=None),
        log("XATTR", tfid="F", xattr_name="user.old", xattr_value=None),
        log("XATTR", tfid="F", xattr_name="user.last", xattr_value=b"a"),
        log("XATTR", tfid="F", xattr_name="user.last", xattr_value=b"b"),
    ]
    assert rows_by_fid(replay(ROOT, prev, recs))["F"]["xattrs"] == [("user.last", b"b")]


def test_sattr_sets_only_what_it_carries_and_keeps_type_bits():
    log = Log()
    recs = [mkfile(log, "F", "f", atime_ns=1, mtime_ns=1, ctime_ns=1), log("SATTR", tfid="F", mode=0o600, uid=7)]
    row = rows_by_fid(replay(ROOT, [], recs))["F"]
    assert (row["mode"], row["uid"], row["gid"], row["mtime_ns"]) == (stat.S_IFREG | 0o600, 7, 100, 1)
    recs.append(log("SATTR", tfid="F", size=33, mtime_ns=99, gid=5))
    row = rows_by_fid(replay(ROOT, [], recs))["F"]
    assert (row["size"], row["mtime_ns"], row["gid"], row["atime_ns"]) == (33, 99, 5, 1)


def test_time_records_use_their_value_or_the_record_time():
    log = Log()
    c = mkfile(log, "F", "f")
    m = log("MTIME", tfid="F")
    a = log("ATIME", tfid="F", atime_ns=42)
    x = log("CTIME", tfid="F")
    row = rows_by_fid(replay(ROOT, [], [c, m, a, x]))["F"]
    assert (row["mtime_ns"], row["atime_ns"], row["ctime_ns"]) == (m.time_ns, 42, x.time_ns)


def test_truncate_down_then_extend_zero_fills():
    log = Log()
    model = run([mkfile(log, "F", "f"), log("WRITE", tfid="F", extents=(Extent(0, 10),))], track_data=True)
    model.nodes["F"].data[:] = b"0123456789"
    model.apply(log("TRUNC", tfid="F", size=4))
    model.apply(log("TRUNC", tfid="F", size=8))
    assert (model.nodes["F"].size, bytes(model.nodes["F"].data)) == (8, b"0123\0\0\0\0")


def test_eventless_records_change_nothing():
    log = Log()
    prev = replay(ROOT, [], [mkfile(log, "F", "f")])
    recs = [log(t, tfid="F") for t in ("OPEN", "CLOSE", "MARK", "EPOCH", "HSM", "GXATR")]
    assert replay(ROOT, prev, recs) == prev


# --------------------------------------------------------------------------- data


def test_striped_write_maps_object_offsets_to_file_offsets():
    log = Log()
    lay = Layout(4, 2, (LayoutObject("OST0000", "0xa"), LayoutObject("OST0001", "0xb")))
    model = run([mkfile(log, "F", "f", layout=lay)])
    # object 1 bytes [0, 6) hold file bytes [4, 8) and [12, 14): size becomes 14
    model.apply(
        log("WRITE", server="OST0001", tfid="F", object=ObjectRef("OST0001", "0xb", "v1"), extents=(Extent(0, 6),))
    )
    assert model.nodes["F"].size == 14
    # a write inside the size does not shrink it; the newest version wins
    model.apply(
        log("WRITE", server="OST0000", tfid="F", object=ObjectRef("OST0000", "0xa", "v2"), extents=(Extent(0, 2),))
    )
    model.apply(
        log("WRITE", server="OST0001", tfid="F", object=ObjectRef("OST0001", "0xb", "v3", 6), extents=(Extent(1, 1),))
    )
    row = model.nodes["F"].row()
    assert row["size"] == 14
    # the version's length travels with the version (the record's; None where it gave none)
    assert row["objects"] == [("OST0000", "0xa", "v2", None), ("OST0001", "0xb", "v3", 6)]


def test_object_write_without_extents_only_reports_a_version():
    log = Log()
    lay = Layout(4, 1, (LayoutObject("OST0000", "0xa"),))
    model = run([mkfile(log, "F", "f", layout=lay), log("TRUNC", tfid="F", size=3)])
    model.apply(log("WRITE", server="OST0000", tfid="F", object=ObjectRef("OST0000", "0xa", "p"), extents=()))
    assert (model.nodes["F"].size, model.nodes["F"].row()["objects"]) == (3, [("OST0000", "0xa", "p", None)])


def test_unstriped_and_file_offset_writes():
    log = Log()
    model = run([mkfile(log, "U", "u"), mkfile(log, "V", "v")])
    model.apply(
        log("WRITE", server="OST0002", tfid="U", object=ObjectRef("OST0002", "U", "v9"), extents=(Extent(5, 5),))
    )
    model.apply(log("WRITE", tfid="V", extents=(Extent(100, 1), Extent(0, 3))))
    assert (model.nodes["U"].size, model.nodes["V"].size) == (10, 101)
    assert model.nodes["U"].row()["objects"] == [("OST0002", "U", "v9", None)]
    assert model.nodes["V"].row()["objects"] == []


def test_lyout_replaces_the_layout_and_forgets_old_objects():
    log = Log()
    old = Layout(4, 1, (LayoutObject("OST0000", "0x1"),))
    new = Layout(8, 1, (LayoutObject("OST0001", "0x2"),))
    recs = [
        mkfile(log, "F", "f", layout=old),
        log("WRITE", server="OST0000", tfid="F", object=ObjectRef("OST0000", "0x1", "a"), extents=(Extent(0, 1),)),
        log("LYOUT", tfid="F", layout=new),
    ]
    row = rows_by_fid(replay(ROOT, [], recs))["F"]
    assert (row["layout"], row["objects"], row["size"]) == ((8, 1, [("OST0001", "0x2")]), [], 1)


# --------------------------------------------------------------------------- order and errors


def test_replay_keeps_each_servers_order_whatever_the_input_order():
    log = Log()
    recs = [
        mkfile(log, "A", "a"),
        log("RENME", pfid=ROOT, name="b", sfid="A", spfid=ROOT, sname="a"),
        log("XATTR", tfid="A", xattr_name="user.x", xattr_value=b"1"),
        log("HLINK", tfid="A", pfid=ROOT, name="c"),
        log("UNLNK", tfid="A", pfid=ROOT, name="b"),
    ]
    expect = replay(ROOT, [], recs)
    shuffled = recs[:]
    random.Random(4).shuffle(shuffled)
    assert replay(ROOT, [], shuffled) == expect
    # same time on two servers: the unlink of the last name waits for the hard link that needs the file
    t = [
        Record(server="MDT0001", index=1, epoch=1, type="UNLNK", time_ns=5, tfid="A", pfid=ROOT, name="a"),
        Record(server="MDT0000", index=2, epoch=1, type="HLINK", time_ns=5, tfid="A", pfid=ROOT, name="z"),
        Record(server="MDT0000", index=1, epoch=1, type="CREAT", time_ns=5, tfid="A", pfid=ROOT, name="a", mode=REG),
    ]
    assert rows_by_fid(replay(ROOT, [], t))["A"]["links"] == [(ROOT, "z")]


# --------------------------------------------------------------------------- causal order across servers

M0, M1 = "[0x200000400:0x1:0x0]", "[0x200000401:0x1:0x0]"


def cross_mdt_move(create_ns: int, rename_ns: int) -> list[Record]:
    """Issue 16: MDT0001 creates F in its directory M1, MDT0000 renames it into M0 (one cookie)."""
    return [
        Record("MDT0000", 1, 1, "MKDIR", time_ns=10, tfid=M0, pfid=ROOT, name="m0", mode=DIRM),
        Record("MDT0000", 2, 1, "MKDIR", time_ns=20, tfid=M1, pfid=ROOT, name="m1", mode=DIRM),
        Record("MDT0001", 1, 1, "CREAT", time_ns=create_ns, tfid="F", pfid=M1, name="f", mode=REG, cookie="op"),
        Record(
            "MDT0000", 3, 1, "RENME", time_ns=rename_ns, sfid="F", spfid=M1, sname="f", pfid=M0, name="f", cookie="op"
        ),
    ]


@pytest.mark.parametrize("create_ns, rename_ns", [(1000, 1001), (1000, 1000), (1005, 1002), (1_000_000, 30)], ids=str)
def test_cross_mdt_create_then_rename_whatever_the_clocks(create_ns, rename_ns):
    """Same time, or MDT0001's clock ahead: the rename still removes the name the create added."""
    rows = rows_by_fid(replay(ROOT, [], cross_mdt_move(create_ns, rename_ns)))
    assert rows["F"]["links"] == [(M0, "f")]


def test_causal_time_keeps_index_order_and_joins_an_operations_servers():
    from epochsync_dev.oracle import causal_times

    recs = [
        Record("MDT0000", 1, 1, "SATTR", time_ns=100, tfid="X"),
        Record("MDT0000", 2, 1, "SATTR", time_ns=40, tfid="X"),  # the clock stepped back
        Record("MDT0000", 3, 1, "MTIME", time_ns=50, tfid="X", cookie="w"),
        Record("OST0000", 1, 1, "WRITE", time_ns=500, tfid="X", cookie="w"),  # the OST clock runs ahead
        Record("MDT0000", 4, 1, "TRUNC", time_ns=60, tfid="X", size=0),
        Record("OST0001", 1, 1, "WRITE", time_ns=7, tfid="Y", cookie="solo"),  # one server: no operation
    ]
    assert causal_times(recs) == [100, 100, 500, 500, 501, 7]
    assert [(r.server, r.index) for r in sort_records(recs)] == [
        ("OST0001", 1),
        ("MDT0000", 1),
        ("MDT0000", 2),
        ("MDT0000", 3),
        ("OST0000", 1),
        ("MDT0000", 4),
    ]


def test_values_follow_the_creator_and_the_operations_across_servers():
    log = Log()
    recs = [
        # the directory is made on MDT0000, its mode set on its own MDT0001, whose clock is behind
        Record("MDT0000", 1, 1, "MKDIR", time_ns=1000, tfid="D", pfid=ROOT, name="d", mode=DIRM),
        Record("MDT0001", 1, 1, "SATTR", time_ns=10, tfid="D", mode=0o700),
        # a write and its MTIME (one operation), then a truncate on the MDT, whose clock is behind
        Record("MDT0000", 2, 1, "CREAT", time_ns=1100, tfid="F", pfid=ROOT, name="f", mode=REG),
        Record("OST0000", 1, 1, "WRITE", time_ns=5000, tfid="F", extents=(Extent(0, 100),), cookie="w"),
        Record("MDT0000", 3, 1, "MTIME", time_ns=1200, tfid="F", cookie="w"),
        Record("MDT0000", 4, 1, "TRUNC", time_ns=1300, tfid="F", size=10),
    ]
    rows = rows_by_fid(replay(ROOT, [], recs))
    assert rows["D"]["mode"] == stat.S_IFDIR | 0o700
    assert (rows["F"]["size"], rows["F"]["mtime_ns"]) == (10, 1200)
    del log


@pytest.mark.parametrize(
    "recs, named",
    [
        # MDT0000 renames away a name no server ever created
        (
            [Record("MDT0000", 7, 1, "RENME", time_ns=5, sfid="F", spfid=M1, sname="f", pfid=ROOT, name="f")],
            "MDT0000 index 7 (RENME",
        ),
        # the only create of the name comes after its removal on the same server
        (
            [
                Record("MDT0001", 1, 1, "UNLNK", time_ns=5, tfid="F", pfid=ROOT, name="f"),
                Record("MDT0001", 2, 1, "CREAT", time_ns=1, tfid="F", pfid=ROOT, name="f", mode=REG),
            ],
            "MDT0001 index 1 (UNLNK",
        ),
        # two creates of one name on one server, the removal between them nowhere
        (
            [
                Record("MDT0000", 1, 1, "CREAT", time_ns=1, tfid="F", pfid=ROOT, name="f", mode=REG),
                Record("MDT0000", 2, 1, "HLINK", time_ns=2, tfid="F", pfid=ROOT, name="f"),
            ],
            "MDT0000 index 2 (HLINK",
        ),
    ],
    ids=["never-created", "removed-before-created", "added-twice"],
)
def test_a_history_with_no_consistent_order_names_the_records(recs, named):
    with pytest.raises(InconsistentRecord, match=re.escape(named)) as err:
        replay(ROOT, [], recs)
    assert "no order of the records applies" in str(err.value)


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(
    seed=st.integers(0, 2**31),
    mdts=st.integers(2, 4),
    osts=st.integers(1, 3),
    ops=st.integers(5, 60),
    skew_us=st.integers(0, 2000),
    tick_us=st.sampled_from([1, 10, 1000]),
)
def test_any_clock_skew_gives_the_true_namespace(seed, mdts, osts, ops, skew_us, tick_us):
    """Per-server clock offsets up to ``skew_us`` and clocks of ``tick_us`` resolution (ties):
    the replay never refuses the history and ends in the true namespace (which fid holds which
    name); values may differ only where no operation links the servers (issue 16)."""
    from epochsync_dev.simulate.workload import simulate_history

    hist = simulate_history(seed, 2, 8, mdts=mdts, osts=osts, ops_per_epoch=ops, data=False)
    rng = random.Random(seed)
    for e in (1, 2):
        offset = {s: rng.randint(-skew_us, skew_us) * 1000 for s in {r.server for r in hist.at(e).records}}
        skewed = [r.replace(time_ns=(r.time_ns + offset[r.server]) // (tick_us * 1000)) for r in hist.at(e).records]
        got = replay(hist.root_fid, hist.snapshot_before(e), skewed)
        want = hist.at(e).snapshot
        assert [(r["fid"], r["links"]) for r in got] == [(r["fid"], r["links"]) for r in want]


@pytest.mark.parametrize(
    "bad, message",
    [
        (lambda log: mkfile(log, "G", "a"), "name 'a' in .* already names A"),
        (lambda log: mkfile(log, "A", "other"), "fid A already exists"),
        (lambda log: log("UNLNK", tfid="A", pfid=ROOT, name="nope"), "no entry 'nope'"),
        (lambda log: log("UNLNK", tfid="Z", pfid=ROOT, name="a"), "names A, not Z"),
        (lambda log: log("RMDIR", tfid="D", pfid=ROOT, name="d"), "non-empty directory D"),
        (lambda log: log("UNLNK", tfid="D", pfid=ROOT, name="d"), "directories go with RMDIR"),
        (lambda log: log("RENME", pfid="E", name="x", sfid="D", spfid=ROOT, sname="d"), "into its own subtree"),
        (lambda log: log("RENME", tfid="A", pfid=ROOT, name="a", sfid="D", spfid=ROOT, sname="d"), "dir over a file"),
        (lambda log: log("HLINK", tfid="D", pfid=ROOT, name="h"), "hard link to directory"),
        (lambda log: log("CREAT", tfid="N", pfid="A", name="n", mode=REG), "is a file, not a directory"),
        (lambda log: log("SATTR", tfid="nobody", uid=1), "fid nobody does not exist"),
        (
            lambda log: log("WRITE", tfid="A", object=ObjectRef("OST0009", "0x1", "v"), extents=(Extent(0, 1),)),
            "not in the layout",
        ),
        (lambda log: log("TRUNC", tfid="A"), "TRUNC without a size"),
    ],
)
def test_inconsistent_records_raise_a_clear_error(bad, message):
    log = Log()
    lay = Layout(4, 1, (LayoutObject("OST0000", "0x1"),))
    model = run([mkfile(log, "A", "a", layout=lay), mkdir(log, "D", "d"), mkdir(log, "E", "e", parent="D")])
    rec = bad(log)
    with pytest.raises(InconsistentRecord, match=message) as err:
        model.apply(rec)
    assert str(err.value).startswith(f"MDT0000 index {rec.index} ({rec.type}, epoch 1): ")
