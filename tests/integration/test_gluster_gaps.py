"""A live Gluster volume at ``changelog.rollover-time 1``: changelog gaps are found and repaired.

Gluster names a rolled changelog by its whole second, so two rollovers in one second (a periodic
one and a cut's explicit one) leave the later file in place of the earlier: the earlier records
are in no file, and the brick's HTIME lists the name twice. It happens at random on a busy volume
at rollover 1 s; here each cut's snapshot of one brick is made to hold exactly what such a
rollover leaves (one rolled file's bytes replaced by the next one's, that one gone, HTIME naming
the survivor twice), at three places of the slice: the first file after the last cut (the one
that must start with the live bytes read then), the last cut's own newest file, and a file in
the middle. A writer runs on the mount all along. Each such cut is walked whole against the
published state: the replica equals the cut, and the cuts after it read on.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from support.gluster import GlusterHistory
from support.machine import cannot_run_here

from epochsync.core.btrfs import run_btrfs
from epochsync.formats.gluster import scan_records
from epochsync.sources.gluster.changelog import CHANGELOG_DIR, rolled_files
from epochsync.sources.gluster.cut import BtrfsCut
from epochsync.sources.gluster.state import SourceState

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HTIME_DIR = "htime"  # a brick's HTIME index, in its changelog folder


@pytest.fixture(scope="module")
def fast_rollover(tmp_path_factory):
    """A 2-brick volume of its own at rollover 1 s (no sharding)."""
    from epochsync_dev.gluster import REQUIRE_ENV, GlusterStack, GlusterUnavailable

    stack = GlusterStack(tmp_path_factory.mktemp("gluster-1s"), brick_size="1G", rollover=1)
    try:
        stack.start(install=bool(os.environ.get(REQUIRE_ENV)))
    except GlusterUnavailable as exc:
        cannot_run_here(REQUIRE_ENV, "Gluster", exc)
    yield stack
    stack.stop()


def _set_ro(path: str, ro: bool) -> None:
    run_btrfs(["property", "set", "-ts", path, "ro", "true" if ro else "false"], f"btrfs property ro of {path}")


def _collide(root: str, snapshot: str, position: dict, where: str) -> str | None:
    """Makes the brick snapshot at ``root`` hold what two rollovers in one second leave (see the
    module docstring), at ``where`` (first, newest, middle) of the slice after ``position``;
    returns the surviving file's name, or None when the slice has too few files for it."""
    cdir = os.path.join(root, CHANGELOG_DIR)
    rolled = rolled_files(cdir)
    newer = [(t, p) for t, p in rolled if position["rolled"] is None or t > position["rolled"]]
    own = [(t, p) for t, p in rolled if t == position["rolled"]]
    pairs = {"first": newer[0:2], "newest": (own + newer)[0:2], "middle": newer[1:3]}[where]
    if len(pairs) < 2 or pairs[1] == rolled[-1]:
        return None  # the newest file stays as it is: the next cut reads on from it
    (_ta, a), (_tb, b) = pairs
    # the records lost (the last cut read the newest file then: there, the next file's are lost)
    lost = scan_records(Path(b if where == "newest" else a).read_bytes())[0]
    if not any(r.type == "CREAT" for _, r in lost):
        return None  # a gap that loses no creation: the replica would not tell
    _set_ro(snapshot, False)
    try:
        Path(a).write_bytes(Path(b).read_bytes())
        os.unlink(b)
        hdir = os.path.join(cdir, HTIME_DIR)
        for name in os.listdir(hdir):
            entries = Path(hdir, name).read_bytes().split(b"\0")
            fixed = [
                e[: -len(os.path.basename(b))] + os.path.basename(a).encode()
                if e.endswith(os.path.basename(b).encode())
                else e
                for e in entries
            ]
            Path(hdir, name).write_bytes(b"\0".join(fixed))
    finally:
        _set_ro(snapshot, True)
    return os.path.basename(a)


def test_changelog_gaps_at_rollover_1s_are_walked_and_repaired(fast_rollover, spark, tmp_path, monkeypatch):
    h = GlusterHistory(fast_rollover, tmp_path, spark)
    # the barrier's own rollover at each cut is the one that collides with the periodic one (and
    # makes enough rolled files per slice for a gap in the middle). The writer also creates a file
    # every few writes: the first file after a cut covers the rest of that cut's publish, before the
    # step's own creations start, and on a loaded machine it held only writes, so no gap there lost
    # a creation that the replica would show (a CI run failed "no brick had the rolled files").
    h.use_barrier(True)
    writer = subprocess.Popen(
        [
            "bash",
            "-c",
            "mkdir -p live; i=0; while [ ! -e live/.stop ]; do i=$((i+1)); printf '%s\\n' $i >> live/log; "
            "echo $i > live/n$((i % 20)); if [ $((i % 5)) = 0 ]; then echo $i > live/c$i; fi; sleep 0.02; done",
        ],
        cwd=h.mount,
    )
    try:
        h.sh("mkdir -p s && for i in $(seq 1 27); do echo old $i > s/old$i; done")
        assert h.step() == 1
        take = BtrfsCut.take
        for k, where in enumerate(("first", "newest", "middle")):
            # a cut, then entry operations in every second until the next one (which loses a
            # rolled file's records), so that whatever file goes held some
            h.cut()
            h.sh(
                f"for j in $(seq 1 9); do echo {k} $j > s/new{k}-$j; mv s/old$((j + 9 * {k})) s/moved{k}-$j; sleep 0.4; done"
            )
            made: list[str] = []

            def gap_take(self, epoch, *, may_miss=False, where=where, made=made):
                cuts, figures = take(self, epoch, may_miss=may_miss)
                state = SourceState(os.path.join(h.folder, "warehouse/cuts/source=vol/state.sqlite"))
                try:
                    positions = state.get("positions")
                finally:
                    state.close()
                for c in cuts:
                    name = _collide(c.root, c.snapshot, positions[c.brick], where)
                    if name:
                        made.append(f"{c.brick}: {name}")
                        break
                return cuts, figures

            monkeypatch.setattr(BtrfsCut, "take", gap_take)
            out = h.cut()
            monkeypatch.setattr(BtrfsCut, "take", take)
            assert made, f"no brick had the rolled files to collide at {where}"
            walk = out["publish"].get("walk")
            assert walk and any(b in walk["why"] for b in ("brick1", "brick2")), (where, made, out["publish"])
            h.lines.append(f"gap at {where} ({made[0]}): {walk}")
            # what the lost file logged is repaired (at the newest file, the records are still there,
            # in the file the slice skips: the walk reads them): the replica equals the cut
            assert walk["repaired"] >= (0 if where == "newest" else 1), (where, walk)
            h.replicate("local", out["epoch"])
            problems = h.problems("local", out["epoch"])
            assert not problems, f"{where}: epoch {out['epoch']} differs from its cut:\n  " + "\n  ".join(problems)
        # later cuts read on from the repaired ones: no refusal, each equal to its cut
        h.step("echo after > s/after && rm s/new0-1")
        h.step("mv s/after s/after-moved")
    finally:
        (h.mount / "live").mkdir(exist_ok=True)
        (h.mount / "live/.stop").touch()
        writer.wait(timeout=60)
        out_dir = Path(__file__).resolve().parents[1] / "output"
        out_dir.mkdir(exist_ok=True)
        (out_dir / "gluster-gaps.log").write_text("\n".join(h.lines) + "\n")
