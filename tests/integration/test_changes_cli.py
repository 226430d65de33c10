"""``epochsync changes`` on a replicated history, held to the simulator's ground truth.

A posix target replicates four simulated epochs (SeaweedFS source, real data, so the
truth has content hashes); then for every pair of committed epochs the listing, read by
:func:`apply_to_listing`, must turn the truth at E1 into the truth at E2 (paths and fids),
every MODIFY must say exactly which of data, attrs and xattrs the truth says changed, and
every record's state must be the truth's. ``snapshot_retention: 2`` prunes snapshot 1:
asking for it is an error naming the snapshots kept.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from support.histories import simulate, truth

from epochsync.cli import main
from epochsync.core.config import load_config
from epochsync.core.errors import SnapshotError
from epochsync.report.changes import apply_to_listing, changes_between, to_json_line, to_text

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EPOCHS = 4


@pytest.fixture(scope="module")
def replicated(seaweed, tmp_path_factory):
    out, _ = simulate(seaweed, tmp_path_factory.mktemp("changes"), EPOCHS, seed=2)
    doc = yaml.safe_load((out / "epochsync.yaml").read_text())
    doc["targets"] = [dict(doc["targets"][0], snapshot_retention=2)]
    (out / "epochsync.yaml").write_text(yaml.safe_dump(doc))
    cfg = load_config(out / "epochsync.yaml")
    assert main(["replicate", "--config", str(cfg.file), "--target", "local", "--through", str(EPOCHS)]) == 0
    return out, cfg


def _truth(out: Path, epoch: int) -> dict[str, dict]:
    return truth(out, epoch) if epoch else {}


def expected_modify(a: dict[str, dict], b: dict[str, dict]) -> dict[str, list[str]]:
    """fid -> what changed between two truths, for fids present (by some path) in both."""
    old = {r["fid"]: r for r in a.values()}
    new = {r["fid"]: r for r in b.values()}
    out = {}
    for fid in old.keys() & new.keys():
        x, y = old[fid], new[fid]
        what = []
        data = x["type"] == "file" and (x["size"] != y["size"] or x["sha256"] != y["sha256"])
        if data:
            what.append("data")
        if any(x[k] != y[k] for k in ("mode", "uid", "gid")) or (not data and x["mtime_ns"] != y["mtime_ns"]):
            what.append("attrs")
        if x["xattrs"] != y["xattrs"]:
            what.append("xattrs")
        if what:
            out[fid] = what
    return out


def state_of(row: dict) -> tuple:
    return (
        row["fid"],
        row["type"],
        row["size"] if row["type"] == "file" else None,
        row["mode"],
        row["uid"],
        row["gid"],
        row.get("symlink"),
        row["xattrs"] or {},
    )


def rec_state(rec: dict) -> tuple:
    return (
        rec["fid"],
        rec["type"],
        rec.get("size"),
        rec["mode"],
        rec["uid"],
        rec["gid"],
        rec.get("symlink"),
        rec.get("xattrs") or {},
    )


def test_every_window_equals_the_ground_truth_diff(replicated, spark):
    out, cfg = replicated
    kinds_seen: set[str] = set()
    moved_dirs_with_content = 0
    for e1 in range(0, EPOCHS):
        for e2 in range(e1 + 1, EPOCHS + 1):
            if 1 in (e1, e2):  # pruned
                with pytest.raises(SnapshotError, match=r"no snapshot at epoch 1: pruned .*kept: 2, 3, 4"):
                    changes_between(cfg, "local", e1, e2, spark)
                continue
            recs = changes_between(cfg, "local", e1, e2, spark)
            a, b = _truth(out, e1), _truth(out, e2)
            got = apply_to_listing({p: r["fid"] for p, r in a.items()}, recs)
            assert got == {p: r["fid"] for p, r in b.items()}, (e1, e2)
            assert {r["fid"]: r["changed"] for r in recs if r["kind"] == "MODIFY"} == expected_modify(a, b), (e1, e2)
            for r in recs:
                side = a if r["kind"] == "DELETE" else b
                assert rec_state(r) == state_of(side[r["path"]]), (e1, e2, r)
                if r["kind"] == "MODIFY" and "data" in r["changed"]:
                    assert r["ranges"] and sum(n for _, n in r["ranges"]) <= r["size"] or r["size"] == 0
            # a directory move is one line: what moved with it is not listed again
            for d in (r for r in recs if r["kind"] == "RENAME" and r["type"] == "dir"):
                inside = [p for p in a if p.startswith(d["old_path"] + "/")]
                moved_dirs_with_content += bool(inside)
                listed = {r.get("old_path") or r["path"] for r in recs}
                assert not [
                    p
                    for p in inside
                    if p in listed and b.get(d["path"] + p[len(d["old_path"]) :], {}).get("fid") == a[p]["fid"]
                ], (e1, e2, d)
            kinds_seen |= {r["kind"] for r in recs}
    assert kinds_seen == {"NEW", "DELETE", "RENAME", "LINK", "MODIFY"}
    assert moved_dirs_with_content, "the history should move a directory with something in it"


def test_the_verb_prints_text_and_jsonl(replicated, spark, capsys):
    out, cfg = replicated
    conf = str(cfg.file)
    recs = changes_between(cfg, "local", 2, 4, spark)
    assert main(["changes", "--config", conf, "--target", "local", "--from", "2", "--to", "4"]) == 0
    assert capsys.readouterr().out.splitlines() == [to_text(r) for r in recs]
    assert (
        main(["changes", "--config", conf, "--target", "local", "--from", "2", "--to", "4", "--format", "jsonl"]) == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines == [to_json_line(r) for r in recs]
    assert [json.loads(x)["kind"] for x in lines] == [r["kind"] for r in recs]
    # errors are one line naming what to do
    assert main(["changes", "--config", conf, "--target", "local", "--from", "2", "--to", "5"]) == 8  # EpochError
    assert "target local is at epoch 4: epoch 5 is not committed yet" in capsys.readouterr().err
    assert main(["changes", "--config", conf, "--target", "local", "--from", "1", "--to", "3"]) == 11  # SnapshotError
    err = capsys.readouterr().err
    assert "no snapshot at epoch 1: pruned" in err and err.count("\n") == 1
