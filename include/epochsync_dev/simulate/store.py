"""The simulated source's object store: every object version a workload writes, in an S3 bucket."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from epochsync.core.errors import StoreError

#: The simulated source's root directory fid (Lustre's well-known root).
from epochsync_dev.simulate.workload import Upload


class SourceStore:
    """The simulated source's versioned bucket: stores object versions with a thread pool.

    Versions of one key are stored in order by one thread (so the newest version is the
    last write); different keys go in parallel.
    """

    def __init__(self, settings: Any, bucket: str, *, threads: int = 16):
        from epochsync.stores.s3 import make_client

        self.bucket = bucket
        self.where = settings.describe()
        self.threads = max(1, threads)
        self.client = make_client(settings, pool=self.threads + 4)

    def _fail(self, what: str, exc: Exception) -> StoreError:
        return StoreError(f"source store {self.where}, bucket {self.bucket!r}: {what}: {exc}")

    def ensure_versioned_bucket(self) -> None:
        """Create the bucket if needed and enable versioning (checked, not assumed)."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            try:
                self.client.create_bucket(Bucket=self.bucket)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise
            self.client.put_bucket_versioning(Bucket=self.bucket, VersioningConfiguration={"Status": "Enabled"})
            status = self.client.get_bucket_versioning(Bucket=self.bucket).get("Status")
        except (BotoCoreError, ClientError) as exc:
            raise self._fail("cannot create or version the bucket", exc) from None
        if status != "Enabled":
            raise StoreError(f"source store {self.where}: bucket {self.bucket!r} did not enable versioning ({status})")

    def put_versions(self, uploads: list[Upload], progress: Callable[[str], None] | None = None) -> dict[str, str]:
        """Store every upload; returns ``{token: VersionId}``. ``progress`` gets a line every 10 s."""
        from concurrent.futures import ThreadPoolExecutor

        from botocore.exceptions import BotoCoreError, ClientError

        by_key: dict[str, list[Upload]] = {}
        for u in uploads:
            by_key.setdefault(u.key, []).append(u)

        def put_all(items: list[Upload]) -> list[tuple[str, str]]:
            out = []
            for u in items:
                try:
                    resp = self.client.put_object(Bucket=self.bucket, Key=u.key, Body=u.data)
                except (BotoCoreError, ClientError) as exc:
                    raise self._fail(f"PUT {u.key}", exc) from None
                version = resp.get("VersionId")
                if not version or version == "null":
                    raise StoreError(f"source store {self.where}: PUT {u.key} returned no version id (not versioned?)")
                out.append((u.token, version))
            return out

        versions: dict[str, str] = {}
        started = last = time.monotonic()
        with ThreadPoolExecutor(self.threads) as pool:
            for pairs in pool.map(put_all, by_key.values()):
                versions.update(pairs)
                if progress and time.monotonic() - last > 10:
                    last = time.monotonic()
                    rate = len(versions) / (last - started)
                    progress(f"stored {len(versions):,}/{len(uploads):,} object versions ({rate:,.0f}/s)")
        return versions

    def delete(self, keys: list[str]) -> None:
        """Delete keys (a delete marker each; their versions stay readable)."""
        from botocore.exceptions import BotoCoreError, ClientError

        for i in range(0, len(keys), 1000):
            chunk = keys[i : i + 1000]
            try:
                resp = self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in chunk], "Quiet": True}
                )
            except (BotoCoreError, ClientError) as exc:
                raise self._fail(f"DELETE {len(chunk)} keys", exc) from None
            if resp.get("Errors"):
                err = resp["Errors"][0]
                raise StoreError(f"source store {self.where}: DELETE {err.get('Key')}: {err.get('Message')}")
