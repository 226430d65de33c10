"""The retrying, counting S3 access both sides of the data plane use: :class:`S3Access`.

The target's writes and the source reads of apply and verify go through it (the retry policy:
:mod:`epochsync.stores.s3`): every attempt counted (:class:`Counters`), retried with backoff
when :func:`is_retryable`, and the small GETs, whole-object PUTs and copies sent by URLs
botocore presigns.
"""

from __future__ import annotations

import os
import random
import re
import threading
import time
import urllib.parse
from collections import defaultdict

from epochsync.core.errors import EpochsyncError, StoreError

RETRYABLE_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestTimeout",
    "RequestTimeoutException",
    "InternalError",
    "ServiceUnavailable",
    "503",
    "500",
    "502",
    "504",
    "RequestLimitExceeded",
}


# --------------------------------------------------------------------------- counting + retries


class Counters:
    """Requests and bytes seen by botocore's events on one client (not estimates).

    ``requests`` counts every HTTP request sent (retries included), ``bytes_sent`` the
    request bodies, ``bytes_received`` the GET response bodies' Content-Length;
    ``bytes_copied`` is added by the caller from the ranges of server-side copies.
    """

    def __init__(self):
        self.requests: dict[str, int] = defaultdict(int)
        self.bytes_sent = 0
        self.bytes_received = 0
        self.bytes_copied = 0
        self.retries = 0
        self._lock = threading.Lock()  # a client may be shared by threads (S3Target.walk)

    def __getstate__(self):
        d = dict(self.__dict__)
        d.pop("_lock", None)
        return d

    def __setstate__(self, d):
        self.__dict__.update(d)
        self._lock = threading.Lock()

    def attach(self, client) -> None:
        """Count every request ``client`` sends and the bytes its GETs return."""
        client.meta.events.register("before-send.s3", self._before_send)
        client.meta.events.register("after-call.s3.GetObject", self._after_get)

    def _before_send(self, request=None, **kwargs):
        op = kwargs.get("event_name", "before-send.s3.?").rsplit(".", 1)[-1]
        body = getattr(request, "body", None)
        sent = 0
        if isinstance(body, (bytes, bytearray)):
            sent = len(body)
        elif body is not None and hasattr(body, "seek") and hasattr(body, "tell"):
            pos = body.tell()
            body.seek(0, 2)
            sent = body.tell() - pos
            body.seek(pos)
        self.sent(op, sent)

    def _after_get(self, http_response=None, parsed=None, **kwargs):
        if parsed and http_response is not None and http_response.status_code < 300:
            self.received(int(parsed.get("ContentLength") or 0))

    def sent(self, op: str, nbytes: int) -> None:
        """One request sent (botocore's ``before-send`` event: every attempt is one)."""
        with self._lock:
            self.requests[op] += 1
            self.bytes_sent += nbytes

    def received(self, nbytes: int) -> None:
        """Count ``nbytes`` received (a client that bypasses botocore reports its own)."""
        with self._lock:
            self.bytes_received += nbytes

    def count(self, *, copied: int = 0, retries: int = 0) -> None:
        """Add server-side copied bytes or retries (threads may share these counters)."""
        with self._lock:
            self.bytes_copied += copied
            self.retries += retries

    def as_dict(self) -> dict:
        """Returns the figures: requests by operation, their total, bytes sent, received and copied, retries."""
        return {
            "requests": dict(self.requests),
            "total_requests": sum(self.requests.values()),
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "bytes_copied": self.bytes_copied,
            "retries": self.retries,
        }

    def add(self, other: dict) -> None:
        """Add another counter's :meth:`as_dict` (an executor's) to these."""
        for k, v in (other.get("requests") or {}).items():
            self.requests[k] += v
        self.bytes_sent += other.get("bytes_sent", 0)
        self.bytes_received += other.get("bytes_received", 0)
        self.bytes_copied += other.get("bytes_copied", 0)
        self.retries += other.get("retries", 0)


def is_retryable(exc: BaseException) -> bool:
    """Throttling, 5xx, timeouts and dropped connections are worth another attempt."""
    from botocore.exceptions import (
        ClientError,
        ConnectionError,
        HTTPClientError,
        IncompleteReadError,
        ResponseStreamingError,
    )

    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        return err.get("Code") in RETRYABLE_CODES or status >= 500 or status == 429
    if isinstance(exc, (ConnectionError, HTTPClientError, IncompleteReadError, ResponseStreamingError)):
        return True
    try:
        from urllib3.exceptions import ProtocolError

        if isinstance(exc, ProtocolError):
            return True
    except ImportError:  # pragma: no cover
        pass
    return isinstance(exc, (ConnectionResetError, TimeoutError))


