"""The planner on hand-built entries: DistCp order on posix (swaps, cycles, directory
renames, rename over an existing name), version-pinned copies on s3, fileset moves,
source pulls and coalescing, and the S3 part plan's 5 MiB rule.

Namespace plans are applied to a real directory tree (no source bytes needed) and the
resulting tree is compared with what snapshot E says.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epochsync.core.config import TargetConfig
from epochsync.core.config_values import MIN_PART_SIZE
from epochsync.journal.undo import read_journal
from epochsync.stages.translate import build_plan
from epochsync.stages.translate.entries import coalesce, part_plan, source_pulls
from epochsync.stores.connections import S3Settings
from epochsync.stores.s3_access import S3Access
from epochsync.targets.posix import PosixTarget

MiB = 1024 * 1024
STORE = {"key": "{ost}/{oid}", "unstriped_key": "data/{fid}", "bucket": "src"}


def tdict(kind="posix", **kw):
    d = {
        "name": "t",
        "kind": kind,
        "fileset": [],
        "coalesce_gap": 1024,
        "part_size": 8 * MiB,
        "small_object": 8 * MiB,
        "stripe_size": None,
        "stripe_count": None,
    }
    d.update(kw)
    return d


def node(type_, mode=0o755, symlink=None):
    return {
        "type": type_,
        "mode": mode,
        "uid": 0,
        "gid": 0,
        "size": 0,
        "atime_ns": None,
        "mtime_ns": None,
        "xattrs": [],
        "symlink": symlink,
        "layout": None,
        "objects": [],
    }


def ent(fid, old_links, new_links, type_="dir", **kw):
    """Links as (parent fid, name, path)."""
    old = node(type_, **kw) if old_links is not None else None
    new = node(type_, **kw) if new_links is not None else None
    ol = [{"pfid": p, "name": n, "path": x} for p, n, x in old_links or []]
    nl = [{"pfid": p, "name": n, "path": x} for p, n, x in new_links or []]
    return {
        "fid": fid,
        "old": old,
        "new": new,
        "old_links": ol,
        "new_links": nl,
        "old_paths": sorted(x["path"] for x in ol),
        "new_paths": sorted(x["path"] for x in nl),
        "change": None,
    }


def make_tree(root, layout: dict[str, str]):
    """layout: path -> 'dir' or 'symlink:<target>'."""
    for p in sorted(layout, key=lambda p: p.count("/")):
        full = os.path.join(root, p)
        if layout[p] == "dir":
            os.mkdir(full)
        else:
            os.symlink(layout[p].split(":", 1)[1], full)


def read_tree(root) -> dict[str, str]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        if rel.startswith(".epochsync"):
            continue
        for d in dirnames:
            p = os.path.normpath(os.path.join(rel, d))
            if p == ".epochsync":
                continue
            full = os.path.join(root, p)
            out[p] = "symlink:" + os.readlink(full) if os.path.islink(full) else "dir"
        for f in filenames:
            p = os.path.normpath(os.path.join(rel, f))
            full = os.path.join(root, p)
            out[p] = "symlink:" + os.readlink(full) if os.path.islink(full) else "file"
    return out


def apply_ns(tmp_path, before: dict, entries: list, epoch=2):
    from epochsync.stages.apply import apply_plan

    root = tmp_path / "replica"
    root.mkdir()
    make_tree(root, before)
    target = PosixTarget(TargetConfig(name="t", source="s", kind="posix", path=str(root)))
    plan = build_plan(entries, target=tdict(), store=STORE, epoch=epoch)
    problems, state = target.fence_check(plan["fence"], None)
    assert problems == []
    jdir = str(tmp_path / "undo")
    apply_plan(plan, target, S3Access(S3Settings("none")), "src", jdir, state)
    after = read_tree(root)
    # and the journal undoes it exactly
    for e in reversed(read_journal(jdir)):
        target.undo(e, jdir)
    target.finish_rollback(epoch)
    assert read_tree(root) == before
    return plan, after


def test_swap_of_two_directories_through_the_scratch_area(tmp_path):
    before = {"a": "dir", "b": "dir", "a/x": "symlink:in-a", "b/y": "symlink:in-b"}
    entries = [
        ent("A", [("R", "a", "a")], [("R", "b", "b")]),
        ent("B", [("R", "b", "b")], [("R", "a", "a")]),
    ]
    plan, after = apply_ns(tmp_path, before, entries)
    assert after == {"b": "dir", "a": "dir", "b/x": "symlink:in-a", "a/y": "symlink:in-b"}
    # DistCp order: every source into the scratch area first, then into place
    ops = [(o["op"], o["src"][:4]) for o in plan["namespace"]]
    assert ops == [("rename", "a"), ("rename", "b"), ("rename", "@tmp"), ("rename", "@tmp")]


def test_three_way_cycle_and_rename_over_existing(tmp_path):
    before = {"p": "dir", "q": "dir", "r": "dir", "victim": "symlink:v", "mover": "symlink:m"}
    entries = [
        ent("P", [("R", "p", "p")], [("R", "q", "q")]),
        ent("Q", [("R", "q", "q")], [("R", "r", "r")]),
        ent("Rr", [("R", "r", "r")], [("R", "p", "p")]),
        # 'mover' is renamed over 'victim': victim loses its last name
        ent("V", [("R", "victim", "victim")], None, type_="symlink", symlink="v"),
        ent("M", [("R", "mover", "mover")], [("R", "victim", "victim")], type_="symlink", symlink="m"),
    ]
    _, after = apply_ns(tmp_path, before, entries)
    assert after == {"p": "dir", "q": "dir", "r": "dir", "victim": "symlink:m"}


def test_directory_rename_with_a_child_moved_out_and_a_new_dir_in_its_place(tmp_path):
    before = {"a": "dir", "a/keep": "symlink:k", "a/out": "symlink:o"}
    entries = [
        ent("A", [("R", "a", "a")], [("R", "b", "b")]),
        ent("O", [("A", "out", "a/out")], [("N", "out", "a/out")], type_="symlink", symlink="o"),
        ent("N", None, [("R", "a", "a")]),
    ]
    plan, after = apply_ns(tmp_path, before, entries)
    # 'a/out' keeps its path string but now lives in the new directory 'a'
    assert after == {"b": "dir", "b/keep": "symlink:k", "a": "dir", "a/out": "symlink:o"}


def test_deleted_tree_travels_whole_and_comes_back_on_rollback(tmp_path):
    before = {"d": "dir", "d/e": "dir", "d/e/f": "symlink:f", "d/g": "symlink:g"}
    entries = [
        ent("D", [("R", "d", "d")], None),
        ent("E", [("D", "e", "d/e")], None),
        ent("F", [("E", "f", "d/e/f")], None, type_="symlink", symlink="f"),
        ent("G", [("D", "g", "d/g")], None, type_="symlink", symlink="g"),
    ]
    plan, after = apply_ns(tmp_path, before, entries)
    assert after == {}
    # children of a deleted directory are not moved one by one: the directory takes them
    assert [o["src"] for o in plan["namespace"]] == ["d"]


def test_s3_directory_move_is_server_side_copies_of_every_object():
    f = node("file", mode=0o644)
    f["size"] = 10
    entries = [
        ent("D", [("R", "a", "a")], [("R", "b", "b")]),
        {"fid": "F", "old": f, "new": f, "old_paths": ["a/f"], "new_paths": ["b/f"], "change": None},
    ]
    plan = build_plan(entries, target=tdict("s3"), store=STORE, epoch=2)
    assert plan["data"] == []
    ops = [(o["op"], o["key"], o.get("src")) for o in plan["namespace"]]
    assert ops == [
        ("delete", ".epochsync/dirs/_a/dir", None),
        ("delete", "a/f", None),
        ("copy", "b/f", "a/f"),
        ("put_empty", ".epochsync/dirs/_b/dir", None),
    ]
    assert plan["summary"]["planned_pull_bytes"] == 0


def test_fileset_moves_become_creates_and_deletes():
    f = node("file", mode=0o644)
    f.update(size=5000, layout=None, objects=[{"ost": "OST0000", "oid": "F", "version": "v9"}])
    moved_in = {"fid": "F", "old": f, "new": f, "old_paths": [], "new_paths": ["keep/f"], "change": None}
    moved_out = {"fid": "G", "old": f, "new": f, "old_paths": ["keep/g"], "new_paths": [], "change": None}
    plan = build_plan([moved_in, moved_out], target=tdict(fileset=["/keep"]), store=STORE, epoch=3)
    (data,) = plan["data"]
    assert data["create"] and data["ranges"] == [[0, 5000]]
    assert data["pulls"] == [{"index": 0, "key": "data/F", "version": "v9", "ranges": [[0, 5000]]}]
    assert [o["src"] for o in plan["namespace"]] == ["keep/g"]


def test_striped_source_pulls_are_per_object_and_coalesced():
    row = {
        "layout": {
            "stripe_size": 4096,
            "stripe_count": 2,
            "objects": [{"ost": "OST0000", "oid": "1"}, {"ost": "OST0001", "oid": "2"}],
        },
        "objects": [{"ost": "OST0000", "oid": "1", "version": "a"}, {"ost": "OST0001", "oid": "2", "version": "b"}],
    }
    # file bytes 0..100 and 8192..8292 are both in object 0 (offsets 0 and 4096): gap 3996
    pulls = source_pulls("F", row, [(0, 100), (8192, 100)], STORE, gap=4000)
    assert pulls == [{"index": 0, "key": "OST0000/1", "version": "a", "ranges": [[0, 4196]]}]
    pulls = source_pulls("F", row, [(0, 100), (8192, 100)], STORE, gap=1000)
    assert pulls[0]["ranges"] == [[0, 100], [4096, 100]]
    # a range across the stripe boundary reads both objects
    pulls = source_pulls("F", row, [(4000, 200)], STORE, gap=0)
    assert [(p["key"], p["ranges"]) for p in pulls] == [("OST0000/1", [[4000, 96]]), ("OST0001/2", [[0, 104]])]


def test_coalesce_merges_only_gaps_below_the_threshold():
    assert coalesce([(0, 10), (15, 5), (100, 1)], 6) == [(0, 20), (100, 1)]
    assert coalesce([(0, 10), (15, 5)], 5) == [(0, 10), (15, 5)]


@settings(max_examples=200, deadline=None)
@given(
    length=st.integers(1, 40 * MiB),
    base_frac=st.floats(0, 1.2),
    changes=st.lists(st.tuples(st.integers(0, 40 * MiB), st.integers(1, 3 * MiB)), max_size=6),
)
def test_part_plan_respects_the_5_mib_minimum_and_never_copies_changed_bytes(length, base_frac, changes):
    base_len = min(int(length * base_frac), 40 * MiB)
    parts = part_plan(length, changes, base_len, 8 * MiB)
    spans = [p.get("copy") or p.get("upload") for p in parts]
    assert spans[0][0] == 0 and spans[-1][1] == length
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert all(b - a >= MIN_PART_SIZE for a, b in spans[:-1])
    for p in parts:
        if "copy" in p:
            a, b = p["copy"]
            assert b <= base_len
            assert all(o + n <= a or o >= b for o, n in changes)


def test_names_that_could_escape_are_refused_before_anything_is_planned():
    from epochsync.targets.base import UnsafePathError

    for bad in ["../x", "/etc/passwd", "a/../../b", "a\x00b", "n" * 256, ".epochsync/x", "a//b", ""]:
        with pytest.raises(UnsafePathError):
            build_plan([ent("X", None, [("R", "x", bad)])], target=tdict(), store=STORE, epoch=1)


def test_spark_app_entry_point_fails_with_one_line(capsys, tmp_path):
    from epochsync.stages.entry import stage_main

    assert (
        stage_main("translate", ["--config", str(tmp_path / "none.yaml"), "--target", "t", "--epoch", "1"]) == 3
    )  # ConfigError
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("translate: error:") and "none.yaml" in err[0]


def test_unwritten_objects_of_a_versioned_source_are_zeros_not_a_later_epochs_bytes():
    """Found by make demo: epoch 1 of a catch-up read an object first written in epoch 3."""
    from epochsync.stages.translate.entries import source_objects, source_pulls

    row = {
        "layout": {
            "stripe_size": 16384,
            "stripe_count": 4,
            "objects": [{"ost": f"OST000{i}", "oid": "0x1"} for i in range(4)],
        },
        "objects": [{"ost": "OST0000", "oid": "0x1", "version": "v7"}],
    }
    store = {"key": "{ost}/{oid}", "unstriped_key": "data/{fid}", "versioned": True}
    objs = source_objects("f", row, store)["objects"]
    assert objs[0] == {"key": "OST0000/0x1", "version": "v7"} and objs[1:] == [None, None, None]
    # a range in the never-written object 2 pulls nothing (apply writes zeros there)
    assert [p["key"] for p in source_pulls("f", row, [(0, 100), (32768 + 10, 50)], store, 0)] == ["OST0000/0x1"]
    # a source without versions (Lustre, Gluster) can only read the current object
    store["versioned"] = False
    assert source_objects("f", row, store)["objects"][2] == {"key": "OST0002/0x1", "version": None}
    unstriped = {"layout": None, "objects": []}
    assert source_objects("f", unstriped, {**store, "versioned": True})["objects"] == [None]


def test_a_renamed_directory_fences_its_new_name_once_not_every_descendant(tmp_path):
    # a directory moved with its children: each child's new path is implied absent by the new name
    before = {"a": "dir", "a/s": "dir", "a/s/x": "symlink:x", "a/y": "symlink:y"}
    entries = [
        ent("A", [("R", "a", "a")], [("R", "b", "b")]),
        ent("S", [("A", "s", "a/s")], [("A", "s", "b/s")]),
        ent("X", [("S", "x", "a/s/x")], [("S", "x", "b/s/x")], type_="symlink", symlink="x"),
        ent("Y", [("A", "y", "a/y")], [("A", "y", "b/y")], type_="symlink", symlink="y"),
    ]
    plan, after = apply_ns(tmp_path, before, entries)
    assert after == {"b": "dir", "b/s": "dir", "b/s/x": "symlink:x", "b/y": "symlink:y"}
    absent = [it["path"] for it in plan["fence"] if it["type"] is None]
    assert absent == ["b"]
    # every old path is still fenced as it was
    assert {it["path"] for it in plan["fence"] if it["type"]} == {"a", "a/s", "a/s/x", "a/y"}


def test_the_fence_still_refuses_a_descendant_of_a_new_name_that_someone_made(tmp_path):
    root = tmp_path / "replica"
    root.mkdir()
    make_tree(root, {"a": "dir", "a/y": "symlink:y", "b": "dir", "b/y": "symlink:z"})
    target = PosixTarget(TargetConfig(name="t", source="s", kind="posix", path=str(root)))
    entries = [
        ent("A", [("R", "a", "a")], [("R", "b", "b")]),
        ent("Y", [("A", "y", "a/y")], [("A", "y", "b/y")], type_="symlink", symlink="y"),
    ]
    plan = build_plan(entries, target=tdict(), store=STORE, epoch=2)
    problems, _ = target.fence_check(plan["fence"], None)
    assert problems == ["b: exists but the replica at the last epoch did not have it"]


def test_a_read_only_pass_resolves_each_parent_once_and_still_refuses_a_symlinked_parent(tmp_path):
    from epochsync.targets.base import UnsafePathError

    root = tmp_path / "replica"
    root.mkdir()
    make_tree(root, {"d": "dir", "d/e": "symlink:e", "link": "symlink:d"})
    target = PosixTarget(TargetConfig(name="t", source="s", kind="posix", path=str(root)))
    with target.reading():
        assert target._lstat("d/e") is not None
        assert target._parents and os.path.join(str(root), "d") in target._parents
        with pytest.raises(UnsafePathError):
            target._abs("link/e")
    assert target._parents is None


def _deletes(tmp_path, n):
    root = tmp_path / "replica"
    root.mkdir()
    before = {"d": "dir", **{f"d/f{i:02d}": f"symlink:t{i}" for i in range(n)}}
    make_tree(root, before)
    entries = [
        ent(f"F{i}", [("D", f"f{i:02d}", f"d/f{i:02d}")], None, type_="symlink", symlink=f"t{i}") for i in range(n)
    ]
    target = PosixTarget(TargetConfig(name="t", source="s", kind="posix", path=str(root)))
    return root, before, target, build_plan(entries, target=tdict(), store=STORE, epoch=2)


def test_moves_to_scratch_are_journaled_in_one_batch_before_the_first_of_them(tmp_path, monkeypatch):
    from epochsync.stages.apply import apply_plan

    root, before, target, plan = _deletes(tmp_path, 12)
    jdir = str(tmp_path / "undo")
    seen = []
    real_rename = os.rename

    def rename(src, dst):
        seen.append(len([e for e in read_journal(jdir) if e["op"] == "rename"]))
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    apply_plan(plan, target, S3Access(S3Settings("none")), "src", jdir, {})
    assert seen[:12] == [12] * 12  # every entry durable before the first move
    assert read_tree(root) == {"d": "dir"}


def test_a_batch_of_moves_that_stops_half_way_rolls_back_exactly(tmp_path, monkeypatch):
    from epochsync.core.errors import EpochsyncError
    from epochsync.stages.apply import apply_plan

    root, before, target, plan = _deletes(tmp_path, 12)
    jdir = str(tmp_path / "undo")
    real_rename = os.rename
    calls = []

    def rename(src, dst):
        calls.append(dst)
        if len(calls) == 5:
            raise OSError("disk gone")
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises((OSError, EpochsyncError)):
        apply_plan(plan, target, S3Access(S3Settings("none")), "src", jdir, {})
    monkeypatch.setattr(os, "rename", real_rename)
    assert len(read_journal(jdir)) == 12  # journaled, though only 4 moves ran
    for e in reversed(read_journal(jdir)):
        target.undo(e, jdir)
    target.finish_rollback(2)
    assert read_tree(root) == before
