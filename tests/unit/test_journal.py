"""Undo journal, cursors, fault specs: the small pieces rollback and commit rely on."""

from __future__ import annotations

import json
import os

import pytest

from epochsync.errors import EpochsyncError
from epochsync.faults import FaultCounter, FaultSpec, InjectedFailure
from epochsync.journal import (
    PHASE_DATA,
    PHASE_NAMESPACE,
    PHASE_POST,
    UndoJournal,
    advance_cursor,
    read_journal,
)
from epochsync.paths import Warehouse, local_path


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
    from epochsync.journal import mark_aborted

    d = str(tmp_path / "undo")
    with UndoJournal(d, "data-00003", PHASE_DATA) as j:
        j.append({"op": "create", "path": "a"})
        mark_aborted(d)
        with pytest.raises(EpochsyncError, match="rollback"):
            j.append({"op": "create", "path": "b"})
    assert [e["path"] for e in read_journal(d)] == ["a"]
