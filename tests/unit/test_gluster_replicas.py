"""Replicated Gluster volumes without a volume: replica sets, quorum, coverage, the union of the
set's records, the reader's choice, pending heals read from a brick's AFR index, the volume types
refused, and AFR's anonymous-inode directory kept out of the namespace."""

from __future__ import annotations

import os
import uuid

import pytest
from support.machine import cannot_run_here

from epochsync.core import gluster as core_gluster
from epochsync.core.config import config_from_dict
from epochsync.core.errors import ConfigError, EpochError
from epochsync.core.gluster import GlusterError, check_supported, volume_info
from epochsync.core.schema import Record
from epochsync.sources.gluster.backend import BrickView, walk_brick
from epochsync.sources.gluster.reader import data_roots
from epochsync.sources.gluster.replicas import (
    choose_reader,
    covered,
    merge_set_records,
    owed_heals,
    quorum,
    replica_sets,
    started_s,
)

ROOT = "00000000-0000-0000-0000-000000000001"


def test_sets_group_consecutive_bricks_and_the_arbiter_is_last():
    sets = replica_sets([f"brick{i}" for i in range(1, 7)], 3, False)
    assert [(s.name, s.bricks, s.arbiter) for s in sets] == [
        ("set1", ("brick1", "brick2", "brick3"), None),
        ("set2", ("brick4", "brick5", "brick6"), None),
    ]
    (arb,) = replica_sets(["brick1", "brick2", "brick3"], 3, True)
    assert arb.arbiter == "brick3" and arb.data_bricks == ("brick1", "brick2")


def test_quorum_follows_afr_client_quorum():
    assert quorum(3, {}) == 2  # auto from replica 3 on
    assert quorum(2, {}) == 1  # none for replica 2
    assert quorum(4, {"cluster.quorum-type": "auto"}) == 2
    assert quorum(3, {"cluster.quorum-type": "none"}) == 1
    assert quorum(3, {"cluster.quorum-type": "fixed", "cluster.quorum-count": "3"}) == 3
    assert quorum(3, {"cluster.quorum-type": "fixed", "cluster.quorum-count": "x"}) == 1


def test_a_set_is_covered_while_fewer_than_quorum_bricks_are_unread():
    (s,) = replica_sets(["brick1", "brick2", "brick3"], 3, False)
    assert covered(s, set(), 2) and covered(s, {"brick2"}, 2)
    assert not covered(s, {"brick2", "brick3"}, 2)
    assert not covered(s, {"brick1"}, 1)  # quorum none: an operation may be on one brick only
    (a,) = replica_sets(["brick1", "brick2", "brick3"], 3, True)
    assert covered(a, set(), 2)
    assert not covered(a, {"brick1"}, 2)  # the arbiter counts as unread: it holds no data


def _r(type_, tfid, name=None, server="x"):
    return Record(server=server, index=0, epoch=1, type=type_, tfid=tfid, pfid=ROOT if name else None, name=name)


def test_the_union_of_a_sets_records_counts_each_operation_once():
    a = [_r("CREAT", "g1", "a"), _r("WRITE", "g1"), _r("WRITE", "g1")]
    b = [_r("CREAT", "g1", "a", server="y"), _r("WRITE", "g1", server="y"), _r("UNLNK", "g2", "b", server="y")]
    c = [_r("WRITE", "g1"), _r("WRITE", "g1"), _r("WRITE", "g1"), _r("UNLNK", "g2", "b")]
    out = merge_set_records([a, b, c])
    assert [(r.type, r.tfid) for r in out] == [
        ("CREAT", "g1"),
        ("WRITE", "g1"),
        ("WRITE", "g1"),
        ("UNLNK", "g2"),  # only b and c have it: once
        ("WRITE", "g1"),  # c logged a third write: more than any brick before
    ]
    assert merge_set_records([[], a]) == a


def _choose(**kw):
    (s,) = replica_sets(["brick1", "brick2", "brick3"], 3, kw.pop("arbiter", False))
    base = dict(
        previous=None, online=None, owed_now={}, owed_before={}, started={}, last_cut_s=None, source="v", epoch=4
    )
    base.update(kw)
    return choose_reader(s, **base)


