"""The end-to-end benchmark's quick scenarios, as a correctness test (not a speed test).

Every tool's replica must equal the source at epoch 2, and the byte counts the proxy
takes must show what each tool really did: epochsync copies the changed files (all up to
``small_file``, each one source object version) server-side from the source, verifies them by
the copies' facts without reading them again, and reads nothing at all for a directory rename.
"""

import pytest

from epochsync_dev.bench.e2e import (
    QUICK,
    LaterRepeats,
    checks,
    groups_of,
    rclone_binary,
    run_group,
    run_scenario,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_small_writes_and_directory_rename(seaweed, spark, tmp_path):
    rclone, why = rclone_binary(install=False)  # the test never installs packages
    # two changes of one tree: epochs 2 and 3 of one source, every tool's replica carried along
    group = groups_of([QUICK["small-writes-1pct"], QUICK["dir-rename-1000"], QUICK["small-writes-40"]])
    assert [[s.name for s in g] for g in group] == [["small-writes-1pct", "small-writes-40"], ["dir-rename-1000"]]
    # the repeat epochs are left for later (as make bench-full measures them, in turn across the
    # trees): they run after the next tree's group, whose proxy is gone by then, through their own
    with LaterRepeats() as later:
        rows = run_group(group[0], seaweed, spark, tmp_path, rclone_bin=rclone, rclone_why=why, later=later)
        assert [r["epoch"] for r in rows] == [2] * 4 + [3] * 4
        assert "repeats" not in rows[-4] and [rep.left for rep in later.repeats] == [1]
        rows += run_scenario(QUICK["dir-rename-1000"], seaweed, spark, tmp_path, rclone_bin=rclone, rclone_why=why)
        later.run(lambda: spark)
    by = {(r["scenario"], r["tool"]): r for r in rows}
    ran = [r for r in rows if not r.get("skipped")]
    assert all(r["replica_equals_source"] for r in ran), [(r["scenario"], r["tool"], r.get("differences")) for r in ran]
    assert {r["tool"] for r in ran} >= {"epochsync", "aws-s3-sync", "whole-file"}
    if not rclone:
        assert by[("small-writes-1pct", "rclone-sync")]["skipped"] == why

    small = by[("small-writes-1pct", "epochsync")]
    assert small["net_changed_bytes"] == 4 * 4096  # 1% of 400 files, one 4 KiB write each
    assert small["changed_files"] == 4
    # the changed files (16-128 KiB, each one source object whose WRITE record gives the version's
    # length) copied server-side from their pinned versions: no byte through epochsync, nothing
    # listed or read back by verify (the copies' facts cover them)
    keys = ("bytes_read_source", "bytes_copied_server_side", "pulled", "planned_pull_bytes", "verify", "requests")
    print({k: small[k] for k in keys})
    whole = by[("small-writes-1pct", "whole-file")]
    assert small["pulled"] == 0, small
    assert small["bytes_read_source"] == small["bytes_copied_server_side"] == whole["bytes_read_source"]
    assert small["planned_pull_bytes"] == whole["bytes_read_source"]  # the plan's reads, had it not copied
    assert small["verify"]["files_by_checksum"] == 4 and small["verify"]["files_hashed"] == 0, small["verify"]
    assert set(small["stages"]) == {"ingest", "merge", "translate", "apply", "verify", "commit and the rest"}
    assert abs(sum(small["stages"].values()) - small["seconds"]) < 0.01
    # CPU by process: the proxy served every request; aws s3 sync is a subprocess, counted when reaped
    assert small["cpu_seconds"]["proxy"] > 0 and small["cpu_seconds"]["tool"] > 0, small["cpu_seconds"]
    assert by[("small-writes-1pct", "aws-s3-sync")]["cpu_seconds"]["tool"] > 0.1
    forty = by[("small-writes-40", "epochsync")]
    assert forty["changed_files"] == 40 and forty["files"] == 400 and forty["replica_equals_source"]
    # and once more, epochsync alone (epoch 4, after the other tree's scenario): each measured, the median kept
    assert [r["epoch"] for r in forty["repeats"]] == [3, 4], forty["repeats"]
    again = forty["repeats"][1]
    assert again["requests"] > 0 and set(again["stages"]) == set(forty["stages"]), again
    assert again["cpu_seconds"]["proxy"] > 0, again
    assert forty["median_seconds"] == pytest.approx((forty["seconds"] + again["seconds"]) / 2, abs=0.002)

    rename = by[("dir-rename-1000", "epochsync")]
    assert rename["bytes_read_source"] == 0 and rename["bytes_copied_server_side"] > 0
    assert by[("dir-rename-1000", "whole-file")]["bytes_read_source"] == 0  # renames are copies there too
    assert by[("dir-rename-1000", "aws-s3-sync")]["bytes_read_source"] > 0

    verdicts = {c["check"]: c["pass"] for c in checks(rows)}
    assert verdicts["dir-rename-1000: no file bytes read from the source"]
    assert verdicts["small-writes-1pct: bytes apply pulled <= 1.1 x the plan's (changed ranges, small files whole)"]


def test_a_baseline_replica_goes_back_to_epoch_1_or_a_fresh_one_is_seeded(seaweed):
    from epochsync_dev.bench.e2e import _bucket_files, _expected_files, _put_tree, reset_replica

    admin = seaweed.client()
    before = {"a": b"one", "d/b": b"two", "d/c": b"three"}
    after = {"a": b"ONE", "d/c": b"three", "e/new": b"four"}  # a changed, d/b removed, e/new created
    admin.create_bucket(Bucket="reset-dst")
    _put_tree(admin, "reset-dst", before)
    _put_tree(admin, "reset-dst", after)
    admin.delete_object(Bucket="reset-dst", Key="d/b")
    assert reset_replica(admin, "reset-dst", before, after, "reset-spare") == "reset-dst"
    assert _bucket_files(admin, "reset-dst") == _expected_files(before)

    # a key the change did not touch was damaged: the reset cannot see it, the check does
    admin.put_object(Bucket="reset-dst", Key="d/c", Body=b"damaged")
    assert reset_replica(admin, "reset-dst", before, after, "reset-spare") == "reset-spare"
    assert _bucket_files(admin, "reset-spare") == _expected_files(before)
