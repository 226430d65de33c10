"""The end-to-end benchmark's quick scenarios, as a correctness test (not a speed test).

Every tool's replica must equal the source at epoch 2, and the byte counts the proxy
takes must show what each tool really did: epochsync reads exactly the changed ranges
from the source and nothing at all for a directory rename.
"""

import pytest

from epochsync_dev.bench.e2e import QUICK, checks, rclone_binary, run_scenario

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_small_writes_and_directory_rename(seaweed, spark, tmp_path):
    rclone, why = rclone_binary(install=False)  # the test never installs packages
    rows = run_scenario(QUICK["small-writes-1pct"], seaweed, spark, tmp_path, rclone_bin=rclone, rclone_why=why)
    rows += run_scenario(QUICK["dir-rename-1000"], seaweed, spark, tmp_path, rclone_bin=rclone, rclone_why=why)
    by = {(r["scenario"], r["tool"]): r for r in rows}
    ran = [r for r in rows if not r.get("skipped")]
    assert all(r["replica_equals_source"] for r in ran), [(r["scenario"], r["tool"], r.get("differences")) for r in ran]
    assert {r["tool"] for r in ran} >= {"epochsync", "aws-s3-sync", "whole-file"}
    if rclone:
        rc = by[("small-writes-1pct", "rclone-sync")]
        assert rc["bytes_read_source"] > 4 * by[("small-writes-1pct", "epochsync")]["bytes_read_source"]
    else:
        assert by[("small-writes-1pct", "rclone-sync")]["skipped"] == why

    small = by[("small-writes-1pct", "epochsync")]
    assert small["net_changed_bytes"] == 4 * 4096  # 1% of 400 files, one 4 KiB write each
    assert small["bytes_read_source"] == small["net_changed_bytes"]
    sync = by[("small-writes-1pct", "aws-s3-sync")]
    assert sync["bytes_read_source"] > 4 * small["bytes_read_source"]  # whole files (16-128 KiB) copied

    rename = by[("dir-rename-1000", "epochsync")]
    assert rename["bytes_read_source"] == 0 and rename["bytes_copied_server_side"] > 0
    assert by[("dir-rename-1000", "whole-file")]["bytes_read_source"] == 0  # renames are copies there too
    assert by[("dir-rename-1000", "aws-s3-sync")]["bytes_read_source"] > 0

    verdicts = {c["check"]: c["pass"] for c in checks(rows)}
    assert verdicts["dir-rename-1000: no file bytes read from the source"]
    assert verdicts["small-writes-1pct: bytes pulled <= 1.1 x net changed"]
