"""Writing an ``s3`` replica: every mutation journaled first, fenced by a listing or by its own
precondition (a conditional write), and the version it made kept as verify's fact."""

from __future__ import annotations

import base64
import hashlib
import time
from typing import Any

from epochsync.core.errors import EpochsyncError, FenceError, StoreError
from epochsync.stores.s3_access import RETRYABLE_CODES, error_code
from epochsync.targets.base import drain
from epochsync.targets.s3.control import NS
from epochsync.targets.s3.meta import META_LIMIT, attrs_sidecar, encode_meta, meta_digest, meta_size
from epochsync.targets.s3.naming import XML_BODY_UNSAFE
from epochsync.targets.s3.reads import S3Reads
from epochsync.targets.s3.versions import bare_etag, both_versions


class S3Writes(S3Reads):
    """The mutations of an ``s3`` replica: PUTs, copies, deletes, multipart uploads, the plan's operations."""

    # ------------------------------------------------------------------ mutations
    def _journal_key(
        self, journal, op: str, rel_key: str, state: dict, *, whole: bool = False, meta: dict | None = None
    ) -> dict:
        """Journal ``op`` of ``rel_key`` before it is made; returns the precondition the request carries
        (its keyword arguments; none: the fence listed the key).

        ``whole``: the write replaces the object whatever it was (a PUT of a whole body, a copy).
        Such a write of a key the fence left to the store (``state``: a ``condition``) carries
        ``If-None-Match: *`` (absent at E-1) or ``If-Unmodified-Since`` the fence instant (present),
        and its undo entry says that instant instead of the versions the key had, and the
        digest of the write's ``meta``: the undo deletes the versions written after that
        instant if one of them is this write (:meth:`undo`). Any other mutation of such a key
        lists it first, as the fence would have."""
        from email.utils import formatdate

        from epochsync.stores.s3 import IF_UNMODIFIED_SINCE

        known = state.get(rel_key)
        cond = (known or {}).get("condition")
        if cond is not None and whole and op == "put":
            journal.append({"op": "put", "key": rel_key, "since_ns": cond["since_ns"], "meta": meta_digest(meta or {})})
            if cond["present"]:
                return {IF_UNMODIFIED_SINCE: formatdate(cond["since_ns"] / NS, usegmt=True)}
            return {"IfNoneMatch": "*"}
        if known is None or cond is not None:
            known = self.key_versions(rel_key)
            state[rel_key] = known
        journal.append({"op": op, "key": rel_key, "known": known["known"]})
        return {}

    def _conditional_write(self, what: str, send, rel_key: str, precondition: dict, meta: dict, etag):
        """``send(client, precondition)`` (a PUT or a copy of ``rel_key``), with a 412 told apart.

        - An earlier attempt of this very request landed and its answer was lost (a retry
          finds its own object: same metadata, and ETag when known): the HEAD of it is the
          answer.
        - ``If-None-Match: *`` refused where the key has no current object: SeaweedFS refuses
          it where its filer keeps a directory of the key's name (the versions of keys below
          it, deleted long ago: a directory that became a file). The listing just made is
          the fence the key would have had (nothing there), so the write goes again without it.
        - Anything else: someone wrote the key after the fence instant, and the epoch fails,
          naming the key with both its versions. Its undo entry then deletes nothing: no
          version after the instant is this write (:meth:`undo`).
        """
        from botocore.exceptions import ClientError

        try:
            return self.io.call(what, lambda c: send(c, precondition))
        except ClientError as exc:
            if not precondition or error_code(exc) not in ("PreconditionFailed", "412"):
                raise
        h = self.head(rel_key)
        if h is not None and h.get("Metadata") == meta and (etag is None or bare_etag(h.get("ETag")) == etag):
            return h
        now = self.key_versions(rel_key)
        if "IfNoneMatch" in precondition and now["current"] is None:
            return self.io.call(what, lambda c: send(c, {}))
        since = next(iter(self._condition_since(precondition)), None)
        raise FenceError(
            f"write fence: {self.describe()}{rel_key} was changed by someone else since the last commit: the store "
            f"refused this epoch's conditional write of it (412 Precondition Failed: "
            f"{', '.join(sorted(precondition))}){both_versions(now['current'], now['history'], since)}. "
            "The epoch fails and is rolled back; that key is left as it is. Restore it or re-hydrate the target."
        )

    @staticmethod
    def _condition_since(precondition: dict) -> list[int]:
        """The fence instant (ns) an ``If-Unmodified-Since`` precondition names, if it has one."""
        from email.utils import parsedate_to_datetime

        from epochsync.stores.s3 import IF_UNMODIFIED_SINCE

        if IF_UNMODIFIED_SINCE not in precondition:
            return []
        return [int(parsedate_to_datetime(precondition[IF_UNMODIFIED_SINCE]).timestamp() * NS)]

    def check_meta(self, rel_key: str, meta: dict) -> None:
        """Refuse metadata S3 would refuse (:data:`META_LIMIT`), before anything is written."""
        n = meta_size(meta)
        if n > META_LIMIT:
            raise StoreError(
                f"{self.describe()}: metadata of {rel_key!r} is {n} bytes; S3 allows {META_LIMIT} "
                "(attributes that do not fit belong in the fid's attribute sidecar)"
            )

    def _wrote(self, rel_key: str, resp: dict, meta: dict, size: int, **extra) -> None:
        """Remember the version a PUT, copy or multipart upload made (from its response), the
        metadata and size it was given and the store's ETag (``extra``: what else the writer
        knows of the bytes): verify's facts, instead of a HEAD and a read of the key."""
        resp = resp or {}
        version = resp.get("VersionId")
        if version:
            fact = {"version": version, "meta": meta, "size": size}
            etag = extra.pop("etag", None) or bare_etag(resp.get("ETag"))
            if etag:
                fact["etag"] = etag
            fact.update(extra)
            self._written[rel_key] = fact
        else:
            self._written.pop(rel_key, None)

    def last_written(self, rel_key: str) -> dict | None:
        """What this process's last write of ``rel_key`` made (``{version, meta, size}``), if not taken yet."""
        return self._written.get(rel_key)

    def take_written(self) -> dict[str, dict]:
        """The versions this process wrote since the last call, key -> ``{version, meta, size}``,
        and forget them (threads may be writing: one atomic ``popitem`` at a time)."""
        return drain(self._written)

    def copy(self, journal, state: dict, rel_key: str, src_key: str, meta: dict, size: int) -> None:
        """Server-side copy of the E-1 version of ``src_key`` to ``rel_key`` with new metadata."""
        src = state.get(src_key) or self.key_versions(src_key)
        state.setdefault(src_key, src)
        if src["current"] is None:
            raise StoreError(f"{self.describe()}: cannot copy {src_key}: it has no current version")
        cur = src["current"]
        # the version copied and its ETag (the fence's listing, or the write that made it): the
        # copy holds its bytes when the copy's ETag is that one (stages.verify)
        copy_of = {"key": src_key, "version": cur["version"], "etag": cur.get("etag")}
        source = {"Bucket": self.bucket, "Key": self._full(src_key), "VersionId": cur["version"]}
        self._copy(journal, state, rel_key, source, f"COPY {src_key} -> {rel_key}", meta, size, copy_of=copy_of)

    def _copy(
        self,
        journal,
        state: dict,
        rel_key: str,
        source: dict,
        what: str,
        meta: dict,
        size: int,
        *,
        stated_length: bool = False,
        **fact,
    ) -> None:
        """CopyObject of ``source`` (bucket, key, version) to ``rel_key`` with ``meta``, journaled first;
        ``fact``: what the copy's fact says it copied. ``stated_length``: ``size`` is the source
        version's length as the source stated it (:meth:`copy_from_source`), not only the plan's."""
        self.check_meta(rel_key, meta)
        precondition = self._journal_key(journal, "put", rel_key, state, whole=True, meta=meta)

        def send(c, precondition: dict):
            return self.io.copy_object(c, self.bucket, self._full(rel_key), source, meta, precondition)

        resp = self._conditional_write(what, send, rel_key, precondition, meta, None)
        etag = bare_etag((resp.get("CopyObjectResult") or {}).get("ETag") or resp.get("ETag"))
        self.io.counters.count(copied=size)
        # "conditional" in the fact, as a PUT's, only when ``size`` is the source version's stated
        # length: else it is what the plan says, and verify's listing gives the store's (a source
        # version shorter than its file is caught by that)
        if precondition and stated_length:
            fact["conditional"] = True
        self._wrote(rel_key, resp, meta, size, etag=etag, **fact)

    def put(self, journal, state: dict, rel_key: str, body: bytes, meta: dict, *, source: dict | None = None) -> None:
        """PUT ``body`` with ``meta`` at ``rel_key``, journaled first; the version written is kept as a
        fact with the body's MD5 (computed here; the request carries it as ``Content-MD5``, which
        the store checks) and the store's ETag, and ``source``: the plan's source objects the
        body was read whole from (``stages.verify`` then needs no read of it)."""
        self.check_meta(rel_key, meta)
        md5 = hashlib.md5(body).hexdigest()
        precondition = self._journal_key(journal, "put", rel_key, state, whole=True, meta=meta)

        content_md5 = base64.b64encode(bytes.fromhex(md5)).decode()

        def send(c, precondition: dict):
            return self.io.put_object(c, self.bucket, self._full(rel_key), body, meta, content_md5, precondition)

        resp = self._conditional_write(f"PUT {rel_key}", send, rel_key, precondition, meta, md5)
        extra: dict[str, Any] = {"md5": md5}
        if precondition:
            extra["conditional"] = True
        if source is not None:
            extra["source"] = source
        self._wrote(rel_key, resp, meta, len(body), **extra)

    def copy_from_source(
        self, journal, state: dict, rel_key: str, bucket: str, obj: dict, meta: dict, size: int
    ) -> None:
        """Server-side copy of a pinned source object version (``obj``: ``{key, version}`` in the source
        ``bucket`` of the same store, and ``size``: the version's length when the source stated it)
        to ``rel_key`` with ``meta``, journaled first: a whole file that is exactly that version, no
        byte through the client. The fact says what it was copied from; a conditional copy of a
        version whose stated length is ``size`` is a conditional write's fact (verify lists it not)."""
        source = {"Bucket": bucket, "Key": obj["key"], "VersionId": obj["version"]}
        what = f"COPY s3://{bucket}/{obj['key']}@{obj['version']} -> {rel_key}"
        copied = {"bucket": bucket, "key": obj["key"], "version": obj["version"]}
        stated = obj.get("size") is not None and int(obj["size"]) == size
        self._copy(journal, state, rel_key, source, what, meta, size, stated_length=stated, copied_from=copied)

    def delete(self, journal, state: dict, rel_key: str) -> None:
        """DELETE ``rel_key``, journaled first."""
        self._journal_key(journal, "delete", rel_key, state)
        self._written.pop(rel_key, None)
        self.io.call(f"DELETE {rel_key}", lambda c: c.delete_object(Bucket=self.bucket, Key=self._full(rel_key)))

    #: keys per DeleteObjects request (S3's limit)
    DELETE_BATCH = 1000

    def delete_many(self, journal, state: dict, rel_keys: list[str]) -> None:
        """Delete keys with one DeleteObjects request per :data:`DELETE_BATCH` keys (a delete marker
        each, as :meth:`delete` makes). Every key's undo entry is durable before the request;
        keys the store answers with a retryable error are sent again, any other error fails.
        A key the request's XML cannot carry as it is (:data:`XML_BODY_UNSAFE`) is deleted
        on its own."""
        for k in [k for k in rel_keys if XML_BODY_UNSAFE.search(k)]:
            self.delete(journal, state, k)
        rel_keys = [k for k in rel_keys if not XML_BODY_UNSAFE.search(k)]
        missing = [k for k in rel_keys if k not in state]
        state.update(self.versions_of(missing))
        for start in range(0, len(rel_keys), self.DELETE_BATCH):
            chunk = rel_keys[start : start + self.DELETE_BATCH]
            journal.append_many([{"op": "delete", "key": k, "known": state[k]["known"]} for k in chunk])
            for k in chunk:
                self._written.pop(k, None)
            pending = [self._full(k) for k in chunk]
            for attempt in range(1, self.io.max_attempts + 1):
                objects = {"Objects": [{"Key": k} for k in pending], "Quiet": True}
                resp = self.io.call(
                    f"DELETE {len(pending)} keys ({chunk[0]}...)",
                    lambda c, objects=objects: c.delete_objects(Bucket=self.bucket, Delete=objects),
                )
                errors = resp.get("Errors") or []
                if not errors:
                    break
                retry = [e for e in errors if e.get("Code") in RETRYABLE_CODES]
                if len(retry) < len(errors) or attempt == self.io.max_attempts:
                    e = next((e for e in errors if e.get("Code") not in RETRYABLE_CODES), errors[0])
                    raise StoreError(
                        f"{self.describe()}: DeleteObjects: {e.get('Key')}: {e.get('Code')} {e.get('Message') or ''}"
                        f" ({len(errors)} of {len(pending)} key(s) not deleted, after {attempt} attempt(s))"
                    )
                self.io.counters.count(retries=1)
                pending = [e["Key"] for e in retry]
                time.sleep(min(self.io.max_delay, self.io.base_delay * 2 ** (attempt - 1)))

    def multipart(
        self, journal, state: dict, rel_key: str, parts: list[dict], meta: dict, read_upload, *, pulled_from=None
    ) -> None:
        """Build a new version from parts: ``{"copy": [a, b)}`` from the key's E-1 version or
        ``{"upload": [a, b)}`` whose bytes ``read_upload(a, b)`` returns. Each part is a mutation.

        The version's fact keeps each part: its range and the store's ETag of it, the version a
        copied part was copied from, and the MD5 of an uploaded part's bytes (computed here; the
        request carries it as ``Content-MD5``, which the store checks); and ``pulled_from``, the
        ``[key, version]`` of every source object version the uploaded bytes were pulled from
        (``stages.verify.covered``)."""
        self.check_meta(rel_key, meta)
        self._journal_key(journal, "put", rel_key, state)
        key = self._full(rel_key)
        cur = (state.get(rel_key) or {}).get("current")
        base_key = parts[0].get("base") if parts else None
        if base_key is not None and base_key != rel_key:
            src = state.get(base_key) or self.key_versions(base_key)
            state.setdefault(base_key, src)
            cur = src["current"]
        up = self.io.call(
            f"CREATE multipart {rel_key}",
            lambda c: c.create_multipart_upload(Bucket=self.bucket, Key=key, Metadata=meta),
        )
        upload_id = up["UploadId"]
        journal.append({"op": "mpu", "key": rel_key, "upload_id": upload_id})
        done = []
        made: list[dict] = []  # the fact's parts
        for n, part in enumerate(parts, start=1):
            journal.tick(f"part {n} of {rel_key}")
            if "copy" in part:
                a, b = part["copy"]
                copy_source = {"Bucket": self.bucket, "Key": self._full(part.get("base") or rel_key)}
                if cur is not None:
                    copy_source["VersionId"] = cur["version"]
                r = self.io.call(
                    f"UploadPartCopy {rel_key} part {n}",
                    lambda c, copy_source=copy_source, a=a, b=b, n=n: c.upload_part_copy(
                        Bucket=self.bucket,
                        Key=key,
                        UploadId=upload_id,
                        PartNumber=n,
                        CopySource=copy_source,
                        CopySourceRange=f"bytes={a}-{b - 1}",
                    ),
                )
                self.io.counters.count(copied=b - a)
                done.append({"PartNumber": n, "ETag": r["CopyPartResult"]["ETag"]})
                copied_from = {"key": part.get("base") or rel_key, "version": copy_source.get("VersionId")}
                made.append({"copy": [a, b], "from": copied_from, "etag": bare_etag(r["CopyPartResult"]["ETag"])})
            else:
                a, b = part["upload"]
                body = read_upload(a, b)
                made.append({"upload": [a, b], "md5": hashlib.md5(body).hexdigest()})
                r = self.io.call(
                    f"UploadPart {rel_key} part {n}",
                    lambda c, body=body, n=n: c.upload_part(
                        Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=n, Body=body
                    ),
                )
                done.append({"PartNumber": n, "ETag": r["ETag"]})
                made[-1]["etag"] = bare_etag(r["ETag"])
        resp = self.io.call(
            f"COMPLETE multipart {rel_key}",
            lambda c: c.complete_multipart_upload(
                Bucket=self.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": done}
            ),
        )
        size = max(_part_end(p) for p in parts) if parts else 0
        fact: dict[str, Any] = {"parts": made}
        if pulled_from is not None:
            fact["pulled_from"] = [list(kv) for kv in pulled_from]
        self._wrote(rel_key, resp, meta, size, **fact)

    def op_keys(self, op: dict) -> tuple[set[str], set[str]]:
        """Keys a namespace or post operation reads and writes: one object each, so
        :func:`epochsync.stages.apply.run_in_order` may run independent ones concurrently."""
        return ({op["src"]} if op["op"] == "copy" else set()), {op["key"]}

    def run_namespace_op(self, op: dict, journal, state: dict) -> None:
        """Run one namespace operation (delete, copy, put_empty, put_attrs), journaled first."""
        kind = op["op"]
        if kind == "delete":
            self.delete(journal, state, op["key"])
        elif kind == "copy":
            self.copy(journal, state, op["key"], op["src"], encode_meta(op["attrs"]), int(op.get("size") or 0))
        elif kind == "put_empty":
            self.put(journal, state, op["key"], b"", encode_meta(op["attrs"]))
        elif kind == "put_attrs":  # a fid's attribute sidecar
            body = attrs_sidecar(op["attrs"])
            if body is None:
                raise EpochsyncError(f"s3 target: {op['key']}: these attributes need no sidecar")
            self.put(journal, state, op["key"], body, {})
        else:
            raise EpochsyncError(f"s3 target: unknown namespace operation {kind!r}")

    def run_post_op(self, op: dict, journal, state: dict) -> None:
        """Run one post operation (a delete, or a namespace-like operation), journaled first."""
        if op["op"] == "delete":
            self.delete(journal, state, op["key"])
        else:
            self.run_namespace_op(op, journal, state)


def _part_end(part: dict) -> int:
    """Where a part plan's entry ends in the object: its copied or its uploaded range's end."""
    span = part.get("copy") or part.get("upload")
    assert span is not None, part  # a part is copied or uploaded (translate.part_plan)
    return int(span[1])
