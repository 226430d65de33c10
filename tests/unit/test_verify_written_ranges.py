"""Verify on a posix target from the facts apply records (``PosixTarget.settle_facts``,
``stages.verify.posix_contents``): the ranges apply wrote are read back and compared with the
checksums of the bytes it wrote; a file only moved or re-attributed is not read; anything
without a fact, or changed since apply, is read whole and compared with the source.

Two epochs of a real plan (``build_plan``) applied to a directory tree by ``apply_plan``, the
source bytes from an in-memory reader that counts what it returns.
"""

from __future__ import annotations

import os

import pytest
from support.plans import POSIX_TARGET as TARGET
from support.plans import STORE, row

from epochsync.core.config import TargetConfig
from epochsync.stages.apply import apply_plan
from epochsync.stages.translate import build_plan
from epochsync.stages.verify import posix_contents, verify_plan
from epochsync.stores.s3_access import Counters
from epochsync.targets.posix import PosixTarget, range_checksum

A1 = os.urandom(300_000)
A2 = A1[:1000] + os.urandom(100) + A1[1100:] + os.urandom(65536)  # a patch and an append
B1, C1, L1 = os.urandom(5000), os.urandom(7000), os.urandom(4000)


class Source:
    """The source reader contract over ``{(key, version): bytes}``, counting the bytes it returns."""

    kind = "gluster"
    client = None

    def __init__(self, objects: dict):
        self.objects = objects
        self.counters = Counters()

    def get_range(self, bucket, key, version, offset, length):
        data = self.objects.get((key, version), b"")[offset : offset + length]
        data += bytes(length - len(data))
        self.counters.received(len(data))
        return data

    def get_all(self, bucket, key, version=None):
        data = self.objects[(key, version)]
        self.counters.received(len(data))
        return data


SOURCE = {
    ("data/A", "a1"): A1,
    ("data/A", "a2"): A2,
    ("data/B", "b1"): B1,
    ("data/C", "c1"): C1,
    ("data/L", "l1"): L1,
}


def link(pfid, name, path):
    return {"pfid": pfid, "name": name, "path": path}


def ent(fid, old, new, old_links=(), new_links=(), change=None):
    return {
        "fid": fid,
        "old": old,
        "new": new,
        "old_paths": sorted(lk["path"] for lk in old_links),
        "new_paths": sorted(lk["path"] for lk in new_links),
        "old_links": list(old_links),
        "new_links": list(new_links),
        "change": change,
    }


def file(fid, data, version, mode=0o644):
    return row("file", size=len(data), version=version, fid=fid, mode=mode)


EPOCH1 = [
    ent("D", None, row("dir", mode=0o755), new_links=[link("R", "d", "d")]),
    ent("A", None, file("A", A1, "a1"), new_links=[link("R", "a", "a")]),
    ent("B", None, file("B", B1, "b1"), new_links=[link("R", "b", "b")]),
    ent("C", None, file("C", C1, "c1"), new_links=[link("D", "c", "d/c")]),
    ent("L", None, file("L", L1, "l1"), new_links=[link("R", "l1", "l1"), link("R", "l2", "l2")]),
]
EPOCH2 = [
    ent(
        "A",
        file("A", A1, "a1"),
        file("A", A2, "a2"),
        [link("R", "a", "a")],
        [link("R", "a", "a")],
        {"data_changed": True, "ranges": [{"offset": 1000, "length": 100}, {"offset": 300_000, "length": 65536}]},
    ),
    # an attribute change, and a directory rename with its child renamed in it
    ent("B", file("B", B1, "b1"), file("B", B1, "b1", mode=0o600), [link("R", "b", "b")], [link("R", "b", "b")]),
    ent("D", row("dir", mode=0o755), row("dir", mode=0o755), [link("R", "d", "d")], [link("R", "e", "e")]),
    ent("C", file("C", C1, "c1"), file("C", C1, "c1"), [link("D", "c", "d/c")], [link("D", "c2", "e/c2")]),
]
#: the directory renamed with its child only carried along (the child's parent and name unchanged)
EPOCH2_CARRIED = [
    ent("D", row("dir", mode=0o755), row("dir", mode=0o755), [link("R", "d", "d")], [link("R", "e", "e")]),
    ent("C", file("C", C1, "c1"), file("C", C1, "c1"), [link("D", "c", "d/c")], [link("D", "c", "e/c")]),
]


