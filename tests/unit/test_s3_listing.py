"""Listings with keys XML cannot carry (issue 16, bug 4), without a server: what the lean
client asks for and how it reads the answers a store may send."""

from __future__ import annotations

from epochsync.stores.connections import S3Settings
from epochsync.targets.s3 import Counters, decode_listing, listed_key_is
from epochsync.targets.s3fast import FastClient

HEAD = b'<?xml version="1.0" encoding="UTF-8"?>\n<ListVersionsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'


def version(key: bytes) -> bytes:
    return (
        b"<Version><Key>" + key + b"</Key><VersionId>v1</VersionId><IsLatest>true</IsLatest>"
        b"<LastModified>2026-01-01T00:00:00Z</LastModified><Size>3</Size></Version>"
    )


def client(answer: bytes, sent: list):
    fast = FastClient(None, S3Settings("x", "http://127.0.0.1:9", "k", "s"), Counters())

    def send(op, method, bucket, key, query=None, headers=None, body=b""):
        sent.append(query)
        return 200, {}, answer

    fast._send = send
    return fast


def test_the_lean_client_asks_for_url_encoding_and_decodes_keys_and_markers():
    sent = []
    answer = HEAD + b"<EncodingType>url</EncodingType><Prefix>p%2Fa%01</Prefix><IsTruncated>true</IsTruncated>"
    answer += b"<NextKeyMarker>p%2Fa%01b+c</NextKeyMarker><NextVersionIdMarker>v1</NextVersionIdMarker>"
    answer += version(b"p%2Fa%01b+c") + b"</ListVersionsResult>"
    out = client(answer, sent).list_object_versions(Bucket="b", Prefix="p/a\x01")
    assert sent == [{"versions": "", "encoding-type": "url", "prefix": "p/a\x01"}]
    assert [v["Key"] for v in out["Versions"]] == ["p/a\x01b c"]
    assert (out["NextKeyMarker"], out["Prefix"], out["IsTruncated"]) == ("p/a\x01b c", "p/a\x01", True)
    # asked for explicitly: the answer stays encoded, as botocore leaves it
    out = client(answer, sent).list_object_versions(Bucket="b", Prefix="p/a\x01", EncodingType="url")
    assert [v["Key"] for v in out["Versions"]] == ["p%2Fa%01b+c"] and out["EncodingType"] == "url"
    assert [v["Key"] for v in decode_listing(out)["Versions"]] == ["p/a\x01b c"]


def test_a_store_that_ignores_the_encoding_sends_raw_control_characters():
    answer = HEAD + b"<IsTruncated>false</IsTruncated>" + version(b"p/a\x01b") + b"</ListVersionsResult>"
    out = client(answer, []).list_object_versions(Bucket="b", Prefix="p/a\x01b")
    (listed,) = [v["Key"] for v in out["Versions"]]
    assert listed == "p/a\ufffdb"  # not well-formed XML: read as SeaweedFS sends it (U+FFFD)
    assert listed_key_is(listed, "p/a\x01b") and not listed_key_is(listed, "p/a\x01bc")
    assert listed_key_is("p/plain", "p/plain") and not listed_key_is("p/a\ufffdb", "p/a\x02bc")
