"""Every S3 client epochsync builds, built here, with one retry policy.

The policy (docs/INTERNALS.md, "S3 clients"):

- **Retried**: throttling (``SlowDown``, 503), 5xx answers and dropped or refused
  connections, with exponential backoff and jitter; never a 4xx that says the request is
  wrong (a missing key, a refused precondition, an access error).
- **At most** :data:`MAX_ATTEMPTS` attempts per request (first try included), after which
  the error names the request, the store and the attempts.
- **Who retries**: the data path (targets, the source reads of apply and verify) goes
  through :class:`epochsync.stores.s3_access.S3Access`, which retries itself, so that every
  attempt is counted in the run's figures; its client has botocore's retries off
  (``counted=True``). Every other client (changelog listing and reads, purge, the
  simulator, the embedded servers' admin) lets botocore retry in its ``standard`` mode
  with the same bound.
- **Timeouts**: :data:`CONNECT_TIMEOUT` s to connect, :data:`READ_TIMEOUT` s per read.
- **Pool**: :data:`POOL_CONNECTIONS` connections per client (an executor's apply threads
  share one client); a caller with more threads asks for more.
- Path-style addressing (MinIO, SeaweedFS, Ceph and AWS all accept it), and the CA
  bundle from ``AWS_CA_BUNDLE`` as botocore reads it.
- **Integrity**: a PUT or UploadPart of bytes carries ``Content-MD5`` (AWS and SeaweedFS check
  it and refuse a body damaged on the way; moto does not); botocore's own checksums are asked for only
  where an operation requires one (``request_checksum_calculation="when_required"``, e.g.
  DeleteObjects), and answers are not checksummed a second time
  (``response_checksum_validation="when_required"``).
- **Listings** a store sends with characters XML 1.0 cannot carry (a key with ``\\x01``,
  from a store that ignores ``encoding-type=url``) are read with U+FFFD in their place, as
  stores written in Go send them (:func:`epochsync.targets.s3.naming.listed_key_is` matches them).
- **Per-request CPU**: botocore spends about 2 ms of CPU per request on this machine
  (s3fast, the hand-signing client it replaced, 0.4 ms; issue 14,
  ``bench/results/s3clients.json``), in its request pipeline (events, the user-agent
  string, endpoint rules, signing, parsing); turning parameter validation off or the
  checksums down saved nothing measurable. Each :class:`~epochsync.stores.s3_access.S3Access`
  builds its client once and shares it between threads. No request is signed by hand.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Any

MAX_ATTEMPTS = 5
CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 60.0
POOL_CONNECTIONS = 16


def client_config(*, counted: bool = False, max_attempts: int = MAX_ATTEMPTS, pool: int = POOL_CONNECTIONS):
    """The botocore ``Config`` of every epochsync S3 client.

    ``counted``: the caller retries (and counts) itself; botocore then sends each request
    once (``total_max_attempts=1``). Otherwise botocore's ``standard`` retry mode makes at most ``max_attempts`` attempts.
    """
    from botocore.config import Config

    retries = {"total_max_attempts": 1 if counted else max_attempts, "mode": "standard"}
    return Config(
        s3={"addressing_style": "path"},
        # SigV4 for the URLs the data path presigns too (``S3Access``): botocore's requests are
        # signed with it already, but its presigned URLs default to SigV2, which moto refuses for a
        # PUT naming both metadata and Content-MD5 (SeaweedFS took both) and AWS is retiring
        signature_version="s3v4",
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        retries=retries,
        connect_timeout=CONNECT_TIMEOUT,
        read_timeout=READ_TIMEOUT,
        max_pool_connections=max(1, pool),
    )


def make_client(
    settings: Any, *, counted: bool = False, max_attempts: int = MAX_ATTEMPTS, pool: int = POOL_CONNECTIONS
):
    """A boto3 S3 client for ``settings`` (anything with ``endpoint_url``, ``access_key``,
    ``secret_key`` and ``region``: :class:`~epochsync.stores.connections.S3Settings`, an
    embedded server's endpoint); returns the client."""
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=settings.endpoint_url,
        aws_access_key_id=settings.access_key,
        aws_secret_access_key=settings.secret_key,
        region_name=settings.region,
        config=client_config(counted=counted, max_attempts=max_attempts, pool=pool),
    )
    events = client.meta.events
    for op in ("PutObject", "UploadPart"):
        events.register(f"before-parameter-build.s3.{op}", content_md5)
    for op in ("PutObject", "CopyObject"):
        events.register(f"before-parameter-build.s3.{op}", take_unmodified_since)
        events.register(f"before-call.s3.{op}", send_unmodified_since)
    for op in ("ListObjectVersions", "ListObjectsV2", "ListObjects"):
        events.register(f"before-parse.s3.{op}", readable_listing)
    return client


