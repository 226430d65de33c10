"""Creates of new files and small overwrites on a posix target are journaled in batches
(``PosixTarget.journal_ahead``, ``stages.apply.CREATES_PER_FSYNC``), post operations too
(``PosixTarget.run_post_ops``): every entry of a batch is durable before the first of its
changes, and a batch stopped half-way rolls back to exactly the tree before."""

from __future__ import annotations

import os

import pytest
from support.plans import POSIX_TARGET as TARGET
from support.plans import STORE, row

from epochsync.core.config import TargetConfig
from epochsync.journal.undo import read_journal
from epochsync.stages import apply as apply_stage
from epochsync.stages.translate import build_plan
from epochsync.stores.s3_access import Counters
from epochsync.targets.posix import PosixTarget


class Source:
    kind = "gluster"
    client = None

    def __init__(self, objects):
        self.objects, self.counters = objects, Counters()

    def get_range(self, bucket, key, version, offset, length):
        data = self.objects.get((key, version), b"")[offset : offset + length]
        return data + bytes(length - len(data))

    def get_all(self, bucket, key, version=None):
        return self.objects[(key, version)]


def _plan(tmp_path, n):
    entries, objects = [], {}
    entries.append(
        {
            "fid": "D",
            "old": None,
            "new": row("dir", mode=0o755),
            "old_paths": [],
            "new_paths": ["d"],
            "old_links": [],
            "new_links": [{"pfid": "R", "name": "d", "path": "d"}],
            "change": None,
        }
    )
    for i in range(n):
        fid, data = f"F{i}", f"file {i}".encode()
        objects[(f"data/{fid}", "v1")] = data
        entries.append(
            {
                "fid": fid,
                "old": None,
                "new": row("file", size=len(data), version="v1", fid=fid),
                "old_paths": [],
                "new_paths": [f"d/f{i:03d}"],
                "old_links": [],
                "new_links": [{"pfid": "D", "name": f"f{i:03d}", "path": f"d/f{i:03d}"}],
                "change": None,
            }
        )
    target = PosixTarget(TargetConfig(name="t", source="s", kind="posix", path=str(tmp_path / "replica")))
    return target, build_plan(entries, target=TARGET, store=STORE, epoch=1), Source(objects)


def _tree(root):
    return sorted(
        os.path.relpath(os.path.join(d, f), root)
        for d, ds, fs in os.walk(root)
        for f in fs + ds
        if not os.path.relpath(os.path.join(d, f), root).startswith(".epochsync")
    )


def test_creates_are_journaled_in_batches_before_their_files_exist(tmp_path, monkeypatch):
    monkeypatch.setattr(apply_stage, "LOCAL_APPLY_THREADS", 1)
    monkeypatch.setattr(apply_stage, "CREATES_PER_FSYNC", 8)
    target, plan, source = _plan(tmp_path, 20)
    jdir = str(tmp_path / "undo")
    seen = []
    real_open = os.open

    def spy(path, flags, *a, **kw):
        if flags & os.O_CREAT and "/d/f" in str(path):
            seen.append(sum(1 for e in read_journal(jdir) if e["op"] == "create"))
        return real_open(path, flags, *a, **kw)

    monkeypatch.setattr(os, "open", spy)
    _, state = target.fence_check(plan["fence"], None)
    apply_stage.apply_plan(plan, target, source, "src", jdir, state)
    # three batches (8, 8, 4): a file is created only after every entry of its batch is durable
    assert seen == [8] * 8 + [16] * 8 + [20] * 4
    assert (tmp_path / "replica/d/f007").read_bytes() == b"file 7"


def test_a_batch_of_creates_stopped_half_way_rolls_back_exactly(tmp_path, monkeypatch):
    from epochsync.core.errors import EpochsyncError

    monkeypatch.setattr(apply_stage, "LOCAL_APPLY_THREADS", 1)
    target, plan, source = _plan(tmp_path, 20)
    jdir = str(tmp_path / "undo")
    real_open = os.open
    made = []

    def failing(path, flags, *a, **kw):
        if flags & os.O_CREAT and "/d/f" in str(path):
            made.append(path)
            if len(made) == 6:
                raise OSError("no space left")
        return real_open(path, flags, *a, **kw)

    monkeypatch.setattr(os, "open", failing)
    _, state = target.fence_check(plan["fence"], None)
    with pytest.raises((OSError, EpochsyncError)):
        apply_stage.apply_plan(plan, target, source, "src", jdir, state)
    monkeypatch.setattr(os, "open", real_open)
    entries = read_journal(jdir)
    assert sum(1 for e in entries if e["op"] == "create") == 20  # journaled, though 5 files were made
    assert len(_tree(tmp_path / "replica/d")) == 5
    for e in reversed(entries):
        target.undo(e, jdir)
    target.finish_rollback(1)
    assert _tree(tmp_path / "replica") == []