def test_the_reader_is_kept_while_it_qualifies_and_never_down_owed_or_an_arbiter():
    assert _choose().reader == "brick1"
    assert _choose(previous="brick2").reader == "brick2"
    v = _choose(previous="brick1", online={"brick1": False, "brick2": True, "brick3": True})
    assert v.reader == "brick2" and "down at the cut" in v.refused["brick1"]
    v = _choose(owed_now={"brick1": 5, "brick2": 1})
    assert v.reader == "brick3" and "owed heals of 5 gfids at this cut" in v.refused["brick1"]
    # owed at the last cut or restarted since it: a last choice, taken only when nothing else is left
    assert _choose(owed_before={"brick1": 2}).reader == "brick2"
    assert _choose(started={"brick1": 100, "brick2": 100}, last_cut_s=99.5).reader == "brick3"
    assert _choose(owed_before={"brick1": 1, "brick2": 1, "brick3": 1}, previous="brick3").reader == "brick3"
    assert _choose(arbiter=True, owed_now={"brick1": 1}).reader == "brick2"  # the arbiter never reads
    with pytest.raises(EpochError, match=r"no brick of set1 can be read \(brick1: down .*brick3: the arbiter"):
        _choose(arbiter=True, online={"brick1": False, "brick2": True, "brick3": True}, owed_now={"brick2": 3})


def _gfid_bytes(g: str) -> bytes:
    return uuid.UUID(g).bytes


def _can_set_trusted(path) -> bool:
    try:
        os.setxattr(path, "trusted.epochsync-test", b"1")
        os.removexattr(path, "trusted.epochsync-test")
        return True
    except OSError:
        return False


def _brick(root, files: dict[str, dict[str, bytes]]):
    """A brick tree: each gfid a file at the root with its handle and the given trusted xattrs."""
    os.makedirs(root / ".glusterfs" / "indices" / "xattrop", exist_ok=True)
    (root / ".glusterfs" / "indices" / "xattrop" / f"xattrop-{uuid.uuid4()}").write_bytes(b"")
    for g, xattrs in files.items():
        d = root / ".glusterfs" / g[0:2] / g[2:4]
        d.mkdir(parents=True, exist_ok=True)
        (d / g).write_bytes(b"x")
        for k, v in xattrs.items():
            os.setxattr(d / g, k, v)
        (root / ".glusterfs" / "indices" / "xattrop" / g).write_bytes(b"")  # the index entry (a link in Gluster)


def test_pending_heals_are_read_from_a_peers_afr_index(tmp_path):
    if not _can_set_trusted(tmp_path):
        cannot_run_here("EPOCHSYNC_REQUIRE_GLUSTER", "a brick's trusted.* xattrs", "setting them needs root")
    g1, g2, g3 = (str(uuid.uuid4()) for _ in range(3))
    zero, data = bytes(12), bytes.fromhex("000000020000000100000000")
    _brick(
        tmp_path / "b1",
        {
            g1: {"trusted.afr.vol-client-2": data, "trusted.afr.dirty": zero},
            g2: {"trusted.afr.vol-client-2": data, "trusted.afr.vol-client-1": zero},
        },
    )
    _brick(tmp_path / "b2", {g1: {"trusted.afr.vol-client-2": data}, g3: {"trusted.afr.other-client-0": data}})
    _brick(tmp_path / "b3", {})
    from epochsync.sources.gluster.bricks import LocalBrick

    bricks = [LocalBrick(f"brick{i}", str(tmp_path / f"b{i}")) for i in (1, 2, 3)]
    owed = owed_heals(bricks, "vol", {"brick1": 0, "brick2": 1, "brick3": 2})
    assert owed == {
        "brick3": 2
    }  # g1 and g2 (g1 on two peers: the most one says); a zero counter and another volume's key owe nothing
    assert owed_heals([LocalBrick("brick1", str(tmp_path / "nowhere"))], "vol", {"brick1": 0}) == {}


def test_a_restart_is_the_newest_htime(tmp_path):
    (tmp_path / "htime").mkdir()
    assert started_s(str(tmp_path)) is None
    for t in (1796188402, 1796189000):
        (tmp_path / "htime" / f"HTIME.{t}").write_text("")
    assert started_s(str(tmp_path)) == 1796189000


