"""plan_entries on Spark snapshots: path resolution, fileset visibility, renamed directories."""

from __future__ import annotations

from epochsync.stages.translate import build_plan
from epochsync.stages.translate.entries import plan_entries

ROOT = "[0x200000007:0x1:0x0]"
STORE = {"key": "{ost}/{oid}", "unstriped_key": "data/{fid}", "bucket": "src"}


def row(fid, type_, links, size=0):
    mode = {"dir": 0o40755, "file": 0o100644}[type_]
    return (fid, type_, links, mode, 0, 0, size, None, None, None, [], None, None, [])


def snap(spark, rows):
    from epochsync.core.model import snapshot_struct_type

    return spark.createDataFrame([row(ROOT, "dir", []), *rows], snapshot_struct_type())


def no_changes(spark):
    from epochsync.core.model import change_struct_type

    return spark.createDataFrame([], change_struct_type())


def test_fileset_moves_and_directory_renames(spark):
    old = [
        row("P", "dir", [(ROOT, "proj")]),
        row("K", "dir", [("P", "keep")]),
        row("O", "dir", [(ROOT, "other")]),
        row("M", "dir", [("O", "moving-in")]),
        row("F1", "file", [("M", "f1")], 10),
        row("L", "dir", [("K", "leaving")]),
        row("F2", "file", [("L", "f2")], 20),
        row("S", "file", [("K", "stays"), ("O", "outside-link")], 5),
    ]
    new = [
        row("P", "dir", [(ROOT, "proj")]),
        row("K", "dir", [("P", "kept")]),  # renamed inside the fileset
        row("O", "dir", [(ROOT, "other")]),
        row("M", "dir", [("K", "moving-in")]),  # moved into the fileset with its file
        row("F1", "file", [("M", "f1")], 10),
        row("L", "dir", [("O", "leaving")]),  # moved out with its file
        row("F2", "file", [("L", "f2")], 20),
        row("S", "file", [("K", "stays"), ("O", "outside-link")], 5),
    ]
    entries = plan_entries(snap(spark, old), snap(spark, new), no_changes(spark), root_fid=ROOT, fileset=("/proj",))
    paths = {e["fid"]: (e["old_paths"], e["new_paths"]) for e in entries}
    assert paths == {
        "K": (["proj/keep"], ["proj/kept"]),
        "M": ([], ["proj/kept/moving-in"]),
        "F1": ([], ["proj/kept/moving-in/f1"]),
        "L": (["proj/keep/leaving"], []),
        "F2": (["proj/keep/leaving/f2"], []),
        "S": (["proj/keep/stays"], ["proj/kept/stays"]),  # the link outside the fileset is invisible
    }
    target = {
        "name": "t",
        "kind": "posix",
        "fileset": ["/proj"],
        "coalesce_gap": 0,
        "part_size": 8 << 20,
        "small_object": 8 << 20,
        "stripe_size": None,
        "stripe_count": None,
    }
    plan = build_plan(entries, target=target, store=STORE, epoch=2)
    # posix: one rename for the renamed directory (its file follows), the moved-out tree
    # leaves as one, the moved-in tree is created and its file pulled whole
    assert [(o["op"], o["src"]) for o in plan["namespace"] if o["op"] == "rename" and o["src"][0] != "@"] == [
        ("rename", "proj/keep/leaving"),
        ("rename", "proj/keep"),
    ]
    placed = [o for o in plan["namespace"] if o["op"] == "mkdir" or o["src"].startswith("@")]
    assert [(o["op"], o.get("dst") or o["path"]) for o in placed] == [
        ("rename", "proj/kept"),
        ("mkdir", "proj/kept/moving-in"),
    ]
    assert [(d["path"], d["create"], d["ranges"]) for d in plan["data"]] == [
        ("proj/kept/moving-in/f1", True, [[0, 10]])
    ]


def test_the_roots_attributes_are_an_entry_of_path_nothing(spark):
    """Regression (issue 16, bug 2): the root has no link, so its SATTR/XATTR changes built no
    entry. With the root in the fileset it is the entry of path ""; a fileset of subtrees
    (whose parents are scaffolding) leaves it out."""
    from epochsync.core.model import change_struct_type

    f = row("F", "file", [(ROOT, "f")], 3)
    old_snap = snap(spark, [f])
    new_snap = spark.createDataFrame(
        [(ROOT, "dir", [], 0o40700, 0, 0, 0, None, None, None, [("user.k", b"v")], None, None, []), f], old_snap.schema
    )
    changes = spark.createDataFrame(
        [(ROOT, "dir", False, False, False, True, True, False, False, [], None, None)], change_struct_type()
    )
    for fileset, want in (((), True), (("/",), True), (("/proj",), False)):
        entries = plan_entries(old_snap, new_snap, changes, root_fid=ROOT, fileset=fileset)
        assert [(e["fid"], e["old_paths"], e["new_paths"]) for e in entries] == ([(ROOT, [""], [""])] if want else [])
    target = {
        "name": "t",
        "kind": "s3",
        "fileset": [],
        "coalesce_gap": 0,
        "part_size": 8 << 20,
        "small_object": 8 << 20,
        "stripe_size": None,
        "stripe_count": None,
        "prefix": "p/",
    }
    entries = plan_entries(old_snap, new_snap, changes, root_fid=ROOT)
    plan = build_plan(entries, target=target, store=STORE, epoch=2)
    assert [(o["op"], o["key"]) for o in plan["post"]] == [("put_empty", ".epochsync/dirs/dir")]
    assert [i["path"] for i in plan["verify"]["present"]] == [""] and plan["summary"]["attrs"] == 1
    # a file at the root: the fileset "/" keeps every path (it used to keep none but the root)
    changed = spark.createDataFrame(
        [("F", "file", True, False, True, False, False, True, True, [], None, 3)], change_struct_type()
    )
    assert [e["fid"] for e in plan_entries(old_snap, new_snap, changed, root_fid=ROOT, fileset=("/",))] == ["F"]
