"""A lean S3 client for the data path: GET, HEAD, PUT, DELETE, CopyObject, ListObjectVersions.

(DeleteObjects, a request per 1,000 keys, goes through botocore: it needs a body and Content-MD5.)

botocore spends about 1.2 ms of CPU on every request (events, endpoint rules, signing
through its header classes, the user-agent string, dateutil timestamps). On a store
that answers in a millisecond, that cost is the whole budget: an epoch of small writes
sends four requests per changed file, from threads that share one interpreter lock.
This client signs with SigV4 itself and talks HTTP/1.1 over one kept-alive
:mod:`http.client` connection per thread, at about 0.3 ms per request (measured on
SeaweedFS, ``bench/results`` and the #6 note).

:class:`FastClient` wraps a botocore client and answers only the calls it knows, with
the keyword arguments it knows; every other call, or a known call with another
argument, goes to botocore unchanged. Answers have botocore's shape for the keys
epochsync reads, errors are botocore's ``ClientError`` (same ``Error.Code``, so
``error_code`` and the retry rules see no difference), and connection failures are
``HTTPClientError`` (retryable). Requests and bytes are counted in the same
:class:`~epochsync.targets.s3.Counters` as botocore's events count them.

It is used when the connection names an ``endpoint_url`` (http or https) and static
keys, and no HTTP proxy applies to that endpoint; otherwise (AWS's default endpoint,
credential chains, proxies) botocore does everything. ``EPOCHSYNC_S3_CLIENT=botocore``
turns it off. Payloads are not hashed into the signature (``UNSIGNED-PAYLOAD``, as
botocore does over https); a PUT carries ``Content-MD5`` so the store refuses a body
damaged on the way.
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import hmac
import http.client
import io
import os
import re
import socket
import ssl
import threading
import time
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from typing import Any

from epochsync.stores.s3 import decode_listing

#: ``EPOCHSYNC_S3_CLIENT=botocore`` sends every request through botocore
ENV_SWITCH = "EPOCHSYNC_S3_CLIENT"
_S3_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
#: control characters XML 1.0 cannot carry, even as character references
_XML_FORBIDDEN = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f]")
_UNSIGNED = "UNSIGNED-PAYLOAD"


def eligible(settings) -> bool:
    """Whether :class:`FastClient` may serve these settings (see the module doc)."""
    if os.environ.get(ENV_SWITCH, "").strip().lower() == "botocore":
        return False
    url = settings.endpoint_url
    if not url or not settings.access_key or not settings.secret_key:
        return False
    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname or u.query or u.fragment:
        return False
    proxies = urllib.request.getproxies()
    return not (proxies.get(u.scheme) and not urllib.request.proxy_bypass(u.hostname))


def _quote(s: str, safe: str = "~") -> str:
    return urllib.parse.quote(s, safe=safe)


def _iso(text: str | None) -> datetime | None:
    if not text:
        return None
    dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def _http_date(text: str | None) -> datetime | None:
    return email.utils.parsedate_to_datetime(text) if text else None


class _Body(io.BytesIO):
    """``resp["Body"]``: the bytes already read, with ``read()`` like botocore's stream."""


class _Conn(http.client.HTTPConnection):
    def __init__(self, host, port, connect_timeout, read_timeout):
        super().__init__(host, port, timeout=connect_timeout)
        self.read_timeout = read_timeout

    def connect(self):
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.settimeout(self.read_timeout)


class _TLSConn(http.client.HTTPSConnection):
    def __init__(self, host, port, connect_timeout, read_timeout):
        super().__init__(host, port, timeout=connect_timeout, context=ssl.create_default_context())
        self.read_timeout = read_timeout

    def connect(self):
        super().connect()
        self.sock.settimeout(self.read_timeout)


