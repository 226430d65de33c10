"""One writer per target: a lease taken before any stage writes a target or its warehouse state.

Every stage that writes a target or the target's warehouse state (merge and translate
outputs, the undo journal, verify, the manifest, a rollback, a hydrate) runs inside
:func:`target_lease`, usually through the :func:`holds_target_lease` decorator. A second
writer is refused before it changes anything::

    target T is being written by pid 4242 on host h (run R) since 2026-01-02T03:04:05Z; nothing was changed

The lease lives in the target's control area, next to the manifest:

- **posix**: ``.epochsync/lease``, locked with ``flock`` for as long as the lease is
  held and holding the owner (host, pid, run id, since) as JSON. The kernel releases the
  lock when its process dies, however it dies, so a dead owner's lease is free at once;
  the next writer finds the dead owner's JSON still there and logs the takeover.
- **s3**: ``.epochsync/lease.json``, created with a conditional PUT (``If-None-Match: *``),
  renewed every third of its time to live with ``If-Match`` on its ETag. Released by deleting the versions its own PUTs made
  (their ids are in the PUTs' answers; the newest last, so it stays held until then): one
  DELETE for a lease never renewed, and the key is as it was before the lease. Where an
  id is unknown (an unversioned bucket, an answer lost and retried) or the lease took over
  a stale one, the release is a conditional DELETE and the old versions are listed and
  deleted. A lease that has expired, or whose owner ran on this host (same kernel and pid
  namespace) and is gone, is taken over with ``If-Match`` on the stale ETag (so two writers
  cannot both take it over) and a log line. SeaweedFS 4.48 and moto both honour
  ``If-None-Match: *`` and ``If-Match`` on PUT and DELETE, atomically under concurrent
  requests (``tests/unit/test_lease.py``).

Within one process the lease is re-entrant: ``replicate`` holds it for its whole loop and
the stage functions it calls find it held. A forked child does not inherit it. While it is
held, what the process read or wrote of the control area is kept
(:class:`epochsync.targets.base.HeldControl`): no other writer changes it meanwhile.

Airflow runs one task per process, so each task holds the lease for its own duration; one
pool per target with one slot (:func:`pool_name`) keeps the tasks that write a target
from being scheduled at the same time, and the lease refuses anything that still overlaps
(a ``epochsync replicate`` started by hand, a hydrate run).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import logging
import os
import socket
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from epochsync.core.errors import BusyError, EpochsyncError
from epochsync.core.shutdown import process_start
from epochsync.targets.base import drop_control, hold_control

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable, Iterator

    from epochsync.core.config import Config, TargetConfig

log = logging.getLogger("epochsync.journal.lease")

#: seconds an s3 lease stays valid without renewal (renewed every third of it)
DEFAULT_TTL_S = 120.0
TTL_ENV = "EPOCHSYNC_LEASE_TTL_S"
#: names the run in the lease (default: the Airflow task, else the command and a random id)
RUN_ID_ENV = "EPOCHSYNC_RUN_ID"
POOL_PREFIX = "epochsync_target_"


class TargetBusyError(BusyError):
    """Another live writer holds the target's lease; nothing was changed."""

    def __init__(self, target: str, holder: dict | None):
        self.target = target
        self.holder = holder or {}
        super().__init__(
            f"target {target} is being written by {describe_owner(self.holder)} since "
            f"{self.holder.get('since') or '(unknown)'}; nothing was changed. Run again once it has finished "
            "(a lease whose owner died is taken over by the next run)"
        )


class LeaseLostError(BusyError):
    """Our s3 lease expired or was taken over while we held it."""


# --------------------------------------------------------------------------- Airflow pools


def pool_name(target: str) -> str:
    """The Airflow pool (one slot) of every task that writes ``target``."""
    return f"{POOL_PREFIX}{target}"


def airflow_pools(config: Config) -> dict[str, dict]:
    """``airflow pools import`` document: one pool with one slot per target of ``config``."""
    return {
        pool_name(t.name): {
            "slots": 1,
            "description": f"epochsync: one writer at a time for target {t.name} (epoch DAG and hydrate DAG)",
            "include_deferred": False,
        }
        for t in config.targets
    }