def decode_listing(resp: dict) -> dict:
    """URL-decode, in place, the keys and markers of a listing asked for with ``EncodingType=url``.

    Every listing asks for it: a key may hold characters XML 1.0 cannot carry (a file name
    with ``\x01``), which breaks the answer's parsing or comes back altered. Stores that
    honour it say so (``EncodingType: url``); an answer without it is left as sent.
    """
    if resp.get("EncodingType") != "url":
        return resp
    for field in ("Prefix", "Delimiter", "Marker", "NextMarker", "KeyMarker", "NextKeyMarker", "StartAfter"):
        if resp.get(field):
            resp[field] = urllib.parse.unquote_plus(resp[field])
    for group in ("Contents", "Versions", "DeleteMarkers"):
        for item in resp.get(group) or []:
            item["Key"] = urllib.parse.unquote_plus(item["Key"])
    for item in resp.get("CommonPrefixes") or []:
        item["Prefix"] = urllib.parse.unquote_plus(item["Prefix"])
    resp.pop("EncodingType")
    return resp


def content_md5(params: dict, **kwargs) -> None:
    """botocore handler: ``Content-MD5`` on a PUT or UploadPart of bytes that names no checksum."""
    body = params.get("Body")
    if isinstance(body, (bytes, bytearray)) and not params.get("ContentMD5") and not params.get("ChecksumAlgorithm"):
        import base64
        import hashlib

        params["ContentMD5"] = base64.b64encode(hashlib.md5(body).digest()).decode()


#: a PutObject or CopyObject parameter of ours (botocore's models have no such header for
#: them): the HTTP date sent as ``If-Unmodified-Since``, the write's own precondition on the
#: key it writes (SeaweedFS honours it, answering 412; see ``S3Target.probe_conditional_writes``)
IF_UNMODIFIED_SINCE = "EsIfUnmodifiedSince"


def take_unmodified_since(params: dict, context: dict, **kwargs) -> None:
    """botocore handler: move :data:`IF_UNMODIFIED_SINCE` out of the parameters (botocore would
    refuse it) into the request's context."""
    value = params.pop(IF_UNMODIFIED_SINCE, None)
    if value is not None:
        context[IF_UNMODIFIED_SINCE] = value


def send_unmodified_since(params: dict, **kwargs) -> None:
    """botocore handler: the ``If-Unmodified-Since`` header :func:`take_unmodified_since` kept."""
    value = (params.get("context") or {}).get(IF_UNMODIFIED_SINCE)
    if value is not None:
        params["headers"]["If-Unmodified-Since"] = value


#: control characters XML 1.0 cannot carry, even as character references
XML_FORBIDDEN = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f]")
#: the text of a leaf element (a key, a marker, a prefix) that holds a carriage return
_TEXT_WITH_CR = re.compile(rb">([^<]*\r[^<]*)</")


def readable_listing(response_dict: dict, **kwargs) -> None:
    """botocore handler: a listing's body read as the store meant it, before botocore parses it.

    - Characters XML 1.0 forbids get U+FFFD in their place. botocore's own
      ``before-parse.s3.*`` handler runs first and turns a 200 whose body does not parse
      into a 500 (a truncated answer, to be retried): a body that parses once the
      characters are replaced, and is not an ``<Error>``, was that 200.
    - A carriage return in an element's text (a key named ``"cr\\rname"``, from a store that
      does not URL-encode the listing: SeaweedFS's version listings) becomes ``&#13;``: an
      XML parser turns a raw CR into LF (line-end normalization), so the key would come back
      as another key; a character reference keeps it.
    """
    body = response_dict.get("body")
    if not isinstance(body, (bytes, bytearray)):
        return
    if b"\r" in body:
        body = response_dict["body"] = _TEXT_WITH_CR.sub(
            lambda m: b">" + m.group(1).replace(b"\r", b"&#13;") + b"</", body
        )
    if not XML_FORBIDDEN.search(body):
        return
    body = response_dict["body"] = XML_FORBIDDEN.sub("\ufffd".encode(), body)
    if response_dict.get("status_code") == 500:
        import xml.etree.ElementTree as ET

        try:
            root = ET.fromstring(body)
        except ET.ParseError:
            return
        if root.tag.rsplit("}", 1)[-1] != "Error":
            response_dict["status_code"] = 200
