"""Shared fixtures: one Spark session, one SeaweedFS and one moto server per test run."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"

os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")


@pytest.fixture(scope="session", autouse=True)
def spark_submit_opts():
    """Every spark-submit the tests start (DAG stages, the PySpark gateway) uses the small
    profile's JVM and the class-data archive (built once per checkout, about 30 s)."""
    if "SPARK_SUBMIT_OPTS" not in os.environ:
        from epochsync.spark import ensure_cds_archive, jvm_options

        ensure_cds_archive()
        os.environ["SPARK_SUBMIT_OPTS"] = jvm_options()
    yield


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture(scope="session")
def spark():
    """local[2], UI off, few shuffle partitions: the same builder the Spark apps use."""
    from epochsync.spark import spark_session

    session = spark_session("epochsync-tests", master="local[2]", shuffle_partitions=2)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def seaweed():
    """A real S3 server (SeaweedFS ``weed mini``) on loopback; yields an S3Endpoint."""
    from epochsync.embedded import SeaweedFS

    server = SeaweedFS()
    endpoint = server.start()
    yield endpoint
    server.stop()


@pytest.fixture(scope="session")
def moto_server():
    from epochsync.embedded import MotoS3

    server = MotoS3()
    server.start()
    yield server
    server.stop()


@pytest.fixture()
def moto_s3(moto_server):
    """moto's S3 double, emptied before each test."""
    moto_server.reset()
    return moto_server.endpoint


@pytest.fixture()
def bucket_name() -> str:
    return "t-" + uuid.uuid4().hex[:12]
