"""``epochsync changes`` without Spark: the diff rules on hand-made entries, and the window checks.

The listing is a diff (E1 paths on the left of RENAME and in DELETE, E2 paths elsewhere);
every case also checks that :func:`apply_to_listing` turns the E1 namespace into the E2
one, which is what the ground-truth tests check on simulated histories.
"""

from __future__ import annotations

import json
import os

import pytest

from epochsync.core.config import config_from_dict
from epochsync.core.errors import EpochError, SnapshotError
from epochsync.report.changes import (
    apply_to_listing,
    check_inputs,
    committed_windows,
    diff_entries,
    glusterfind_lines,
    glusterfind_path,
    quote_path,
    to_json_line,
    to_text,
)
from epochsync.warehouse.paths import Warehouse, local_path


def row(type_="file", size=10, mode=0o644, uid=0, gid=0, mtime=1, xattrs=()):
    bits = {"file": 0o100000, "dir": 0o40000, "symlink": 0o120000}[type_]
    return {
        "type": type_,
        "size": size,
        "mode": bits | mode,
        "uid": uid,
        "gid": gid,
        "mtime_ns": mtime,
        "symlink": None,
        "xattrs": [{"name": k, "value": v} for k, v in xattrs],
    }


def entry(fid, old_paths, new_paths, old=None, new=None, windows=(), type_="file"):
    old = (old or row(type_)) if old_paths else None
    new = (new or dict(old or row(type_))) if new_paths else None
    return {
        "fid": fid,
        "type": type_,
        "old_paths": list(old_paths),
        "new_paths": list(new_paths),
        "old": old,
        "new": new,
        "windows": list(windows),
    }


def text(records):
    return [to_text(r) for r in records]


def check(before: dict[str, str], after: dict[str, str], records) -> None:
    assert apply_to_listing(before, records) == after


def test_directory_move_is_one_line_and_a_moved_child_follows_it():
    # a/ (D) holds x (X) and y (Y); a moves to b, y moves out to top-level z
    entries = [
        entry("D", ["a"], ["b"], type_="dir"),
        entry("Y", ["a/y"], ["z"]),
    ]
    recs = diff_entries(entries)
    assert text(recs) == ["RENAME a b", "RENAME a/y z"]
    check({"a": "D", "a/x": "X", "a/y": "Y"}, {"b": "D", "b/x": "X", "z": "Y"}, recs)


def test_child_renamed_inside_a_moved_directory():
    recs = diff_entries([entry("D", ["a"], ["b"], type_="dir"), entry("X", ["a/x"], ["b/x2"])])
    assert text(recs) == ["RENAME a b", "RENAME a/x b/x2"]
    check({"a": "D", "a/x": "X"}, {"b": "D", "b/x2": "X"}, recs)


def test_swap_of_two_directories():
    recs = diff_entries([entry("A", ["a"], ["b"], type_="dir"), entry("B", ["b"], ["a"], type_="dir")])
    assert text(recs) == ["RENAME a b", "RENAME b a"]
    check({"a": "A", "a/1": "F1", "b": "B", "b/2": "F2"}, {"b": "A", "b/1": "F1", "a": "B", "a/2": "F2"}, recs)


def test_rename_over_an_existing_file_and_a_deleted_directory_with_a_survivor():
    # c is overwritten by x; directory d is removed after its child s moved out
    recs = diff_entries(
        [
            entry("C", ["c"], []),
            entry("X", ["x"], ["c"]),
            entry("D", ["d"], [], type_="dir"),
            entry("S", ["d/s"], ["s"]),
            entry("G", ["d/gone"], []),  # deleted with d: implied by DELETE d
        ]
    )
    assert text(recs) == ["DELETE c", "DELETE d", "RENAME d/s s", "RENAME x c"]
    check({"c": "C", "x": "X", "d": "D", "d/s": "S", "d/gone": "G"}, {"c": "X", "s": "S"}, recs)


def test_hard_links_shown_once():
    new = row(size=20)
    recs = diff_entries(
        [
            entry("N", [], ["n1", "n2"]),  # a new file with two names
            entry(
                "H",
                ["h"],
                ["h", "h2"],
                windows=[{"data_changed": True, "whole_file": False, "ranges": [], "old_size": 10, "new_size": 20}],
                new=new,
            ),
            entry("U", ["u1", "u2"], ["u1"]),  # loses one name
        ]
    )
    assert text(recs) == ["DELETE u2", "NEW n1", "LINK h2 h", "LINK n2 n1", "MODIFY h data"]
    check({"h": "H", "u1": "U", "u2": "U"}, {"h": "H", "h2": "H", "n1": "N", "n2": "N", "u1": "U"}, recs)
    modify = recs[-1]
    # growth from 10 to 20 bytes is a changed range even without extents
    assert modify["ranges"] == [[10, 10]] and modify["old_size"] == 10 and modify["size"] == 20


