"""The JVM class-data archive that spark-submit starts from (epochsync.spark)."""

from __future__ import annotations

import pytest

from epochsync.spark import SMALL_JVM_OPTIONS, cds_archive_path, jvm_options


def test_archive_path_is_keyed_and_used_only_when_built(tmp_path, monkeypatch):
    monkeypatch.setenv("EPOCHSYNC_BUILD_DIR", str(tmp_path))
    path = cds_archive_path()
    if path is None:
        pytest.skip("no java on this machine")
    assert path.parent == tmp_path and path.name.startswith("spark-cds-") and path.suffix == ".jsa"
    assert cds_archive_path() == path  # same JDK and jars: same key
    assert jvm_options() == SMALL_JVM_OPTIONS  # not built: plain options, never a missing file
    path.write_bytes(b"")
    assert jvm_options() == f"{SMALL_JVM_OPTIONS} -XX:SharedArchiveFile={path} -Xshare:auto"
    monkeypatch.setenv("EPOCHSYNC_SPARK_CDS", "0")
    assert cds_archive_path() is None and jvm_options() == SMALL_JVM_OPTIONS
