"""The lean data-path client answers like botocore, on a real S3 server and on moto."""

import pytest
from botocore.exceptions import ClientError

from epochsync.core.errors import StoreError
from epochsync.stores.connections import S3Settings
from epochsync.targets import s3fast
from epochsync.targets.s3 import Counters, S3Access, error_code, is_retryable

pytestmark = pytest.mark.integration

KEYS = ["plain/file.txt", "sp ace/ü nï+cödé%20~'()!*=,;@$&[].bin", "deep/a/b/c/d/e/f"]


@pytest.fixture(params=["seaweed", "moto"])
def store(request, bucket_name):
    ep = request.getfixturevalue("seaweed") if request.param == "seaweed" else request.getfixturevalue("moto_s3")
    settings = S3Settings("t", ep.url, ep.access_key, ep.secret_key)
    boto = ep.client()
    boto.create_bucket(Bucket=bucket_name)
    boto.put_bucket_versioning(Bucket=bucket_name, VersioningConfiguration={"Status": "Enabled"})
    access = S3Access(settings, max_attempts=2, base_delay=0.01)
    assert isinstance(access.client, s3fast.FastClient)
    return access, boto, bucket_name


def _same_object(a: dict, b: dict):
    for k in ("ContentLength", "Metadata", "VersionId", "ETag"):
        assert a.get(k) == b.get(k), k
    assert a["LastModified"] == b["LastModified"]


@pytest.mark.parametrize("key", KEYS)
def test_put_get_head_delete_like_botocore(store, key):
    access, boto, bucket = store
    fast = access.client
    meta = {"es-type": "file", "es-mode": "33188", "es-fid": "%5B0x1%3A0x2%3A0x0%5D"}
    v1 = fast.put_object(Bucket=bucket, Key=key, Body=b"0123456789" * 10, Metadata=meta)["VersionId"]
    v2 = fast.put_object(Bucket=bucket, Key=key, Body=b"abc", Metadata={"es-type": "file"})["VersionId"]
    assert v1 != v2
    _same_object(fast.head_object(Bucket=bucket, Key=key), boto.head_object(Bucket=bucket, Key=key))
    _same_object(
        fast.head_object(Bucket=bucket, Key=key, VersionId=v1), boto.head_object(Bucket=bucket, Key=key, VersionId=v1)
    )
    got = fast.get_object(Bucket=bucket, Key=key, VersionId=v1, Range="bytes=5-14")
    assert got["Body"].read() == b"5678901234" and got["ContentLength"] == 10
    assert got["Metadata"] == meta
    assert fast.get_object(Bucket=bucket, Key=key)["Body"].read() == b"abc"
    # a delete puts a marker; deleting the marker's version brings the object back
    marker = fast.delete_object(Bucket=bucket, Key=key)
    assert marker["DeleteMarker"] is True
    assert error_code(_raises(lambda: fast.get_object(Bucket=bucket, Key=key))) == "NoSuchKey"
    fast.delete_object(Bucket=bucket, Key=key, VersionId=marker["VersionId"])
    assert fast.get_object(Bucket=bucket, Key=key)["Body"].read() == b"abc"
    counts = access.counters.as_dict()
    assert counts["requests"]["PutObject"] == 2 and counts["requests"]["GetObject"] == 4
    assert counts["bytes_sent"] == 103 and counts["bytes_received"] == 16


def test_version_listing_like_botocore(store):
    access, boto, bucket = store
    fast = access.client
    for key in ("d/a", "d/a2", "d/b"):
        for body in (b"1", b"22"):
            fast.put_object(Bucket=bucket, Key=key, Body=body)
    fast.delete_object(Bucket=bucket, Key="d/a2")

    def norm(resp):
        return {
            kind: [
                (v["Key"], v["VersionId"], v["IsLatest"], v["LastModified"], v.get("Size")) for v in resp.get(kind, [])
            ]
            for kind in ("Versions", "DeleteMarkers")
        } | {"IsTruncated": resp["IsTruncated"]}

    for prefix in ("d/a", "d/", "nothing"):
        assert norm(fast.list_object_versions(Bucket=bucket, Prefix=prefix)) == norm(
            boto.list_object_versions(Bucket=bucket, Prefix=prefix)
        )
    first = boto.list_object_versions(Bucket=bucket, Prefix="d/", MaxKeys=2)  # MaxKeys: botocore answers
    assert first["IsTruncated"]
    page = {"KeyMarker": first["NextKeyMarker"], "VersionIdMarker": first["NextVersionIdMarker"]}
    assert norm(fast.list_object_versions(Bucket=bucket, Prefix="d/", **page)) == norm(
        boto.list_object_versions(Bucket=bucket, Prefix="d/", **page)
    )


