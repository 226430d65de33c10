"""The data path's S3 access (``S3Access``: one botocore client, retries and counters of its own)
on a real S3 server and on moto: what the targets and the apply rely on."""

import pytest
from botocore.exceptions import ClientError

from epochsync.core.errors import StoreError
from epochsync.stores.connections import S3Settings
from epochsync.stores.s3_access import Counters, S3Access, error_code, is_retryable

pytestmark = pytest.mark.integration

KEYS = ["plain/file.txt", "sp ace/ü nï+cödé%20~'()!*=,;@$&[].bin", "deep/a/b/c/d/e/f"]


@pytest.fixture(params=["seaweed", "moto"])
def store(request, bucket_name):
    ep = request.getfixturevalue("seaweed") if request.param == "seaweed" else request.getfixturevalue("moto_s3")
    settings = S3Settings("t", ep.url, ep.access_key, ep.secret_key)
    admin = ep.client()
    admin.create_bucket(Bucket=bucket_name)
    admin.put_bucket_versioning(Bucket=bucket_name, VersioningConfiguration={"Status": "Enabled"})
    access = S3Access(settings, max_attempts=2, base_delay=0.01)
    return access, admin, bucket_name


def _sent_headers(client) -> list[dict]:
    """The headers of every request ``client`` sends from now on (botocore's ``before-send`` event)."""
    seen: list[dict] = []
    client.meta.events.register("before-send.s3", lambda request=None, **kw: seen.append(dict(request.headers)))
    return seen


@pytest.mark.parametrize("key", KEYS)
def test_put_get_head_delete_of_versions_and_what_is_counted(store, key):
    access, admin, bucket = store
    c = access.client
    sent = _sent_headers(c)
    meta = {"es-type": "file", "es-mode": "33188", "es-fid": "%5B0x1%3A0x2%3A0x0%5D"}
    v1 = access.call("PUT", lambda c: c.put_object(Bucket=bucket, Key=key, Body=b"0123456789" * 10, Metadata=meta))
    v2 = c.put_object(Bucket=bucket, Key=key, Body=b"abc", Metadata={"es-type": "file"})
    assert v1["VersionId"] != v2["VersionId"] and v1["ETag"] and v2["ETag"]  # verify takes its facts from these
    # every PUT carries Content-MD5: the store refuses a body damaged on the way
    puts = [h for h in sent if "Content-MD5" in h]
    assert len(puts) == 2 == len(sent)
    head = c.head_object(Bucket=bucket, Key=key, VersionId=v1["VersionId"])
    assert (head["ContentLength"], head["Metadata"], head["ETag"]) == (100, meta, v1["ETag"])
    got = c.get_object(Bucket=bucket, Key=key, VersionId=v1["VersionId"], Range="bytes=5-14")
    assert got["Body"].read() == b"5678901234" and got["ContentLength"] == 10 and got["Metadata"] == meta
    assert access.get_all(bucket, key) == b"abc"
    assert access.get_range(bucket, key, v1["VersionId"], 98, 4) == b"89\0\0"  # past the end: zeros
    # a delete puts a marker; deleting the marker's version brings the object back
    marker = c.delete_object(Bucket=bucket, Key=key)
    assert marker["DeleteMarker"] is True
    assert error_code(_raises(lambda: c.get_object(Bucket=bucket, Key=key))) == "NoSuchKey"
    c.delete_object(Bucket=bucket, Key=key, VersionId=marker["VersionId"])
    assert c.get_object(Bucket=bucket, Key=key)["Body"].read() == b"abc"
    counts = access.counters.as_dict()
    assert counts["requests"]["PutObject"] == 2 and counts["requests"]["GetObject"] == 5
    assert counts["requests"]["HeadObject"] == 1 and counts["requests"]["DeleteObject"] == 2
    assert counts["bytes_sent"] == 103 and counts["bytes_received"] == 10 + 3 + 2 + 3


def test_a_body_that_does_not_match_its_content_md5_is_refused(seaweed, bucket_name):
    """What the Content-MD5 every PUT carries is for: the store refuses a body damaged on the way
    (SeaweedFS checks it, as AWS does; moto does not)."""
    import base64
    import hashlib

    admin = seaweed.client()
    admin.create_bucket(Bucket=bucket_name)
    access, bucket = S3Access(S3Settings("t", seaweed.url, seaweed.access_key, seaweed.secret_key)), bucket_name
    other = base64.b64encode(hashlib.md5(b"what was meant").digest()).decode()
    exc = _raises(lambda: access.client.put_object(Bucket=bucket, Key="k", Body=b"what arrived", ContentMD5=other))
    assert error_code(exc) in ("BadDigest", "InvalidDigest") and not is_retryable(exc)
    assert error_code(_raises(lambda: admin.head_object(Bucket=bucket, Key="k"))) == "404"