def test_fileset_boundary_moves_are_new_and_delete():
    # visible paths only: a move out of the fileset has no new path, a move in no old one
    recs = diff_entries([entry("O", ["proj/o"], []), entry("I", [], ["proj/i"])])
    assert text(recs) == ["DELETE proj/o", "NEW proj/i"]


def test_same_path_under_a_replaced_parent_is_a_rename_onto_itself():
    # directory p was deleted and a new directory p created; x moved from the old p to the new one
    recs = diff_entries(
        [
            entry("P1", ["p"], [], type_="dir"),
            entry("P2", [], ["p"], type_="dir"),
            entry("X", ["p/x"], ["p/x"]),
        ]
    )
    assert text(recs) == ["DELETE p", "RENAME p/x p/x", "NEW p"]
    check({"p": "P1", "p/x": "X"}, {"p": "P2", "p/x": "X"}, recs)


def test_modify_says_what_changed():
    win = {
        "data_changed": True,
        "whole_file": False,
        "old_size": 100,
        "new_size": 100,
        "ranges": [{"offset": 10, "length": 5}],
    }
    recs = diff_entries(
        [
            entry("D", ["d"], ["d"], old=row(size=100), new=row(size=100, mtime=2), windows=[win]),
            entry("A", ["a"], ["a"], old=row(), new=row(mode=0o600)),
            entry("T", ["t"], ["t"], old=row(), new=row(mtime=5)),  # a touch: attrs
            entry("X", ["x"], ["x"], old=row(), new=row(xattrs=[("user.k", b"v")])),
            entry("S", ["s"], ["s"], old=row(), new=row()),  # in a change set, nothing visible changed
        ]
    )
    assert text(recs) == ["MODIFY a attrs", "MODIFY d data", "MODIFY t attrs", "MODIFY x xattrs"]
    d = next(r for r in recs if r["path"] == "d")
    assert d["ranges"] == [[10, 5]] and d["whole_file"] is False
    x = json.loads(to_json_line(next(r for r in recs if r["path"] == "x")))
    assert x["xattrs"] == {"user.k": "dg=="} and x["changed"] == ["xattrs"] and "old_path" not in x


def test_shrink_and_regrowth_across_windows_is_a_changed_range():
    # window 1 truncates 100 -> 50 (no range survives the clip), window 2 extends back to 100
    windows = [
        {"data_changed": True, "whole_file": False, "ranges": [], "old_size": 100, "new_size": 50},
        {"data_changed": True, "whole_file": False, "ranges": [], "old_size": 50, "new_size": 100},
    ]
    (rec,) = diff_entries([entry("F", ["f"], ["f"], old=row(size=100), new=row(size=100), windows=windows)])
    assert rec["changed"] == ["data"] and rec["ranges"] == [[50, 50]]


def test_text_quotes_spaces_and_percent():
    assert quote_path("a b/c%d\te") == "a%20b/c%25d%09e"
    (rec,) = diff_entries([entry("X", ["my file"], ["new name"])])
    assert to_text(rec) == "RENAME my%20file new%20name"


# --------------------------------------------------------------------------- committed windows


def _cfg(tmp_path, **target):
    return config_from_dict(
        {
            "warehouse": f"file://{tmp_path / 'wh'}",
            "sources": [
                {
                    "name": "s",
                    "root_fid": "R",
                    "servers": ["MDT0000"],
                    "changelogs": {"uri": f"file://{tmp_path}/cl/"},
                    "store": {"conn_id": "c", "bucket": "b"},
                    "epoch": {"interval": "1m", "start": "2026-01-01T00:00:00Z"},
                }
            ],
            "targets": [{"name": "t", "source": "s", "kind": "posix", "path": str(tmp_path / "rep"), **target}],
        }
    )


def _stats(cfg, first, last):
    path = local_path(Warehouse(cfg.warehouse).stats("t", last))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"first_epoch": first, "epoch": last}, f)


def test_windows_follow_the_commits_and_name_what_is_not_committed(tmp_path):
    cfg = _cfg(tmp_path)
    t = cfg.target("t")
    for first, last in [(1, 1), (2, 4), (5, 5), (6, 6)]:
        _stats(cfg, first, last)
    _stats(cfg, 3, 7)  # a stale row above the manifest: never followed
    assert committed_windows(cfg, t, 0, 6, 6) == [(1, 1), (2, 4), (5, 5), (6, 6)]
    assert committed_windows(cfg, t, 4, 6, 6) == [(5, 5), (6, 6)]
    with pytest.raises(EpochError, match=r"epoch 3 is not a committed state: epochs 2..4 were committed together"):
        committed_windows(cfg, t, 3, 6, 6)
    with pytest.raises(EpochError, match=r"target t is at epoch 6: epoch 7 is not committed yet"):
        committed_windows(cfg, t, 1, 7, 6)
    with pytest.raises(EpochError, match=r"need 0 <= from < to"):
        committed_windows(cfg, t, 4, 4, 6)


