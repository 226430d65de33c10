"""``S3Access.copy_object`` (the s3 target's CopyObject, sent by a presigned URL) against a canned
HTTP answer: the request is the one the botocore client sends, and its answers, the 200 whose body
is an ``<Error>`` included, read as the client reads them."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, ParamValidationError

from epochsync.core.errors import EpochsyncError
from epochsync.stores.connections import S3Settings
from epochsync.stores.s3 import IF_UNMODIFIED_SINCE, client_config
from epochsync.stores.s3_access import S3Access, _copy_result, _copy_source, is_retryable

OK = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<CopyObjectResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
    b"<LastModified>2026-01-01T00:00:00.000Z</LastModified><ETag>&quot;0123abcd&quot;</ETag></CopyObjectResult>"
)
#: what S3 sends when a copy fails after its 200 went out (whitespace kept the connection alive)
ERROR_IN_200 = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n   \n<Error><Code>InternalError</Code>'
    b"<Message>We encountered an internal error. Please try again.</Message><RequestId>R</RequestId></Error>"
)
#: keys whose copy source needs encoding: space, unicode, +, %, #, ?, a carriage return
AWKWARD = ["plain/k", "sp ace/ü nï+cödé%20~'()!*=,;@$&[].bin", "hash#tag?versionId=x&y", "cr\rname", "50%+%2F"]
META = {"es-type": "file", "es-mode": "33188", "es-fid": "%5B0x1%3A0x2%3A0x0%5D"}


@pytest.fixture()
def canned():
    """An HTTP server that answers each PUT with the next of ``answers`` (status, body, headers; the
    last one again when they run out) and records what it was sent."""
    answers: list[tuple[int, bytes, dict]] = [(200, OK, {"x-amz-version-id": "v-new"})]
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self):  # noqa: N802 - http.server's name
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n) if n else b""
            parts = urlsplit(self.path)
            seen.append(
                {
                    "path": parts.path,
                    "query": {k: v[0] for k, v in parse_qs(parts.query, keep_blank_values=True).items()},
                    "headers": {k.lower(): v for k, v in self.headers.items()},
                    "body": body,
                }
            )
            status, data, headers = answers.pop(0) if len(answers) > 1 else answers[0]
            self.send_response(status)
            for k, v in {"Content-Type": "application/xml", **headers}.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", answers, seen
    server.shutdown()
    server.server_close()


def _access(url: str, monkeypatch, presigned: bool, **kw) -> S3Access:
    monkeypatch.setenv("EPOCHSYNC_S3_PRESIGNED", "1" if presigned else "0")
    access = S3Access(S3Settings("x", url, "k", "s"), max_attempts=kw.pop("max_attempts", 1), base_delay=0.0, **kw)
    monkeypatch.delenv("EPOCHSYNC_S3_PRESIGNED")
    return access


def _copy(access: S3Access, key: str, precondition: dict, meta: dict = META) -> dict:
    src = {"Bucket": "src", "Key": key, "VersionId": "3f2a-v1"}
    return access.call("COPY", lambda c: access.copy_object(c, "dst", "d/" + key, src, meta, precondition))


#: the headers the copy is about (the rest are the transport's and the signature's)
COPY_HEADERS = ("x-amz-copy-source", "x-amz-metadata-directive", "if-none-match", "if-unmodified-since")


def _copy_headers(request: dict) -> dict:
    return {k: v for k, v in request["headers"].items() if k in COPY_HEADERS or k.startswith("x-amz-meta-")}


@pytest.mark.parametrize("key", AWKWARD)
@pytest.mark.parametrize(
    "precondition",
    [{}, {"IfNoneMatch": "*"}, {IF_UNMODIFIED_SINCE: "Mon, 01 Jan 2001 00:00:00 GMT"}],
    ids=["none", "if-none-match", "if-unmodified-since"],
)
def test_the_presigned_copy_is_the_request_the_client_sends(canned, monkeypatch, key, precondition):
    """Same path, same copy source (botocore's encoding, which the signature covers), metadata and
    preconditions as the client's own CopyObject; signed by the URL, not an Authorization header."""
    from botocore.handlers import _quote_source_header_from_dict

    url, _, seen = canned
    by_url = _access(url, monkeypatch, True)
    by_client = _access(url, monkeypatch, False)
    assert by_url.http() is not None and by_client.http() is None
    out_url, out_client = _copy(by_url, key, precondition), _copy(by_client, key, precondition)
    presigned, client = seen
    assert "authorization" not in presigned["headers"] and "X-Amz-Signature" in presigned["query"]
    assert "authorization" in client["headers"] and "X-Amz-Signature" not in client["query"]
    assert presigned["path"] == client["path"]
    assert _copy_headers(presigned) == _copy_headers(client)
    assert presigned["headers"]["x-amz-copy-source"] == _quote_source_header_from_dict(
        {"Bucket": "src", "Key": key, "VersionId": "3f2a-v1"}
    )
    signed = set(presigned["query"]["X-Amz-SignedHeaders"].split(";"))
    assert signed == {"host"} | (_copy_headers(presigned).keys() - {"if-unmodified-since"})
    assert presigned["body"] == client["body"] == b""
    # what the target reads of the answer
    assert out_url["CopyObjectResult"]["ETag"] == out_client["CopyObjectResult"]["ETag"] == '"0123abcd"'
    assert out_url["VersionId"] == out_client["VersionId"] == "v-new"
    assert by_url.counters.as_dict()["requests"] == by_client.counters.as_dict()["requests"] == {"CopyObject": 1}
    assert by_url.counters.bytes_sent == by_client.counters.bytes_sent == 0


@pytest.mark.parametrize(
    "body",
    [ERROR_IN_200, OK[:90]],
    ids=["error", "cut-short"],
)
def test_a_200_whose_body_is_an_error_is_the_clients_error(canned, monkeypatch, body):
    """S3 may answer a copy 200 and then write an ``<Error>`` as the body (or the answer is cut
    short): the client's ``ClientError``, a 500 with the body's code, which :meth:`S3Access.call`
    retries; the presigned copy raises the same, and the retry that lands is the answer."""
    url, answers, seen = canned
    errors = []
    for presigned in (True, False):
        answers[:] = [(200, body, {}), (200, OK, {"x-amz-version-id": "v-new"})]
        access = _access(url, monkeypatch, presigned)
        with pytest.raises(ClientError) as caught:
            access.copy_object(access.client, "dst", "d/k", {"Bucket": "src", "Key": "k"}, META, {})
        exc = caught.value
        errors.append((exc.response["Error"]["Code"], exc.response["ResponseMetadata"]["HTTPStatusCode"]))
        assert is_retryable(exc)
        retried = _access(url, monkeypatch, presigned, max_attempts=3)
        answers[:] = [(200, body, {}), (200, OK, {"x-amz-version-id": "v-new"})]
        assert _copy(retried, "k", {})["VersionId"] == "v-new"
        assert retried.counters.retries == 1 and retried.counters.as_dict()["requests"] == {"CopyObject": 2}
    assert errors[0] == errors[1] == ("500" if body == OK[:90] else "InternalError", 500)


def test_an_error_answer_keeps_its_code_and_a_refused_precondition_is_not_retried(canned, monkeypatch):
    url, answers, _ = canned
    refused = b"<Error><Code>PreconditionFailed</Code><Message>At least one of the pre-conditions</Message></Error>"
    for presigned in (True, False):
        answers[:] = [(412, refused, {})]
        access = _access(url, monkeypatch, presigned, max_attempts=3)
        with pytest.raises(ClientError) as caught:
            _copy(access, "k", {"IfNoneMatch": "*"})
        assert caught.value.response["Error"]["Code"] == "PreconditionFailed"
        assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
        assert access.counters.retries == 0 and access.counters.as_dict()["requests"] == {"CopyObject": 1}


def test_what_the_presigned_copy_does_not_send_goes_by_the_client(canned, monkeypatch):
    """An unknown precondition is refused (as put_object refuses it); metadata that is not printable
    ASCII (the client refuses what is not ASCII, as it did), a source with more than bucket, key
    and version, and a client whose URLs are not signed with those headers (SigV2) are sent by
    the client's own CopyObject."""
    url, _, seen = canned
    access = _access(url, monkeypatch, True)
    with pytest.raises(EpochsyncError, match="unknown precondition"):
        _copy(access, "k", {"IfMatch": "x"})
    with pytest.raises(ParamValidationError, match="Non ascii"):  # the client's refusal, as before
        _copy(access, "k", {}, meta={"es-x": "ü"})
    _copy(access, "k", {}, meta={"es-x": "a\x01b"})
    access.call(
        "COPY", lambda c: access.copy_object(c, "d", "k", {"Bucket": "s", "Key": "k", "SSECustomerKey": "x"}, {}, {})
    )
    assert [("authorization" in r["headers"]) for r in seen] == [True, True]
    v2 = _access(url, monkeypatch, True)
    v2._client = boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id="k",
        aws_secret_access_key="s",
        region_name="us-east-1",
        config=client_config(counted=True).merge(Config(signature_version="s3")),
    )
    out = _copy(v2, "k", {"IfNoneMatch": "*"})
    assert out["VersionId"] == "v-new" and "authorization" in seen[-1]["headers"]


def test_the_copy_source_encoding_is_botocores():
    from botocore.handlers import _quote_source_header_from_dict

    for key in AWKWARD:
        for source in ({"Bucket": "b", "Key": key}, {"Bucket": "b", "Key": key, "VersionId": "v1"}):
            assert _copy_source(source) == _quote_source_header_from_dict(source)
    assert _copy_source({"Bucket": "arn:aws:s3:us-east-1:1:accesspoint/x", "Key": "k"}) is None
    assert _copy_result(b"") == {}
    # an <Error> in S3's namespace is one too (botocore's client takes it for an answer without a result)
    namespaced = ERROR_IN_200.replace(b"<Error>", b'<Error xmlns="http://s3.amazonaws.com/doc/2006-03-01/">')
    with pytest.raises(ClientError, match="InternalError"):
        _copy_result(namespaced)
    assert _copy_result(OK) == {"ETag": '"0123abcd"', "LastModified": "2026-01-01T00:00:00.000Z"}