def test_copy_of_a_pinned_version_with_new_metadata(store):
    access, admin, bucket = store
    c = access.client
    key = KEYS[1]
    v1 = c.put_object(Bucket=bucket, Key=key, Body=b"first")["VersionId"]
    c.put_object(Bucket=bucket, Key=key, Body=b"second")
    out = c.copy_object(
        Bucket=bucket,
        Key="copied/" + key,
        CopySource={"Bucket": bucket, "Key": key, "VersionId": v1},
        MetadataDirective="REPLACE",
        Metadata={"es-type": "file", "es-size": "5"},
    )
    assert out["CopyObjectResult"]["ETag"] and out["VersionId"]
    got = admin.get_object(Bucket=bucket, Key="copied/" + key)
    assert got["Body"].read() == b"first" and got["Metadata"] == {"es-type": "file", "es-size": "5"}
    assert access.counters.as_dict()["requests"]["CopyObject"] == 1


def test_errors_carry_their_codes(store):
    access, admin, bucket = store
    c = access.client
    c.put_object(Bucket=bucket, Key="k", Body=b"abc")
    assert error_code(_raises(lambda: c.get_object(Bucket=bucket, Key="missing"))) == "NoSuchKey"
    assert error_code(_raises(lambda: c.head_object(Bucket=bucket, Key="missing"))) == "404"
    assert error_code(_raises(lambda: c.get_object(Bucket=bucket, Key="k", Range="bytes=10-20"))) == "InvalidRange"
    exc = _raises(lambda: c.get_object(Bucket="no-such-bucket-x", Key="k"))
    assert error_code(exc) == "NoSuchBucket" and not is_retryable(exc)
    # get_range keeps its contract: past the end (or no object) reads as zeros
    assert access.get_range(bucket, "k", None, 1, 4) == b"bc\0\0"
    assert access.get_range(bucket, "missing", None, 0, 2) == b"\0\0"
    # a refused precondition (the lease's conditional PUT) is an error, never retried
    exc = _raises(
        lambda: access.call("PUT", lambda c: c.put_object(Bucket=bucket, Key="k", Body=b"x", IfNoneMatch="*"))
    )
    assert error_code(exc) in ("PreconditionFailed", "412") and not is_retryable(exc)
    assert access.counters.retries == 0


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
    assert access.counters.as_dict()["requests"] == {"GetObject": 3}  # botocore sends each attempt once


def test_a_dropped_connection_and_a_503_are_retried_and_counted(seaweed, bucket_name):
    from epochsync_dev.s3proxy import S3Proxy

    seaweed.client().create_bucket(Bucket=bucket_name)
    with S3Proxy(seaweed.url) as proxy:
        access = S3Access(S3Settings("p", proxy.url, seaweed.access_key, seaweed.secret_key), base_delay=0.01)
        access.call("PUT k", lambda c: c.put_object(Bucket=bucket_name, Key="k", Body=b"abc"))
        proxy.add_fault("reset", method="GET", times=2)
        proxy.add_fault("503", method="HEAD")
        assert access.get_all(bucket_name, "k") == b"abc"
        assert access.call("HEAD k", lambda c: c.head_object(Bucket=bucket_name, Key="k"))["ContentLength"] == 3
        at_proxy = proxy.snapshot()[bucket_name]["requests"]
    assert access.counters.retries == 3  # two resets, one 503: each attempt ours, none botocore's
    assert access.counters.as_dict()["requests"] == {"PutObject": 1, "GetObject": 3, "HeadObject": 2}
    assert at_proxy == {"PUT": 1, "GET": 1, "HEAD": 1}  # the faulted attempts never reached the store


def test_one_client_per_access_shared_by_threads(store):
    from concurrent.futures import ThreadPoolExecutor

    access, admin, bucket = store
    first = access.client
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda i: access.call("PUT", lambda c: c.put_object(Bucket=bucket, Key=f"t/{i}", Body=b"x")), range(32)
            )
        )
    assert access.client is first
    assert access.counters.as_dict()["requests"] == {"PutObject": 32}
    # shipped to a Spark task: it builds its own client there and counts afresh
    import pickle

    shipped = pickle.loads(pickle.dumps(access))
    assert shipped.get_all(bucket, "t/1") == b"x" and shipped.client is not first
    assert shipped.counters.as_dict()["requests"] == {"GetObject": 1}