class FastClient:
    """The data-path subset of a botocore S3 client (path-style addressing), see the module doc."""

    def __init__(self, boto_client, settings, counters, *, connect_timeout: float = 5.0, read_timeout: float = 60.0):
        self._boto = boto_client
        self._counters = counters
        u = urllib.parse.urlsplit(settings.endpoint_url)
        self._tls = u.scheme == "https"
        self._hostname = u.hostname
        self._port = u.port or (443 if self._tls else 80)
        default = (self._tls and self._port == 443) or (not self._tls and self._port == 80)
        host = f"[{u.hostname}]" if ":" in u.hostname else u.hostname
        self._host_header = host if default else f"{host}:{self._port}"
        self._base = u.path.rstrip("/")
        self._access, self._secret, self._region = settings.access_key, settings.secret_key, settings.region
        self._timeouts = (connect_timeout, read_timeout)
        self._local = threading.local()
        self._keys: dict[str, bytes] = {}

    def __getattr__(self, name: str):  # everything else (meta, multipart, bucket calls...) is botocore's
        return getattr(self._boto, name)

    # ------------------------------------------------------------------ plumbing
    def _signing_key(self, day: str) -> bytes:
        k = self._keys.get(day)
        if k is None:
            k = ("AWS4" + self._secret).encode()
            for part in (day, self._region, "s3", "aws4_request"):
                k = hmac.new(k, part.encode(), hashlib.sha256).digest()
            self._keys = {day: k}
        return k

    def _conn(self, fresh: bool = False) -> http.client.HTTPConnection:
        c = getattr(self._local, "conn", None)
        if c is None or fresh:
            if c is not None:
                c.close()
            cls = _TLSConn if self._tls else _Conn
            c = self._local.conn = cls(self._hostname, self._port, *self._timeouts)
        return c

    def _drop(self) -> None:
        c = getattr(self._local, "conn", None)
        if c is not None:
            c.close()
            self._local.conn = None

    def _send(
        self,
        op: str,
        method: str,
        bucket: str,
        key: str | None,
        query: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        body: bytes = b"",
    ) -> tuple[int, Any, bytes]:
        path = f"{self._base}/{_quote(bucket)}" + (f"/{_quote(key, '/~')}" if key is not None else "")
        qs = "&".join(f"{_quote(k)}={_quote(v)}" for k, v in sorted((query or {}).items()))
        amz = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        h = {"host": self._host_header, "x-amz-date": amz, "x-amz-content-sha256": _UNSIGNED}
        for k, v in (headers or {}).items():
            h[k.lower()] = v
        names = sorted(h)
        signed = ";".join(names)
        canonical = "\n".join(
            [method, path, qs, "".join(f"{n}:{' '.join(str(h[n]).split())}\n" for n in names), signed, _UNSIGNED]
        )
        scope = f"{amz[:8]}/{self._region}/s3/aws4_request"
        to_sign = f"AWS4-HMAC-SHA256\n{amz}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
        sig = hmac.new(self._signing_key(amz[:8]), to_sign.encode(), hashlib.sha256).hexdigest()
        h["authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={self._access}/{scope}, SignedHeaders={signed}, Signature={sig}"
        )
        del h["host"]  # http.client sends it
        target = path + ("?" + qs if qs else "")
        for attempt in (1, 2):
            reused = getattr(self._local, "conn", None) is not None
            conn = self._conn()
            self._counters.sent(op, len(body))
            try:
                conn.request(method, target, body=body if method in ("PUT", "POST") else None, headers=h)
                resp = conn.getresponse()
                data = resp.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                self._drop()
                if attempt == 1 and reused:  # the store closed an idle kept-alive connection: once more, fresh
                    continue
                raise self._http_error(exc) from exc
            except (OSError, http.client.HTTPException) as exc:
                self._drop()
                raise self._http_error(exc) from exc
            if resp.will_close:
                self._drop()
            if resp.status >= 300:
                raise self._client_error(op, resp.status, resp.headers, data)
            return resp.status, resp.headers, data
        raise AssertionError("unreachable")

    @staticmethod
    def _http_error(exc: BaseException):
        from botocore.exceptions import HTTPClientError

        return HTTPClientError(error=f"{type(exc).__name__}: {exc}")

    @staticmethod
    def _client_error(op: str, status: int, headers, data: bytes):
        from botocore.exceptions import ClientError

        code, message = str(status), http.client.responses.get(status, "")
        if data.lstrip().startswith(b"<"):
            try:
                root = ET.fromstring(data)
                code = root.findtext("Code") or root.findtext(f"{_S3_NS}Code") or code
                message = root.findtext("Message") or root.findtext(f"{_S3_NS}Message") or message
            except ET.ParseError:
                pass
        meta = {"HTTPStatusCode": status, "HTTPHeaders": {k.lower(): v for k, v in headers.items()}}
        return ClientError({"Error": {"Code": code, "Message": message}, "ResponseMetadata": meta}, op)

    @staticmethod
    def _object_fields(headers) -> dict:
        meta = {k.lower()[len("x-amz-meta-") :]: v for k, v in headers.items() if k.lower().startswith("x-amz-meta-")}
        out = {"Metadata": meta, "ContentLength": int(headers.get("Content-Length") or 0)}
        for field, name in (("ETag", "ETag"), ("VersionId", "x-amz-version-id"), ("ContentRange", "Content-Range")):
            if headers.get(name) is not None:
                out[field] = headers.get(name)
        if headers.get("Last-Modified"):
            out["LastModified"] = _http_date(headers.get("Last-Modified"))
        return out

    # ------------------------------------------------------------------ the calls
    def get_object(self, *, Bucket: str, Key: str, Range: str | None = None, VersionId: str | None = None, **kw):  # noqa: N803
        """Returns botocore's GetObject answer (the fields epochsync reads, ``Body`` in memory); other
        arguments go to botocore."""
        if kw:
            return self._boto.get_object(Bucket=Bucket, Key=Key, **_given(Range=Range, VersionId=VersionId), **kw)
        _, headers, data = self._send("GetObject", "GET", Bucket, Key, _version(VersionId), _given(range=Range))
        out = self._object_fields(headers)
        out["ContentLength"] = len(data)
        out["Body"] = _Body(data)
        self._counters.received(len(data))
        return out

    def head_object(self, *, Bucket: str, Key: str, VersionId: str | None = None, **kw):  # noqa: N803
        """Returns botocore's HeadObject answer (the fields epochsync reads); other arguments go to botocore."""
        if kw:
            return self._boto.head_object(Bucket=Bucket, Key=Key, **_given(VersionId=VersionId), **kw)
        _, headers, _ = self._send("HeadObject", "HEAD", Bucket, Key, _version(VersionId))
        return self._object_fields(headers)

    def put_object(self, *, Bucket: str, Key: str, Body: bytes = b"", Metadata: dict | None = None, **kw):  # noqa: N803
        """Returns botocore's PutObject answer (``ETag``, ``VersionId``); a streamed body or other
        arguments go to botocore."""
        if kw or not isinstance(Body, (bytes, bytearray)):
            return self._boto.put_object(Bucket=Bucket, Key=Key, Body=Body, **_given(Metadata=Metadata), **kw)
        body = bytes(Body)
        h = {f"x-amz-meta-{k}": v for k, v in (Metadata or {}).items()}
        h["content-md5"] = base64.b64encode(hashlib.md5(body).digest()).decode()
        _, headers, _ = self._send("PutObject", "PUT", Bucket, Key, None, h, body)
        return {k: v for k, v in (("ETag", headers.get("ETag")), ("VersionId", headers.get("x-amz-version-id"))) if v}

    def delete_object(self, *, Bucket: str, Key: str, VersionId: str | None = None, **kw):  # noqa: N803
        """Returns botocore's DeleteObject answer (``DeleteMarker``, ``VersionId``); other arguments go to botocore."""
        if kw:
            return self._boto.delete_object(Bucket=Bucket, Key=Key, **_given(VersionId=VersionId), **kw)
        _, headers, _ = self._send("DeleteObject", "DELETE", Bucket, Key, _version(VersionId))
        out: dict[str, Any] = {"DeleteMarker": headers.get("x-amz-delete-marker") == "true"}
        if headers.get("x-amz-version-id"):
            out["VersionId"] = headers.get("x-amz-version-id")
        return out

    def copy_object(
        self,
        *,
        Bucket: str,
        Key: str,
        CopySource: dict,
        MetadataDirective: str | None = None,  # noqa: N803
        Metadata: dict | None = None,
        **kw,
    ):
        """Returns botocore's CopyObject answer (``CopyObjectResult``, ``VersionId``); other arguments go to botocore."""
        if kw or not isinstance(CopySource, dict) or set(CopySource) - {"Bucket", "Key", "VersionId"}:
            extra = _given(MetadataDirective=MetadataDirective, Metadata=Metadata)
            return self._boto.copy_object(Bucket=Bucket, Key=Key, CopySource=CopySource, **extra, **kw)
        src = f"/{_quote(CopySource['Bucket'])}/{_quote(CopySource['Key'], '/~')}"
        if CopySource.get("VersionId"):
            src += f"?versionId={_quote(CopySource['VersionId'])}"
        h = {"x-amz-copy-source": src}
        if MetadataDirective:
            h["x-amz-metadata-directive"] = MetadataDirective
        for k, v in (Metadata or {}).items():
            h[f"x-amz-meta-{k}"] = v
        _, headers, data = self._send("CopyObject", "PUT", Bucket, Key, None, h)
        root = ET.fromstring(data) if data.strip() else None
        if root is not None and root.tag.rsplit("}", 1)[-1] == "Error":  # a copy can fail after its 200
            raise self._client_error("CopyObject", 500, headers, data)  # retryable, as botocore treats it
        result = {}
        if root is not None:
            result = {"ETag": _text(root, "ETag"), "LastModified": _iso(_text(root, "LastModified"))}
        out: dict[str, Any] = {"CopyObjectResult": result}
        if headers.get("x-amz-version-id"):
            out["VersionId"] = headers.get("x-amz-version-id")
        return out

    def list_object_versions(
        self,
        *,
        Bucket: str,
        Prefix: str | None = None,
        KeyMarker: str | None = None,  # noqa: N803
        VersionIdMarker: str | None = None,
        EncodingType: str | None = None,
        Delimiter: str | None = None,
        MaxKeys: int | None = None,
        **kw,
    ):
        """Always asks for ``encoding-type=url`` (a key may hold characters XML 1.0 cannot carry).

        As botocore does: keys and markers come back decoded unless the caller asked for the
        encoding itself (then they are as the store sent them, and ``EncodingType`` says so).
        """
        if kw or EncodingType not in (None, "url"):
            given = _given(
                Prefix=Prefix,
                KeyMarker=KeyMarker,
                VersionIdMarker=VersionIdMarker,
                EncodingType=EncodingType,
                Delimiter=Delimiter,
                MaxKeys=MaxKeys,
            )
            return self._boto.list_object_versions(Bucket=Bucket, **given, **kw)
        q = {"versions": "", "encoding-type": "url"}
        for name, v in (
            ("prefix", Prefix),
            ("key-marker", KeyMarker),
            ("version-id-marker", VersionIdMarker),
            ("delimiter", Delimiter),
            ("max-keys", str(MaxKeys) if MaxKeys else None),
        ):
            if v:
                q[name] = v
        _, _, data = self._send("ListObjectVersions", "GET", Bucket, None, q)
        try:
            root = ET.fromstring(data)
        except ET.ParseError:
            # a store that ignores encoding-type may send characters XML 1.0 forbids: read them as
            # U+FFFD, as stores written in Go do themselves (see s3.listed_key_is)
            root = ET.fromstring(_XML_FORBIDDEN.sub("\ufffd".encode(), data))
        out: dict[str, Any] = {"IsTruncated": _text(root, "IsTruncated") == "true"}
        fields = ("NextKeyMarker", "NextVersionIdMarker", "KeyMarker", "Prefix", "Delimiter", "EncodingType")
        for field in fields:
            if _text(root, field) is not None:
                out[field] = _text(root, field)
        versions, markers, prefixes = [], [], []
        for el in root:
            tag = el.tag.rsplit("}", 1)[-1]
            if tag == "CommonPrefixes":
                prefixes.append({"Prefix": _text(el, "Prefix")})
                continue
            if tag not in ("Version", "DeleteMarker"):
                continue
            v = {
                "Key": _text(el, "Key"),
                "VersionId": _text(el, "VersionId"),
                "IsLatest": _text(el, "IsLatest") == "true",
                "LastModified": _iso(_text(el, "LastModified")),
            }
            if tag == "Version":
                v["Size"] = int(_text(el, "Size") or 0)
                v["ETag"] = _text(el, "ETag")
                versions.append(v)
            else:
                markers.append(v)
        if versions:
            out["Versions"] = versions
        if markers:
            out["DeleteMarkers"] = markers
        if prefixes:
            out["CommonPrefixes"] = prefixes
        if EncodingType is None:
            decode_listing(out)
        return out


def _given(**kw) -> dict:
    """The arguments that were given (not empty), as botocore's keyword arguments or headers."""
    return {k: v for k, v in kw.items() if v}


def _version(version_id: str | None) -> dict | None:
    return {"versionId": version_id} if version_id else None


def _text(el, tag: str) -> str | None:
    found = el.find(f"{_S3_NS}{tag}")
    if found is None:
        found = el.find(tag)
    return None if found is None else (found.text or "")
