"""The ``s3`` target's connection and control area: its keys under the prefix, the bucket, the
manifest, the lease's place and the write fence's instant (the store's clock).

The first class of :class:`epochsync.targets.s3.target.S3Target`'s chain (control, versions,
reads, writes, undo, target), each module one concern of the same objects.
"""

from __future__ import annotations

import json
import time
from datetime import UTC

from epochsync.core.errors import EpochsyncError, StoreError
from epochsync.stores.s3_access import S3Access, create_bucket_if_missing, error_code
from epochsync.targets.base import CONTROL_DIR, Target, held_control, moved_control_dir_error
from epochsync.targets.s3 import naming
from epochsync.targets.s3.naming import key_for

NS = 1_000_000_000


def http_date_ns(value: str | None) -> int | None:
    """An HTTP date (a store's ``Date``) in ns, None if there is none or it is not one date."""
    from email.utils import parsedate_to_datetime

    try:
        return int(parsedate_to_datetime(value).timestamp() * NS) if value else None
    except (TypeError, ValueError):
        return None


class S3Control(Target):
    """An ``s3`` target's bucket, prefix, S3 access and control area (manifest, lease, fence instant)."""

    def __init__(self, cfg, settings=None):
        super().__init__(cfg)
        if not cfg.bucket or not cfg.conn_id:
            raise EpochsyncError(f"target {cfg.name}: an s3 target needs conn_id and bucket")
        if settings is None:
            from epochsync.stores.connections import resolve_s3

            settings = resolve_s3(cfg.conn_id)
        self.bucket = cfg.bucket
        self.prefix = cfg.prefix or ""
        self.io = S3Access(settings, max_attempts=cfg.max_attempts)
        self.striped = bool(cfg.stripe_size and cfg.stripe_count)
        #: key -> what this process's writes made of it (:meth:`take_written`)
        self._written: dict[str, dict] = {}
        #: the replica's layout (:data:`LAYOUT`), known once the manifest was read
        self._layout: int | None = None
        #: the store's ``Server`` header and clock (``Date``) at :meth:`fence_time_ns`
        self.server: str | None = None
        self._store_now_ns: int | None = None

    def describe(self) -> str:
        """Returns ``s3://bucket/prefix``."""
        return f"s3://{self.bucket}/{self.prefix}"

    # ------------------------------------------------------------------ keys
    def key_of(self, path: str, type_: str) -> str:
        """The key (relative to the prefix) that holds ``path`` in the replica's layout."""
        return key_for(path, type_, self.control_dir, self.layout)

    @property
    def layout(self) -> int:
        """The replica's layout: the manifest's ``layout`` (none: 1), :data:`LAYOUT` with no manifest."""
        if self._layout is None:
            self.read_manifest()
        return self._layout if self._layout is not None else naming.LAYOUT

    def _full(self, rel_key: str) -> str:
        if rel_key.startswith("/") or ".." in rel_key.split("/"):
            raise StoreError(f"refusing key {rel_key!r}")
        return self.prefix + rel_key

    def ensure_bucket(self) -> None:
        """Create the bucket if needed and turn versioning on (epochsync relies on it): one request
        when it is there and versioned, none again while this process holds the target's lease."""
        held = self._held()
        if held is not None and held.get("versioned"):
            return
        try:
            status = self.io.call(
                f"GET versioning of {self.bucket}", lambda c: c.get_bucket_versioning(Bucket=self.bucket)
            ).get("Status")
        except Exception as exc:
            if error_code(exc) not in ("404", "NoSuchBucket", "NotFound"):
                raise
            create_bucket_if_missing(self.io, self.bucket)
            status = None
        if status != "Enabled":
            self.io.call(
                f"PUT versioning of {self.bucket}",
                lambda c: c.put_bucket_versioning(Bucket=self.bucket, VersioningConfiguration={"Status": "Enabled"}),
            )
        if held is not None:
            held["versioned"] = True

    # ------------------------------------------------------------------ manifest
    def _control_key(self, name: str, control_dir: str | None = None) -> str:
        return f"{self.prefix}{control_dir or self.control_dir}/{name}"

    def lease_place(self) -> tuple[str, str]:
        """``(where, key)`` of the target's lease: the place that names it (endpoint, bucket, key) and its key."""
        key = self._control_key("lease.json")
        return f"s3:{self.io.settings.endpoint_url or ''}/{self.bucket}/{key}", key

    def _held(self) -> dict | None:
        """What this process keeps of the control area while it holds the target's lease
        (:class:`~epochsync.targets.base.HeldControl`), else None."""
        return held_control(self.lease_place()[0])

    def _note_answer(self, resp: dict) -> None:
        """The store's name (``Server``) and clock (``Date``) from an answer of it (kept under the lease)."""
        headers = resp.get("ResponseMetadata", {}).get("HTTPHeaders", {})
        self.server = headers.get("server") or self.server
        now = http_date_ns(headers.get("date"))
        if now is not None:
            self._store_now_ns = max(self._store_now_ns or 0, now)
        held = self._held()
        if held is not None:
            held["server"] = self.server or held.get("server")
            if now is not None:
                held["store_now_ns"] = max(held.get("store_now_ns") or 0, now)

    def read_manifest(self) -> dict | None:
        """Returns the manifest object's document, or None when it (or the bucket) does not exist.

        Under the target's lease the first read is kept (with the object's LastModified, the
        fence instant's half) and later ones answer from it: no other writer changes the
        manifest meanwhile, and :meth:`write_manifest` keeps what it wrote."""
        held = self._held()
        if held is not None and "manifest" in held:
            doc = held["manifest"]
            self._layout = naming.LAYOUT if doc is None else int(doc.get("layout") or 1)
            return None if doc is None else dict(doc)
        key = self._control_key("manifest.json")

        def fetch(c):
            resp = c.get_object(Bucket=self.bucket, Key=key)
            return resp, resp["Body"].read()

        try:
            resp, data = self.io.call(f"GET s3://{self.bucket}/{key}", fetch)
        except Exception as exc:
            if error_code(exc) in ("NoSuchKey", "404", "NoSuchBucket"):
                legacy = self._control_key("manifest.json", CONTROL_DIR)
                if self.control_dir != CONTROL_DIR and self._last_modified_ns(legacy):
                    old, new = (
                        f"s3://{self.bucket}/{self._control_key('', d)}" for d in (CONTROL_DIR, self.control_dir)
                    )
                    raise moved_control_dir_error(self, f"aws s3 mv --recursive {old} {new}") from None
                self._layout = naming.LAYOUT  # nothing written yet: the current layout from the start
                if held is not None:
                    held.update({"manifest": None, "time:manifest.json": None})
                return None
            raise
        doc = json.loads(data)
        self._layout = int(doc.get("layout") or 1)
        self._note_answer(resp)
        if held is not None:
            held["manifest"] = dict(doc)
            held["time:manifest.json"] = int(resp["LastModified"].astimezone(UTC).timestamp() * NS)
        return doc

    def write_manifest(self, doc: dict) -> None:
        # one PUT is atomic: a reader sees the old or the new manifest
        """Replace the manifest object in one PUT; it says the replica's layout."""
        doc = dict(doc, layout=self.layout)
        body = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
        held = self._held()
        if held is not None:  # the PUT may land even if its answer is lost: nothing kept until it is known
            held.pop("manifest", None)
            held.pop("time:manifest.json", None)
        self.io.call(
            "PUT manifest",
            lambda c: c.put_object(Bucket=self.bucket, Key=self._control_key("manifest.json"), Body=body),
        )
        if held is not None:
            # the answer has no LastModified: the next fence asks for it (a HEAD)
            held["manifest"] = dict(doc)

    def _last_modified_ns(self, key: str) -> int | None:
        try:
            h = self.io.call(f"HEAD {key}", lambda c: c.head_object(Bucket=self.bucket, Key=key))
        except Exception as exc:
            if error_code(exc) in ("NoSuchKey", "404", "NotFound"):
                self._note_answer(getattr(exc, "response", None) or {})  # a 404 has the store's Date too
                return None
            raise
        self._note_answer(h)
        return int(h["LastModified"].astimezone(UTC).timestamp() * 1e9)

    def _control_time_ns(self, name: str) -> int | None:
        """LastModified (ns) of control object ``name``, None if there is none; kept under the lease
        (:meth:`read_manifest` keeps the manifest's, and the writes of this process drop theirs)."""
        held = self._held()
        slot = f"time:{name}"
        if held is not None and slot in held:
            # and what the answers it came from said of the store (another instance may have asked)
            self.server = self.server or held.get("server")
            if held.get("store_now_ns"):
                self._store_now_ns = max(self._store_now_ns or 0, held["store_now_ns"])
            return held[slot]
        t = self._last_modified_ns(self._control_key(name))
        if held is not None:
            held[slot] = t
        return t

    def fence_time_ns(self) -> int | None:
        """Returns the later LastModified of the manifest and the rollback marker (ns), None if neither exists.

        Also notes the store's clock (the answers' ``Date``; under the lease, the latest one
        kept with them, never ahead of the store's) and name (``Server``): see
        :meth:`after_fence_second` and :meth:`conditional_writes`."""
        self._store_now_ns = None
        times = [t for n in ("manifest.json", "rollback.json") if (t := self._control_time_ns(n))]
        return max(times) if times else None

    def now_ns(self) -> int:
        """The store's clock now (its answer's ``Date``, whole seconds), as LastModified reads it."""
        resp = self.io.call(f"HEAD s3://{self.bucket}", lambda c: c.head_bucket(Bucket=self.bucket))
        now = http_date_ns(resp.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date"))
        self._note_answer(resp)
        return now if now is not None else time.time_ns()

    def after_fence_second(self, since_ns: int | None) -> float:
        """Wait until the store's clock is past the second of ``since_ns`` (the fence instant); returns
        the seconds waited (0 almost always: an epoch rarely starts in its predecessor's commit second).

        A conditional write's undo entry (:meth:`undo`) deletes the versions listed as written
        after that instant, and listings give whole seconds: a version this epoch wrote in the
        fence instant's second would look like E-1's and stay."""
        if since_ns is None or self._store_now_ns is None or self._store_now_ns // NS > since_ns // NS:
            return 0.0
        time.sleep(1.0)
        return 1.0

    def mark_rollback(self, epoch: int) -> None:
        """PUT the rollback marker: its LastModified is the new fence instant."""
        body = json.dumps({"rolled_back_epoch": epoch}).encode()
        held = self._held()
        if held is not None:  # its time is the store's: the next fence asks for it
            held.pop("time:rollback.json", None)
        self.io.call(
            "PUT rollback marker",
            lambda c: c.put_object(Bucket=self.bucket, Key=self._control_key("rollback.json"), Body=body),
        )

    #: HEAD (and GET, with hashes) requests a walk keeps in flight: one at a time, a walk of a
    #: few thousand objects spends most of its time waiting on round trips
    WALK_THREADS = 8

    def _in_threads(self, fn, items: list, name: str) -> list:
        """``[fn(i) for i in items]``, ``WALK_THREADS`` at a time when there are several."""
        if len(items) < 2:
            return [fn(i) for i in items]
        from concurrent.futures import ThreadPoolExecutor

        _ = self.io.client  # made once, before the threads share it
        with ThreadPoolExecutor(min(self.WALK_THREADS, len(items)), thread_name_prefix=name) as pool:
            return list(pool.map(fn, items))