def _raises(fn) -> BaseException:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        return exc
    raise AssertionError("no exception")


def test_counters_add_and_report():
    c = Counters()
    c.sent("GetObject", 0)
    c.received(10)
    c.count(copied=5, retries=1)
    assert c.as_dict() == {
        "requests": {"GetObject": 1},
        "total_requests": 1,
        "bytes_sent": 0,
        "bytes_received": 10,
        "bytes_copied": 5,
        "retries": 1,
    }


def test_the_conditional_writes_the_write_fence_relies_on(store, request, tmp_path):
    """SeaweedFS honours every precondition the s3 target's conditional writes carry (412 for a PUT
    or a copy over an object written after ``If-Unmodified-Since``, and for ``If-None-Match: *``
    over one), so a key written whole is fenced by its write there. moto does not (it ignores
    ``If-Unmodified-Since`` on a PUT and every precondition of a copy): the probe says so and
    on the moto double the fence lists, as it would on AWS S3. The probe leaves no object, and
    its answer is kept: a second call sends nothing."""
    from epochsync.core.config import TargetConfig
    from epochsync.targets.s3 import S3Target

    access, admin, bucket = store
    cfg = TargetConfig(name="probe", source="sim", kind="s3", conn_id="unused", bucket=bucket, prefix="p/")
    target = S3Target(cfg, settings=access.settings)
    found = target.probe_conditional_writes()
    if request.node.callspec.params["store"] == "seaweed":
        assert found["how"] == "if-unmodified-since" and found["failed"] == [], found
    else:
        assert found["how"] is None, found
        assert "If-Unmodified-Since 2001 over an object was accepted" in found["failed"], found
        assert "a CopyObject If-Unmodified-Since 2001 over an object was accepted" in found["failed"], found
    listed = admin.list_object_versions(Bucket=bucket, Prefix="p/")
    assert not listed.get("Versions") and not listed.get("DeleteMarkers")
    cache = str(tmp_path / "probe.json")
    assert target.conditional_writes(cache) == found["how"]
    sent = sum(target.io.counters.as_dict()["requests"].values())
    assert target.conditional_writes(cache) == found["how"]
    assert sum(target.io.counters.as_dict()["requests"].values()) == sent


def test_get_range_by_presigned_url_keeps_the_clients_contract(seaweed, bucket_name, monkeypatch):
    """get_range sends a presigned GET outside the client's hooks: a reset and a 503 are still
    retried and counted, a refused signature is the client's error (403, not zeros), and with a
    proxy in the environment the client's own GET is used."""
    from epochsync_dev.s3proxy import S3Proxy

    seaweed.client().create_bucket(Bucket=bucket_name)
    with S3Proxy(seaweed.url) as proxy:
        access = S3Access(S3Settings("p", proxy.url, seaweed.access_key, seaweed.secret_key), base_delay=0.01)
        access.call("PUT k", lambda c: c.put_object(Bucket=bucket_name, Key="k", Body=b"abcdef"))
        assert access.http() is not None
        proxy.add_fault("reset", method="GET", times=1)
        proxy.add_fault("503", method="GET", times=1)
        assert access.get_range(bucket_name, "k", None, 2, 3) == b"cde"
        assert access.counters.retries == 2
        assert access.counters.as_dict()["requests"] == {"PutObject": 1, "GetObject": 3}
        assert access.counters.bytes_received == 3
    bad = S3Access(S3Settings("bad", seaweed.url, seaweed.access_key, "not-the-secret"), max_attempts=2)
    exc = _raises(lambda: bad.get_range(bucket_name, "k", None, 0, 2))
    assert isinstance(exc, ClientError) and exc.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert error_code(exc) == "SignatureDoesNotMatch" and not is_retryable(exc)
    monkeypatch.setenv("AWS_CA_BUNDLE", "/some/ca.pem")  # botocore's bundle is the pool's
    assert S3Access(S3Settings("x", seaweed.url, "a", "b")).http().connection_pool_kw["ca_certs"] == "/some/ca.pem"
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    assert S3Access(S3Settings("x", seaweed.url, "a", "b")).http() is None


