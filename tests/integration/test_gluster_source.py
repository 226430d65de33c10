"""A live GlusterFS volume as the source: one history of epochs on a real 2-brick volume.

Each epoch: a workload on the FUSE mount, a cut (a btrfs snapshot per brick; with
``cut.barrier`` on for some epochs and off, the default, for the others), the posix target replicated and compared with the cut's ground truth (the brick
snapshots walked directly): bytes, modes, owners, xattrs, symlink targets, mtimes, hard links.
The steps cover what a real volume does that no simulator did: directory entry operations on
every brick, DHT linkto files, renames onto names that hash to the other brick, renames over
existing files (Gluster does not log the overwritten gfid, and logs some new parents as the
null gfid), hard links whose LINK record is on one brick, symlinks without targets in the
records, attribute and xattr changes, truncates, create-then-delete, a file replaced by a
directory, sharded files, both changelog encodings, a directory operation that a cut splits
between bricks, a writer that never stops, kills in the middle, and epochs run by the DAG.

The tests share the volume and run in order (one history): a failure early makes later ones
fail too. The history's progress lines go to ``tests/output/gluster-history.log``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.gluster import GlusterHistory

from epochsync.core.gluster import run_gluster
from epochsync.sources.gluster import btrfs
from epochsync.sources.gluster.cut import snapshot_name
from epochsync.stages.audit import audit_target
from epochsync.stages.cut import published_epoch, read_cut
from epochsync.warehouse.fs import write_json_atomic
from epochsync.warehouse.paths import Warehouse, local_path

pytestmark = [pytest.mark.integration, pytest.mark.slow]

OUTPUT = Path(__file__).resolve().parents[1] / "output"


@pytest.fixture(scope="module")
def hist(gluster_stack, spark, tmp_path_factory):
    h = GlusterHistory(gluster_stack, tmp_path_factory.mktemp("gluster-history"), spark)
    # a volume that is not empty when epochsync starts: the first cut publishes it as it is
    h.sh(
        """
        mkdir -p old/a old/b
        for i in $(seq 1 20); do printf 'old %s\\n' $i > old/a/f$i; done
        ln old/a/f1 old/b/f1-link
        ln -s ../a/f2 old/b/f2-symlink
        setfattr -n user.tag -v before old/a/f3
        """
    )
    yield h
    OUTPUT.mkdir(exist_ok=True)
    (OUTPUT / "gluster-history.log").write_text("\n".join(h.lines) + "\n")


def test_the_first_cut_publishes_the_volume_as_it_is(hist):
    epoch = hist.step()
    assert epoch == 1
    kinds = {r["type"] for r in hist.records(1)}
    assert {"MKDIR", "CREAT", "HLINK", "SLINK", "SATTR", "XATTR", "WRITE", "EPOCH"} <= kinds
    # the replica holds the hard link as one file and the symlink's target (not in any record of Gluster's)
    replica = hist.folder / "replica"
    assert os.path.samefile(replica / "old/a/f1", replica / "old/b/f1-link")
    assert os.readlink(replica / "old/b/f2-symlink") == "../a/f2"


def test_namespace_operations_of_a_real_volume(hist):
    # the history runs under both settings of cut.barrier: on, off, on, then off (the default) again
    hist.use_barrier(True)
    # many names, so that renames and links land on the other brick (DHT linkto files)
    hist.step(
        """
        mkdir -p w/src/sub w/empty
        for i in $(seq 1 40); do printf 'file %s\\n' $i > w/src/f$i; done
        dd if=/dev/urandom of=w/src/big.bin bs=64k count=16 status=none
        dd if=/dev/urandom of=sharded.bin bs=1M count=20 status=none            # 5 shards of 4 MB
        """
    )
    linktos = hist.sh("find ../b1/vol/brick/w ../b2/vol/brick/w -perm 1000 -type f | wc -l")
    hist.use_barrier(False)
    epoch = hist.step(
        """
        for i in $(seq 1 10); do mv w/src/f$i w/src/sub/moved-$i; done          # renames, some onto the other brick
        for i in $(seq 11 20); do ln w/src/f$i w/src/sub/link-$i; done           # hard links, some across bricks
        for i in 21 22 23 24 25; do mv w/src/f$i w/src/f$((i + 5)); done        # renames over existing files
        ln -s ../f33 w/src/sub/to-f33                                           # a symlink
        setfattr -n user.project -v epochsync w/src/f34
        setfattr -n user.gone -v soon w/src/f35
        chmod 0600 w/src/f36 && chmod 0700 w/src/sub
        truncate -s 2 w/src/f37 && truncate -s 100000 w/src/f38
        rm w/src/f39 && mkdir w/src/f39 && echo inside > w/src/f39/x            # a file replaced by a directory
        printf tmp > w/tmp && rm w/tmp                                          # created and deleted in one epoch
        touch -d '2020-01-02 03:04:05' w/src/f40
        dd if=/dev/urandom of=w/src/big.bin bs=4k count=1 seek=7 conv=notrunc status=none
        dd if=/dev/urandom bs=64k count=1 status=none >> sharded.bin            # a sharded file grows
        dd if=/dev/urandom of=sharded.bin bs=4k count=1 seek=2500 conv=notrunc status=none
        """
    )
    assert int(hist.sh("find ../b1/vol/brick/w ../b2/vol/brick/w -perm 1000 -type f | wc -l")) > int(linktos)
    assert hist.read_cut(epoch)["cut"]["barrier"] is False and hist.read_cut(epoch - 1)["cut"]["barrier"] is True
    hist.use_barrier(True)
    records = hist.records(epoch)
    assert {"RENME", "HLINK", "UNLNK", "SLINK", "XATTR", "WRITE", "MKDIR"} <= {r["type"] for r in records}
    writes = {r["tfid"]: r["extents"] for r in records if r["type"] == "WRITE"}
    # what was written moves, not the files: 4 KiB into big.bin; 64 KiB + 4 KiB into the sharded file
    moved = sorted(sum(e["length"] for e in ex) for ex in writes.values() if ex[0]["offset"] > 8)
    assert moved == [4096, 64 * 1024 + 4096], writes
    # f38 (8 bytes, inline in btrfs's metadata) truncated up: its 8 bytes compared equal and not
    # sent, only the rest of its first block (the rest of the file is a hole)
    grown = [ex for ex in writes.values() if ex[0]["offset"] == 8]
    assert len(grown) == 1 and sum(e["length"] for e in grown[0]) <= 4096, writes
    stats = json.loads((hist.folder / f"warehouse/stats/target=local/epoch={epoch}.json").read_text())
    assert stats["bytes_pulled"] <= 1024 * 1024

    hist.step(
        """
        mv w/src w/renamed                                                      # a directory rename (every brick)
        setfattr -x user.gone w/renamed/f35                                     # an xattr removed
        rm w/renamed/sub/link-11 && rm w/renamed/f12                            # a hard link's names removed one by one
        rmdir w/empty
        rm -r w/renamed/f39 && echo a-file-again > w/renamed/f39                # a directory replaced by a file
        rm w/renamed/sub/to-f33 && ln -s /etc/hostname w/renamed/sub/to-f33     # a symlink re-pointed
        mkfifo w/renamed/fifo
        chmod 0755 w/renamed/sub && setfattr -n user.dir -v yes w/renamed
        truncate -s 6M sharded.bin                                              # shards dropped
        ln w/renamed/f27 w/renamed/sub/f27-link && mv w/renamed/f28 w/renamed/f27   # a rename over one of two links
        mkdir -p split && echo x > split/keep && mkdir split/old-name && echo y > split/old-name/inner
        """
    )
    hist.use_barrier(False)


def test_a_directory_operation_split_by_a_cut_waits_for_the_next_one(hist):
    """A cut whose bricks were snapshotted on either side of a mkdir and a directory rename (as a
    barrier enabled on one brick a moment before the other can leave them): the first brick
    does not hold them, the second does. They are published with the next cut."""
    epoch = published_epoch(hist.cfg, hist.source) + 1
    rec_path = local_path(Warehouse(hist.cfg.warehouse).cut(hist.source, epoch))
    record = {
        "source": hist.source,
        "volume": hist.volume.name,
        "epoch": epoch,
        "bricks": {},
        "cut": {"barrier": False},
    }
    for i, spec in enumerate(hist.volume.bricks, start=1):
        path = spec.split(":", 1)[1]
        sub = btrfs.subvolume_of(path)
        folder = os.path.join(os.path.dirname(sub), ".epochsync-cuts", hist.source, f"brick{i}")
        dest = os.path.join(folder, snapshot_name(epoch))
        btrfs.snapshot(sub, dest)
        record["bricks"][f"brick{i}"] = {
            "snapshot": dest,
            "root": os.path.join(dest, os.path.relpath(path, sub)),
            "live": path,
        }
        if i == 1:
            record["time_ns"] = time.time_ns()
            hist.sh("mkdir split/new-dir && mv split/old-name split/new-name")
    record["hints"] = []
    write_json_atomic(rec_path, record)
    published = hist.cut()
    assert published["epoch"] == epoch and published["publish"]["split_dirs"] >= 1
    hist.replicate("local", epoch)
    # the cut's own bricks disagree; the replica holds the state before the split operations
    assert sorted(os.listdir(hist.folder / "replica/split")) == ["keep", "old-name"]
    # the next cut has both bricks past them: published then, equal to the cut
    hist.step("chmod 0750 split")
    assert sorted(os.listdir(hist.folder / "replica/split")) == ["keep", "new-dir", "new-name"]


def _brick_roots(hist) -> list[str]:
    return [spec.split(":", 1)[1] for spec in hist.volume.bricks]


def _hand_cut(hist, between=None) -> int:
    """Takes the next cut by hand as the cut does (barrier, a snapshot per brick, barrier off), with
    ``between()`` run once the barrier is on, and writes its record; returns its epoch."""
    from epochsync.stages.cut import _hints

    epoch = published_epoch(hist.cfg, hist.source) + 1
    record = {"source": hist.source, "volume": hist.volume.name, "epoch": epoch, "bricks": {}, "cut": {"barrier": True}}
    run_gluster(["volume", "barrier", hist.volume.name, "enable"])
    try:
        if between is not None:
            between()
        record["time_ns"] = time.time_ns()
        for i, path in enumerate(_brick_roots(hist), start=1):
            sub = btrfs.subvolume_of(path)
            dest = os.path.join(os.path.dirname(sub), ".epochsync-cuts", hist.source, f"brick{i}", snapshot_name(epoch))
            btrfs.snapshot(sub, dest)
            record["bricks"][f"brick{i}"] = {
                "snapshot": dest,
                "root": os.path.join(dest, os.path.relpath(path, sub)),
                "live": path,
            }
    finally:
        run_gluster(["volume", "barrier", hist.volume.name, "disable"])
    record["hints"], failed = _hints(record, False)
    assert not failed, failed
    write_json_atomic(local_path(Warehouse(hist.cfg.warehouse).cut(hist.source, epoch)), record)
    return epoch


def test_a_rename_caught_half_way_waits_for_the_next_cut(hist):
    """DHT renames a file whose new name hashes to the other brick in steps: the new name linked on
    the file's brick (internal, never logged), then the rename held by the barrier. A cut then holds
    two names of one gfid, a hard link no client made: it keeps its published name one epoch."""
    hist.sh("mkdir -p hw && for i in $(seq 1 24); do echo $i > hw/p$i; done")
    hist.step()
    b1, b2 = _brick_roots(hist)
    on1 = [f"p{i}" for i in range(1, 25) if os.path.exists(f"{b1}/hw/p{i}") and not _linkto(f"{b1}/hw/p{i}")]
    on2 = [f"p{i}" for i in range(1, 25) if os.path.exists(f"{b2}/hw/p{i}") and not _linkto(f"{b2}/hw/p{i}")]
    assert on1 and on2, (on1, on2)
    src, dst = on1[0], on2[0]  # dst's name hashes to brick2, src's data is on brick1
    hist.sh(f"rm hw/{dst}")
    hist.step()
    mover: list[subprocess.Popen] = []

    def rename_held():
        mover.append(subprocess.Popen(["mv", f"hw/{src}", f"hw/{dst}"], cwd=hist.mount))
        deadline = time.monotonic() + 10
        while not os.path.exists(f"{b1}/hw/{dst}") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.path.samefile(f"{b1}/hw/{src}", f"{b1}/hw/{dst}"), "the rename was not caught half-way"

    epoch = _hand_cut(hist, rename_held)
    assert mover[0].wait(timeout=60) == 0
    published = hist.cut()
    assert published["epoch"] == epoch and published["publish"]["halfway_renames"] == 1, published["publish"]
    hist.replicate("local", epoch)
    replica = hist.folder / "replica/hw"
    assert (replica / src).exists() and not (replica / dst).exists(), sorted(os.listdir(replica))
    # the next cut has the rename done: published then, equal to the cut
    hist.step()
    assert (replica / dst).exists() and not (replica / src).exists()


def _linkto(path: str) -> bool:
    return (os.lstat(path).st_mode & 0o7777) == 0o1000


def test_a_cut_whose_live_changelogs_cannot_be_read_is_walked_whole(hist, monkeypatch, tmp_path):
    """The hints (what the live changelogs logged just after the snapshots) cannot be read: the
    snapshots are sound, so the cut is published, walked whole against the published state."""
    import epochsync.stages.cut as cut_stage

    fake = tmp_path / "live"
    (fake / ".glusterfs/changelogs").mkdir(parents=True)
    (fake / ".glusterfs/changelogs/CHANGELOG").write_bytes(b"not a changelog\n")
    monkeypatch.setattr(cut_stage, "_live_brick_root", lambda where: str(fake))
    hist.sh("mkdir -p walk && echo 1 > walk/one && chmod 0640 hw/*")
    out = hist.cut()
    walk = out["publish"]["walk"]
    assert "hints" in walk["why"], walk
    monkeypatch.undo()
    hist.replicate("local", out["epoch"])
    assert not hist.problems("local", out["epoch"])
    # the published state was right: a walk asked for by hand repairs nothing
    hist.sh("echo 2 > walk/two")
    done = _cli(hist, "cut", "--source", hist.source, "--rewalk", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    walk = json.loads(done.stdout)["cuts"][-1]["publish"]["walk"]
    assert walk["why"] == {"asked": "epochsync cut ... --rewalk"} and walk["repaired"] == 0, walk
    epoch = published_epoch(hist.cfg, hist.source)
    hist.replicate("local", epoch)
    assert not hist.problems("local", epoch)


def test_binary_changelog_encoding(hist):
    run_gluster(["volume", "set", hist.volume.name, "changelog.encoding", "binary"])
    try:
        # the volume's files are now rolled over with the binary encoding: entries, data, metadata
        epoch = hist.step(
            """
            mkdir -p bin && for i in 1 2 3; do echo $i > bin/b$i; done
            mv bin/b1 bin/b1-renamed && rm bin/b2 && ln bin/b3 bin/b3-link && chmod 0640 bin/b3
            rm w/renamed/f13
            """
        )
        assert any(r["type"] == "UNLNK" for r in hist.records(epoch))
        rec = read_cut(hist.cfg, hist.source, epoch)
        live = os.path.join(rec["bricks"]["brick1"]["root"], ".glusterfs/changelogs/CHANGELOG")
        assert open(live, "rb").readline().rstrip().endswith(b"encoding : 1")
    finally:
        run_gluster(["volume", "set", hist.volume.name, "changelog.encoding", "ascii"])


def test_a_writer_keeps_writing_while_cuts_are_taken(hist):
    """Appends and creates never stop while cuts are taken; every committed epoch equals its cut."""
    writer = subprocess.Popen(
        [
            "bash",
            "-c",
            """
            mkdir -p live; i=0; worst=0
            while [ ! -e live/.stop ]; do
              i=$((i+1)); t0=$(date +%s%N)
              printf 'line %s\\n' $i >> live/log
              echo $i > live/n$((i % 50))
              t1=$(date +%s%N); d=$(( (t1 - t0) / 1000000 )); [ $d -gt $worst ] && worst=$d
              sleep 0.02
            done
            echo "$i $worst"
            """,
        ],
        cwd=hist.mount,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(1)
        hist.use_barrier(True)  # one cut under each setting of cut.barrier
        epochs = [hist.cut()["epoch"]]
        hist.use_barrier(False)
        time.sleep(0.5)
        epochs.append(hist.cut()["epoch"])
    finally:
        hist.use_barrier(False)
        (hist.mount / "live/.stop").touch()
        out, _ = writer.communicate(timeout=60)
    writes, worst_ms = map(int, out.split())
    hist.lines.append(f"writer: {writes} writes during the cuts, the slowest {worst_ms} ms")
    # the writer was writing across the cuts: each cut caught its file at another length
    sizes = [hist.truth(e)["live/log"]["size"] for e in epochs]
    assert writes > 0 and sizes[0] < sizes[1], sizes
    for e in epochs:
        hist.replicate("local", e)
        problems = hist.problems("local", e)
        assert not problems, f"epoch {e} differs from its cut:\n  " + "\n  ".join(problems)


def _cli(hist, *args: str, fault: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if fault:
        env["EPOCHSYNC_INJECT_FAILURE"] = fault
    # its own process group: a kill fault kills the group it runs in
    return subprocess.run(
        [sys.executable, "-m", "epochsync.cli", *args, "--config", str(hist.config_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        start_new_session=True,
    )


def test_killed_between_the_snapshot_and_the_commit(hist):
    """kill -9 after the snapshots, after the records are published (before the source's state is
    committed), and in the middle of the apply: every rerun ends equal to the cut."""
    hist.sh("rm -rf live && mkdir -p kill && for i in $(seq 1 30); do echo $i > kill/k$i; done")
    before = published_epoch(hist.cfg, hist.source)
    for step in (0, 1):
        done = _cli(hist, "cut", "--source", hist.source, fault=f"after={step},stage=cut,mode=kill")
        assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
        assert published_epoch(hist.cfg, hist.source) == before
        rerun = _cli(hist, "cut", "--source", hist.source)
        assert rerun.returncode == 0, rerun.stderr[-2000:]
        before += 1
        assert published_epoch(hist.cfg, hist.source) == before
        hist.sh(
            f"for i in $(seq {1 + 10 * step} {10 + 10 * step}); do mv kill/k$i kill/k$i-moved; done; echo {step} > kill/more"
        )
    # the apply of the first of those epochs is killed half-way; the next run rolls back and redoes it
    epoch = before - 1
    done = _cli(hist, "replicate", "--target", "local", "--epoch", str(epoch), fault="at=0.5,mode=kill")
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    for e in (epoch, before):
        hist.replicate("local", e)
        problems = hist.problems("local", e)
        assert not problems, f"epoch {e} differs from its cut:\n  " + "\n  ".join(problems)


def test_epochs_through_the_dag(hist, seaweed):
    """The epoch DAG of a live source starts with its cut: two epochs run by ``dag.test()``."""
    from support.airflow_stack import airflow_env, dagtest

    env = airflow_env(hist.folder, seaweed, config=hist.config_path)
    for script in ("mkdir -p dag && echo 1 > dag/one && mv kill dag/", "echo 2 >> dag/one && rm -r dag/kill"):
        hist.sh(script)
        epoch = published_epoch(hist.cfg, hist.source) + 1
        result = dagtest(env, "epochsync__vol__local", epoch)
        assert result["state"] == "success", result["log"][-4000:]
        assert result["tasks"]["cut"] == "success" and result["tasks"]["commit"] == "success"
        assert read_cut(hist.cfg, hist.source, epoch)["resolved"]
        problems = hist.problems("local", epoch)
        assert not problems, f"epoch {epoch} differs from its cut:\n  " + "\n  ".join(problems)


def test_the_audit_sees_what_changed_behind_its_back(hist):
    """``epochsync audit`` of the replica against its cut: each change made to the replica behind
    epochsync's back is one difference (a byte only with --deep, the size and mtime kept; the
    directories whose entries changed, by their mtimes); ``--repair`` puts every one right, as
    the cut's truth (walked from the snapshots directly) confirms."""
    replica = hist.folder / "replica"
    f3, f4, f5 = replica / "old/a/f3", replica / "old/a/f4", replica / "old/a/f5"
    twin = replica / "old/b/f1-link"
    mode = f4.stat().st_mode & 0o7777
    f5_st = f5.stat()
    original = f5.read_bytes()
    f4.chmod(0o604 if mode != 0o604 else 0o640)  # a mode
    (replica / "stray.txt").write_text("nobody made me")  # a stray
    os.rename(f3, replica / "old/a/f3-moved")  # one missing, one stray
    subprocess.run(["cp", "--preserve=all", str(twin), str(twin) + ".copy"], check=True)
    os.replace(str(twin) + ".copy", twin)  # two names of one file, now two files: only the links differ
    with open(f5, "r+b") as f:  # a byte, with the size and mtime kept
        f.write(bytes([original[0] ^ 1]))
    os.utime(f5, ns=(f5_st.st_atime_ns, f5_st.st_mtime_ns))
    got = {(d.path, d.what) for d in hist.audit("local", deep=True)["differences"]}
    assert got == {
        ("old/a/f4", "mode"),
        ("stray.txt", "stray"),
        ("old/a/f3", "missing"),
        ("old/a/f3-moved", "stray"),
        ("old/b/f1-link", "links"),
        ("old/a/f5", "bytes"),
        ("old/a", "mtime"),
        ("old/b", "mtime"),
    }, got
    metadata_only = {(d.path, d.what) for d in hist.audit("local")["differences"]}
    assert metadata_only == got - {("old/a/f5", "bytes")}, metadata_only
    done = audit_target(hist.cfg, "local", deep=True, repair=True)
    assert done["repair"]["after"] == [], done["repair"]
    assert done["repair"]["how"] == {"attrs": 3, "data": 1, "replace": 4}, done["repair"]
    assert os.path.samefile(replica / "old/a/f1", twin) and f5.read_bytes() == original
    assert hist.audit("local", deep=True)["differences"] == []
    problems = hist.problems("local", published_epoch(hist.cfg, hist.source))
    assert not problems, "the repaired replica differs from its cut:\n  " + "\n  ".join(problems)
    hist.step("echo after-the-repair > old/a/f4")  # and the next epoch's fence accepts what it wrote


def test_cuts_are_purged_from_the_command_line(hist):
    """``epochsync purge``: what the purge DAG does, from the CLI; every committed cut but the newest goes."""
    kept = _cuts_kept(hist)
    assert len(kept) > 2, kept
    dry = _cli(hist, "purge", "--source", hist.source, "--dry-run")
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert "dry run" in dry.stdout and _cuts_kept(hist) == kept
    done = _cli(hist, "purge", "--source", hist.source, "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    dropped = json.loads(done.stdout)["cuts_dropped"]
    assert dropped and _cuts_kept(hist) == [e for e in kept if e not in dropped] and kept[-1] not in dropped


def _cuts_kept(hist) -> list[int]:
    from epochsync.stages.cut import mechanism

    return mechanism(hist.cfg.source(hist.source)).epochs()