def test_data_is_read_through_each_sets_reader():
    rec = {
        "bricks": {f"brick{i}": {"root": f"/s/b{i}"} for i in range(1, 7)},
        "sets": {"set1": {"reader": "brick2"}, "set2": {"reader": "brick4"}},
    }
    assert data_roots(rec) == {"set1": "/s/b2", "set2": "/s/b4"}
    del rec["sets"]
    assert data_roots(rec)["brick6"] == "/s/b6"


_INFO = """<cliOutput><opRet>0</opRet><volInfo><volumes><volume><name>v</name><id>cfa42df4-4186-44ef-9c09-a5e031b4ab97</id>
<statusStr>Started</statusStr><replicaCount>{r}</replicaCount><arbiterCount>{a}</arbiterCount><disperseCount>{d}</disperseCount>
<typeStr>{t}</typeStr><bricks>{bricks}</bricks><options><option><name>cluster.quorum-type</name><value>auto</value></option></options>
</volume></volumes></volInfo></cliOutput>"""


def _info(monkeypatch, *, t, r=3, a=0, d=0, n=3):
    bricks = "".join(
        f"<brick><name>10.0.0.{i}:/b/{i}</name><isArbiter>{int(a and i % r == 0)}</isArbiter></brick>"
        for i in range(1, n + 1)
    )
    monkeypatch.setattr(core_gluster, "run_gluster", lambda *a_, **k: _INFO.format(r=r, a=a, d=d, t=t, bricks=bricks))
    return volume_info("v", command=("ssh", "n1", "gluster"))


def test_volume_types_are_read_and_dispersed_ones_refused(monkeypatch):
    info = _info(monkeypatch, t="Distributed-Replicate", n=6, a=1)
    assert (info["replica"], info["arbiter"], info["arbiters"]) == (3, 1, ["brick3", "brick6"])
    assert info["id"].startswith("cfa42df4") and info["options"]["cluster.quorum-type"] == "auto"
    check_supported(info)
    with pytest.raises(GlusterError, match="dispersed volume stores each file as erasure-coded fragments"):
        check_supported(_info(monkeypatch, t="Disperse", r=1, d=3))
    with pytest.raises(GlusterError, match="not whole replica sets of 3"):
        check_supported(_info(monkeypatch, t="Replicate", n=4))


def test_a_replicated_sources_servers_are_its_sets(tmp_path):
    def cfg(**src):
        return config_from_dict(
            {
                "warehouse": str(tmp_path / "wh"),
                "sources": [
                    {
                        "name": "v",
                        "kind": "gluster",
                        "volume": "v",
                        "epoch": {"interval": "10s", "start": "2026-01-01T00:00:00Z"},
                        **src,
                    }
                ],
                "targets": [],
            }
        ).sources[0]

    six = [f"h{i}:/b/{i}" for i in range(1, 7)]
    s = cfg(bricks=six, replica=3)
    assert s.servers == ("set1", "set2") and s.replica == 3 and not s.arbiter and not s.cut.barrier
    assert cfg(bricks=six).servers == tuple(f"brick{i}" for i in range(1, 7))
    with pytest.raises(ConfigError, match=r"sources\[0\]: 6 bricks are not whole replica sets of 4"):
        cfg(bricks=six, replica=4)
    with pytest.raises(ConfigError, match="an arbiter needs replica 3"):
        cfg(bricks=six[:2], replica=2, arbiter=True)