def write_airflow_pools(config: Config, path: str | os.PathLike) -> str:
    """Write :func:`airflow_pools` to ``path`` for ``airflow pools import PATH``; returns the path."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(airflow_pools(config), f, indent=1, sort_keys=True)
    return str(path)


# --------------------------------------------------------------------------- owners


def _read_first_line(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.readline().strip()
    except OSError:
        return ""


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


_run_id: str | None = None


def run_id() -> str:
    """What the lease says is writing: ``$EPOCHSYNC_RUN_ID``, the Airflow task, or the command."""
    global _run_id
    if os.environ.get(RUN_ID_ENV):
        return os.environ[RUN_ID_ENV]
    dag, run, task = (os.environ.get(f"AIRFLOW_CTX_{k}") for k in ("DAG_ID", "DAG_RUN_ID", "TASK_ID"))
    if dag and task:
        return f"airflow {dag}/{run or '?'}/{task}"
    if _run_id is None:
        prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
        verb = next((a for a in sys.argv[1:3] if not a.startswith("-")), "") if prog in ("epochsync", "cli.py") else ""
        _run_id = f"{prog}{' ' + verb if verb else ''} {uuid.uuid4().hex[:8]}"
    return _run_id


def owner_doc(token: str) -> dict:
    """Who takes a lease: host (with its boot and pid namespace), pid and its start, run id."""
    pid = os.getpid()
    return {
        "host": socket.gethostname(),
        "boot_id": _read_first_line("/proc/sys/kernel/random/boot_id"),
        "pid_ns": _pid_namespace(),
        "pid": pid,
        "pid_start": process_start(pid) or "",
        "run_id": run_id(),
        "token": token,
    }


def describe_owner(owner: dict) -> str:
    """Returns who holds a lease, from its owner record, for messages."""
    if not owner or not owner.get("pid"):
        return "another process (its owner record is not readable yet)"
    return f"pid {owner['pid']} on host {owner.get('host', '?')} (run {owner.get('run_id') or '?'})"


def owner_alive(owner: dict) -> bool | None:
    """True/False for an owner on this host (same kernel and pid namespace); None elsewhere."""
    same_host = (
        owner.get("boot_id")
        and owner.get("boot_id") == _read_first_line("/proc/sys/kernel/random/boot_id")
        and owner.get("pid_ns") == _pid_namespace()
    )
    if not same_host or not owner.get("pid"):
        return None
    start = process_start(int(owner["pid"]))
    if start is None:
        return False
    # a recycled pid is another process: the start time tells them apart
    return not (owner.get("pid_start") and start and start != owner["pid_start"])


def _now_iso(t: float | None = None) -> str:
    dt = datetime.fromtimestamp(time.time() if t is None else t, UTC)
    return dt.isoformat(timespec="seconds").replace("+00:00", "Z")


def ttl_seconds() -> float:
    """Returns the s3 lease's time to live in seconds (``$EPOCHSYNC_LEASE_TTL_S``, at least 3)."""
    try:
        return max(3.0, float(os.environ.get(TTL_ENV) or DEFAULT_TTL_S))
    except ValueError:
        raise EpochsyncError(f"${TTL_ENV}: expected seconds, got {os.environ[TTL_ENV]!r}") from None


# --------------------------------------------------------------------------- posix