def _journal(jdir, writer="data-00000"):
    from epochsync.journal.undo import PHASE_DATA, UndoJournal

    return UndoJournal(jdir, writer, PHASE_DATA)


def _files(tmp_path, n):
    target = PosixTarget(TargetConfig(name="t", source="s", kind="posix", path=str(tmp_path / "replica")))
    root = tmp_path / "replica"
    root.mkdir()
    for i in range(n):
        p = root / f"f{i}"
        p.write_bytes(f"old content {i:02d}".encode())
        os.utime(p, ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000 + i))
    return target, root


def _state(root):
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns, p.stat().st_mode) for p in sorted(root.iterdir())}


def test_small_overwrites_are_journaled_in_one_batch_with_their_preimages(tmp_path, monkeypatch):
    """journal_ahead: the pre-images of a batch of small overwrites go into their entries, durable
    with one fsync before the first write; a batch stopped after some writes (and a file cut
    short) rolls back to exactly the bytes, sizes and times before; a large pre-image stays a file."""
    target, root = _files(tmp_path, 6)
    (root / "f5").write_bytes(bytes(100 << 10))
    before = _state(root)
    jdir = str(tmp_path / "undo")
    ops = [
        {
            "path": f"f{i}",
            "new_size": 14,
            "ranges": [[4, 3]],
            "attrs": {"mode": 0o600, "mtime_ns": 1_700_000_000_000_000_000},
        }
        for i in range(4)
    ]
    ops.append({"path": "f4", "new_size": 5, "ranges": [[0, 2]]})  # cut short: the tail is a pre-image
    ops.append({"path": "f5", "new_size": 100 << 10, "ranges": [[0, 80 << 10]]})  # above the inline bound
    syncs = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (syncs.append(fd), real_fsync(fd)))
    with _journal(jdir) as journal:
        out = target.journal_ahead(ops, journal)
        assert len(syncs) == 1
        assert [bool(o.get("journaled")) for o in out] == [True] * 5 + [False]
        entries = read_journal(jdir)
        assert [e["path"] for e in entries] == ["f0", "f1", "f2", "f3", "f4"]
        assert entries[4]["old_size"] == 14 and [(p["offset"], p["length"]) for p in entries[4]["preimages"]] == [
            (0, 2),
            (5, 9),
        ]
        # the first three run, then the apply stops
        for op in out[:3]:
            target.run_data_op(op, journal, [(4, b"NEW")])
        target.run_data_op(out[4], journal, [(0, b"XY")])
    assert (root / "f0").read_bytes() == b"old NEWtent 00" and (root / "f4").read_bytes() == b"XYd c"
    for e in reversed(read_journal(jdir)):
        target.undo(e, jdir)
    assert _state(root) == before


def test_post_operations_are_journaled_in_batches(tmp_path, monkeypatch):
    """run_post_ops: links and attributes journaled together with one fsync, then made; an
    attributes change of a path the batch links starts the next batch (its old attributes are
    read once the link exists); the undo puts back the tree."""
    from epochsync.journal.undo import PHASE_POST, UndoJournal

    target, root = _files(tmp_path, 3)
    before = _state(root)
    jdir = str(tmp_path / "undo")
    new = {"mode": 0o600, "mtime_ns": 1_700_000_000_000_000_000}
    ops = [
        {"op": "attrs", "path": "f0", "attrs": new},
        {"op": "link", "path": "g1", "existing": "f1"},
        {"op": "attrs", "path": "f2", "attrs": new},
        {"op": "attrs", "path": "g1", "attrs": new},  # linked in this batch: ends it
        {"op": "attrs", "path": "f1", "attrs": new},
    ]
    appended = []
    with UndoJournal(jdir, "post", PHASE_POST) as journal:
        real_many, real_one = journal.append_many, journal.append
        monkeypatch.setattr(journal, "append_many", lambda es: (appended.append(len(es)), real_many(es))[1])
        monkeypatch.setattr(journal, "append", lambda e: (appended.append(1), real_one(e))[1])
        target.run_post_ops(ops, journal, {})
    assert appended == [3, 2]  # the batch ends before g1's attributes; g1 exists for the next one
    assert (root / "g1").stat().st_ino == (root / "f1").stat().st_ino
    assert all((root / n).stat().st_mtime_ns == new["mtime_ns"] for n in ("f0", "f1", "f2"))
    for e in reversed(read_journal(jdir)):
        target.undo(e, jdir)
    assert _state(root) == before