@pytest.fixture()
def replica(tmp_path):
    """``run(epoch, entries)`` plans and applies an epoch; returns ``(plan, facts)``."""
    target = PosixTarget(TargetConfig(name="t", source="s", kind="posix", path=str(tmp_path / "replica")))
    source = Source(SOURCE)

    def run(epoch: int, entries: list[dict]):
        plan = build_plan(entries, target=TARGET, store=STORE, epoch=epoch)
        problems, state = target.fence_check(plan["fence"], None)
        assert problems == []
        figures = apply_plan(plan, target, source, "src", str(tmp_path / f"undo-{epoch}"), state)
        return plan, figures["facts"]

    def verify(plan, facts, **kw):
        before = source.counters.bytes_received
        result = verify_plan(plan, target, source, "src", facts=facts, **kw)
        return result, source.counters.bytes_received - before

    return {"run": run, "verify": verify, "target": target, "root": tmp_path / "replica"}


def two_epochs(replica):
    plan1, facts1 = replica["run"](1, EPOCH1)
    result, source_read = replica["verify"](plan1, facts1)
    assert result["ok"], result["problems"]
    plan2, facts2 = replica["run"](2, EPOCH2)
    return plan1, facts1, plan2, facts2


def test_apply_records_the_ranges_it_wrote_and_each_files_identity_after_its_last_change(replica):
    plan1, facts1 = replica["run"](1, EPOCH1)
    assert sorted(facts1) == ["a", "b", "d/c", "l1", "l2"]
    assert facts1["a"]["ranges"] == [[0, len(A1), range_checksum(A1)]]
    # the second link of a written inode has the same ranges, and the identity after the link
    assert facts1["l2"]["ranges"] == facts1["l1"]["ranges"] == [[0, len(L1), range_checksum(L1)]]
    st = os.lstat(replica["root"] / "l1")
    assert facts1["l1"]["id"] == facts1["l2"]["id"] == [st.st_dev, st.st_ino, 4000, st.st_mtime_ns, st.st_ctime_ns]
    result, _ = replica["verify"](plan1, facts1)
    assert result["ok"], result["problems"]

    _, facts2 = replica["run"](2, EPOCH2)
    assert facts2["a"]["ranges"] == [
        [1000, 100, range_checksum(A2[1000:1100])],
        [300_000, 65536, range_checksum(A2[300_000:])],
    ]
    # moved or re-attributed, bytes of E-1: the identity alone, taken after the chmod
    assert facts2["b"] == {"id": replica["target"].identity("b")} and "ranges" not in facts2["e/c2"]
    assert oct(os.lstat(replica["root"] / "b").st_mode & 0o777) == "0o600"


def test_verify_reads_back_only_what_apply_wrote_and_nothing_of_a_move(replica):
    plan1, facts1 = replica["run"](1, EPOCH1)
    result, source_read = replica["verify"](plan1, facts1)
    # the first epoch wrote every byte: all read back from the target, nothing from the source
    assert result["files_by_write_checksum"] == 5 and result["files_hashed"] == 0
    assert result["bytes_read_target"] == len(A1) + len(B1) + len(C1) + 2 * len(L1)
    assert source_read == 0

    plan2, facts2 = replica["run"](2, EPOCH2)
    result, source_read = replica["verify"](plan2, facts2)
    assert result["ok"], result["problems"]
    assert result["files_by_write_checksum"] == 1  # a: its two written ranges
    assert result["files_by_identity"] == 2  # b (chmod) and e/c2 (renamed in its renamed directory)
    assert result["files_hashed"] == 0 and source_read == 0
    assert result["bytes_read_target"] == result["bytes_by_write_checksum"] == 100 + 65536


def test_a_child_carried_by_its_directorys_rename_is_fenced_where_it_was_not_verified_where_it_is(replica):
    plan1, facts1 = replica["run"](1, EPOCH1)
    plan2, facts2 = replica["run"](2, EPOCH2_CARRIED)
    assert plan2["summary"]["carried"] == 1 and plan2["summary"]["moved"] == 2
    assert [i["path"] for i in plan2["verify"]["present"]] == ["e"] and plan2["verify"]["absent"] == ["d"]
    assert {"path": "d/c", "type": "file", "size": len(C1)} in plan2["fence"]
    assert facts2 == {}  # no identity taken of it either
    result, source_read = replica["verify"](plan2, facts2)
    assert result["ok"] and result["paths_checked"] == 1 and source_read == 0
    assert (replica["root"] / "e" / "c").read_bytes() == C1 and not (replica["root"] / "d").exists()


