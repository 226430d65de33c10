"""DAG tests run against a throwaway Airflow home (SQLite, no examples) and a small config."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# before anything imports airflow: its home decides where config and the SQLite DB live
_HOME = tempfile.mkdtemp(prefix="epochsync-airflow-home-")
os.environ.setdefault("AIRFLOW_HOME", _HOME)
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(ROOT / "dags"))
os.environ.setdefault("AIRFLOW__CORE__PLUGINS_FOLDER", str(ROOT / "plugins"))

CONFIG = """\
warehouse: {warehouse}
sources:
  - name: lustre1
    root_fid: "[0x200000007:0x1:0x0]"
    servers: [MDT0000, OST0000, OST0001]
    changelogs: {{uri: "file://{changelogs}", format: jsonl}}
    store: {{conn_id: source_s3, bucket: lustre1-data}}
    epoch: {{interval: 7m, start: "2026-01-01T00:00:00Z"}}
targets:
  - name: dr
    source: lustre1
    kind: s3
    conn_id: replica_s3
    bucket: replica
    prefix: lustre1/
  - name: scratch
    source: lustre1
    kind: posix
    path: {posix}
    audit: {{interval: never, deep: true}}
"""


@pytest.fixture(scope="session")
def dag_config(tmp_path_factory) -> Path:
    """A config with one source and two targets (s3 and posix)."""
    d = tmp_path_factory.mktemp("dagcfg")
    path = d / "epochsync.yaml"
    path.write_text(
        CONFIG.format(warehouse=f"file://{d / 'warehouse'}", changelogs=d / "changelogs", posix=d / "replica")
    )
    return path


@pytest.fixture()
def with_config(dag_config, monkeypatch) -> Path:
    monkeypatch.setenv("EPOCHSYNC_CONFIG", str(dag_config))
    return dag_config
