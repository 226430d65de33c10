"""Verify's file contents, on the Spark executors and in this process, against a versioned SeaweedFS source.

Every file's target bytes must equal the source's bytes at the epoch: the pinned versions of
its objects (a later version of each object is in the bucket too), reassembled through the
source layout (striped 1024 x 3 here; an object never written reads as zeros).
"""

from __future__ import annotations

import os
import uuid

import pytest

from epochsync.core.config import TargetConfig
from epochsync.core.errors import EpochsyncError
from epochsync.core.layout import gather_object
from epochsync.core.schema import Layout
from epochsync.stages import verify
from epochsync.stages.verify import verify_plan
from epochsync.stores.connections import resolve_s3
from epochsync.stores.s3_access import S3Access
from epochsync.targets import open_target

pytestmark = pytest.mark.integration

STRIPES = Layout(1024, 3)


@pytest.fixture(scope="module")
def source(seaweed):
    """A versioned bucket: ``put(key, body)`` returns the version id."""
    client = seaweed.client()
    bucket = "verify-" + uuid.uuid4().hex[:8]
    client.create_bucket(Bucket=bucket)
    client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})

    def put(key: str, body: bytes) -> str:
        return client.put_object(Bucket=bucket, Key=key, Body=body)["VersionId"]

    return bucket, put


@pytest.fixture(params=["executors", "driver"])
def route(request, monkeypatch):
    """``(where the contents are read, the session to give verify_plan)``: a plan this small runs
    on the executors only when the threshold says so."""
    if request.param == "executors":
        monkeypatch.setattr(verify, "EXECUTOR_MIN_FILES", 1)
        return request.param, request.getfixturevalue("spark")
    return request.param, None


@pytest.fixture()
def replica(source, seaweed, tmp_path, monkeypatch):
    """A posix replica equal to the source at epoch 2, its plan's verify items and the source access."""
    bucket, put = source
    monkeypatch.setenv("AIRFLOW_CONN_VERIFY_SOURCE", seaweed.airflow_conn_json())
    tag = uuid.uuid4().hex[:6]

    def striped(name: str, content: bytes, written=(0, 1, 2)) -> dict:
        objects = [None] * STRIPES.stripe_count
        for i in written:
            key = f"OST000{i}/{tag}-{name}"
            body = gather_object(STRIPES, i, content)
            objects[i] = {"key": key, "version": put(key, body)}
            put(key, os.urandom(len(body)))  # a later version: not the epoch's
        return {"layout": [STRIPES.stripe_size, STRIPES.stripe_count], "objects": objects}

    big = os.urandom(5000)  # 5 stripes over 3 objects
    plain = os.urandom(3000)
    key = f"data/{tag}-plain"
    plain_source = {"layout": None, "objects": [{"key": key, "version": put(key, plain)}]}
    later_plain = os.urandom(3000)
    put(key, later_plain)
    sparse = os.urandom(2048) + bytes(952)  # object 2 (bytes 2048..2999) never written: zeros
    root = tmp_path / "replica"
    (root / "d").mkdir(parents=True)
    for rel, data in (("d/striped", big), ("plain", plain), ("sparse", sparse), ("empty", b""), ("gone", b"x")):
        (root / rel).write_bytes(data)
        os.chmod(root / rel, 0o644)
    os.link(root / "d/striped", root / "d/hardlink")

    def item(path: str, size: int, src: dict) -> dict:
        return {"path": path, "attrs": {"type": "file", "mode": 0o100644, "size": size, "xattrs": {}}, "source": src}

    big_source = striped("big", big)
    plan = {
        "epoch": 2,
        "verify": {
            "present": [
                item("d/striped", 5000, big_source),
                item("d/hardlink", 5000, big_source),
                item("plain", 3000, plain_source),
                item("sparse", 3000, striped("sparse", sparse, written=(0, 1))),
                item("empty", 0, {"layout": [1024, 3], "objects": [None, None, None]}),
            ],
            "absent": ["gone"],
        },
    }
    target = open_target(TargetConfig(name="t" + tag, source="sim", kind="posix", path=str(root)))
    os.remove(root / "gone")
    return {
        "root": root,
        "plan": plan,
        "target": target,
        "bucket": bucket,
        "big": big,
        "plain": plain,
        "later_plain": later_plain,
    }


def source_io() -> S3Access:
    return S3Access(resolve_s3("verify_source"))


def test_a_replica_equal_to_the_source_passes_with_exact_figures(replica, route):
    where, spark = route
    result = verify_plan(replica["plan"], replica["target"], source_io(), replica["bucket"], spark=spark)
    assert result["problems"] == [] and result["ok"]
    assert result["contents_on"] == where
    assert result["paths_checked"] == 5
    assert result["files_hashed"] == 5
    assert result["bytes_read_target"] == 5000 + 5000 + 3000 + 3000
    # the hard link's source bytes are read once; the empty file and the unwritten object cost nothing
    assert result["source_reads_shared"] == 1
    assert result["source_requests"]["requests"] == {"GetObject": 3 + 1 + 2}
    assert result["source_requests"]["bytes_received"] == 5000 + 3000 + 2048


def test_a_corrupted_byte_of_a_striped_file_is_reported_in_plan_order(replica, route):
    where, spark = route
    root = replica["root"]
    data = bytearray(replica["big"])
    data[2100] ^= 0x01  # the third stripe: object 2 of the layout
    (root / "d/striped").write_bytes(bytes(data))  # the hard link is the same inode
    (root / "plain").write_bytes(replica["later_plain"])  # the object's current version, not the epoch's
    os.chmod(root / "sparse", 0o600)
    (root / "gone").write_bytes(b"back")
    result = verify_plan(replica["plan"], replica["target"], source_io(), replica["bucket"], spark=spark)
    differs_at = next(i for i, (a, b) in enumerate(zip(replica["plain"], replica["later_plain"])) if a != b)
    assert not result["ok"] and result["contents_on"] == where
    assert result["problems"] == [
        "d/striped: content differs from the source at epoch 2 (first difference at byte 2100)",
        "d/hardlink: content differs from the source at epoch 2 (first difference at byte 2100)",
        f"plain: content differs from the source at epoch 2 (first difference at byte {differs_at})",
        "sparse: mode 0o600, expected 0o644",
        "gone: still present, but the source removed it",
    ]
    assert result["problem_count"] == 5 and result["files_hashed"] == 5


def test_sample_zero_reads_no_contents_but_checks_attributes(replica, route):
    where, spark = route
    data = bytearray(replica["big"])
    data[10] ^= 0xFF
    (replica["root"] / "d/striped").write_bytes(bytes(data))
    os.chmod(replica["root"] / "plain", 0o640)
    result = verify_plan(replica["plan"], replica["target"], source_io(), replica["bucket"], sample=0.0, spark=spark)
    assert result["problems"] == ["plain: mode 0o640, expected 0o644"]
    assert result["files_hashed"] == 0 and result["source_requests"]["total_requests"] == 0
    assert result["contents_on"] == "driver"  # nothing to read: no Spark job


def test_a_source_that_cannot_be_read_is_an_error_naming_the_file(replica, route):
    _, spark = route
    plan = dict(replica["plan"], verify={"present": replica["plan"]["verify"]["present"][2:3], "absent": []})
    with pytest.raises(
        EpochsyncError,
        match=r"verify: plain: cannot read the source's bytes at epoch 2 \(s3://no-such-bucket-\w+: data/\w+-plain@.*NoSuchBucket",
    ):
        verify_plan(plan, replica["target"], source_io(), "no-such-bucket-" + uuid.uuid4().hex[:6], spark=spark)