def test_pruned_snapshot_and_missing_change_set_are_named(tmp_path):
    cfg = _cfg(tmp_path, snapshot_retention=2)
    t = cfg.target("t")
    wh = Warehouse(cfg.warehouse)
    for e in (3, 4):
        os.makedirs(local_path(wh.snapshot("t", e)))
    for e in (2, 3):
        os.makedirs(local_path(wh.changes("t", e)))
    with pytest.raises(SnapshotError, match=r"no snapshot at epoch 1: pruned \(snapshot_retention: 2 .*kept: 3, 4\)"):
        check_inputs(cfg, t, 1, 4, [(2, 2), (3, 3), (4, 4)])
    with pytest.raises(EpochError, match=r"no change set for committed epoch\(s\) 4"):
        check_inputs(cfg, t, 3, 4, [(4, 4)])
    # epoch 0 is the empty tree: no snapshot needed
    with pytest.raises(EpochError, match=r"change set for committed epoch\(s\) 1, 4"):
        check_inputs(cfg, t, 0, 4, [(1, 1), (2, 2), (3, 3), (4, 4)])


# --------------------------------------------------------------------------- --format glusterfind

GLUSTERFIND_UTILS = "/usr/lib/x86_64-linux-gnu/glusterfs/glusterfind/utils.py"


def test_glusterfind_lines_tell_the_diff_as_glusterfind_does():
    data = {"data_changed": True, "whole_file": True, "ranges": [], "old_size": 10, "new_size": 10}
    lines = glusterfind_lines(
        [
            entry("D", ["d"], ["e"], type_="dir"),  # a directory renamed ...
            entry("X", ["d/x"], []),  # ... a file in it deleted: named under the new name
            entry("Y", ["d/y"], ["y"]),  # ... a file moved out of it
            entry("G", ["gone"], [], type_="dir"),  # a directory removed with its files
            entry("G1", ["gone/a"], []),
            entry("G2", ["gone/sub"], [], type_="dir"),
            entry("G3", ["gone/sub/b"], []),
            entry("H", ["h"], ["h", "h2"], windows=[data]),  # a new name and a data change
            entry("T", ["t"], ["t"], old=row(), new=row(mode=0o600)),  # attributes only
            entry("N", [], ["new dir"], type_="dir"),
            entry("M", [], ["new dir/100%\nx"]),
        ]
    )
    assert lines == [
        "DELETE gone/sub/b",
        "DELETE e/x",
        "DELETE gone/a",
        "DELETE gone/sub",
        "DELETE gone",
        "RENAME d e",
        "RENAME e/y y",
        "NEW h2",
        "NEW new%20dir",
        "NEW new%20dir/100%25%0Ax",
        "MODIFY h",
        "MODIFY h2",
        "MODIFY t",
    ]


def test_glusterfind_encoding_no_encode_prefix_and_separator():
    entries = [entry("F", [], ["a b/c%d\te\u00fc\nf"])]
    assert glusterfind_lines(entries) == ["NEW a%20b/c%25d\te\u00fc%0Af"]  # a tab and non-ASCII stay as they are
    assert glusterfind_lines(entries, encode=False) == ["NEW a b/c%d\te\u00fc\nf"]
    assert glusterfind_lines(entries, prefix="/mnt/my vol/") == ["NEW /mnt/my%20vol/a%20b/c%25d\te\u00fc%0Af"]
    assert glusterfind_lines([entry("D", ["a"], ["b"], type_="dir")], separator="::") == ["RENAME::a::b"]


@pytest.mark.skipif(not os.path.exists(GLUSTERFIND_UTILS), reason="glusterfind is not installed here")
def test_glusterfind_path_encodes_as_glusterfind_itself():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gf_utils", GLUSTERFIND_UTILS)
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    for name in ["plain", "a b", "100%", "new\nline", "tab\there", "\u00fcn\u00ef", "%20 %25\n", "x\r\x01y"]:
        assert glusterfind_path(name) == utils.quote_plus_space_newline(name), name
        assert utils.unquote_plus_space_newline(glusterfind_path(name)) == name


def test_the_verb_writes_glusterfind_lines_and_refuses_its_options_elsewhere(monkeypatch, capsys):
    from epochsync.cli import main
    from epochsync.report import changes

    monkeypatch.setattr(changes, "entries_between", lambda *a, **k: [entry("L", ["a"], ["a", "b c"])])
    base = ["changes", "--config", "x.yaml", "--target", "t", "--from", "1", "--to", "2"]
    assert main([*base, "--format", "glusterfind"]) == 0
    assert capsys.readouterr().out == "NEW b%20c\n"
    assert (
        main([*base, "--format", "glusterfind", "--no-encode", "--field-separator", ",", "--output-prefix", "m"]) == 0
    )
    assert capsys.readouterr().out == "NEW,m/b c\n"
    assert main([*base]) == 0
    assert capsys.readouterr().out == "LINK b%20c a\n"
    assert main([*base, "--no-encode"]) == 1
    assert "go with --format glusterfind" in capsys.readouterr().err