@pytest.mark.parametrize("key", KEYS)
def test_put_object_by_presigned_url_keeps_the_clients_contract(store, key, request):
    """S3Access.put_object (the target's PUT of a whole file) sends a presigned PUT outside the
    client's hooks: the answer's version and ETag, the metadata and Content-MD5 stored and
    checked, the preconditions the write fence relies on refused with the client's error
    codes (SeaweedFS honours both; moto ignores If-Unmodified-Since on a PUT), counted."""
    import base64
    import hashlib
    from email.utils import formatdate

    from epochsync.stores.s3 import IF_UNMODIFIED_SINCE

    access, admin, bucket = store
    assert access.http() is not None
    body = b"0123456789" * 10
    md5 = base64.b64encode(hashlib.md5(body).digest()).decode()
    meta = {"es-type": "file", "es-mode": "33188", "es-fid": "%5B0x1%3A0x2%3A0x0%5D"}
    put = lambda pre, b=body, m=md5: access.call(  # noqa: E731
        "PUT", lambda c: access.put_object(c, bucket, key, b, meta, m, pre)
    )
    first = put({"IfNoneMatch": "*"})
    head = admin.head_object(Bucket=bucket, Key=key)
    assert (first["VersionId"], first["ETag"]) == (head["VersionId"], head["ETag"])
    assert head["ETag"].strip('"') == hashlib.md5(body).hexdigest()
    assert (head["ContentLength"], head["Metadata"]) == (100, meta)
    assert error_code(_raises(lambda: put({"IfNoneMatch": "*"}))) in ("PreconditionFailed", "412")
    long_ago = {IF_UNMODIFIED_SINCE: formatdate(978307200, usegmt=True)}  # 2001
    if request.node.callspec.params["store"] == "seaweed":
        assert error_code(_raises(lambda: put(long_ago))) in ("PreconditionFailed", "412")
        other = base64.b64encode(hashlib.md5(b"what was meant").digest()).decode()
        exc = _raises(lambda: put({}, m=other))
        assert error_code(exc) in ("BadDigest", "InvalidDigest") and not is_retryable(exc)
    second = put({IF_UNMODIFIED_SINCE: formatdate(usegmt=True)})  # now: the object is older
    assert second["VersionId"] != first["VersionId"]
    assert admin.get_object(Bucket=bucket, Key=key)["Body"].read() == body
    counts = access.counters.as_dict()
    assert counts["requests"]["PutObject"] >= 3 and counts["bytes_sent"] >= 300


def test_a_presigned_put_is_retried_after_a_reset_and_a_503(seaweed, bucket_name):
    import base64
    import hashlib

    from epochsync_dev.s3proxy import S3Proxy

    seaweed.client().create_bucket(Bucket=bucket_name)
    with S3Proxy(seaweed.url) as proxy:
        access = S3Access(S3Settings("p", proxy.url, seaweed.access_key, seaweed.secret_key), base_delay=0.01)
        md5 = base64.b64encode(hashlib.md5(b"abc").digest()).decode()
        proxy.add_fault("reset", method="PUT", times=1)
        proxy.add_fault("503", method="PUT", times=1)
        access.call("PUT k", lambda c: access.put_object(c, bucket_name, "k", b"abc", {"es-type": "file"}, md5, {}))
        assert access.counters.retries == 2
        assert access.counters.as_dict()["requests"] == {"PutObject": 3}
        assert proxy.snapshot()[bucket_name]["requests"] == {"PUT": 1}
    assert seaweed.client().get_object(Bucket=bucket_name, Key="k")["Body"].read() == b"abc"


def test_presigned_requests_can_be_switched_off_and_executors_keep_the_drivers_choice(
    seaweed, bucket_name, monkeypatch
):
    import base64
    import hashlib
    import pickle

    seaweed.client().create_bucket(Bucket=bucket_name)
    settings = S3Settings("p", seaweed.url, seaweed.access_key, seaweed.secret_key)
    md5 = base64.b64encode(hashlib.md5(b"abc").digest()).decode()
    monkeypatch.setenv("EPOCHSYNC_S3_PRESIGNED_PUT", "0")
    puts_by_client = S3Access(settings)
    monkeypatch.setenv("EPOCHSYNC_S3_PRESIGNED", "0")
    none = S3Access(settings)
    monkeypatch.delenv("EPOCHSYNC_S3_PRESIGNED")
    monkeypatch.delenv("EPOCHSYNC_S3_PRESIGNED_PUT")
    assert none.http() is None and pickle.loads(pickle.dumps(none)).http() is None
    copy = pickle.loads(pickle.dumps(puts_by_client))  # as an executor gets it, its own environment unset
    assert copy.http() is not None  # the GETs stay presigned
    sent = _sent_headers(copy.client)
    copy.call("PUT k", lambda c: copy.put_object(c, bucket_name, "k", b"abc", {"es-type": "file"}, md5, {}))
    assert len(sent) == 1 and sent[0]["Content-MD5"] == md5.encode()  # the client's own PUT
    assert copy.get_range(bucket_name, "k", None, 0, 3) == b"abc" and len(sent) == 1  # presigned: no client request