def error_code(exc: BaseException) -> str | None:
    """Returns the S3 error code of a botocore ``ClientError`` (``NoSuchKey``, ``404``, ...), None for
    any other exception."""
    resp = getattr(exc, "response", None)
    return resp.get("Error", {}).get("Code") if isinstance(resp, dict) else None


#: validity of a presigned URL (:meth:`S3Access.get_range`, :meth:`S3Access.put_object`,
#: :meth:`S3Access.copy_object`): it is used at once
PRESIGNED_SECONDS = 900


def _presigned_request(http, method: str, url: str, headers: dict, body: bytes | None, operation: str):
    """``method`` of a presigned ``url`` through the urllib3 pool ``http``; returns the 2xx answer. A
    connection that fails (refused, reset, timed out) raises botocore's ``HTTPClientError``
    (retryable, as the client's would be); an error answer the ``ClientError`` the client would
    raise for ``operation`` (code from the body, else the HTTP status)."""
    from botocore.exceptions import ClientError, HTTPClientError
    from urllib3.exceptions import HTTPError

    try:
        resp = http.request(method, url, headers=headers, body=body, redirect=False)
    except HTTPError as exc:
        raise HTTPClientError(error=exc) from exc
    if resp.status < 300:
        return resp
    found = re.search(rb"<Code>([^<]*)</Code>", resp.data or b"")
    message = re.search(rb"<Message>([^<]*)</Message>", resp.data or b"")
    error = {
        "Code": found.group(1).decode() if found else str(resp.status),
        "Message": message.group(1).decode(errors="replace") if message else "",
    }
    raise ClientError({"Error": error, "ResponseMetadata": {"HTTPStatusCode": resp.status}}, operation)


def _copy_source(source: dict) -> str | None:
    """The ``x-amz-copy-source`` header of a CopyObject of ``source`` (``Bucket``, ``Key``, optional
    ``VersionId``), encoded as botocore encodes it (and signs it): ``bucket/key`` percent-encoded
    as UTF-8 but for ``/`` and ``-._~``, then ``?versionId=`` and the version as it is. None for a
    source this does not know (an access point ARN, other fields): the client sends that one."""
    from botocore.utils import SAFE_CHARS, percent_encode

    bucket, key = source.get("Bucket"), source.get("Key")
    if set(source) - {"Bucket", "Key", "VersionId"} or not isinstance(bucket, str) or not isinstance(key, str):
        return None
    if ":" in bucket or not bucket:  # an ARN: botocore rewrites it
        return None
    value = percent_encode(f"{bucket}/{key}", safe=SAFE_CHARS + "/")
    if source.get("VersionId") is not None:
        value += f"?versionId={source['VersionId']}"
    return value


def _copy_headers(source: dict, meta: dict) -> dict | None:
    """The signed headers of a presigned CopyObject of ``source`` with ``meta`` (REPLACE), None where
    the client must send it (:func:`_copy_source`; metadata not printable ASCII)."""
    copy_source = _copy_source(source)
    if copy_source is None:
        return None
    headers = {"x-amz-copy-source": copy_source, "x-amz-metadata-directive": "REPLACE"}
    for k, v in meta.items():
        if not (k.isascii() and k.isprintable() and v.isascii() and v.isprintable()):
            return None
        headers[f"x-amz-meta-{k}"] = v
    return headers


def _copy_result(data: bytes | None) -> dict:
    """The ``CopyObjectResult`` (``ETag``, ``LastModified``) of a CopyObject's 200 answer.

    S3 answers a copy 200 before it is done and may then write an ``<Error>`` as the body; a
    body that does not parse is an answer cut short. botocore makes both a 500 (so that they
    are retried) with the body's code, else ``500``; so does this: the ``ClientError`` the
    client would raise."""
    import xml.etree.ElementTree as ET

    from botocore.exceptions import ClientError

    body = (data or b"").strip()
    if not body:
        return {}
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        root = None
    fields = {} if root is None else {c.tag.rsplit("}", 1)[-1]: c.text or "" for c in root}
    if root is not None and root.tag.rsplit("}", 1)[-1] != "Error":
        return {k: v for k, v in fields.items() if k in ("ETag", "LastModified")}
    error = {"Code": fields.get("Code") or "500", "Message": fields.get("Message") or ""}
    raise ClientError({"Error": error, "ResponseMetadata": {"HTTPStatusCode": 500}}, "CopyObject")


