"""``epochsync audit``: a posix replica of a simulated source, damaged behind epochsync's back,
shows each damage as one difference; a clean replica shows none. The audit DAG's task passes a
clean target and fails naming the first differences; a target another writer holds, or with an
epoch applied but not committed, is refused as busy (it would count that run's writes)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support.histories import ingest_epoch, merge_once, replicate_epoch, simulate

from epochsync.core.errors import BusyError, EpochError
from epochsync.stages.audit import audit_target

pytestmark = [pytest.mark.integration]


def test_audit_sees_each_change_made_behind_its_back(seaweed, spark, tmp_path):
    out, cfg = simulate(seaweed, tmp_path, 1, seed=31)
    ingest_epoch(spark, cfg, 1)
    merge_once(spark, cfg, 1)
    replicate_epoch(spark, cfg, "local", 1)
    clean = audit_target(cfg, "local", deep=True, spark=spark)
    assert clean["differences"] == [], clean["differences"][:5]
    from epochsync.airflow.tasks import audit_task

    assert audit_task(cfg.file, "local", params={"deep": False}, spark=spark)["differences"] == 0
    # busy: an epoch applied but not committed (its undo journal), then a writer holding the lease
    from epochsync.journal.undo import journal_dir

    pending = journal_dir(cfg.warehouse, "local", 2)
    os.makedirs(pending)
    open(os.path.join(pending, "driver.jsonl"), "w").write("")
    with pytest.raises(BusyError, match="epoch 2 applied but not committed"):
        audit_target(cfg, "local", spark=spark)
    os.remove(os.path.join(pending, "driver.jsonl"))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from epochsync.core.config import load_config\n"
            "from epochsync.journal.lease import target_lease\n"
            "cfg = load_config(sys.argv[1])\n"
            "with target_lease(cfg, cfg.target('local')):\n"
            "    print('held', flush=True)\n"
            "    time.sleep(60)\n",
            str(cfg.file),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(BusyError, match="is being written by pid"):
            audit_target(cfg, "local", spark=spark)
    finally:
        holder.kill()
        holder.wait()
    root = cfg.target("local").path
    files = sorted(
        os.path.relpath(os.path.join(d, f), root)
        for d, _, fs in os.walk(root)
        for f in fs
        if ".epochsync" not in d and os.path.getsize(os.path.join(d, f)) > 0
    )
    flipped, chmodded, removed = files[0], files[1], files[2]
    st = os.stat(os.path.join(root, flipped))  # its times are put back: only --deep sees the byte
    with open(os.path.join(root, flipped), "r+b") as f:
        b = f.read(1)
        f.seek(0)
        f.write(bytes([b[0] ^ 0xFF]))
    os.chmod(
        os.path.join(root, chmodded),
        0o600 if (os.stat(os.path.join(root, chmodded)).st_mode & 0o777) != 0o600 else 0o640,
    )
    os.remove(os.path.join(root, removed))
    open(os.path.join(root, "stray.txt"), "w").write("x")
    os.utime(os.path.join(root, flipped), ns=(st.st_atime_ns, st.st_mtime_ns))
    shallow = {(d.path, d.what) for d in audit_target(cfg, "local", spark=spark)["differences"]}
    # the removal changed its directory's mtime too
    moved_dir = {(os.path.dirname(removed), "mtime")} if os.path.dirname(removed) else set()
    assert shallow == {(chmodded, "mode"), (removed, "missing"), ("stray.txt", "stray")} | moved_dir
    deep = {(d.path, d.what) for d in audit_target(cfg, "local", deep=True, spark=spark)["differences"]}
    assert deep == shallow | {(flipped, "bytes")}
    from airflow.sdk.exceptions import AirflowFailException

    with pytest.raises(AirflowFailException, match=r"at epoch 1 \(metadata and bytes.*: \d differences; first: "):
        audit_task(cfg.file, "local", params={"deep": True}, spark=spark)

    # a repair that fails half way is undone: the target is as the audit found it
    with pytest.raises(EpochError, match="failed and was undone"):
        audit_target(cfg, "local", deep=True, spark=spark, repair=True, inject="after=2")
    assert {(d.path, d.what) for d in audit_target(cfg, "local", deep=True, spark=spark)["differences"]} == deep
    # one that died half way (its undo never ran) keeps the target from an audit until it is undone
    from epochsync.stages import rollback as rollback_module

    real = rollback_module.roll_back_repair
    rollback_module.roll_back_repair = lambda *a, **k: 0
    try:
        with pytest.raises(EpochError, match="failed and was undone"):
            audit_target(cfg, "local", deep=True, spark=spark, repair=True, inject="after=2")
    finally:
        rollback_module.roll_back_repair = real
    with pytest.raises(BusyError, match="a repair that did not finish"):
        audit_target(cfg, "local", spark=spark)
    from epochsync.stages.rollback import rollback_target

    assert "unfinished repair undone" in rollback_target(cfg, "local", check=False)["message"]
    assert {(d.path, d.what) for d in audit_target(cfg, "local", deep=True, spark=spark)["differences"]} == deep
    # the repair: every difference put right, the target clean, and the next epoch's fence accepts it
    done = audit_target(cfg, "local", deep=True, spark=spark, repair=True)
    assert {(d.path, d.what) for d in done["differences"]} == deep
    assert done["repair"]["after"] == [] and done["repair"]["paths"] == len(deep), done["repair"]
    assert done["repair"]["how"] == {"attrs": 1 + len(moved_dir), "data": 1, "replace": 2}, done["repair"]
    assert audit_target(cfg, "local", deep=True, spark=spark)["differences"] == []
    from epochsync.warehouse.events import read_events

    assert read_events(cfg.warehouse, "local")[-1]["event"] == "repaired"


def test_audit_of_an_s3_replica_sees_a_key_that_holds_another_file(seaweed, spark, tmp_path):
    """On s3 a hard link is a copy: each key names in its metadata the file it holds, so a key
    overwritten with another file's object (same metadata, as a copy would leave it) is a
    ``links`` difference."""
    from epochsync.targets import open_target

    out, cfg = simulate(seaweed, tmp_path, 1, seed=31)
    ingest_epoch(spark, cfg, 1)
    merge_once(spark, cfg, 1)
    replicate_epoch(spark, cfg, "s3", 1)
    assert audit_target(cfg, "s3", spark=spark)["differences"] == []
    target = open_target(cfg.target("s3"))
    files = sorted((e.path, e.fid) for e in target.walk(hashes=False) if e.type == "file")
    (victim, _), (donor, donor_fid) = files[0], files[1]
    c = target.io.client
    c.copy_object(
        Bucket=target.bucket,
        Key=target._full(victim),
        CopySource={"Bucket": target.bucket, "Key": target._full(donor)},
        MetadataDirective="COPY",
    )
    got = audit_target(cfg, "s3", spark=spark)["differences"]
    assert (victim, "links") in {(d.path, d.what) for d in got}, got
    assert any(donor_fid in d.detail for d in got if d.what == "links"), got
    (tmp_path / "stray").write_bytes(b"stray")
    c.upload_file(str(tmp_path / "stray"), target.bucket, target._full("stray.txt"))
    from epochsync.airflow.tasks import audit_task

    # the audit DAG's task with its repair param: both differences put right, the task passes
    done = audit_task(cfg.file, "s3", params={"deep": True, "repair": True}, spark=spark)
    assert done["repaired"] == 2 and done["differences"] >= 2, done
    assert audit_target(cfg, "s3", deep=True, spark=spark)["differences"] == []