#: keys a copy source must encode (space, unicode, ``+``, ``%``, ``#``, ``?``, a carriage return)
COPY_KEYS = [KEYS[1], "hash#tag?versionId=x&y=1", "50%+%2F plus", "cr\rname ü"]


@pytest.mark.parametrize("key", COPY_KEYS)
def test_copy_object_by_presigned_url_keeps_the_clients_contract(store, key, request):
    """S3Access.copy_object (the target's server-side copies) sends a presigned PUT outside the
    client's hooks: the pinned version's bytes land with the new metadata, the answer's version
    and ETag are the new object's, the preconditions the write fence relies on are refused with
    the client's codes (SeaweedFS honours both on a copy; moto neither), counted as CopyObject."""
    import hashlib
    from email.utils import formatdate

    from epochsync.stores.s3 import IF_UNMODIFIED_SINCE

    access, admin, bucket = store
    assert access.http() is not None
    v1 = admin.put_object(Bucket=bucket, Key=key, Body=b"first")["VersionId"]
    admin.put_object(Bucket=bucket, Key=key, Body=b"second")
    sent = _sent_headers(access.client)
    meta = {"es-type": "file", "es-mode": "33188", "es-fid": "%5B0x1%3A0x2%3A0x0%5D"}
    source, dst = {"Bucket": bucket, "Key": key, "VersionId": v1}, "copied/" + key
    copy = lambda pre: access.call(  # noqa: E731
        "COPY", lambda c: access.copy_object(c, bucket, dst, source, meta, pre)
    )
    first = copy({"IfNoneMatch": "*"})
    head = admin.head_object(Bucket=bucket, Key=dst)
    assert first["VersionId"] == head["VersionId"]
    assert first["CopyObjectResult"]["ETag"].strip('"') == head["ETag"].strip('"') == hashlib.md5(b"first").hexdigest()
    got = admin.get_object(Bucket=bucket, Key=dst)
    assert (got["Body"].read(), got["Metadata"]) == (b"first", meta)
    assert sent == []  # nothing through the client
    if request.node.callspec.params["store"] == "seaweed":
        assert error_code(_raises(lambda: copy({"IfNoneMatch": "*"}))) in ("PreconditionFailed", "412")
        long_ago = {IF_UNMODIFIED_SINCE: formatdate(978307200, usegmt=True)}  # 2001
        exc = _raises(lambda: copy(long_ago))
        assert error_code(exc) in ("PreconditionFailed", "412") and not is_retryable(exc)
        missing = dict(source, VersionId="no-such-version")
        exc = _raises(lambda: access.call("COPY", lambda c: access.copy_object(c, bucket, dst, missing, meta, {})))
        assert isinstance(exc, ClientError) and not is_retryable(exc)
    second = copy({IF_UNMODIFIED_SINCE: formatdate(usegmt=True)})  # now: the copy is older
    assert second["VersionId"] not in (None, first["VersionId"])
    assert admin.head_object(Bucket=bucket, Key=dst)["VersionId"] == second["VersionId"]
    counts = access.counters.as_dict()
    assert counts["requests"]["CopyObject"] >= 2 and counts["bytes_sent"] == 0 and counts["retries"] == 0


