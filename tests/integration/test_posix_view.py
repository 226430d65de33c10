"""A posix target's committed view on a real btrfs file system (a loop image the suite makes).

A simulated history (SeaweedFS source, real bytes) replicated into a posix target whose path is
on btrfs: epochsync makes the path a subvolume, and every commit publishes a read-only snapshot
``<path>.epochs/epoch-NNNNNNNNNN`` and flips ``<path>.epochs/current`` to it. Each snapshot must
equal the simulator's ground truth of its epoch, and only ``view.keep`` of them stay. A reader
of ``current`` during an apply (stalled half way in another process) sees the last committed
epoch exactly, while the replica itself is half applied; after the rollback nothing moved. A
commit that dies after its manifest and before the view is finished by a rerun of the commit,
or by the next epoch before it changes anything (also after the control directory moved).
``epochsync status`` says where readers read whole epochs and, for a target on another file
system, that they cannot; ``view.snapshots: required`` refuses such a target before it changes.

Skipped where no btrfs loop can be made (not root, no loop devices), failed instead when
``EPOCHSYNC_REQUIRE_BTRFS`` is set (CI).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.histories import simulate
from support.machine import wait_for

from epochsync.cli import main
from epochsync.core.config import TargetConfig, ViewConfig, load_config
from epochsync.core.errors import EpochsyncError
from epochsync.journal.undo import plan_dir
from epochsync.report.status import format_table, target_status
from epochsync.stages.commit import run_commit
from epochsync.stages.context import committed_epoch
from epochsync.stages.replicate import replicate
from epochsync.targets import open_target
from epochsync.targets.posix import VIEW_LINK, view_name
from epochsync_dev.truth import compare_with_truth, load_truth, truth_path

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
EPOCHS = 6


@pytest.fixture(scope="module")
def hist(seaweed, btrfs_dir, spark_connect, tmp_path_factory):
    out, _ = simulate(seaweed, tmp_path_factory.mktemp("view"), EPOCHS, seed=5)
    doc = yaml.safe_load((out / "epochsync.yaml").read_text())
    doc["targets"] = [
        {"name": "view", "source": "sim", "kind": "posix", "path": str(btrfs_dir / "replica"), "view": {"keep": 2}},
        {"name": "plain", "source": "sim", "kind": "posix", "path": str(out / "plain")},
        {
            "name": "strict",
            "source": "sim",
            "kind": "posix",
            "path": str(out / "strict"),
            "view": {"snapshots": "required"},
        },
    ]
    (out / "epochsync.yaml").write_text(yaml.safe_dump(doc))
    return out, load_config(out / "epochsync.yaml")


def problems(out: Path, path: str, epoch: int, control: str = ".epochsync") -> list[str]:
    """How the tree at ``path`` (the replica, or a snapshot of it) differs from the truth of ``epoch``."""
    truth = {p: r for p, r in load_truth(truth_path(out, epoch)).items() if p not in ("", ".")}
    reader = TargetConfig(
        name="reader", source="sim", kind="posix", path=path, control_dir=control, view=ViewConfig(snapshots="never")
    )
    return compare_with_truth(open_target(reader), truth)


def view_dir(cfg) -> Path:
    return Path(cfg.target("view").path + ".epochs")


def current(cfg) -> str:
    return os.readlink(view_dir(cfg) / VIEW_LINK)


def kept(cfg) -> list[str]:
    return sorted(n for n in os.listdir(view_dir(cfg)) if n.startswith("epoch-"))


def test_every_commit_is_a_read_only_snapshot_and_current_follows(hist, spark):
    out, cfg = hist
    for e in (1, 2, 3):
        replicate(cfg, "view", e, spark=spark, progress=lambda _l: None)
        assert current(cfg) == view_name(e)
        snap = view_dir(cfg) / view_name(e)
        assert problems(out, str(snap), e) == [], e
        assert json.loads((snap / ".epochsync" / "manifest.json").read_text())["epoch"] == e
        with pytest.raises(OSError) as exc:
            (snap / "written-by-a-reader").write_text("x")
        assert exc.value.errno == errno.EROFS
    # the replica was made a subvolume; keep: 2 leaves the two newest
    assert os.stat(cfg.target("view").path).st_ino == 256
    assert kept(cfg) == [view_name(2), view_name(3)]
    # a reader path through the link
    assert problems(out, str(view_dir(cfg) / VIEW_LINK), 3) == []


def test_a_reader_of_current_never_sees_an_epoch_half_applied(hist):
    out, cfg = hist
    stalled = Path(plan_dir(cfg.warehouse, "view", 4)) / "fault.fired.stalled"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "include"), EPOCHSYNC_INJECT_FAILURE="at=0.5,epoch=4,mode=stall")
    args = ["replicate", "--config", cfg.file, "--target", "view", "--through", "4"]
    cmd = [sys.executable, "-m", "epochsync.cli", *args]
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        wait_for(stalled, proc, timeout=300)
        # the replica is half way from epoch 3 to epoch 4; current is epoch 3, exactly
        assert problems(out, cfg.target("view").path, 3) != []
        assert problems(out, cfg.target("view").path, 4) != []
        assert current(cfg) == view_name(3)
        assert problems(out, str(view_dir(cfg) / VIEW_LINK), 3) == []
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert committed_epoch(cfg, "view") == 3 and problems(out, cfg.target("view").path, 3) == []
    assert current(cfg) == view_name(3) and kept(cfg) == [view_name(2), view_name(3)]


def test_a_commit_that_died_before_the_view_is_finished_later(hist, spark, monkeypatch, capsys):
    out, cfg = hist
    # epoch 4: the commit dies after the manifest and the scratch area, before the view (step 4)
    monkeypatch.setenv("EPOCHSYNC_INJECT_FAILURE", "after=3,stage=commit,epoch=4")
    with pytest.raises(Exception, match="injected"):
        replicate(cfg, "view", 4, spark=spark, progress=lambda _l: None)
    assert committed_epoch(cfg, "view") == 4 and current(cfg) == view_name(3)
    view = target_status(cfg, cfg.target("view"))["view"]
    assert view["available"] and view["current"] == 3 and view["kept"] == [2, 3]
    # a rerun of the commit finishes it
    monkeypatch.delenv("EPOCHSYNC_INJECT_FAILURE")
    assert run_commit(cfg, "view", 4)["noop"]
    assert current(cfg) == view_name(4) and problems(out, str(view_dir(cfg) / view_name(4)), 4) == []

    # epoch 5 dies the same way; then the control directory moves; epoch 6's apply publishes 5
    # before it changes anything
    monkeypatch.setenv("EPOCHSYNC_INJECT_FAILURE", "after=3,stage=commit,epoch=5")
    with pytest.raises(Exception, match="injected"):
        replicate(cfg, "view", 5, spark=spark, progress=lambda _l: None)
    monkeypatch.delenv("EPOCHSYNC_INJECT_FAILURE")
    assert current(cfg) == view_name(4)
    doc = yaml.safe_load(Path(cfg.file).read_text())
    doc["targets"][0]["control_dir"] = ".ctl"
    Path(cfg.file).write_text(yaml.safe_dump(doc))
    assert main(["relocate", "--config", cfg.file, "--target", "view"]) == 0
    capsys.readouterr()
    cfg2 = load_config(cfg.file)
    replicate(cfg2, "view", 6, spark=spark, progress=lambda _l: None)
    assert current(cfg2) == view_name(6) and kept(cfg2) == [view_name(5), view_name(6)]
    assert problems(out, str(view_dir(cfg2) / view_name(5)), 5, ".ctl") == []
    assert problems(out, str(view_dir(cfg2) / view_name(6)), 6, ".ctl") == []
    assert (view_dir(cfg2) / view_name(6) / ".ctl" / "manifest.json").exists()


def test_status_says_where_readers_read_whole_epochs_and_where_not(hist, spark):
    out, cfg = hist
    cfg = load_config(cfg.file)  # as the test before left it (control_dir moved)
    replicate(cfg, "plain", 1, spark=spark, progress=lambda _l: None)
    rows = [target_status(cfg, cfg.target(t)) for t in ("view", "plain")]
    view, plain = rows[0]["view"], rows[1]["view"]
    assert view["available"] and view["current"] == committed_epoch(cfg, "view")
    assert not plain["available"] and "not btrfs" in plain["reason"]
    text = format_table(rows)
    assert f"committed view: {view_dir(cfg) / VIEW_LINK} -> epoch {view['current']}" in text
    assert "committed view: none: " in text and "readers of the replica can see an epoch half applied" in text
    # required, where the replica cannot snapshot: refused before anything changes
    with pytest.raises(EpochsyncError, match="view.snapshots is required, but .* not btrfs"):
        replicate(cfg, "strict", 1, spark=spark, progress=lambda _l: None)
    assert committed_epoch(cfg, "strict") == 0
    strict = Path(cfg.target("strict").path)
    assert not strict.exists() or [p.name for p in strict.iterdir() if p.name != ".epochsync"] == []
    # and a view folder inside the replica is not one
    inside = dataclasses.replace(cfg.target("view"), view=ViewConfig(path=cfg.target("view").path + "/v"))
    assert "inside the replica" in open_target(inside).view_unavailable()