def presigned_wanted() -> tuple[bool, bool]:
    """Whether the data path sends its small GETs, its whole-object PUTs and its copies by presigned
    URLs (:meth:`S3Access.get_range`, :meth:`S3Access.put_object`, :meth:`S3Access.copy_object`):
    all unless ``$EPOCHSYNC_S3_PRESIGNED`` is ``0`` (a store that refuses presigned requests:
    every request then goes through the botocore client), the PUTs and copies unless
    ``$EPOCHSYNC_S3_PRESIGNED_PUT`` is ``0`` (for side-by-side runs). Read where the
    :class:`S3Access` is made (the driver); its executors' copies keep the answer."""
    on = os.environ.get("EPOCHSYNC_S3_PRESIGNED", "1").strip() != "0"
    return on, on and os.environ.get("EPOCHSYNC_S3_PRESIGNED_PUT", "1").strip() != "0"


class S3Access:
    """A boto3 client (made lazily, once, shared by the threads of its process) with bounded
    retries and counters: the data path's S3 access (target writes, the source reads of apply
    and verify). Every request is one botocore builds and signs
    (:func:`epochsync.stores.s3.make_client` with ``counted=True``); the small GETs, the
    whole-object PUTs and the CopyObjects are sent by URLs it presigns (:func:`presigned_wanted`).

    botocore's own retries are off: every attempt, including reading the body of a
    ranged GET, goes through :meth:`call`, which backs off exponentially (with
    jitter) on retryable errors and fails clearly after ``max_attempts``.
    """

    #: the kind of source reader (``stages.context.source_access``): ``"s3"``, or ``"gluster"`` for
    #: :class:`epochsync.sources.gluster.reader.CutReader`; S3-only requests are asked for by kind
    kind = "s3"

    def __init__(self, settings, *, max_attempts: int = 6, base_delay: float = 0.05, max_delay: float = 2.0):
        self.settings = settings
        self.max_attempts = max_attempts
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._client = None
        self._http = None
        self._lock = threading.Lock()
        self.counters = Counters()
        self.presigned, self.presigned_put = presigned_wanted()

    def __getstate__(self):
        d = dict(self.__dict__)
        d["_client"] = None
        d["_http"] = None
        d["counters"] = Counters()
        d.pop("_lock", None)
        return d

    def __setstate__(self, d):
        self.__dict__.update(d)
        self._lock = threading.Lock()

    @property
    def client(self):
        """Returns the counted botocore client, built once on first use and shared by the threads."""
        if self._client is None:
            with self._lock:  # threads that ask at once share one client
                if self._client is None:
                    from epochsync.stores.s3 import make_client

                    # counted: botocore sends each request once; every retry is ours, counted and bounded
                    client = make_client(self.settings, counted=True)
                    self.counters.attach(client)
                    self._client = client
        return self._client

    def call(self, what: str, fn, *args, **kwargs):
        """``fn(client, ...)`` with retries; ``what`` names the request in the error."""
        for attempt in range(1, self.max_attempts + 1):
            try:
                return fn(self.client, *args, **kwargs)
            except Exception as exc:
                if not is_retryable(exc):
                    raise
                if attempt == self.max_attempts:
                    raise StoreError(
                        f"{what}: failed after {attempt} attempts against {self.settings.describe()}: "
                        f"{type(exc).__name__}: {exc}"
                    ) from exc
                self.counters.count(retries=1)
                delay = min(self.max_delay, self.base_delay * 2 ** (attempt - 1))
                time.sleep(delay * (0.5 + random.random() / 2))
        raise AssertionError("unreachable")

    def get_range(self, bucket: str, key: str, version: str | None, offset: int, length: int) -> bytes:
        """Bytes ``[offset, offset+length)`` of an object; past its end (or no object): zeros.

        Sent as a presigned GET (:meth:`_presigned_get`) where :meth:`http` allows it: botocore
        signs the URL as its client would, and the request and its answer skip the client's
        event hooks and response parsing, which cost 3.5 ms of CPU per small GET here against
        1.5 ms (579 GETs of 4 KiB from SeaweedFS: 2.0 CPU-s against 0.8-0.9), most of an apply's
        data phase of small files. Counted, retried and failing as a client's GET does."""
        if length <= 0:
            return b""
        http = self.http()

        def fetch(c):
            kw = {"Bucket": bucket, "Key": key, "Range": f"bytes={offset}-{offset + length - 1}"}
            if version:
                kw["VersionId"] = version
            try:
                if http is not None:
                    return self._presigned_get(c, http, kw)
                resp = c.get_object(**kw)
            except Exception as exc:
                if error_code(exc) in ("InvalidRange", "NoSuchKey", "404"):
                    return b""
                raise
            return resp["Body"].read()

        data = self.call(f"GET s3://{bucket}/{key} bytes {offset}+{length}", fetch)
        if len(data) > length:
            data = data[:length]
        return data + bytes(length - len(data))

    def http(self):
        """The connection pool of :meth:`_presigned_get` (urllib3, made once, shared by the threads), or
        None where the client's own requests must be used: no endpoint configured (AWS's, whose
        addressing and redirects the client handles), a proxy set in the environment (botocore
        honours it), or presigned requests switched off (:func:`presigned_wanted`). Certificates
        are checked against the bundle botocore uses."""
        if self._http is None:
            import urllib.request

            endpoint = self.settings.endpoint_url or ""
            if (
                not endpoint.startswith(("http://", "https://"))
                or urllib.request.getproxies()
                or not getattr(self, "presigned", True)
            ):
                self._http = False
            else:
                with self._lock:
                    if self._http is None:
                        import urllib3
                        from botocore.httpsession import get_cert_path

                        from epochsync.stores.s3 import CONNECT_TIMEOUT, POOL_CONNECTIONS, READ_TIMEOUT

                        self._http = urllib3.PoolManager(
                            maxsize=POOL_CONNECTIONS,
                            timeout=urllib3.Timeout(connect=CONNECT_TIMEOUT, read=READ_TIMEOUT),
                            retries=False,  # every retry is ours (call), counted and bounded
                            cert_reqs="CERT_REQUIRED",
                            # the bundle botocore verifies with: AWS_CA_BUNDLE, else certifi's
                            ca_certs=os.environ.get("AWS_CA_BUNDLE") or get_cert_path(True),
                        )
        return self._http or None

    def _presigned_get(self, client, http, kw: dict) -> bytes:
        """One GET of ``kw`` (get_object's parameters) by a URL ``client`` presigns; an error answer
        raises the ``ClientError`` the client would (code from the body, else the HTTP status)."""
        params = {k: v for k, v in kw.items() if k != "Range"}
        url = client.generate_presigned_url("get_object", Params=params, ExpiresIn=PRESIGNED_SECONDS)
        self.counters.sent("GetObject", 0)
        resp = _presigned_request(http, "GET", url, {"Range": kw["Range"]}, None, "GetObject")
        self.counters.received(len(resp.data))
        return resp.data

    def put_object(self, client, bucket: str, key: str, body: bytes, meta: dict, md5: str, precondition: dict) -> dict:
        """One PutObject of ``body`` (``md5``: its base64 ``Content-MD5``, which the store checks) with
        user metadata ``meta`` and ``precondition`` (``IfNoneMatch``, or
        :data:`~epochsync.stores.s3.IF_UNMODIFIED_SINCE`), sent through ``client`` (inside
        :meth:`call`); returns the answer's ``VersionId`` and ``ETag``.

        Sent by a URL botocore presigns where :meth:`http` allows it, as :meth:`get_range`: a small
        PUT through the client's hooks, user agent and response parsing cost 4.4-5.6 ms of CPU
        here, 2.8-3.7 ms this way (400-500 PUTs of 8 KiB with seven metadata fields to SeaweedFS,
        2026-11-29), and the apply of small files is mostly such PUTs. The headers the URL
        names are sent as signed; ``If-Unmodified-Since`` is not a PutObject parameter of
        botocore's, so it goes as a header the signature does not cover (SigV2 and SigV4
        alike allow that). Errors are the client's (``ClientError`` with the store's code)."""
        from epochsync.stores.s3 import IF_UNMODIFIED_SINCE

        http = self.http() if getattr(self, "presigned_put", True) else None
        if http is None:
            return client.put_object(Bucket=bucket, Key=key, Body=body, Metadata=meta, ContentMD5=md5, **precondition)
        params = {"Bucket": bucket, "Key": key, "Metadata": meta, "ContentMD5": md5}
        headers = {f"x-amz-meta-{k}": v for k, v in meta.items()}
        headers["Content-MD5"] = md5
        if "IfNoneMatch" in precondition:
            params["IfNoneMatch"] = headers["If-None-Match"] = precondition["IfNoneMatch"]
        if IF_UNMODIFIED_SINCE in precondition:
            headers["If-Unmodified-Since"] = precondition[IF_UNMODIFIED_SINCE]
        unknown = set(precondition) - {"IfNoneMatch", IF_UNMODIFIED_SINCE}
        if unknown:
            raise EpochsyncError(f"S3Access.put_object: unknown precondition {sorted(unknown)}")
        url = client.generate_presigned_url("put_object", Params=params, ExpiresIn=PRESIGNED_SECONDS)
        self.counters.sent("PutObject", len(body))
        resp = _presigned_request(http, "PUT", url, headers, body, "PutObject")
        return {"VersionId": resp.headers.get("x-amz-version-id"), "ETag": resp.headers.get("ETag")}

    def copy_object(self, client, bucket: str, key: str, source: dict, meta: dict, precondition: dict) -> dict:
        """One CopyObject of ``source`` (``Bucket``, ``Key``, ``VersionId``) to ``key`` with user metadata
        ``meta`` (``MetadataDirective`` REPLACE) and ``precondition`` (``IfNoneMatch``, or
        :data:`~epochsync.stores.s3.IF_UNMODIFIED_SINCE`), sent through ``client`` (inside
        :meth:`call`); returns botocore's answer where the target reads it:
        ``CopyObjectResult.ETag`` and ``VersionId``.

        Sent by a URL botocore presigns (SigV4) where :meth:`http` allows it and the PUTs are
        presigned (:func:`presigned_wanted`), as :meth:`put_object`: the copies of renames and of
        changed small files from their pinned source versions skip the client's hooks and
        response parsing. SigV4 query signing keeps every header botocore would send signed as
        a header (none goes into the query string), so they are sent as botocore would send
        them: ``x-amz-copy-source`` encoded by botocore's rule (:func:`_copy_source`; a key with
        a space, ``+``, ``%``, ``#``, ``?`` or a carriage return comes through), the metadata
        directive, the ``x-amz-meta-*`` fields and ``If-None-Match``; ``If-Unmodified-Since``
        goes unsigned, as :meth:`put_object` sends it. A URL whose signed headers are not
        exactly those (a client signing otherwise), a source that is not a plain bucket and
        key, or metadata that is not printable ASCII is sent by ``client.copy_object`` instead.
        S3 may answer a copy 200 with an ``<Error>`` in the body (an error met after its answer
        began): that raises the ``ClientError`` the client raises for it (:func:`_copy_result`)."""
        from epochsync.stores.s3 import IF_UNMODIFIED_SINCE

        http = self.http() if getattr(self, "presigned_put", True) else None
        headers = None
        if http is not None:
            unknown = set(precondition) - {"IfNoneMatch", IF_UNMODIFIED_SINCE}
            if unknown:
                raise EpochsyncError(f"S3Access.copy_object: unknown precondition {sorted(unknown)}")
            headers = _copy_headers(source, meta)
        if headers is not None:
            params = {
                "Bucket": bucket,
                "Key": key,
                "CopySource": dict(source),
                "MetadataDirective": "REPLACE",
                "Metadata": meta,
            }
            if "IfNoneMatch" in precondition:
                params["IfNoneMatch"] = headers["If-None-Match"] = precondition["IfNoneMatch"]
            url = client.generate_presigned_url("copy_object", Params=params, ExpiresIn=PRESIGNED_SECONDS)
            signed = urllib.parse.quote(";".join(sorted({"host", *(h.lower() for h in headers)})), safe="-._~")
            if f"X-Amz-SignedHeaders={signed}&" in url:
                if IF_UNMODIFIED_SINCE in precondition:
                    headers["If-Unmodified-Since"] = precondition[IF_UNMODIFIED_SINCE]
                self.counters.sent("CopyObject", 0)
                resp = _presigned_request(http, "PUT", url, headers, b"", "CopyObject")
                return {"VersionId": resp.headers.get("x-amz-version-id"), "CopyObjectResult": _copy_result(resp.data)}
        return client.copy_object(
            Bucket=bucket, Key=key, CopySource=source, MetadataDirective="REPLACE", Metadata=meta, **precondition
        )

    def get_all(self, bucket: str, key: str, version: str | None = None) -> bytes:
        """Returns the whole body of ``key`` (at ``version`` if given), with retries."""

        def fetch(c):
            kw = {"Bucket": bucket, "Key": key}
            if version:
                kw["VersionId"] = version
            return c.get_object(**kw)["Body"].read()

        return self.call(f"GET s3://{bucket}/{key}", fetch)


def create_bucket_if_missing(io, bucket: str) -> None:
    """HEAD ``bucket`` through ``io`` (an :class:`S3Access`) and create it when the store says it is absent."""
    try:
        io.call(f"HEAD bucket {bucket}", lambda c: c.head_bucket(Bucket=bucket))
    except Exception as exc:
        if error_code(exc) not in ("404", "NoSuchBucket", "NotFound"):
            raise
        io.call(f"create bucket {bucket}", lambda c: c.create_bucket(Bucket=bucket))
