"""End to end over a simulated history: every epoch lands in a posix tree, an s3 prefix
and a striped s3 target, each equal to the simulator's ground truth byte for byte.

Source: ``epochsync simulate`` (striped layouts over 4 OSTs, mixed workload: overwrites,
appends, truncates, renames of files and directories, swaps, hard links, symlinks,
xattrs, chmod/chown, unlinks, rmdirs, create-and-delete) writing changelogs and versioned
objects into SeaweedFS. Stages run as the DAG runs them: merge → translate → apply
(Spark executors) → verify → commit, one epoch at a time.
"""

from __future__ import annotations

import os

import pytest
from support.histories import (
    EPOCHS,
    actual_entries,
    expected_entries,
    ingest_epoch,
    merge_once,
    replicate_epoch,
    simulate,
    truth,
)

from epochsync.targets import open_target


@pytest.fixture(scope="module")
def sim(seaweed, tmp_path_factory):
    return simulate(seaweed, tmp_path_factory.mktemp("sim"), EPOCHS)


def test_every_epoch_equals_the_ground_truth(sim, spark):
    out, cfg = sim
    for epoch in range(1, EPOCHS + 1):
        ingest_epoch(spark, cfg, epoch)
        merge_once(spark, cfg, epoch)
        want = truth(out, epoch)
        for t in cfg.targets:
            summary, row = replicate_epoch(spark, cfg, t.name, epoch)
            target = open_target(t)
            assert target.read_manifest()["epoch"] == epoch
            got = actual_entries(target)
            exp = expected_entries(want, posix=t.kind == "posix")
            diff = {p: (got.get(p), exp.get(p)) for p in set(got) | set(exp) if got.get(p) != exp.get(p)}
            assert diff == {}, f"{t.name} epoch {epoch}"
            # bytes pulled: exactly the net changed bytes without coalescing, bounded slack with it
            # (a read past an object's end returns fewer bytes: zeros need no transfer)
            if t.coalesce_gap == 0:
                assert summary["planned_pull_bytes"] == row["bytes_changed"], (t.name, epoch, summary)
                assert row["bytes_pulled"] <= row["bytes_changed"], (t.name, epoch, row)
            else:
                assert row["bytes_pulled"] <= summary["planned_pull_bytes"], (t.name, row)
                slack = summary["planned_pull_bytes"] - row["bytes_changed"]
                assert 0 <= slack <= t.coalesce_gap * max(1, summary["data_ops"]) * 4, (t.name, summary)
            assert row["requests"]["source"] >= 1 or row["bytes_changed"] == 0
        # hard links are hard links on posix (same inode for every path of a fid)
        by_fid: dict[str, set] = {}
        for p, r in want.items():
            if r["type"] == "file":
                by_fid.setdefault(r["fid"], set()).add(os.stat(out / "replica" / p, follow_symlinks=False).st_ino)
        assert all(len(inodes) == 1 for inodes in by_fid.values())