def test_copy_of_a_pinned_version_with_new_metadata(store):
    access, boto, bucket = store
    fast = access.client
    key = KEYS[1]
    v1 = fast.put_object(Bucket=bucket, Key=key, Body=b"first")["VersionId"]
    fast.put_object(Bucket=bucket, Key=key, Body=b"second")
    out = fast.copy_object(
        Bucket=bucket,
        Key="copied/" + key,
        CopySource={"Bucket": bucket, "Key": key, "VersionId": v1},
        MetadataDirective="REPLACE",
        Metadata={"es-type": "file", "es-size": "5"},
    )
    assert out["CopyObjectResult"]["ETag"]
    got = boto.get_object(Bucket=bucket, Key="copied/" + key)
    assert got["Body"].read() == b"first" and got["Metadata"] == {"es-type": "file", "es-size": "5"}
    assert access.counters.as_dict()["requests"]["CopyObject"] == 1


def test_errors_carry_botocore_codes(store):
    access, boto, bucket = store
    fast = access.client
    fast.put_object(Bucket=bucket, Key="k", Body=b"abc")
    assert error_code(_raises(lambda: fast.get_object(Bucket=bucket, Key="missing"))) == "NoSuchKey"
    assert error_code(_raises(lambda: fast.head_object(Bucket=bucket, Key="missing"))) == "404"
    assert error_code(_raises(lambda: fast.get_object(Bucket=bucket, Key="k", Range="bytes=10-20"))) == "InvalidRange"
    exc = _raises(lambda: fast.get_object(Bucket="no-such-bucket-x", Key="k"))
    assert error_code(exc) == "NoSuchBucket" and not is_retryable(exc)
    # get_range keeps its contract: past the end (or no object) reads as zeros
    assert access.get_range(bucket, "k", None, 1, 4) == b"bc\0\0"
    assert access.get_range(bucket, "missing", None, 0, 2) == b"\0\0"


def test_a_wrong_secret_is_refused_clearly(seaweed, bucket_name):
    seaweed.client().create_bucket(Bucket=bucket_name)
    access = S3Access(S3Settings("bad", seaweed.url, seaweed.access_key, "not-the-secret"), max_attempts=2)
    exc = _raises(lambda: access.call("GET k", lambda c: c.get_object(Bucket=bucket_name, Key="k")))
    assert isinstance(exc, ClientError) and exc.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert not is_retryable(exc)


def test_an_unreachable_endpoint_fails_after_the_retries_naming_it():
    from epochsync_dev.embedded import free_port

    url = f"http://127.0.0.1:{free_port()}"
    access = S3Access(S3Settings("gone", url, "a", "b"), max_attempts=3, base_delay=0.01)
    with pytest.raises(StoreError, match=rf"GET x: failed after 3 attempts against gone \({url}\)"):
        access.call("GET x", lambda c: c.get_object(Bucket="b", Key="x"))
    assert access.counters.retries == 2


def test_a_dropped_connection_is_retried(seaweed, bucket_name):
    from epochsync_dev.s3proxy import S3Proxy

    seaweed.client().create_bucket(Bucket=bucket_name)
    with S3Proxy(seaweed.url) as proxy:
        access = S3Access(S3Settings("p", proxy.url, seaweed.access_key, seaweed.secret_key), base_delay=0.01)
        access.call("PUT k", lambda c: c.put_object(Bucket=bucket_name, Key="k", Body=b"abc"))
        proxy.add_fault("reset", method="GET", times=3)
        proxy.add_fault("503", method="HEAD")
        assert access.get_all(bucket_name, "k") == b"abc"
        assert access.call("HEAD k", lambda c: c.head_object(Bucket=bucket_name, Key="k"))["ContentLength"] == 3
    assert access.counters.retries >= 2  # 3 resets (one absorbed as a stale kept-alive connection), one 503


def test_eligibility(monkeypatch):
    ok = S3Settings("c", "http://127.0.0.1:9000", "a", "b")
    assert s3fast.eligible(ok)
    assert not s3fast.eligible(S3Settings("c", None, "a", "b"))  # AWS's default endpoint: botocore
    assert not s3fast.eligible(S3Settings("c", "http://127.0.0.1:9000"))  # a credential chain: botocore
    monkeypatch.setenv("EPOCHSYNC_S3_CLIENT", "botocore")
    assert not s3fast.eligible(ok)
    monkeypatch.delenv("EPOCHSYNC_S3_CLIENT")
    monkeypatch.setenv("http_proxy", "http://proxy.example:3128")
    monkeypatch.setenv("no_proxy", "")
    assert not s3fast.eligible(ok)
    assert not isinstance(S3Access(ok).client, s3fast.FastClient)


def test_other_calls_and_arguments_go_to_botocore(store):
    access, boto, bucket = store
    fast = access.client
    fast.put_object(Bucket=bucket, Key="k", Body=b"abc", ContentType="text/plain")  # an argument it does not know
    assert boto.head_object(Bucket=bucket, Key="k")["ContentType"] == "text/plain"
    assert [o["Key"] for o in fast.list_objects_v2(Bucket=bucket)["Contents"]] == ["k"]  # a call it does not know
    assert access.counters.as_dict()["requests"] == {"PutObject": 1, "ListObjectsV2": 1}  # botocore's events count


def _raises(fn) -> BaseException:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        return exc
    raise AssertionError("no exception")


def test_counters_are_shared_with_botocores_events():
    c = Counters()
    c.sent("GetObject", 0)
    c.received(10)
    assert c.as_dict()["requests"] == {"GetObject": 1} and c.as_dict()["bytes_received"] == 10
