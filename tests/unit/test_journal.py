"""Undo journal, cursors, fault specs: the small pieces rollback and commit rely on."""

from __future__ import annotations

import json
import os

import pytest

from epochsync.core.errors import EpochsyncError
from epochsync.journal.faults import FaultCounter, FaultSpec, InjectedFailure
from epochsync.journal.undo import (
    PHASE_DATA,
    PHASE_NAMESPACE,
    PHASE_POST,
    UndoJournal,
    advance_cursor,
    journal_dir,
    journal_exists,
    read_journal,
)
from epochsync.warehouse.paths import Warehouse, local_path


def test_entries_come_back_in_mutation_order_and_a_torn_last_line_is_ignored(tmp_path):
    d = str(tmp_path / "undo")
    with UndoJournal(d, "post", PHASE_POST) as j:
        j.append({"op": "attrs", "path": "p1"})
    with UndoJournal(d, "ns", PHASE_NAMESPACE) as j:
        j.append({"op": "rename", "src": "a", "dst": "@tmp/1/1"})
        j.append({"op": "mkdir", "path": "b"})
    with UndoJournal(d, "data-00001", PHASE_DATA) as j:
        j.append({"op": "create", "path": "b/f"})
    # a second attempt of the same writer continues its sequence
    with UndoJournal(d, "ns", PHASE_NAMESPACE) as j:
        j.append({"op": "mkdir", "path": "c"})
    with open(os.path.join(d, "data-00001.jsonl"), "a") as f:
        f.write('{"op": "create", "path": "half')  # killed while writing: its mutation never started
    got = [(e["op"], e.get("path") or e.get("src"), e["seq"]) for e in read_journal(d)]
    assert got == [("rename", "a", 1), ("mkdir", "b", 2), ("mkdir", "c", 3), ("create", "b/f", 1), ("attrs", "p1", 1)]


def test_preimages_are_durable_files(tmp_path):
    with UndoJournal(str(tmp_path), "data-00000", PHASE_DATA) as j:
        path = j.save_preimage("x", b"old bytes")
    assert open(path, "rb").read() == b"old bytes"


def test_cursor_only_moves_forward(tmp_path):
    wh = f"file://{tmp_path}"
    advance_cursor(wh, "src", "t", 2, {"MDT0000": 10, "OST0000": 5})
    doc = advance_cursor(wh, "src", "t", 1, {"MDT0000": 7, "OST0001": 3})
    assert doc == {"epoch": 2, "servers": {"MDT0000": 10, "OST0000": 5, "OST0001": 3}}
    assert json.load(open(local_path(Warehouse(wh).cursor("src", "t")))) == doc


def test_fault_spec_parsing_and_one_shot_firing(tmp_path):
    spec = FaultSpec.parse("after=2,epoch=3,target=dr")
    assert (spec.after, spec.epoch, spec.target, spec.mode) == (2, 3, "dr", "raise")
    assert spec.applies("dr", 3) and not spec.applies("dr", 4) and not spec.applies("x", 3)
    for bad in ("after", "after=x", "epoch=2", "after=1,mode=explode", "after=1,color=red"):
        with pytest.raises(EpochsyncError):
            FaultSpec.parse(bad)
    counter = FaultCounter(spec, str(tmp_path / "n"), str(tmp_path / "fired"))
    counter.tick("m1")
    counter.tick("m2")
    with pytest.raises(InjectedFailure, match="mutation 3"):
        counter.tick("m3")
    # fired once: a rerun of the epoch goes through
    fresh = FaultCounter(spec, str(tmp_path / "n2"), str(tmp_path / "fired"))
    for i in range(5):
        fresh.tick(f"m{i}")


def test_a_rollback_in_progress_stops_late_writers(tmp_path):
    from epochsync.journal.undo import mark_aborted

    d = str(tmp_path / "undo")
    with UndoJournal(d, "data-00003", PHASE_DATA) as j:
        j.append({"op": "create", "path": "a"})
        mark_aborted(d)
        with pytest.raises(EpochsyncError, match="rollback"):
            j.append({"op": "create", "path": "b"})
    assert [e["path"] for e in read_journal(d)] == ["a"]


