"""Creates of new files on a posix target are journaled in batches (``PosixTarget.journal_creates``,
``stages.apply.CREATES_PER_FSYNC``): every entry of a batch is durable before the first of its
files exists, and a batch stopped half-way rolls back to exactly the tree before."""

from __future__ import annotations

import os

import pytest
from support.plans import POSIX_TARGET as TARGET
from support.plans import STORE, row

from epochsync.core.config import TargetConfig
from epochsync.journal.undo import read_journal
from epochsync.stages import apply as apply_stage
from epochsync.stages.translate import build_plan
from epochsync.targets.posix import PosixTarget
from epochsync.targets.s3 import Counters


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
