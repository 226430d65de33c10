"""Hostile changelogs cannot touch anything outside the target.

Names with ``..``, absolute paths, NUL bytes, names longer than NAME_MAX, a directory
renamed into its own subtree (a cycle), a file placed "under" a symlink that points
outside: the importer refuses the records it can see are bad; whatever reaches a
snapshot anyway is refused by translate or the target before any mutation, and a
sentinel directory next to the replica stays byte-for-byte untouched.
"""

from __future__ import annotations

import io
import os

import pytest

from epochsync.core.config import TargetConfig
from epochsync.core.errors import ParseError
from epochsync.stores.connections import S3Settings
from epochsync.stores.s3_access import S3Access
from epochsync.targets.base import UnsafePathError
from epochsync.targets.posix import PosixTarget

pytestmark = pytest.mark.integration

ROOT = "[0x200000007:0x1:0x0]"
HOSTILE_NAMES = ["..", "../../outside", "/etc/passwd", "a\x00b", "n" * 300, "a/../../b"]


def snap_row(fid, type_, links, *, symlink=None, mode=None):
    mode = mode if mode is not None else {"dir": 0o40755, "file": 0o100644, "symlink": 0o120777}[type_]
    return (fid, type_, [(p, n) for p, n in links], mode, 0, 0, 0, None, None, None, [], symlink, None, [])


def snapshot(spark, rows):
    from epochsync.core.model import snapshot_struct_type

    return spark.createDataFrame([snap_row(ROOT, "dir", []), *rows], snapshot_struct_type())


def changes(spark, fids):
    from epochsync.core.model import change_struct_type

    rows = [(f, None, True, False, True, False, False, False, False, [], None, None) for f in fids]
    return spark.createDataFrame(rows, change_struct_type())


def tree_digest(root) -> dict:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture()
def world(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"keep me")
    replica = tmp_path / "replica"
    replica.mkdir()
    target = PosixTarget(TargetConfig(name="t", source="s", kind="posix", path=str(replica)))
    return tmp_path, outside, replica, target


def plan_and_apply(spark, world, old_rows, new_rows, changed):
    from epochsync.stages.apply import apply_plan
    from epochsync.stages.translate import build_plan
    from epochsync.stages.translate.entries import plan_entries

    tmp_path, _, _, target = world
    entries = plan_entries(snapshot(spark, old_rows), snapshot(spark, new_rows), changes(spark, changed), root_fid=ROOT)
    tdict = {
        "name": "t",
        "kind": "posix",
        "fileset": [],
        "coalesce_gap": 0,
        "part_size": 8 << 20,
        "small_object": 8 << 20,
        "stripe_size": None,
        "stripe_count": None,
    }
    plan = build_plan(entries, target=tdict, store={"key": "{ost}/{oid}", "unstriped_key": "data/{fid}"}, epoch=1)
    problems, state = target.fence_check(plan["fence"], None)
    assert problems == []
    apply_plan(plan, target, S3Access(S3Settings("none")), "src", str(tmp_path / "undo"), state)
    return plan


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_hostile_names_are_refused_before_any_mutation(spark, world, name):
    tmp_path, outside, replica, _ = world
    before = tree_digest(tmp_path)
    rows = [snap_row("[0x1:0x2:0x0]", "file", [(ROOT, name)]), snap_row("[0x1:0x3:0x0]", "dir", [(ROOT, "ok")])]
    with pytest.raises(UnsafePathError):
        plan_and_apply(spark, world, [], rows, ["[0x1:0x2:0x0]", "[0x1:0x3:0x0]"])
    assert tree_digest(tmp_path) == before  # not even the harmless directory was made
    assert (outside / "secret").read_bytes() == b"keep me"


def test_the_importer_refuses_escaping_names_with_file_and_line():
    from epochsync.formats import parse_stream

    bad = b'{"server":"MDT0000","index":1,"epoch":1,"type":"CREAT","tfid":"[0x1:0x2:0x0]","pfid":"%s","name":"../x"}\n'
    with pytest.raises(ParseError, match="changelog.jsonl:1"):
        list(parse_stream("jsonl", io.BytesIO(bad % ROOT.encode()), "changelog.jsonl"))


def test_a_directory_renamed_into_its_own_subtree_cannot_loop_or_escape(spark, world):
    tmp_path, outside, replica, _ = world
    a, b = "[0x1:0xa:0x0]", "[0x1:0xb:0x0]"
    old = [snap_row(a, "dir", [(ROOT, "a")]), snap_row(b, "dir", [(a, "b")])]
    # 'a' renamed to a/b/a: a cycle no path from the root reaches
    new = [snap_row(a, "dir", [(b, "a")]), snap_row(b, "dir", [(a, "b")])]
    os.makedirs(replica / "a" / "b")
    plan = plan_and_apply(spark, world, old, new, [a])
    # unreachable at E: it left the replica (into the epoch's scratch area, dropped at commit)
    assert [o["src"] for o in plan["namespace"]] == ["a"]
    assert os.listdir(replica) == [".epochsync"]
    assert (outside / "secret").read_bytes() == b"keep me"


def test_a_file_under_a_symlink_pointing_outside_is_refused(spark, world):
    from epochsync.stages.apply import apply_plan
    from epochsync.stages.translate import build_plan

    tmp_path, outside, replica, target = world
    link, f = "[0x1:0xc:0x0]", "[0x1:0xd:0x0]"
    os.symlink(str(outside), replica / "evil")
    before = tree_digest(outside)
    old = [snap_row(link, "symlink", [(ROOT, "evil")], symlink=str(outside))]
    # hostile: a new file whose parent is the symlink: no path reaches it, nothing is planned
    plan = plan_and_apply(spark, world, old, [*old, snap_row(f, "file", [(link, "pwned")])], [f])
    assert plan["data"] == [] and plan["namespace"] == []
    # and a plan that names such a path anyway is refused by the target itself
    entry = {
        "fid": f,
        "old": None,
        "new": {"type": "file", "size": 0, "mode": 0o644, "xattrs": []},
        "old_paths": [],
        "new_paths": ["evil/pwned"],
        "change": None,
    }
    tdict = {
        "name": "t",
        "kind": "posix",
        "fileset": [],
        "coalesce_gap": 0,
        "part_size": 8 << 20,
        "small_object": 8 << 20,
        "stripe_size": None,
        "stripe_count": None,
    }
    plan = build_plan([entry], target=tdict, store={"key": "{ost}/{oid}", "unstriped_key": "data/{fid}"}, epoch=2)
    with pytest.raises(UnsafePathError, match="symlink"):
        apply_plan(plan, target, S3Access(S3Settings("none")), "src", str(tmp_path / "undo2"), {})
    assert tree_digest(outside) == before
    assert not (outside / "pwned").exists()
