"""``epochsync check``: every piece of a setup reached as a run would, one line each."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml


def _config(tmp_path, changelogs: str, conn_id: str = "chk_src", bucket: str = "chk-data") -> str:
    doc = {
        "warehouse": str(tmp_path / "wh"),
        "sources": [
            {
                "name": "s",
                "root_fid": "[0x200000007:0x1:0x0]",
                "servers": ["mdt0"],
                "store": {"conn_id": conn_id, "bucket": bucket},
                "changelogs": {"uri": f"file://{changelogs}", "format": "jsonl"},
                "epoch": {"interval": "1h", "start": "2026-01-01T00:00:00Z"},
            }
        ],
        "targets": [{"name": "t", "source": "s", "kind": "posix", "path": str(tmp_path / "replica")}],
    }
    path = tmp_path / "epochsync.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def _check(config: str, env: dict | None = None, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "epochsync.cli", "check", "--config", config, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_a_missing_changelog_folder_and_an_unknown_connection_are_named(tmp_path):
    done = _check(_config(tmp_path, str(tmp_path / "not-there")))
    assert done.returncode == 12, done.stderr
    out = done.stdout
    assert "FAILED source s: changelogs:" in out and "no such directory here" in out
    assert "FAILED source s: data store: connection 'chk_src' is not defined" in out
    assert "ok     target t:" in out and "not ready" in out
    assert "Traceback" not in done.stderr


def _ready(tmp_path, moto_server) -> str:
    """A config whose source's changelogs and bucket are there."""
    moto_server.endpoint.client().create_bucket(Bucket="chk-data")
    changelogs = tmp_path / "changelogs" / "mdt0"
    changelogs.mkdir(parents=True)
    (changelogs / "0000000001.jsonl").write_text("")
    return _config(tmp_path, str(tmp_path / "changelogs"))


def test_a_ready_setup_passes(tmp_path, moto_server):
    ep = moto_server.endpoint
    config = _ready(tmp_path, moto_server)
    env = {"AIRFLOW_CONN_CHK_SRC": ep.airflow_conn_json()}
    done = _check(config, env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "everything is ready" in done.stdout and "bucket chk-data answers" in done.stdout
    # the bucket gone: a store error (status 5), as JSON too
    done = _check(_config(tmp_path, str(tmp_path / "changelogs"), bucket="chk-missing"), env, "--format", "json")
    assert done.returncode == 5, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert not doc["ok"] and [c["check"] for c in doc["checks"] if not c["ok"]] == ["source s: data store"]


def test_a_target_bucket_not_made_yet_is_ready(tmp_path, moto_server):
    """A source's bucket must be there; a target's is made by its first epoch, so only the store
    answering counts."""
    ep = moto_server.endpoint
    config = _ready(tmp_path, moto_server)
    doc = yaml.safe_load(open(config))
    doc["targets"].append({"name": "r", "source": "s", "kind": "s3", "conn_id": "chk_src", "bucket": "chk-new"})
    with open(config, "w") as f:
        yaml.safe_dump(doc, f)
    done = _check(config, {"AIRFLOW_CONN_CHK_SRC": ep.airflow_conn_json()})
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        "ok     target r: s3: bucket chk-new does not exist yet" in done.stdout
        and "first epoch creates it" in done.stdout
    )
