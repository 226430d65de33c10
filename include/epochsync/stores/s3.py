"""Every S3 client epochsync builds, built here, with one retry policy.

The policy (docs/INTERNALS.md, "S3 clients"):

- **Retried**: throttling (``SlowDown``, 503), 5xx answers and dropped or refused
  connections, with exponential backoff and jitter; never a 4xx that says the request is
  wrong (a missing key, a refused precondition, an access error).
- **At most** :data:`MAX_ATTEMPTS` attempts per request (first try included), after which
  the error names the request, the store and the attempts.
- **Who retries**: the data path (targets, the source reads of apply and verify) goes
  through :class:`epochsync.targets.s3.S3Access`, which retries itself, so that every
  attempt is counted in the run's figures; its client has botocore's retries off
  (``counted=True``). Every other client (changelog listing and reads, purge, the
  simulator, the embedded servers' admin) lets botocore retry in its ``standard`` mode
  with the same bound.
- **Timeouts**: :data:`CONNECT_TIMEOUT` s to connect, :data:`READ_TIMEOUT` s per read.
- **Pool**: :data:`POOL_CONNECTIONS` connections per client (an executor's apply threads
  share one client); a caller with more threads asks for more.
- Path-style addressing (MinIO, SeaweedFS, Ceph and AWS all accept it), and the CA
  bundle from ``AWS_CA_BUNDLE`` as botocore reads it.
"""

from __future__ import annotations

from typing import Any

MAX_ATTEMPTS = 5
CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 60.0
POOL_CONNECTIONS = 16


def client_config(
    *, counted: bool = False, max_attempts: int = MAX_ATTEMPTS, pool: int = POOL_CONNECTIONS, lean: bool = False
):
    """The botocore ``Config`` of every epochsync S3 client.

    ``counted``: the caller retries (and counts) itself; botocore then sends each request
    once (``total_max_attempts=1``). Otherwise botocore's ``standard`` retry mode makes at
    most ``max_attempts`` attempts.
    """
    from botocore.config import Config

    retries = {"total_max_attempts": 1 if counted else max_attempts, "mode": "standard"}
    extra = {}
    if lean:
        extra = dict(
            parameter_validation=False,
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
    return Config(
        **extra,
        s3={"addressing_style": "path"},
        retries=retries,
        connect_timeout=CONNECT_TIMEOUT,
        read_timeout=READ_TIMEOUT,
        max_pool_connections=max(1, pool),
    )


def make_client(
    settings: Any,
    *,
    counted: bool = False,
    max_attempts: int = MAX_ATTEMPTS,
    pool: int = POOL_CONNECTIONS,
    lean: bool = False,
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
        config=client_config(counted=counted, max_attempts=max_attempts, pool=pool, lean=lean),
    )
    if lean:
        client.meta.events.register("before-parameter-build.s3.PutObject", _content_md5)
        client.meta.events.register("before-parameter-build.s3.UploadPart", _content_md5)
    return client


def _content_md5(params, **kwargs):
    """``Content-MD5`` on a PUT of bytes that has no checksum of its own: the store refuses a body
    damaged on the way (botocore adds none when ``request_checksum_calculation`` is
    ``when_required``)."""
    body = params.get("Body")
    if isinstance(body, (bytes, bytearray)) and not params.get("ContentMD5") and not params.get("ChecksumAlgorithm"):
        import base64
        import hashlib

        params["ContentMD5"] = base64.b64encode(hashlib.md5(body).digest()).decode()