class PosixLease:
    """``<replica>/.epochsync/lease``: an ``flock`` held while writing, the owner inside."""

    def __init__(self, target_name: str, path: str, make_place=None):
        self.target = target_name
        self.path = path
        self.make_place = make_place  # creates the replica's directory the first time (its own way)
        self.fd: int | None = None
        self.doc: dict = {}

    def _read(self, fd: int) -> dict:
        for _ in range(20):  # the holder writes its record right after locking: wait for it briefly
            try:
                data = os.pread(fd, 65536, 0)
                if data.strip():
                    return json.loads(data)
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        return {}

    def acquire(self) -> None:
        """Take the lock and write our owner record; raises :class:`TargetBusyError` if a live process holds it."""
        if self.make_place is not None:
            self.make_place()
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._read(fd)
            os.close(fd)
            raise TargetBusyError(self.target, holder) from None
        except OSError as exc:
            os.close(fd)
            raise EpochsyncError(
                f"target {self.target}: cannot lock {self.path} ({exc.strerror}); the file system must support "
                "flock (Lustre: mount with -o flock)"
            ) from None
        previous: dict = {}
        try:
            data = os.pread(fd, 65536, 0)
            previous = json.loads(data) if data.strip() else {}
        except (OSError, ValueError):
            previous = {"pid": None}
        if previous:
            log.warning(
                "target %s: taking over the lease of %s since %s: that run ended without releasing it",
                self.target,
                describe_owner(previous),
                previous.get("since") or "(unknown)",
            )
        self.doc = {**owner_doc(uuid.uuid4().hex), "since": _now_iso(), "target": self.target}
        data = (json.dumps(self.doc, sort_keys=True) + "\n").encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        os.fsync(fd)
        self.fd = fd

    def check(self) -> None:
        """A held flock cannot be lost while the process lives."""

    def release(self) -> None:
        """Empty the owner record and unlock (idempotent)."""
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        try:
            os.ftruncate(fd, 0)  # empty = released cleanly (a dead owner leaves its record)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


# --------------------------------------------------------------------------- s3


