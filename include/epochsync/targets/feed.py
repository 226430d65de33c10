"""Where a feed target's files live: a directory, or a prefix in an S3 bucket.

:class:`FeedStore` is the small interface :mod:`epochsync.stages.publish` needs: read, write
atomically, list one folder, delete. A write is all or nothing for a reader: on a
directory the bytes go to a hidden temporary file that is fsynced and renamed over the
name (then the directory is fsynced); on S3 one PUT is atomic. :class:`FeedTarget`
lets the rest of the package treat a feed like a replica where that makes sense: its
"manifest" is ``_feed.json`` (the last published epoch), so ``status``, the
preconditions of an epoch run and ``changes`` read a feed's committed epoch the same way.
"""

from __future__ import annotations

import json
import os
import uuid

from epochsync.core.errors import EpochsyncError, StoreError
from epochsync.targets.base import Target

#: the feed's commit point, like a replica's manifest
FEED_DOC = "_feed.json"


class FeedStore:
    """Where a feed's files live: a folder or an S3 prefix; names are relative to its root."""

    def describe(self) -> str:
        """Returns the feed's root for messages (ends with ``/``)."""
        raise NotImplementedError

    def read(self, name: str) -> bytes | None:
        """The bytes of ``name`` (relative to the feed root), None when it does not exist."""
        raise NotImplementedError

    def write(self, name: str, data: bytes) -> None:
        """Replace ``name`` with ``data``; a reader sees the old or the new bytes, never part."""
        raise NotImplementedError

    def list(self, folder: str) -> list[str]:
        """Names of the files directly in ``folder`` (relative to it), sorted; hidden ones left out."""
        raise NotImplementedError

    def delete(self, name: str) -> None:
        """Remove ``name`` (missing is fine)."""
        raise NotImplementedError

    def read_json(self, name: str) -> dict | None:
        """Returns the JSON document ``name``, or None when it does not exist; raises if it is not JSON."""
        data = self.read(name)
        if data is None:
            return None
        try:
            return json.loads(data)
        except ValueError:
            raise EpochsyncError(f"{self.describe()}{name} is not valid JSON") from None

    def write_json(self, name: str, doc: dict) -> None:
        """Replace ``name`` with ``doc`` as indented JSON."""
        self.write(name, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())


def _check(name: str) -> str:
    parts = name.split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise StoreError(f"refusing feed file name {name!r}")
    return name


class PosixFeedStore(FeedStore):
    """A feed in a local or shared folder."""

    def __init__(self, root: str):
        self.root = root

    def describe(self) -> str:
        """Returns the feed folder, with a trailing ``/``."""
        return self.root.rstrip("/") + "/"

    def _path(self, name: str) -> str:
        return os.path.join(self.root, _check(name))

    def read(self, name: str) -> bytes | None:
        """Returns the bytes of ``name``, or None when it does not exist."""
        try:
            with open(self._path(name), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def write(self, name: str, data: bytes) -> None:
        """Replace ``name`` with ``data`` through a temporary file and a rename, fsynced with its folder."""
        path = self._path(name)
        folder = os.path.dirname(path)
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp-{uuid.uuid4().hex[:8]}")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def list(self, folder: str) -> list[str]:
        """Returns the names of the visible files in ``folder`` (no sub-folders, no hidden names), sorted."""
        path = os.path.join(self.root, _check(folder))
        if not os.path.isdir(path):
            return []
        return sorted(n for n in os.listdir(path) if not n.startswith(".") and os.path.isfile(os.path.join(path, n)))

    def delete(self, name: str) -> None:
        """Remove ``name`` (missing is fine)."""
        try:
            os.unlink(self._path(name))
        except FileNotFoundError:
            pass


class S3FeedStore(FeedStore):
    """A feed under an S3 prefix."""

    def __init__(self, settings, bucket: str, prefix: str, *, max_attempts: int = 6):
        from epochsync.stores.s3_access import S3Access

        self.io = S3Access(settings, max_attempts=max_attempts)
        self.bucket = bucket
        self.prefix = prefix or ""
        self._bucket_checked = False

    def describe(self) -> str:
        """Returns ``s3://bucket/prefix``."""
        return f"s3://{self.bucket}/{self.prefix}"

    def _key(self, name: str) -> str:
        return self.prefix + _check(name)

    def read(self, name: str) -> bytes | None:
        """Returns the bytes of ``name``, or None when it (or the bucket) does not exist."""
        from epochsync.stores.s3_access import error_code

        try:
            return self.io.call(
                f"GET {self._key(name)}",
                lambda c: c.get_object(Bucket=self.bucket, Key=self._key(name))["Body"].read(),
            )
        except Exception as exc:
            if error_code(exc) in ("NoSuchKey", "404", "NoSuchBucket", "NotFound"):
                return None
            raise

    def _ensure_bucket(self) -> None:

        if self._bucket_checked:
            return
        from epochsync.stores.s3_access import create_bucket_if_missing

        create_bucket_if_missing(self.io, self.bucket)
        self._bucket_checked = True

    def write(self, name: str, data: bytes) -> None:
        """Replace ``name`` with ``data`` in one PUT (the bucket is created if needed)."""
        self._ensure_bucket()
        key = self._key(name)
        self.io.call(f"PUT {key}", lambda c: c.put_object(Bucket=self.bucket, Key=key, Body=data))

    def list(self, folder: str) -> list[str]:
        """Returns the names of the visible objects right under ``folder`` (none without the bucket), sorted."""
        from epochsync.stores.s3_access import error_code

        base = self.prefix + _check(folder) + "/"
        names = []
        try:
            pages = self.io.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base)
            for page in pages:
                for o in page.get("Contents", []):
                    rest = o["Key"][len(base) :]
                    if rest and "/" not in rest and not rest.startswith("."):
                        names.append(rest)
        except Exception as exc:
            if error_code(exc) in ("NoSuchBucket", "404"):
                return []
            raise
        return sorted(names)

    def delete(self, name: str) -> None:
        """Remove ``name``."""
        key = self._key(name)
        self.io.call(f"DELETE {key}", lambda c: c.delete_object(Bucket=self.bucket, Key=key))


def open_feed_store(cfg) -> FeedStore:
    """The store of a ``kind: feed`` target config."""
    if cfg.path:
        return PosixFeedStore(cfg.path)
    if not cfg.bucket or not cfg.conn_id:
        raise EpochsyncError(f"target {cfg.name}: a feed needs a path, or conn_id and bucket")
    from epochsync.stores.connections import resolve_s3

    return S3FeedStore(resolve_s3(cfg.conn_id), cfg.bucket, cfg.prefix, max_attempts=cfg.max_attempts)


class FeedTarget(Target):
    """A feed seen as a target: its manifest is ``_feed.json``; it holds no replica to walk."""

    kind = "feed"

    def view_status(self) -> dict | None:
        """None: a feed's epoch files are published whole (no replica to view)."""
        return None

    def __init__(self, cfg, store: FeedStore | None = None):
        super().__init__(cfg)
        self.store = store or open_feed_store(cfg)

    def describe(self) -> str:
        """Returns the feed store's root."""
        return self.store.describe()

    def read_manifest(self) -> dict | None:
        """Returns the feed's ``_feed.json`` (its manifest), or None for a feed never published."""
        return self.store.read_json(FEED_DOC)

    def write_manifest(self, doc: dict) -> None:
        """Replace the feed's ``_feed.json`` with ``doc``."""
        self.store.write_json(FEED_DOC, doc)
