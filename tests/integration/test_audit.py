"""``epochsync audit``: a posix replica of a simulated source, damaged behind epochsync's back,
shows each damage as one difference; a clean replica shows none."""

from __future__ import annotations

import os

import pytest
from support.histories import ingest_epoch, merge_once, replicate_epoch, simulate

from epochsync.stages.audit import audit_target

pytestmark = [pytest.mark.integration]


def test_audit_sees_each_change_made_behind_its_back(seaweed, spark, tmp_path):
    out, cfg = simulate(seaweed, tmp_path, 1, seed=31)
    ingest_epoch(spark, cfg, 1)
    merge_once(spark, cfg, 1)
    replicate_epoch(spark, cfg, "local", 1)
    clean = audit_target(cfg, "local", deep=True, spark=spark)
    assert clean["differences"] == [], clean["differences"][:5]
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
    assert shallow == {(chmodded, "mode"), (removed, "missing"), ("stray.txt", "stray")}
    deep = {(d.path, d.what) for d in audit_target(cfg, "local", deep=True, spark=spark)["differences"]}
    assert deep == shallow | {(flipped, "bytes")}
