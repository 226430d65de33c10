"""Listings with keys XML cannot carry (issue 16, bug 4), against a canned HTTP answer: what the
data path's client asks for and how it reads the answers a store may send."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from epochsync.stores.connections import S3Settings
from epochsync.stores.s3 import decode_listing
from epochsync.stores.s3_access import S3Access
from epochsync.targets.s3 import listed_key_is

HEAD = b'<?xml version="1.0" encoding="UTF-8"?>\n<ListVersionsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'


def version(key: bytes) -> bytes:
    return (
        b"<Version><Key>" + key + b"</Key><VersionId>v1</VersionId><IsLatest>true</IsLatest>"
        b"<LastModified>2026-01-01T00:00:00Z</LastModified><Size>3</Size></Version>"
    )


@pytest.fixture()
def canned():
    """An HTTP server that answers every request with ``answer[0]`` and records the queries."""
    answer: list[bytes] = [b""]
    queries: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            queries.append({k: v[0] for k, v in parse_qs(urlsplit(self.path).query, keep_blank_values=True).items()})
            self.send_response(200)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(answer[0])))
            self.end_headers()
            self.wfile.write(answer[0])

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    access = S3Access(S3Settings("x", f"http://127.0.0.1:{server.server_address[1]}", "k", "s"), max_attempts=1)
    yield access, answer, queries
    server.shutdown()
    server.server_close()


def test_listings_ask_for_url_encoding_and_the_keys_and_markers_are_decoded(canned):
    access, answer, queries = canned
    answer[0] = HEAD + b"<EncodingType>url</EncodingType><Prefix>p%2Fa%01</Prefix><IsTruncated>true</IsTruncated>"
    answer[0] += b"<NextKeyMarker>p%2Fa%01b+c</NextKeyMarker><NextVersionIdMarker>v1</NextVersionIdMarker>"
    answer[0] += version(b"p%2Fa%01b+c") + b"</ListVersionsResult>"
    out = access.client.list_object_versions(Bucket="b", Prefix="p/a\x01", EncodingType="url")
    assert queries == [{"versions": "", "encoding-type": "url", "prefix": "p/a\x01"}]
    # asked for explicitly (as the target does): the answer stays encoded and says so
    assert [v["Key"] for v in out["Versions"]] == ["p%2Fa%01b+c"] and out["EncodingType"] == "url"
    out = decode_listing(out)
    assert [v["Key"] for v in out["Versions"]] == ["p/a\x01b c"]
    assert (out["NextKeyMarker"], out["Prefix"], out["IsTruncated"]) == ("p/a\x01b c", "p/a\x01", True)


def test_a_store_that_ignores_the_encoding_and_sends_raw_control_characters(canned):
    access, answer, _ = canned
    answer[0] = HEAD + b"<IsTruncated>false</IsTruncated>" + version(b"p/a\x01b") + b"</ListVersionsResult>"
    out = access.client.list_object_versions(Bucket="b", Prefix="p/a\x01b", EncodingType="url")
    (listed,) = [v["Key"] for v in decode_listing(out)["Versions"]]
    assert listed == "p/a\ufffdb"  # not well-formed XML: read as SeaweedFS sends it (U+FFFD)
    assert listed_key_is(listed, "p/a\x01b") and not listed_key_is(listed, "p/a\x01bc")
    assert listed_key_is("p/plain", "p/plain") and not listed_key_is("p/a\ufffdb", "p/a\x02bc")


def test_a_carriage_return_in_an_unencoded_listing_stays_a_carriage_return(canned):
    """A store that does not URL-encode a listing (SeaweedFS's version listings) sends a key
    ``cr\\rname`` as it is; an XML parser would read its CR as a LF (line-end normalization), so
    the key came back as ``cr\\nname``: verify called the file missing and its rollback left it."""
    access, answer, _ = canned
    answer[0] = HEAD.replace(b"\n", b"\r\n") + b"<Prefix>d/cr\rname</Prefix><IsTruncated>false</IsTruncated>\r\n"
    answer[0] += version(b"d/cr\rname") + b"\r\n" + version(b"d/lf\nname") + b"\r\n" + version(b"d/both\r\n")
    answer[0] += b"</ListVersionsResult>\r\n"
    out = access.client.list_object_versions(Bucket="b", Prefix="d/cr\rname", EncodingType="url")
    assert [v["Key"] for v in out["Versions"]] == ["d/cr\rname", "d/lf\nname", "d/both\r\n"]
    assert out["Prefix"] == "d/cr\rname"
