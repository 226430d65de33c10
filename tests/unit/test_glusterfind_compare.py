"""The comparison of ``epochsync changes --format glusterfind`` with ``glusterfind pre``: each reason a
line may be on one side only, borne out by the rest of the two listings, and what stays unexplained.

The listings are what the two wrote on a live volume for such changes (``test_glusterfind.py``
compares real ones); here each case is one difference alone.
"""

from __future__ import annotations

from epochsync_dev.glusterfind import REASONS, compare

GFID = "ffe75d59-2f0e-4729-828e-10448b009c9e"


def entry(fid, new_paths, type_="file"):
    return {"fid": fid, "type": type_, "old_paths": [], "new_paths": list(new_paths)}


def reasons(ours, theirs, entries=()):
    r = compare(ours, theirs, list(entries))
    return r.reasons(), r.unexplained, r.same


def test_the_same_lines_in_any_order_are_the_same():
    assert reasons(["NEW a", "MODIFY b"], ["MODIFY b", "NEW a"]) == ({}, [], 2)


def test_shard_files_are_explained_only_when_their_file_is_listed():
    theirs = ["NEW .shard", f"MODIFY .shard/{GFID}.2", "DELETE .shard/.remove_me/" + GFID, "MODIFY big"]
    assert reasons(["MODIFY big"], theirs, [entry(GFID, ["big"])]) == ({"shard": 3}, [], 1)
    # a shard changed, and epochsync lists no change of its file: unexplained
    _, unexplained, _ = reasons([], [f"MODIFY .shard/{GFID}.2"], [entry(GFID, ["big"])])
    assert unexplained == [("glusterfind", f"MODIFY .shard/{GFID}.2")]


def test_a_directory_modify_and_a_replaced_file():
    got = reasons(["MODIFY d", "DELETE d/b", "RENAME d/a d/b"], ["RENAME d/a d/b"], [entry("D", ["d"], "dir")])
    assert got == ({"directory_modify": 1, "replaced": 1}, [], 1)
    # a file's MODIFY glusterfind lacks is not a directory's
    assert reasons(["MODIFY f"], [], [entry("F", ["f"])])[1] == [("epochsync", "MODIFY f")]


def test_renames_glusterfind_tells_otherwise():
    # the new parent logged as the null gfid
    assert reasons(["RENAME a b"], ["RENAME a"]) == ({"rename_without_new_path": 2}, [], 0)
    # renamed and changed: glusterfind keeps the MODIFY only
    assert reasons(["RENAME a b", "MODIFY b"], ["MODIFY b"]) == ({"renamed_and_changed": 1}, [], 1)
    # renamed, then deleted (a directory with a file)
    got = reasons(["DELETE a/x", "DELETE a"], ["RENAME a b", "DELETE b/x", "DELETE b"])
    assert got == ({"renamed_then_deleted": 5}, [], 0)
    # one name of a file gone, another added
    assert reasons(["RENAME a b"], ["DELETE a", "NEW b"]) == ({"relinked": 3}, [], 0)
    # changed, then a new name: glusterfind lists the old name as NEW too
    assert reasons(["NEW b", "MODIFY a", "MODIFY b"], ["NEW b", "NEW a", "MODIFY a", "MODIFY b"]) == (
        {"link_and_changed": 1},
        [],
        3,
    )


def test_anything_else_is_unexplained_on_its_side():
    r = compare(["NEW a", "DELETE x"], ["NEW b", "RENAME x y"], [])
    assert r.unexplained == [
        ("epochsync", "NEW a"),
        ("epochsync", "DELETE x"),
        ("glusterfind", "NEW b"),
        ("glusterfind", "RENAME x y"),
    ]
    assert r.as_dict()["unexplained"][0] == "epochsync: NEW a"
    assert set(REASONS) >= set(r.reasons())