def test_afrs_anonymous_inode_directory_is_not_part_of_the_volume(tmp_path):
    if not _can_set_trusted(tmp_path):
        cannot_run_here("EPOCHSYNC_REQUIRE_GLUSTER", "a brick's trusted.* xattrs", "setting them needs root")
    root = tmp_path / "brick"
    anon_gfid, parked, kept = (str(uuid.uuid4()) for _ in range(3))
    anon = root / f".glusterfs-anonymous-inode-{uuid.uuid4()}"
    anon.mkdir(parents=True)
    os.setxattr(anon, "trusted.gfid", _gfid_bytes(anon_gfid))
    for g, where in ((parked, anon / parked), (kept, root / "kept")):
        where.write_bytes(b"data")
        os.setxattr(where, "trusted.gfid", _gfid_bytes(g))
        parent = anon_gfid if g == parked else ROOT
        name = parked if g == parked else "kept"
        os.setxattr(where, f"trusted.gfid2path.{uuid.uuid4().hex[:16]}", f"{parent}/{name}".encode())
        h = root / ".glusterfs" / g[0:2] / g[2:4]
        h.mkdir(parents=True, exist_ok=True)
        os.link(where, h / g)
    h = root / ".glusterfs" / anon_gfid[0:2] / anon_gfid[2:4]
    h.mkdir(parents=True, exist_ok=True)
    os.symlink(f"../../00/00/{ROOT}/{anon.name}", h / anon_gfid)
    view = BrickView("set1", str(root))
    assert [n for _, _, n, _ in walk_brick(view)] == ["kept"]
    assert view.lookup(parked) is None  # a heal parked it: no longer a file of the volume
    assert view.lookup(anon_gfid) is None
    assert view.lookup(kept).names == [(ROOT, "kept")]


def test_status_says_which_brick_read_each_set_and_why_not_the_others():
    from epochsync.report.status import source_cut_lines

    lines = source_cut_lines(
        {
            "epoch": 7,
            "walked": False,
            "down": ["brick1"],
            "owed_heals": {"brick1": 42, "brick3": 0},
            "sets": {
                "set1": {"reader": "brick2", "not_reader": {"brick1": "down at the cut (gluster volume status)"}},
                "set2": {"reader": "brick4", "not_reader": {}},
            },
        }
    )
    assert lines == [
        "  source's last cut: epoch 7; bricks down at the cut: brick1; heals owed to brick1 (42 gfids)",
        "    set1 read by brick2 (not brick1: down at the cut (gluster volume status))",
        "    set2 read by brick4",
    ]
    assert source_cut_lines({"epoch": 3, "walked": True}) == ["  source's last cut: epoch 3 (walked whole)"]


def test_gluster_commands_are_tried_in_turn_until_one_answers(tmp_path):
    """``gluster_command`` then ``gluster_fallbacks``: a server that does not answer (its ssh
    refused, its glusterd down) is passed over; when none answers, the first one's words say why."""
    from epochsync.core.gluster import GlusterError, gluster_commands, run_gluster

    dead = tmp_path / "dead"
    dead.write_text("#!/bin/sh\necho 'ssh: connect to host node1 port 22: Connection refused' >&2\nexit 255\n")
    alive = tmp_path / "alive"
    alive.write_text('#!/bin/sh\necho "answered: $*"\n')
    for f in (dead, alive):
        f.chmod(0o755)
    assert run_gluster(["pool", "list"], command=((str(dead),), (str(alive),))) == "answered: --mode=script pool list\n"
    assert run_gluster(["pool", "list"], command=(str(alive),)).startswith("answered")
    with pytest.raises(GlusterError, match=r"Connection refused \(and 1 more gluster commands failed too: "):
        run_gluster(["pool", "list"], command=((str(dead),), (str(dead), "again")))
    assert gluster_commands(((), ("ssh", "node2", "gluster")))[1] == ["ssh", "node2", "gluster"]


def test_a_source_tries_its_gluster_fallbacks_after_its_command(tmp_path):
    doc = {
        "warehouse": str(tmp_path / "wh"),
        "sources": [
            {
                "name": "vol",
                "kind": "gluster",
                "volume": "v",
                "bricks": ["node1:/b", "node2:/b", "node3:/b"],
                "replica": 3,
                "gluster_command": ["ssh", "node1", "gluster"],
                "gluster_fallbacks": [["ssh", "node2", "gluster"], ["ssh", "node3", "gluster"]],
                "epoch": {"interval": "1m", "start": "2026-01-01T00:00:00Z"},
            }
        ],
        "targets": [{"name": "t", "source": "vol", "kind": "posix", "path": str(tmp_path / "r")}],
    }
    src = config_from_dict(doc).source("vol")
    assert src.gluster_commands == (
        ("ssh", "node1", "gluster"),
        ("ssh", "node2", "gluster"),
        ("ssh", "node3", "gluster"),
    )
