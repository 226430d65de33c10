"""``epochsync changes`` against glusterfind, GlusterFS's own lister, on one real history.

A second gluster source (``gf``) over the session's live volume, replicated into a posix
target, and a glusterfind session on the same volume, lined up on the same windows (the
session is created a rollover before the first cut; each ``pre`` runs a rollover after the
window's cut, before anything else is written). For each window, ``epochsync changes
--format glusterfind`` and ``glusterfind pre`` must list the same lines, and every line
only one of them lists must be one of the differences :data:`epochsync_dev.glusterfind.REASONS`
explains (Gluster's shard files, a directory's MODIFY glusterfind never lists, ...). The first
window also holds names glusterfind encodes (a space, ``%``, a newline, non-ASCII) and compares
both sides' ``--no-encode`` text; the second window checks the command line prints the same
lines as the function, and times it.

Skipped where Gluster or glusterfind cannot run, failed instead when ``EPOCHSYNC_REQUIRE_GLUSTER``
is set (CI: ``.ci/run`` installs glusterfs and python3-pyxattr).
"""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
from support.gluster import GlusterHistory
from support.machine import cannot_run_here

from epochsync_dev.gluster import REQUIRE_ENV
from epochsync_dev.glusterfind import GlusterfindUnavailable, Session, check_glusterfind, compare_window

pytestmark = [pytest.mark.integration, pytest.mark.slow]

OUTPUT = Path(__file__).resolve().parents[1] / "output"

#: new entries, among them names glusterfind encodes (space, %, newline) and one it does not (non-ASCII)
FIRST = r"""
mkdir -p gf/dir/sub gf/gone
for i in 1 2 3 4 5 6; do echo "file $i" > gf/dir/f$i; done
echo x > "gf/with space"; echo y > "gf/pct%41"; echo z > $'gf/new\nline'; echo u > gf/ünï
echo g > gf/gone/g1; echo g > gf/gone/g2
"""
#: renames (one inside a directory renamed after it), a hard link, attribute, xattr and data
#: changes, a directory removed with its files, and names to encode on both sides of a rename
SECOND = r"""
mv gf/dir/f1 gf/dir/sub/f1-moved
ln gf/dir/f2 gf/dir/sub/f2-link
mv gf/dir/sub gf/sub2
chmod 600 gf/dir/f3
setfattr -n user.k -v v gf/dir/f4
echo more >> gf/dir/f5
mv gf/dir/f6 "gf/dir/f6 renamed%"
rm -r gf/gone
"""


def _unquote(line: str) -> str:
    return line.replace("%20", " ").replace("%0A", "\n").replace("%25", "%")


@pytest.fixture(scope="module")
def windows(gluster_stack, spark, tmp_path_factory):
    try:
        check_glusterfind()
    except GlusterfindUnavailable as exc:
        cannot_run_here(REQUIRE_ENV, "glusterfind", exc)
    folder = tmp_path_factory.mktemp("glusterfind")
    target = {"name": "gfr", "source": "gf", "kind": "posix", "path": str(folder / "replica")}
    h = GlusterHistory(gluster_stack, folder, spark, [target], source="gf")
    session = Session(f"es_{secrets.token_hex(4)}", h.volume.name)
    rows = []
    try:
        session.create()  # a rollover later: what is written from now on is in its first window
        e1 = h.step(targets=("gfr",))  # the volume as it is: the window starts here
        for script, last in ((FIRST, False), (SECOND, True)):
            e2 = h.step(script, targets=("gfr",))
            row = compare_window(
                h.cfg, "gfr", e1, e2, session, spark=spark, out_dir=folder / "listings", cli=last, raw=not last
            )
            row["ours"] = (folder / "listings" / f"epochsync-{e1}-{e2}.txt").read_text().splitlines()
            row["theirs"] = (folder / "listings" / f"glusterfind-{e1}-{e2}.txt").read_text().splitlines()
            rows.append(row)
            e1 = e2
    finally:
        session.delete()
        OUTPUT.mkdir(exist_ok=True)
        with open(OUTPUT / "glusterfind.log", "w") as log:
            for row in rows:
                shown = {k: v for k, v in row.items() if k not in ("raw", "ours", "theirs")}
                log.write(f"{shown}\n  epochsync:   {row['ours']}\n  glusterfind: {row['theirs']}\n")
    return rows


def test_every_window_lists_the_same_entries_or_says_why_not(windows):
    for row in windows:
        assert row["unexplained"] == [], (row["window"], row["explained"], row["ours"], row["theirs"])
        assert row["same"] > 0
    first, second = windows
    # names glusterfind encodes, encoded alike
    both = set(first["ours"]) & set(first["theirs"])
    assert {"NEW gf/with%20space", "NEW gf/pct%2541", "NEW gf/new%0Aline", "NEW gf/ünï", "NEW gf/dir/f1"} <= both
    # a rename inside a directory renamed after it, a hard link, changes, a directory removed with its files
    both = set(second["ours"]) & set(second["theirs"])
    assert {
        "RENAME gf/dir/sub gf/sub2",
        "RENAME gf/dir/f1 gf/sub2/f1-moved",
        "RENAME gf/dir/f6 gf/dir/f6%20renamed%25",
        "NEW gf/sub2/f2-link",
        "MODIFY gf/dir/f3",
        "MODIFY gf/dir/f4",
        "MODIFY gf/dir/f5",
        "DELETE gf/gone/g1",
        "DELETE gf/gone/g2",
        "DELETE gf/gone",
    } <= both, second
    # what glusterfind never lists: a directory's MODIFY (gf/dir lost and gained entries)
    assert "MODIFY gf/dir" in second["ours"] and second["explained"].get("directory_modify")


def test_no_encode_writes_the_same_raw_names(windows):
    first = windows[0]
    raw = first["raw"]
    same = set(first["ours"]) & set(first["theirs"])
    assert "NEW gf/new\nline\n" in raw["glusterfind"] and "NEW gf/with space\n" in raw["glusterfind"]
    for line in same:
        assert _unquote(line) + "\n" in raw["glusterfind"], line
        assert _unquote(line) + "\n" in raw["epochsync"], line


def test_both_are_timed_and_the_command_line_prints_the_same_lines(windows):
    second = windows[1]  # compare_window raised if the command line's lines differed
    for key in ("epochsync_s", "epochsync_cli_s", "glusterfind_pre_s", "glusterfind_post_s"):
        assert isinstance(second[key], float) and second[key] > 0, key