def test_a_writer_that_starts_after_the_rollback_listed_the_writers_leaves_no_journal(tmp_path):
    """An executor task's thread may open its journal after the rollback wrote ABORTED and
    listed the writers to wait for: it must refuse and leave no file, and never create the
    epoch's directory again once the rollback removed it (an unfinished epoch on disk)."""
    from epochsync.journal.undo import mark_aborted, remove_journal, start_run

    d = str(tmp_path / "undo" / "epoch=1")
    token = start_run(d)
    with UndoJournal(d, "data-00000", PHASE_DATA, run=token) as j:  # a writer before the rollback
        j.append({"op": "create", "path": "a"})
    mark_aborted(d)
    with pytest.raises(EpochsyncError, match="rollback"):
        UndoJournal(d, "data-00101", PHASE_DATA, run=token)
    assert sorted(n for n in os.listdir(d) if n.endswith(".jsonl")) == ["data-00000.jsonl"]
    remove_journal(d)  # the rollback is done: the folder is renamed away, then deleted
    assert os.listdir(tmp_path / "undo") == []
    with pytest.raises(EpochsyncError, match="rolled back|over"):
        UndoJournal(d, "data-00102", PHASE_DATA, run=token)
    assert not os.path.exists(d)
    assert not journal_exists(d)
    remove_journal(d)  # missing is fine


def test_a_rollback_run_again_after_a_crash_does_not_undo_twice(tmp_path, monkeypatch):
    """Regression: a rollback killed after its last undo, before the journal was removed, ran the
    whole journal again; undoing ``create s`` a second time removed the original ``s`` that
    undoing ``rename s -> scratch`` had just put back (an epoch that replaced ``s`` by another
    entry of the same name). A rerun skips what the killed one undid (``undone.txt``)."""
    from epochsync.core.config import config_from_dict
    from epochsync.stages.apply import apply_plan
    from epochsync.stages.context import _target_dict
    from epochsync.stages.rollback import rollback_target
    from epochsync.stages.translate import build_plan
    from epochsync.stores.connections import S3Settings
    from epochsync.stores.s3_access import S3Access
    from epochsync.targets.posix import PosixTarget

    replica = tmp_path / "replica"
    cfg = config_from_dict(
        {
            "warehouse": str(tmp_path / "wh"),
            "sources": [
                {
                    "name": "s",
                    "root_fid": "R",
                    "servers": ["M"],
                    "changelogs": {"uri": "/x"},
                    "store": {"conn_id": "c", "bucket": "b"},
                    "epoch": {"interval": 60, "start": "2026-01-01"},
                }
            ],
            "targets": [{"name": "t", "source": "s", "kind": "posix", "path": str(replica)}],
        },
        file=str(tmp_path / "c.yaml"),
    )
    target = PosixTarget(cfg.target("t"))

    def link(to: str) -> dict:
        return {"type": "symlink", "mode": 0o120777, "uid": 0, "gid": 0, "size": 0, "symlink": to, "xattrs": []}

    def apply(entries, epoch):
        plan = build_plan(
            entries, target=_target_dict(cfg.target("t")), store={"unstriped_key": "d/{fid}"}, epoch=epoch
        )
        _, state = target.fence_check(plan["fence"], None)
        apply_plan(plan, target, S3Access(S3Settings("none")), "b", journal_dir(cfg.warehouse, "t", epoch), state)

    apply([{"fid": "A", "old": None, "new": link("one"), "old_paths": [], "new_paths": ["s"], "change": None}], 1)
    target.write_manifest({"epoch": 1})
    apply(
        [
            {"fid": "A", "old": link("one"), "new": None, "old_paths": ["s"], "new_paths": [], "change": None},
            {"fid": "B", "old": None, "new": link("two"), "old_paths": [], "new_paths": ["s"], "change": None},
        ],
        2,
    )
    assert os.readlink(replica / "s") == "two"

    def killed(self, epoch):
        raise KeyboardInterrupt("killed after the undo, before the journal was removed")

    monkeypatch.setattr(PosixTarget, "mark_rollback", killed)
    with pytest.raises(KeyboardInterrupt):
        rollback_target(cfg, "t", check=False)
    assert os.readlink(replica / "s") == "one"
    monkeypatch.undo()
    assert rollback_target(cfg, "t", check=False)["rolled_back"] == [2]
    assert os.readlink(replica / "s") == "one"
    assert not journal_exists(journal_dir(cfg.warehouse, "t", 2))
