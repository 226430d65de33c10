"""One factory builds every S3 client, with one retry policy (epochsync.stores.s3)."""

from __future__ import annotations

import ast
from pathlib import Path

from epochsync.stores import s3
from epochsync.stores.connections import S3Settings

INCLUDE = Path(__file__).resolve().parents[2] / "include"


def test_the_policy_in_the_client():
    c = S3Settings("store", "http://127.0.0.1:9", "k", "s", "eu-west-1").client()
    cfg = c.meta.config
    assert c.meta.endpoint_url == "http://127.0.0.1:9" and c.meta.region_name == "eu-west-1"
    assert cfg.retries == {"total_max_attempts": s3.MAX_ATTEMPTS, "mode": "standard"}
    assert (cfg.connect_timeout, cfg.read_timeout, cfg.max_pool_connections) == (5.0, 60.0, 16)
    assert cfg.s3 == {"addressing_style": "path"}


def test_a_counting_caller_gets_one_attempt_per_request_and_more_connections():
    cfg = s3.client_config(counted=True, pool=40)
    assert cfg.retries["total_max_attempts"] == 1 and cfg.max_pool_connections == 40


def test_nothing_else_builds_an_s3_client():
    """boto3.client appears in the factory only (the shipped package and the dev tools)."""
    found = []
    for top in ("epochsync", "epochsync_dev"):
        for path in (INCLUDE / top).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Attribute)
                    and node.attr == "client"
                    and getattr(node.value, "id", "") == "boto3"
                ):
                    found.append(str(path.relative_to(INCLUDE)))
    assert found == ["epochsync/stores/s3.py"], found