@pytest.mark.parametrize("switch", ["EPOCHSYNC_S3_PRESIGNED", "EPOCHSYNC_S3_PRESIGNED_PUT"])
def test_copy_object_by_the_client_where_presigned_puts_are_switched_off(store, switch, monkeypatch):
    """The presigned PUTs' switch is the copies' too: with it off the client's own CopyObject is
    sent, and the answer reads the same."""
    access, admin, bucket = store
    key = COPY_KEYS[0]
    v1 = admin.put_object(Bucket=bucket, Key=key, Body=b"first")["VersionId"]
    admin.put_object(Bucket=bucket, Key=key, Body=b"second")
    monkeypatch.setenv(switch, "0")
    off = S3Access(access.settings, max_attempts=2, base_delay=0.01)
    sent = _sent_headers(off.client)
    source, meta = {"Bucket": bucket, "Key": key, "VersionId": v1}, {"es-type": "file"}
    out = off.call("COPY", lambda c: off.copy_object(c, bucket, "c/" + key, source, meta, {"IfNoneMatch": "*"}))
    assert len(sent) == 1 and b"versionId=" + v1.encode() in sent[0]["x-amz-copy-source"]
    head = admin.head_object(Bucket=bucket, Key="c/" + key)
    assert out["VersionId"] == head["VersionId"]
    assert out["CopyObjectResult"]["ETag"].strip('"') == head["ETag"].strip('"')  # SeaweedFS's unquoted
    assert admin.get_object(Bucket=bucket, Key="c/" + key)["Body"].read() == b"first"
    assert off.counters.as_dict()["requests"] == {"CopyObject": 1}


@pytest.mark.parametrize("presigned", ["1", "0"])
def test_a_conditional_copy_refused_with_412_takes_the_writes_way(seaweed, bucket_name, presigned, monkeypatch):
    """S3Target's copies (a changed small file from its pinned source version) through
    _conditional_write, presigned or by the client alike: a retry that finds its own copy takes
    it as the answer, a copy refused because someone wrote the key after the fence fails the
    epoch naming the key (412), ``If-None-Match: *`` over a foreign object too."""
    import time

    from epochsync.core.config import TargetConfig
    from epochsync.core.errors import EpochError
    from epochsync.targets.s3 import S3Target

    monkeypatch.setenv("EPOCHSYNC_S3_PRESIGNED", presigned)
    admin = seaweed.client()
    admin.create_bucket(Bucket=bucket_name)
    admin.put_bucket_versioning(Bucket=bucket_name, VersioningConfiguration={"Status": "Enabled"})
    settings = S3Settings("t", seaweed.url, seaweed.access_key, seaweed.secret_key)
    cfg = TargetConfig(name="c", source="sim", kind="s3", conn_id="unused", bucket=bucket_name, prefix="p/")
    target = S3Target(cfg, settings=settings)
    assert (target.io.http() is not None) == (presigned == "1")
    src_key = COPY_KEYS[1]
    v1 = admin.put_object(Bucket=bucket_name, Key=src_key, Body=b"pinned")["VersionId"]
    admin.put_object(Bucket=bucket_name, Key=src_key, Body=b"later")
    obj, meta = {"key": src_key, "version": v1}, {"es-type": "file", "es-size": "6"}
    journal: list[dict] = []
    since_ns = (int(time.time()) - 2) * 1_000_000_000

    def copy(rel: str, present: bool) -> None:
        state = {rel: {"condition": {"present": present, "since_ns": since_ns}}}
        target.copy_from_source(journal, state, rel, bucket_name, obj, meta, 6)

    copy("k", False)
    fact = target.last_written("k")
    head = admin.head_object(Bucket=bucket_name, Key="p/k")
    assert (fact["version"], fact["etag"], fact["meta"]) == (head["VersionId"], head["ETag"].strip('"'), meta)
    assert fact["copied_from"] == {"bucket": bucket_name, "key": src_key, "version": v1}
    assert admin.get_object(Bucket=bucket_name, Key="p/k")["Body"].read() == b"pinned"
    # the same copy again (its first answer lost): refused, and its own object is the answer
    copy("k", False)
    assert target.last_written("k")["version"] == head["VersionId"]
    assert len(target.key_versions("k")["known"]) == 1
    # someone wrote the key after the fence instant: refused (If-Unmodified-Since), named
    admin.put_object(Bucket=bucket_name, Key="p/k", Body=b"foreign")
    with pytest.raises(EpochError, match=r"p/k was changed by someone else.*412.*EsIfUnmodifiedSince"):
        copy("k", True)
    # a key the fence saw absent that someone created: refused (If-None-Match), named
    admin.put_object(Bucket=bucket_name, Key="p/squat", Body=b"foreign")
    with pytest.raises(EpochError, match=r"p/squat was changed by someone else.*412.*IfNoneMatch"):
        copy("squat", False)
    assert [e["op"] for e in journal] == ["put"] * 4
    requests = target.io.counters.as_dict()["requests"]
    assert requests["CopyObject"] == 4, requests
