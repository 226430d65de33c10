"""Undoing an ``s3`` replica's journaled writes: the versions written since deleted, keys in parallel."""

from __future__ import annotations

import threading

from epochsync.core.errors import EpochsyncError
from epochsync.stores.s3_access import error_code
from epochsync.targets.base import UndoProgress
from epochsync.targets.s3.meta import meta_digest
from epochsync.targets.s3.writes import S3Writes

#: threads of a rollback's undo replay (:meth:`S3Undo.undo_all`): one key per thread at a
#: time; each undo is a version listing and DELETEs, mostly waiting on the store (no more
#: than the shared client's connection pool, ``stores.s3.POOL_CONNECTIONS``)
UNDO_THREADS = 16
#: the undo entries :meth:`S3Undo.undo` knows, each touching only ``entry["key"]``
UNDO_OPS = ("put", "delete", "mpu")


class S3Undo(S3Writes):
    """The undo of an ``s3`` replica's journal entries (:meth:`undo`, :meth:`undo_all`)."""

    # ------------------------------------------------------------------ undo
    def undo_all(self, entries, journal_dir, on_done, before=None, progress=None) -> int:
        """Reverse ``entries`` (replay order: the journal reversed) with keys in parallel; returns how
        many were undone.

        Every entry touches only its own key: ``put``/``delete`` delete the versions of
        ``entry["key"]`` not in ``known``, or written after ``since_ns`` (a copy's source is
        another key with an entry of its own, and only if one of those is the entry's own
        write), ``mpu`` aborts an upload of that key. So the entries are grouped by key, each
        group replayed in the order given by one of :data:`UNDO_THREADS` threads. ``on_done``
        is called (from those threads) only after an entry's undo finished. The first error,
        including an injected fault from ``before``, stops the other groups at their next
        entry; the replay waits for the running undos, then raises that error: what is not
        reported done is left for the next rollback (undo is idempotent).
        """
        entries = list(entries)
        groups: dict[str, list[dict]] = {}
        for entry in entries:
            groups.setdefault(entry.get("key"), []).append(entry)
        if len(groups) < 2 or any(e.get("op") not in UNDO_OPS or not e.get("key") for e in entries):
            # one key, or an entry this replay does not know to be confined to its key: in order
            return super().undo_all(entries, journal_dir, on_done, before, progress)
        from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

        tracker = UndoProgress(len(entries), progress)
        stop = threading.Event()
        first: list[BaseException] = []  # the error that stopped the replay, in time order
        first_lock = threading.Lock()

        def replay(group: list[dict]) -> None:
            for entry in group:
                if stop.is_set():
                    return
                try:
                    if before is not None:
                        before(entry)
                    self.undo(entry, journal_dir)
                    on_done(entry)
                except BaseException as exc:
                    with first_lock:
                        first.append(exc)
                    stop.set()
                    raise
                tracker.step()

        _ = self.io.client  # made once, before the threads share it (boto3 clients are thread-safe)
        pool = ThreadPoolExecutor(min(UNDO_THREADS, len(groups)), thread_name_prefix="s3-undo")
        try:
            futures = [pool.submit(replay, g) for g in groups.values()]
            wait(futures, return_when=FIRST_EXCEPTION)
        finally:
            # an error or a signal (Interrupted, in this thread): no new entry starts; the
            # running ones finish (each is short) before this returns or raises
            stop.set()
            _join_pool(pool)
        if first:
            # others may have failed at the same moment: the first one is the cause
            raise first[0]
        return tracker.done

    def _made_by(self, entry: dict, version: str) -> bool:
        """Is ``version`` of ``entry["key"]`` the write ``entry`` journaled (its metadata's digest)?"""
        key = self._full(entry["key"])
        try:
            h = self.io.call(
                f"HEAD {key} version {version}",
                lambda c: c.head_object(Bucket=self.bucket, Key=key, VersionId=version),
            )
        except Exception as exc:
            if error_code(exc) in ("NoSuchKey", "NoSuchVersion", "404", "NotFound", "405", "MethodNotAllowed"):
                return False
            raise
        return meta_digest(h.get("Metadata") or {}) == entry.get("meta")

    def undo(self, entry: dict, journal_dir: str) -> None:
        """Reverse one undo entry: abort its multipart upload, or delete the key's versions written
        since (the earlier one is current again)."""
        op = entry["op"]
        if op == "mpu":
            key = self._full(entry["key"])
            try:
                self.io.call(
                    f"ABORT multipart {key}",
                    lambda c: c.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=entry["upload_id"]),
                )
            except Exception as exc:
                if error_code(exc) not in ("NoSuchUpload", "404"):
                    raise
            return
        if op not in ("put", "delete"):
            raise EpochsyncError(f"s3 target: unknown undo entry {op!r}")
        now = self.key_versions(entry["key"])
        key = self._full(entry["key"])
        if "known" in entry:
            known = set(entry["known"])
            undone = [vid for vid in now["known"] if vid not in known]
        else:
            # a conditional write (_journal_key): the store let it through only while the key was as
            # at the fence instant, so when it landed every version after that instant is its own
            # or later. When none of them is it (the store refused it with 412, or the process
            # died before sending it), what came after the instant is someone else's: kept
            later = [v for v in now["history"] if v["time_ns"] > entry["since_ns"]]
            ours = any(self._made_by(entry, v["version"]) for v in later if not v["marker"])
            undone = [v["version"] for v in later] if ours else []
        for vid in undone:
            self.io.call(
                f"DELETE {key} version {vid}",
                lambda c, vid=vid: c.delete_object(Bucket=self.bucket, Key=key, VersionId=vid),
            )


def _join_pool(pool) -> None:
    """Shut ``pool`` down and wait for every thread, even when a signal interrupts the wait
    (``Interrupted``, raised in this thread by :func:`epochsync.core.shutdown.signals_raise`):
    the wait goes on, then the signal is raised. A wait cut short would let undo threads run
    on after the rollback has returned. (A parallel ``make test`` found undo threads alive
    right after a rollback raised ``Interrupted``; a signal during this wait is the way to
    that state found in the code, so this closes it. Not reproduced alone.)"""
    from epochsync.core.shutdown import Interrupted

    signal: Interrupted | None = None
    while True:
        try:
            pool.shutdown(wait=True, cancel_futures=True)
            break
        except Interrupted as exc:
            signal = signal or exc
    if signal is not None:
        raise signal
