"""The ``s3`` target, :class:`S3Target`: the chain of its concerns (control, versions, reads,
writes, undo) and what needs them all: the conditional-write probe, the layout upgrade and the
move of the control directory."""

from __future__ import annotations

import json

from epochsync.core.errors import EpochsyncError, StoreError
from epochsync.stores.s3_access import error_code
from epochsync.targets.s3 import naming
from epochsync.targets.s3.control import http_date_ns
from epochsync.targets.s3.naming import XML_BODY_UNSAFE, dir_key, dir_path_of
from epochsync.targets.s3.undo import S3Undo


class S3Target(S3Undo):
    """A replica as objects under a bucket prefix (one per path, or striped); versioned bucket required."""

    kind = "s3"

    #: the answer :meth:`probe_conditional_writes` gives for a store that honours what a
    #: conditional write fence needs
    CONDITIONAL_HOW = "if-unmodified-since"

    def probe_conditional_writes(self) -> dict:
        """Try, on throw-away keys of the control area, the preconditions a conditional write fence
        relies on; returns ``{"how": CONDITIONAL_HOW or None, "server", "failed": what did not hold}``.

        Each must be refused (412) or must succeed, as S3's conditional requests say:
        ``If-None-Match: *`` over a current object (refused) and over none (succeeds);
        ``If-Unmodified-Since`` a date before the current object (refused, a PUT and a
        CopyObject) and the date of its own write's second (succeeds: the store compares whole
        seconds, as the fence's instant has them). AWS S3 and moto do not honour
        ``If-Unmodified-Since`` on a write (moto ignores every precondition of a copy), so
        there the fence stays a listing. 7 requests (the last one deletes the versions the
        probe made, by the ids their answers gave), once per target and store version
        (:meth:`conditional_writes`).
        """
        import uuid

        from botocore.exceptions import ClientError

        from epochsync.stores.s3 import IF_UNMODIFIED_SINCE

        rel = f"{self.control_dir}/probe/conditional-{uuid.uuid4().hex}"
        key, fresh = self._full(rel), self._full(rel + "-new")
        long_ago = "Mon, 01 Jan 2001 00:00:00 GMT"
        failed: list[str] = []
        made: list[tuple[str, str | None]] = []  # (key, version) of every write that landed

        def attempt(what: str, want_refused: bool, written: str, fn) -> None:
            try:
                made.append((written, self.io.call(f"probe: {what}", fn).get("VersionId")))
                refused = False
            except ClientError as exc:
                if error_code(exc) not in ("PreconditionFailed", "412"):
                    raise
                refused = True
            if refused != want_refused:
                failed.append(f"{what} was {'refused' if refused else 'accepted'}")

        done = False
        try:
            first = self.io.call("probe: PUT", lambda c: c.put_object(Bucket=self.bucket, Key=key, Body=b"probe"))
            made.append((key, first.get("VersionId")))
            headers = first.get("ResponseMetadata", {}).get("HTTPHeaders", {})
            self.server = headers.get("server") or self.server
            written_second = headers.get("date") if http_date_ns(headers.get("date")) is not None else None
            attempt(
                "If-None-Match * over an object",
                True,
                key,
                lambda c: c.put_object(Bucket=self.bucket, Key=key, Body=b"x", IfNoneMatch="*"),
            )
            attempt(
                "If-None-Match * over no object",
                False,
                fresh,
                lambda c: c.put_object(Bucket=self.bucket, Key=fresh, Body=b"x", IfNoneMatch="*"),
            )
            attempt(
                "If-Unmodified-Since 2001 over an object",
                True,
                key,
                lambda c: c.put_object(Bucket=self.bucket, Key=key, Body=b"x", **{IF_UNMODIFIED_SINCE: long_ago}),
            )
            attempt(
                "a CopyObject If-Unmodified-Since 2001 over an object",
                True,
                key,
                lambda c: c.copy_object(
                    Bucket=self.bucket,
                    Key=key,
                    CopySource={"Bucket": self.bucket, "Key": fresh},
                    **{IF_UNMODIFIED_SINCE: long_ago},
                ),
            )
            if written_second:
                attempt(
                    "If-Unmodified-Since the second of the object's write",
                    False,
                    key,
                    lambda c: c.put_object(
                        Bucket=self.bucket, Key=key, Body=b"x", **{IF_UNMODIFIED_SINCE: written_second}
                    ),
                )
            else:
                failed.append("the store's answer has no Date")
            done = True
        finally:
            self._drop_probe_keys([rel, rel + "-new"], made if done else None)
        return {"how": None if failed else self.CONDITIONAL_HOW, "server": self.server, "failed": failed}

    def _drop_probe_keys(self, rels: list[str], made: list[tuple[str, str | None]] | None) -> None:
        """Delete every version of the probe's keys: those of ``made`` (full key, version id) in one
        DeleteObjects when the probe ran to its end and the store named each; else (or should that
        request not delete them all) each key's versions listed and deleted, as an undo does."""
        if made and all(v and v != "null" for _, v in made):
            objects = {"Objects": [{"Key": k, "VersionId": v} for k, v in made], "Quiet": True}
            try:
                resp = self.io.call(
                    f"DELETE {len(made)} probe versions",
                    lambda c: c.delete_objects(Bucket=self.bucket, Delete=objects),
                )
                if not resp.get("Errors"):
                    return
            except Exception:  # noqa: BLE001 (a store that refuses versioned DeleteObjects: the listing below)
                pass
        for k in rels:
            self.undo({"op": "put", "key": k, "known": []}, "")

    def conditional_writes(self, cache_path: str | None = None) -> str | None:
        """How this target's writes carry their own fence (:data:`CONDITIONAL_HOW`), or None (the
        fence lists). Probed once per target and store (:meth:`probe_conditional_writes`); the
        answer is kept at ``cache_path`` with the endpoint, the bucket and the store's ``Server``
        header, so another store, bucket or version of the store is probed again."""
        import os

        ident = {"endpoint": self.io.settings.endpoint_url, "bucket": self.bucket, "server": self.server}
        if cache_path and os.path.exists(cache_path):
            try:
                with open(cache_path) as f:
                    doc = json.load(f)
            except (OSError, ValueError):
                doc = {}
            if all(doc.get(k) == v for k, v in ident.items()):
                return doc.get("how")
        found = self.probe_conditional_writes()
        if cache_path:
            from epochsync.warehouse.fs import write_json_atomic

            os.makedirs(os.path.dirname(cache_path), exist_ok=True)
            write_json_atomic(cache_path, {**ident, "server": found["server"], **found})
        return found["how"]

    def upgrade_layout(self, progress=None) -> int:
        """Move a layout-1 replica to :data:`LAYOUT` before an epoch writes it; returns the directory
        objects moved (0: already there).

        Every ``<path>/.epochsync-dir`` object (and the root's ``.epochsync-dir``) is copied
        server-side, metadata and all, to :func:`dir_key` of its directory, then deleted; the
        manifest, rewritten with ``layout: 2`` (same epoch), comes last, so its time stays the
        write fence's instant after the move, and a move killed half way is finished by the
        next run (copies and deletes are idempotent; the manifest still says layout 1 until
        then). The caller holds the target's lease and has rolled back any unfinished epoch
        (its journal names layout-1 keys).
        """
        doc = self.read_manifest()
        if doc is None or self.layout >= naming.LAYOUT:
            return 0
        old = sorted(
            (rel, d)
            for rel in (o["Key"][len(self.prefix) :] for o in self.list_keys())
            if (d := dir_path_of(rel, self.control_dir, 1)) is not None
        )
        if progress:
            progress(f"{self.describe()}: moving {len(old):,} directory object(s) to layout {naming.LAYOUT}")

        def move(item: tuple[str, str]) -> None:
            rel, d = item
            src = {"Bucket": self.bucket, "Key": self._full(rel)}
            dst = self._full(dir_key(d, self.control_dir))
            self.io.call(
                f"COPY {rel} -> {dst}",
                lambda c: c.copy_object(Bucket=self.bucket, Key=dst, CopySource=src, MetadataDirective="COPY"),
            )

        self._in_threads(move, old, "s3-layout")
        keys = [self._full(rel) for rel, _ in old]
        alone = [k for k in keys if XML_BODY_UNSAFE.search(k)]
        batch = [k for k in keys if k not in set(alone)]
        for k in alone:
            self.io.call(f"DELETE {k}", lambda c, k=k: c.delete_object(Bucket=self.bucket, Key=k))
        for start in range(0, len(batch), self.DELETE_BATCH):
            objects = [{"Key": k} for k in batch[start : start + self.DELETE_BATCH]]
            chunk = {"Objects": objects, "Quiet": True}
            resp = self.io.call(
                f"DELETE {len(objects)} layout-1 directory objects",
                lambda c, chunk=chunk: c.delete_objects(Bucket=self.bucket, Delete=chunk),
            )
            if resp.get("Errors"):
                e = resp["Errors"][0]
                raise StoreError(
                    f"{self.describe()}: DeleteObjects: {e.get('Key')}: {e.get('Code')} {e.get('Message') or ''}"
                )
        self._layout = naming.LAYOUT
        self.write_manifest(doc)
        return len(old)

    def move_control_dir(self, old: str) -> str:
        """Server-side copies of every current object under ``old/`` (the manifest last), then the
        deletes (the manifest first): a move killed half way is finished by running it again.
        Returns a line saying what moved."""
        if old == self.control_dir:
            raise EpochsyncError(f"target {self.name}: the control directory is already {old!r}")
        rels = sorted(o["Key"][len(self.prefix) + len(old) + 1 :] for o in self.list_keys(old + "/"))
        if not rels:
            if self._last_modified_ns(self._control_key("manifest.json")):
                return f"{self.describe()}{self.control_dir}/ already holds the manifest; nothing to move"
            raise EpochsyncError(f"target {self.name}: nothing under {self.describe()}{old}/ to move")
        first = [r for r in rels if r != "manifest.json"] + [r for r in rels if r == "manifest.json"]
        for rel in first:
            src = {"Bucket": self.bucket, "Key": self._control_key(rel, old)}
            self.io.call(
                f"COPY {old}/{rel}",
                lambda c, src=src, rel=rel: c.copy_object(
                    Bucket=self.bucket, Key=self._control_key(rel), CopySource=src
                ),
            )
        for rel in reversed(first):
            key = self._control_key(rel, old)
            self.io.call(f"DELETE {key}", lambda c, key=key: c.delete_object(Bucket=self.bucket, Key=key))
        return f"moved {len(rels)} object(s) from {self.describe()}{old}/ to {self.describe()}{self.control_dir}/"
