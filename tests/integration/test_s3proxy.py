"""The counting proxy measures what tools really send, against a real S3 server."""

import subprocess
import sys
from pathlib import Path

import pytest
from botocore.exceptions import ClientError, ConnectionClosedError

from epochsync_dev.embedded import S3Endpoint
from epochsync_dev.s3proxy import S3Proxy

pytestmark = pytest.mark.integration


@pytest.fixture()
def proxied(seaweed):
    with S3Proxy(seaweed.url, head_client=seaweed.client()) as proxy:
        yield proxy, S3Endpoint(proxy.url, seaweed.access_key, seaweed.secret_key)


def test_counts_bytes_requests_and_copies(proxied, bucket_name):
    proxy, ep = proxied
    c = ep.client()
    c.create_bucket(Bucket=bucket_name)
    c.put_object(Bucket=bucket_name, Key="a/x", Body=b"0123456789" * 100)
    assert c.get_object(Bucket=bucket_name, Key="a/x", Range="bytes=10-19")["Body"].read() == b"0123456789"
    c.copy_object(Bucket=bucket_name, Key="b/x", CopySource={"Bucket": bucket_name, "Key": "a/x"})
    assert len(c.list_objects_v2(Bucket=bucket_name)["Contents"]) == 2
    # the whole-object copy is sized when the counters are read, not while it waits for its answer
    assert [u[0] for u in proxy.unsized] == [bucket_name]
    counts = proxy.snapshot()[bucket_name]
    assert proxy.unsized == []
    assert counts["bytes_in"] == 1000
    assert counts["bytes_out"] == 10
    assert counts["bytes_copied"] == 1000 and counts["bytes_copied_out"] == 1000
    assert counts["requests"] == {"PUT": 3, "GET": 2}
    # a rename: the copy's source is gone when the counters are read, its copy is sized instead;
    # a copy whose source and result are both gone is counted as not sized, not as 0 bytes
    c.copy_object(Bucket=bucket_name, Key="c/x", CopySource={"Bucket": bucket_name, "Key": "b/x"})
    c.delete_object(Bucket=bucket_name, Key="b/x")
    c.copy_object(Bucket=bucket_name, Key="e/x", CopySource={"Bucket": bucket_name, "Key": "a/x"})
    c.delete_object(Bucket=bucket_name, Key="a/x")
    c.delete_object(Bucket=bucket_name, Key="e/x")
    counts = proxy.snapshot()[bucket_name]
    assert counts["bytes_copied"] == 2000 and counts["copies_unsized"] == 1, counts
    assert counts["listing_bytes"] > 0  # a listing is metadata, not file data read


def test_aws_cli_sync_is_counted(proxied, bucket_name, tmp_path):
    proxy, ep = proxied
    ep.client().create_bucket(Bucket=bucket_name)
    (tmp_path / "f1").write_bytes(b"x" * 5000)
    (tmp_path / "f2").write_bytes(b"y" * 3000)
    env = {
        "AWS_ACCESS_KEY_ID": ep.access_key,
        "AWS_SECRET_ACCESS_KEY": ep.secret_key,
        "AWS_DEFAULT_REGION": "us-east-1",
        "PATH": str(Path(sys.executable).parent),
        "HOME": str(tmp_path),
    }
    aws = str(Path(sys.executable).parent / "aws")
    subprocess.run(
        [aws, "--endpoint-url", ep.url, "s3", "sync", str(tmp_path), f"s3://{bucket_name}/r/", "--exclude", ".aws/*"],
        check=True,
        env=env,
        capture_output=True,
    )
    counts = proxy.snapshot()[bucket_name]
    assert counts["bytes_in"] == 8000
    assert counts["requests"]["PUT"] >= 2


def test_injected_503_and_reset(proxied, bucket_name):
    proxy, ep = proxied
    c = ep.client()
    c.create_bucket(Bucket=bucket_name)
    c.put_object(Bucket=bucket_name, Key="k", Body=b"v")
    proxy.add_fault("503", method="GET", key="^k$", nth=1, times=5)
    with pytest.raises(ClientError) as e:
        c.get_object(Bucket=bucket_name, Key="k")  # 2 attempts configured: both 503
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    proxy.clear_faults()
    proxy.add_fault("reset", method="GET", key="^k$", times=5)
    with pytest.raises(ConnectionClosedError):
        c.get_object(Bucket=bucket_name, Key="k")
    proxy.clear_faults()
    assert c.get_object(Bucket=bucket_name, Key="k")["Body"].read() == b"v"


def test_head_through_the_proxy_reports_the_object_length(proxied, bucket_name):
    proxy, ep = proxied
    c = ep.client()
    c.create_bucket(Bucket=bucket_name)
    c.put_object(Bucket=bucket_name, Key="k", Body=b"x" * 1234)
    assert c.head_object(Bucket=bucket_name, Key="k")["ContentLength"] == 1234
    assert proxy.snapshot()[bucket_name]["requests"]["HEAD"] == 1