def _code(exc: BaseException) -> tuple[str | None, int]:
    resp = getattr(exc, "response", None)
    if not isinstance(resp, dict):
        return None, 0
    return resp.get("Error", {}).get("Code"), int(resp.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def _conflict(exc: BaseException) -> bool:
    """A conditional request lost: 412 (precondition), 409 (concurrent conditional write)."""
    code, status = _code(exc)
    return status in (409, 412) or code in ("PreconditionFailed", "ConditionalRequestConflict")


def _absent(exc: BaseException) -> bool:
    code, status = _code(exc)
    return status == 404 or code in ("NoSuchKey", "NotFound", "404")


class S3Lease:
    """``<prefix>.epochsync/lease.json``: conditional create, renew and delete, with an expiry.

    ``io`` is an :class:`~epochsync.stores.s3_access.S3Access`; ``ensure_bucket()`` makes the
    bucket exist (a new target's first writer creates it).
    """

    def __init__(self, target_name: str, io, bucket: str, key: str, ensure_bucket, ttl_s: float | None = None):
        self.target = target_name
        self.io = io
        self.bucket = bucket
        self.key = key
        self.ensure_bucket = ensure_bucket
        self.ttl = ttl_s or ttl_seconds()
        self.token = uuid.uuid4().hex
        self.etag: str | None = None
        #: the versions this lease's PUTs made, oldest first; None once one is unknown or the
        #: lease took over a stale one (the release then lists the key's versions)
        self.versions: list[str] | None = []
        self.doc: dict = {}
        self.lost: str | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._pid = os.getpid()

    # -- requests (each through S3Access: bounded retries on throttling and dropped connections)
    def _body(self) -> bytes:
        now = time.time()
        self.doc = {**self.doc, "renewed": _now_iso(now), "expires": now + self.ttl, "ttl_s": self.ttl}
        return (json.dumps(self.doc, sort_keys=True) + "\n").encode()

    def _put(self, what: str, **cond) -> str:
        body = self._body()
        r = self.io.call(
            f"PUT lease s3://{self.bucket}/{self.key} ({what})",
            lambda c: c.put_object(Bucket=self.bucket, Key=self.key, Body=body, **cond),
        )
        self._made(r.get("VersionId"))
        return r.get("ETag") or ""

    def _made(self, version: str | None) -> None:
        """Note a version of the lease key this lease made (None: one it made but cannot name)."""
        if self.versions is not None:
            if version and version != "null":
                self.versions.append(version)
            else:
                self.versions = None

    def _get(self) -> tuple[dict | None, str | None]:
        doc, etag, _ = self._get_version()
        return doc, etag

    def _get_version(self) -> tuple[dict | None, str | None, str | None]:
        """The lease key's current record, ETag and version (all None: there is none)."""
        try:
            r = self.io.call(
                f"GET lease s3://{self.bucket}/{self.key}", lambda c: c.get_object(Bucket=self.bucket, Key=self.key)
            )
        except Exception as exc:
            if _absent(exc):
                return None, None, None
            raise
        try:
            doc = json.loads(r["Body"].read())
        except ValueError:
            doc = {}
        return doc, r.get("ETag"), r.get("VersionId")

    def _mine(self, doc: dict | None) -> bool:
        # a PUT retried after a lost response answers 412 against our own first write
        if not doc:
            return False
        return doc.get("token") == self.token

    # -- the lease
    def acquire(self) -> None:
        """Create the lease object, or take over a stale one, then renew it in the background; raises
        :class:`TargetBusyError` if a live owner holds it."""
        self.ensure_bucket()
        self.doc = {**owner_doc(self.token), "since": _now_iso(), "target": self.target}
        for _ in range(10):
            try:
                self.etag = self._put("create", IfNoneMatch="*")
                break
            except Exception as exc:
                if not _conflict(exc):
                    raise
            holder, etag, version = self._get_version()
            if holder is None:
                continue  # released in between: try to create it again
            if self._mine(holder):
                # our create landed and its answer was lost: a retry met it
                self.etag = etag
                self._made(version)
                break
            why = self._stale(holder)
            if why is None:
                raise TargetBusyError(self.target, holder)
            try:
                self.etag = self._put("take over", IfMatch=etag)
            except Exception as exc:
                if _conflict(exc) or _absent(exc):
                    continue  # someone else took it over or released it first: look again
                raise
            # the stale record stays a version below ours: the release lists and deletes it too
            self.versions = None
            log.warning(
                "target %s: taking over the lease of %s since %s: %s",
                self.target,
                describe_owner(holder),
                holder.get("since") or "(unknown)",
                why,
            )
            break
        else:
            raise EpochsyncError(f"target {self.target}: the lease at s3://{self.bucket}/{self.key} kept changing")
        self._renewer = threading.Thread(target=self._renew_loop, name=f"lease-{self.target}", daemon=True)
        self._renewer.start()

    def _stale(self, holder: dict) -> str | None:
        """Why the holder's lease may be taken over, or None while it is valid."""
        alive = owner_alive(holder)
        if alive is False:
            return f"its process {holder.get('pid')} on this host is gone"
        expires = holder.get("expires")
        if not isinstance(expires, (int, float)):
            return "its record is unreadable"
        if time.time() > expires:
            return f"it expired at {_now_iso(expires)} (not renewed for {holder.get('ttl_s', '?')} s)"
        return None

    def _renew_loop(self) -> None:
        every = self.ttl / 3
        deadline = time.time() + self.ttl
        while not self._stop.wait(every):
            try:
                self.renew()
                deadline = time.time() + self.ttl
            except LeaseLostError as exc:
                self.lost = str(exc)
                log.error("%s", exc)
                return
            except Exception as exc:  # the store is unreachable: keep trying until the lease would expire
                if time.time() > deadline:
                    self.lost = f"target {self.target}: the lease could not be renewed before it expired ({exc})"
                    log.error("%s", self.lost)
                    return
                log.warning("target %s: lease renewal failed (%s); retrying", self.target, exc)

    def renew(self) -> None:
        """Extend the lease with a conditional PUT; raises :class:`LeaseLostError` if another owner has it now."""
        try:
            self.etag = self._put("renew", IfMatch=self.etag)
        except Exception as exc:
            if not (_conflict(exc) or _absent(exc)):
                raise
            holder, etag, version = self._get_version()
            if self._mine(holder):
                self.etag = etag
                self._made(version)
                return
            raise LeaseLostError(
                f"target {self.target}: lost the lease to {describe_owner(holder or {})}; stop writing and "
                "roll back with 'epochsync rollback' once that writer has finished"
            ) from None

    def check(self) -> None:
        """Raise :class:`LeaseLostError` if a renewal found the lease taken over."""
        if self.lost:
            raise LeaseLostError(self.lost)

    def release(self) -> None:
        """Stop renewing and delete the lease: the versions its PUTs made, when it knows them all,
        else the key if it is still ours (then its old versions); a failure is logged, the lease
        then expires."""
        self._stop.set()
        if self._renewer is not None and self._renewer is not threading.current_thread():
            self._renewer.join(timeout=30)
        if self.etag is None or os.getpid() != self._pid:
            return
        etag, self.etag = self.etag, None
        if self.versions:
            try:
                # oldest first: the newest, the record in force, goes last. A version is never
                # another writer's, so this takes nothing from one who took the lease over
                for vid in self.versions:
                    self.io.call(
                        f"DELETE lease s3://{self.bucket}/{self.key} version {vid}",
                        lambda c, vid=vid: c.delete_object(Bucket=self.bucket, Key=self.key, VersionId=vid),
                    )
            except Exception as exc:
                log.warning(
                    "target %s: releasing the lease failed (%s); it expires in %.0f s", self.target, exc, self.ttl
                )
            return
        try:
            self.io.call(
                f"DELETE lease s3://{self.bucket}/{self.key}",
                lambda c: c.delete_object(Bucket=self.bucket, Key=self.key, IfMatch=etag),
            )
        except Exception as exc:
            if _absent(exc):
                return
            if _conflict(exc):
                log.warning("target %s: the lease was no longer ours at release; left as it is", self.target)
                return
            log.warning("target %s: releasing the lease failed (%s); it expires in %.0f s", self.target, exc, self.ttl)
            return
        self._drop_old_versions()

    def _drop_old_versions(self) -> None:
        """Versioned buckets keep every lease write: delete the noncurrent versions of the lease key."""
        try:
            resp = self.io.call(
                "LIST lease versions", lambda c: c.list_object_versions(Bucket=self.bucket, Prefix=self.key)
            )
            for kind in ("Versions", "DeleteMarkers"):
                for v in resp.get(kind, []):
                    if v["Key"] == self.key and not v.get("IsLatest") and v.get("VersionId") not in (None, "null"):
                        self.io.call(
                            "DELETE old lease version",
                            lambda c, vid=v["VersionId"]: c.delete_object(
                                Bucket=self.bucket, Key=self.key, VersionId=vid
                            ),
                        )
        except Exception as exc:  # garbage only
            log.debug("target %s: old lease versions left: %s", self.target, exc)


# --------------------------------------------------------------------------- taking it


class _Held:
    def __init__(self, lease, pid: int):
        self.lease, self.pid, self.depth = lease, pid, 0


_held: dict[str, _Held] = {}
_held_lock = threading.RLock()


#: a feed's lease: a hidden name in its folder (a feed lists no hidden file)
FEED_LEASE = ".epochsync-lease"


def open_lease(tcfg: TargetConfig) -> tuple[str, PosixLease | S3Lease]:
    """(identity of the place, the lease object) of a target; nothing is taken yet."""
    from epochsync.targets import open_target

    # open_target has imported the kind's module already: the imports below cost nothing
    tgt = open_target(tcfg)
    if tgt.kind == "posix":
        from epochsync.targets.posix import PosixTarget

        assert isinstance(tgt, PosixTarget)  # open_target's class of the kind
        return f"posix:{tgt.root}", PosixLease(tcfg.name, os.path.join(tgt.control, "lease"), tgt.make_root)
    if tgt.kind == "s3":
        from epochsync.targets.s3 import S3Target

        assert isinstance(tgt, S3Target)
        where, key = tgt.lease_place()
        return where, S3Lease(tcfg.name, tgt.io, tgt.bucket, key, tgt.ensure_bucket)
    if tgt.kind == "feed":
        from epochsync.targets.feed import FeedTarget, PosixFeedStore, S3FeedStore

        assert isinstance(tgt, FeedTarget)
        store = tgt.store
        if isinstance(store, PosixFeedStore):
            return f"posix:{store.root}", PosixLease(tcfg.name, os.path.join(store.root, FEED_LEASE))
        assert isinstance(store, S3FeedStore)  # open_feed_store's other kind
        key = store.prefix + FEED_LEASE + ".json"
        where = f"s3:{store.io.settings.endpoint_url or ''}/{store.bucket}/{key}"
        return where, S3Lease(tcfg.name, store.io, store.bucket, key, store._ensure_bucket)
    raise EpochsyncError(f"target {tcfg.name}: no lease for kind {tgt.kind!r}")


@contextlib.contextmanager
def target_lease(cfg: Config, tcfg: TargetConfig) -> Iterator[object]:
    """Hold ``tcfg``'s lease for the block (re-entrant within a process), yielding the lease object;
    see the module docstring.

    Raises :class:`TargetBusyError` when another live writer holds it, before anything changed.
    """
    key, lease = open_lease(tcfg)
    pid = os.getpid()
    with _held_lock:
        held = _held.get(key)
        if held is None or held.pid != pid:
            # what the acquisition learns of the target (its bucket versioned) is kept with the lease
            hold_control(key, lease)
            try:
                lease.acquire()
            except BaseException:
                drop_control(key)
                raise
            held = _held[key] = _Held(lease, pid)
        held.depth += 1
    try:
        yield held.lease
    finally:
        with _held_lock:
            held.depth -= 1
            last = held.depth == 0
            if last:
                _held.pop(key, None)
                drop_control(key)
        if last:
            lost = getattr(held.lease, "lost", None)
            held.lease.release()
            if lost and sys.exc_info()[0] is None:
                raise LeaseLostError(lost)


def check_lease(tcfg: TargetConfig) -> None:
    """Raise if this process's lease of ``tcfg`` was lost (before a commit point); no request is sent."""
    with _held_lock:
        for held in _held.values():
            if getattr(held.lease, "target", None) == tcfg.name and held.pid == os.getpid():
                held.lease.check()


def holds_target_lease(fn: Callable) -> Callable:
    """Returns stage ``fn(cfg, target, ...)`` wrapped to run holding the target's lease.

    ``cfg`` is a :class:`~epochsync.core.config.Config` or a config file path, ``target`` a
    target name or :class:`~epochsync.core.config.TargetConfig`; both are passed on unchanged.
    """

    @functools.wraps(fn)
    def wrapper(cfg, target, *args, **kwargs):
        from epochsync.core.config import Config, TargetConfig, load_config

        config = cfg if isinstance(cfg, Config) else load_config(cfg)
        tcfg = target if isinstance(target, TargetConfig) else config.target(target)
        with target_lease(config, tcfg):
            return fn(config, target, *args, **kwargs)

    return wrapper


def holder(tcfg: TargetConfig) -> dict | None:
    """The record of whoever holds ``tcfg``'s lease now (None: free); for status and tests."""
    key, lease = open_lease(tcfg)
    if isinstance(lease, PosixLease):
        try:
            fd = os.open(lease.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return lease._read(fd) or {"pid": None}
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)
    doc, _ = lease._get()
    return doc if doc and lease._stale(doc) is None else None


def _main(argv: list[str] | None = None) -> int:
    """``python -m epochsync.journal.lease pools CONFIG [OUT]``: the Airflow pools document of a config."""
    import argparse

    from epochsync.core.config import load_config

    p = argparse.ArgumentParser(prog="python -m epochsync.journal.lease")
    sub = p.add_subparsers(dest="cmd", required=True)
    pools = sub.add_parser("pools", help="write the 'airflow pools import' file: one pool per target, one slot")
    pools.add_argument("config")
    pools.add_argument("out", nargs="?", help="output file (default: stdout)")
    args = p.parse_args(argv)
    try:
        cfg = load_config(args.config)
    except EpochsyncError as exc:
        print(f"epochsync.journal.lease: error: {exc}", file=sys.stderr)
        return 1
    if args.out:
        write_airflow_pools(cfg, args.out)
    else:
        print(json.dumps(airflow_pools(cfg), indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
