"""Measurement prototype (issue 14): the data-path calls obstore can serve, everything else botocore's.

Not a supported client: it exists to measure obstore side by side with ``s3fast`` and botocore
(``EPOCHSYNC_S3_CLIENT=obstore``). obstore (the Rust object_store crate) serves a GET (ranged,
of a given version, user metadata in its attributes), a HEAD with metadata (a GET with
``head``), a PUT with user metadata (returns ETag and version id) and a DELETE of the current
version. It cannot send a copy from a given version or with new metadata, a DELETE of a given
version, a version listing, an UploadPartCopy or a multipart upload it did not start, and it
refuses keys object_store's ``Path`` refuses (control characters, empty segments, ``.``/``..``,
a trailing ``/``): those go to botocore.
"""

from __future__ import annotations

import io
import re
from datetime import timedelta

_STATUS = re.compile(r"status code: (\d{3})")
_CODE = re.compile(r"<Code>([^<]+)</Code>")
_STANDARD = {"Content-Type", "Content-Encoding", "Content-Disposition", "Content-Language", "Cache-Control"}
_BAD_KEY = re.compile(r"[\x00-\x1f\x7f]|//|(^|/)\.\.?(/|$)|/$|^/")


class ObstoreClient:
    def __init__(self, boto_client, settings, counters):
        from obstore.store import S3Store

        self._boto = boto_client
        self._counters = counters
        self._stores: dict[str, object] = {}
        self._settings = settings

    def _store(self, bucket: str):
        st = self._stores.get(bucket)
        if st is None:
            from obstore.store import S3Store

            s = self._settings
            st = self._stores[bucket] = S3Store(
                bucket,
                endpoint=s.endpoint_url,
                access_key_id=s.access_key,
                secret_access_key=s.secret_key,
                region=s.region,
                virtual_hosted_style_request=False,
                client_options={
                    "allow_http": True,
                    "connect_timeout": timedelta(seconds=5),
                    "timeout": timedelta(seconds=60),
                },
                retry_config={"max_retries": 0, "retry_timeout": timedelta(seconds=60)},
                checksum_algorithm="sha256",
            )
        return st

    def __getattr__(self, name: str):
        return getattr(self._boto, name)

    @staticmethod
    def _error(op: str, exc: BaseException):
        from botocore.exceptions import ClientError, HTTPClientError

        text = str(exc)
        m = _STATUS.search(text)
        if m is None:
            if type(exc).__name__ in ("NotFoundError", "FileNotFoundError"):
                status, code = 404, "NoSuchKey"
            else:
                return HTTPClientError(error=f"{type(exc).__name__}: {text[:300]}")
        else:
            status = int(m.group(1))
            c = _CODE.search(text)
            code = c.group(1) if c else str(status)
        if op == "HeadObject" and status == 404:
            code = "404"
        meta = {"HTTPStatusCode": status, "HTTPHeaders": {}}
        return ClientError({"Error": {"Code": code, "Message": text[:300]}, "ResponseMetadata": meta}, op)

    @staticmethod
    def _fields(meta: dict, attributes: dict) -> dict:
        out = {
            "Metadata": {k: v for k, v in attributes.items() if k not in _STANDARD},
            "ContentLength": meta["size"],
            "LastModified": meta["last_modified"],
        }
        if meta.get("e_tag"):
            out["ETag"] = meta["e_tag"]
        if meta.get("version"):
            out["VersionId"] = meta["version"]
        return out

    def get_object(self, *, Bucket, Key, Range=None, VersionId=None, **kw):  # noqa: N803
        if kw or _BAD_KEY.search(Key):
            extra = {k: v for k, v in (("Range", Range), ("VersionId", VersionId)) if v}
            return self._boto.get_object(Bucket=Bucket, Key=Key, **extra, **kw)
        import obstore

        opts: dict = {}
        if VersionId:
            opts["version"] = VersionId
        if Range:
            a, b = Range[len("bytes=") :].split("-")
            opts["range"] = (int(a), int(b) + 1)
        self._counters.sent("GetObject", 0)
        try:
            r = obstore.get(self._store(Bucket), Key, options=opts)
            data = bytes(r.bytes())
        except Exception as exc:
            raise self._error("GetObject", exc) from exc
        out = self._fields(r.meta, r.attributes)
        out["ContentLength"] = len(data)
        out["Body"] = io.BytesIO(data)
        self._counters.received(len(data))
        return out

    def head_object(self, *, Bucket, Key, VersionId=None, **kw):  # noqa: N803
        if kw or _BAD_KEY.search(Key):
            extra = {"VersionId": VersionId} if VersionId else {}
            return self._boto.head_object(Bucket=Bucket, Key=Key, **extra, **kw)
        import obstore

        opts: dict = {"head": True}
        if VersionId:
            opts["version"] = VersionId
        self._counters.sent("HeadObject", 0)
        try:
            r = obstore.get(self._store(Bucket), Key, options=opts)
        except Exception as exc:
            raise self._error("HeadObject", exc) from exc
        return self._fields(r.meta, r.attributes)

    def put_object(self, *, Bucket, Key, Body=b"", Metadata=None, **kw):  # noqa: N803
        if kw or _BAD_KEY.search(Key) or not isinstance(Body, (bytes, bytearray)):
            extra = {"Metadata": Metadata} if Metadata else {}
            return self._boto.put_object(Bucket=Bucket, Key=Key, Body=Body, **extra, **kw)
        import obstore

        self._counters.sent("PutObject", len(Body))
        try:
            r = obstore.put(self._store(Bucket), Key, bytes(Body), attributes=dict(Metadata or {}), use_multipart=False)
        except Exception as exc:
            raise self._error("PutObject", exc) from exc
        return {k: v for k, v in (("ETag", r.get("e_tag")), ("VersionId", r.get("version"))) if v}

    def delete_object(self, *, Bucket, Key, VersionId=None, **kw):  # noqa: N803
        if kw or VersionId or _BAD_KEY.search(Key):
            extra = {"VersionId": VersionId} if VersionId else {}
            return self._boto.delete_object(Bucket=Bucket, Key=Key, **extra, **kw)
        import obstore

        self._counters.sent("DeleteObject", 0)
        try:
            obstore.delete(self._store(Bucket), Key)
        except Exception as exc:
            raise self._error("DeleteObject", exc) from exc
        return {"DeleteMarker": True}