def test_full_reads_every_file_whole_from_both_sides(replica):
    _, _, plan2, facts2 = two_epochs(replica)
    result, source_read = replica["verify"](plan2, facts2, contents="full")
    assert result["ok"], result["problems"]
    assert result["files_hashed"] == 3 and result["files_by_write_checksum"] == result["files_by_identity"] == 0
    assert source_read == result["bytes_read_target"] == len(A2) + len(B1) + len(C1)


def test_a_written_range_corrupted_after_apply_fails_even_with_the_identity_kept(replica):
    # a change ctime cannot see (the block device written, the clock set back): the fact's
    # identity is made the file's current one, so only the checksum can tell
    _, _, plan2, facts2 = two_epochs(replica)
    path = replica["root"] / "a"
    with open(path, "r+b") as f:
        f.seek(300_010)
        f.write(b"\0" if A2[300_010] else b"\1")
    facts2["a"]["id"] = replica["target"].identity("a")
    result, source_read = replica["verify"](plan2, facts2)
    assert not result["ok"]
    assert result["problems"] == [
        "a: bytes 300000..365536 differ from what apply wrote there at epoch 2 (its checksum)"
    ]
    assert source_read == 0


def test_a_file_changed_since_apply_is_read_whole_and_fails(replica):
    _, _, plan2, facts2 = two_epochs(replica)
    # a byte apply did not write, its mtime put back: the ctime still moved
    for rel, offset in (("a", 5), ("e/c2", 6)):
        path = replica["root"] / rel
        before = os.lstat(path)
        with open(path, "r+b") as f:
            f.seek(offset)
            byte = f.read(1)
            f.seek(offset)
            f.write(bytes([byte[0] ^ 0xFF]))
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    result, source_read = replica["verify"](plan2, facts2)
    assert not result["ok"]
    assert result["problems"] == [
        "a: content differs from the source at epoch 2 (first difference at byte 5)",
        "e/c2: content differs from the source at epoch 2 (first difference at byte 6)",
    ]
    assert result["files_hashed"] == 2 and result["files_by_identity"] == 1  # b only
    assert source_read == len(A2) + len(C1)


def test_without_a_fact_a_file_is_read_whole_and_compared_with_the_source(replica):
    _, _, plan2, facts2 = two_epochs(replica)
    del facts2["a"], facts2["e/c2"]
    result, source_read = replica["verify"](plan2, facts2)
    assert result["ok"], result["problems"]
    assert result["files_hashed"] == 2 and source_read == len(A2) + len(C1)
    # and a corruption of a byte apply did not write is found that way
    with open(replica["root"] / "a", "r+b") as f:
        f.seek(7)
        f.write(b"\0" if A2[7] else b"\1")
    result, _ = replica["verify"](plan2, facts2)
    assert result["problems"] == ["a: content differs from the source at epoch 2 (first difference at byte 7)"]


def test_sample_zero_reads_no_written_range(replica):
    _, _, plan2, facts2 = two_epochs(replica)
    result, source_read = replica["verify"](plan2, facts2, sample=0.0)
    assert result["ok"] and result["bytes_read_target"] == 0 and source_read == 0
    assert result["files_by_write_checksum"] == 0 and result["files_by_identity"] == 2


def test_posix_contents_decisions():
    ident = [1, 2, 3, 4, 5]
    moved = {"path": "x", "unchanged": True}
    written = {"id": ident, "ranges": [[0, 3, "h"]]}
    assert posix_contents({"path": "x"}, written, ident) == "ranges"
    assert posix_contents(moved, {"id": ident}, ident) == "covered"
    assert posix_contents({"path": "x"}, {"id": ident}, ident) == "whole"  # no ranges, bytes not of E-1
    assert posix_contents(moved, {"id": ident}, [1, 2, 3, 4, 6]) == "whole"  # ctime moved
    assert posix_contents(moved, written, [1, 9, 3, 4, 5]) == "whole"  # another inode
    assert posix_contents(moved, None, ident) == "whole"
    assert posix_contents(moved, {"id": ident}, None) == "whole"  # not a file now
