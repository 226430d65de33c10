"""The ``replicate`` and ``rollback`` verbs end to end (real ingest, merge and Spark stages).

One posix target over a simulated 3-epoch source in SeaweedFS: progress per stage,
the replica equal to the ground truth, a gap refused with the missing epochs and the
backfill command named, a no-op rerun, an injected failure rolled back to the previous
epoch, then a rerun that succeeds; ``rollback`` on a target with an unfinished epoch.
"""

from __future__ import annotations

import json
import os

import pytest
from support.histories import assert_equals_truth, simulate

from epochsync.cli import main
from epochsync.core.errors import EpochError
from epochsync.journal.faults import InjectedFailure
from epochsync.journal.undo import journal_dir, journal_exists, read_json
from epochsync.targets import open_target
from epochsync.warehouse.paths import Warehouse, local_path

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def sim3(seaweed, tmp_path_factory):
    out, cfg = simulate(seaweed, tmp_path_factory.mktemp("cli"), 3, seed=31)
    return out, cfg


def test_replicate_and_rollback_verbs(sim3, spark, capsys, monkeypatch):
    out, cfg = sim3
    conf = str(cfg.file)
    target = open_target(cfg.target("local"))

    assert main(["replicate", "--config", conf, "--target", "local", "--through", "2"]) == 0
    text = capsys.readouterr().out
    for stage in ("ingest", "merge", "translate", "apply", "verify", "commit"):
        assert f"local epoch 1: {stage} done" in text and f"local epoch 2: {stage} done" in text
    assert "epoch 2: committed" in text
    assert target.read_manifest()["epoch"] == 2
    assert_equals_truth(target, out, 2)
    # the consumer cursor moved to the last record of epoch 2 on every server
    cursor = read_json(local_path(Warehouse(cfg.warehouse).cursor("sim", "local")))
    assert cursor["epoch"] == 2
    for server in cfg.sources[0].servers:
        lines = (out / "changelogs" / server / "000002.jsonl").read_text().splitlines()
        assert cursor["servers"][server] == json.loads(lines[-1])["index"]
    stats = read_json(local_path(Warehouse(cfg.warehouse).stats("local", 2)))
    assert stats["records_in"] > 0 and set(stats["durations"]) >= {"ingest", "merge", "translate", "apply", "verify"}

    # a gap is refused, naming the missing epoch and the backfill command
    assert main(["replicate", "--config", conf, "--target", "local", "--epoch", "4"]) == EpochError.exit_code
    err = capsys.readouterr().err
    assert "epoch(s) 3 are missing" in err and "--through 3" in err

    # an epoch already committed is a no-op
    assert main(["replicate", "--config", conf, "--target", "local", "--epoch", "2"]) == 0
    assert "no-op" in capsys.readouterr().out

    # an injected failure in apply: rolled back, the target is exactly at epoch 2
    rc = main(["replicate", "--config", conf, "--target", "local", "--epoch", "3", "--inject-failure", "after=2"])
    assert rc == InjectedFailure.exit_code == 1  # the failure's own status, after the rollback
    captured = capsys.readouterr()
    assert "FAILED" in captured.out and "rolled back" in captured.out
    assert "injected failure" in captured.err
    assert target.read_manifest()["epoch"] == 2
    assert not journal_exists(journal_dir(cfg.warehouse, "local", 3))
    assert_equals_truth(target, out, 2)

    # nothing to roll back now
    assert main(["rollback", "--config", conf, "--target", "local"]) == 0
    assert "nothing to roll back" in capsys.readouterr().out

    # an apply that died without its rollback: the rollback verb restores epoch 2
    from epochsync.stages.apply import run_apply

    with pytest.raises(Exception, match="injected failure"):
        run_apply(cfg, "local", 3, spark, inject="after=3,repeat=1")
    assert journal_exists(journal_dir(cfg.warehouse, "local", 3))
    assert main(["rollback", "--config", conf, "--target", "local"]) == 0
    assert "back at epoch 2" in capsys.readouterr().out
    assert_equals_truth(target, out, 2)

    # and the rerun succeeds
    assert main(["replicate", "--config", conf, "--target", "local", "--through", "3"]) == 0
    assert target.read_manifest()["epoch"] == 3
    assert_equals_truth(target, out, 3)

    # the history operators see in `epochsync status`: commits, the failure and both rollbacks
    from epochsync.warehouse.events import read_events

    kinds = [(ev["event"], ev["epoch"]) for ev in read_events(cfg.warehouse, "local")]
    assert kinds == [
        ("committed", 1),
        ("committed", 2),
        ("failed", 3),
        ("rolled_back", 3),
        ("rolled_back", 3),
        ("committed", 3),
    ]
    capsys.readouterr()
    assert main(["status", "--config", conf, "--target", "local", "--format", "json"]) == 0
    status = json.loads(capsys.readouterr().out)[0]
    assert (status["committed_epoch"], status["failures"], status["rollbacks"]) == (3, 1, 2)
    assert status["status"] == "Active" and status["unfinished_epochs"] == []

    # an epoch in which nothing changed runs every stage in this process: no Spark session is opened
    from epochsync_dev.bench.warm import append_empty_epoch

    empty = append_empty_epoch(out)

    def no_spark(*args, **kwargs):
        raise AssertionError("an empty epoch opened a Spark session")

    monkeypatch.setattr("epochsync.spark.spark_session", no_spark)
    assert main(["replicate", "--config", conf, "--target", "local", "--epoch", str(empty)]) == 0
    assert target.read_manifest()["epoch"] == empty
    assert_equals_truth(target, out, empty)
    # ... and a process replicating one imports neither pyspark nor pandas (0.3-0.5 s each
    # on 2 cores; pyarrow imports pandas at the first pa.array, pa.scalar or compute call
    # given a Python value: epochsync.core.arrow builds those). pyarrow takes a failed import
    # of pandas for "no pandas", so the check is that it was never asked for.
    import subprocess
    import sys

    again = append_empty_epoch(out)
    code = (
        "import sys, traceback\n"
        "sys.modules['pyspark'] = None\n"
        "asked = []\n"
        "class Watch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'pandas' and not asked:\n"
        "            asked.append(''.join(traceback.format_stack(limit=14)))\n"
        "sys.meta_path.insert(0, Watch())\n"
        "from epochsync.cli import main\n"
        "rc = main(sys.argv[1:])\n"
        "if asked:\n"
        "    print('pandas was imported from:\\n' + asked[0], file=sys.stderr)\n"
        "sys.exit(rc or (3 if asked else 0))\n"
    )
    cmd = [sys.executable, "-c", code, "replicate", "--config", conf, "--target", "local", "--epoch", str(again)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
    assert done.returncode == 0, done.stderr[-3000:]
    assert target.read_manifest()["epoch"] == again
    assert_equals_truth(target, out, again)
