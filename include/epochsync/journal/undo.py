"""The undo journal, the manifest document, consumer cursors and the stats row.

Undo journal (``undo/target=T/epoch=E/`` in the warehouse): one JSON Lines file per
writer (``ns`` = the driver's namespace operations, ``data-<task * 100 + thread>`` = one
per thread of an executor task, ``data-<n>`` = one per thread without Spark, ``post`` =
the driver's links, attributes and deletes). Each line
is made durable (flush + fsync) BEFORE the mutation it describes, and says how to
reverse it. ``preimages/`` holds saved bytes of overwritten ranges (posix).

Rollback replays every entry in reverse journal order (phase, then sequence; the s3 target
keeps that order per key and replays different keys in threads: ``S3Target.undo_all``), and
every undo step is idempotent, so a rollback killed half way simply runs again; it logs
each entry it undid (``undone.txt``, :class:`UndoneLog`) and a rerun skips those.
Entries of one phase written by different partitions touch disjoint paths, so their
relative order does not matter; nor does the order of an s3 writer's entries written
by concurrent threads (``apply.run_in_order`` only overlaps operations on disjoint keys).

The warehouse must be a local or shared file system (``file://``) for the journal.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import shutil
import threading
import time
from datetime import UTC, datetime
from typing import TextIO

from epochsync.core.errors import EpochsyncError
from epochsync.journal.faults import FaultCounter, FaultSpec
from epochsync.warehouse.fs import read_json, write_json_atomic
from epochsync.warehouse.paths import Warehouse, local_path

PHASE_NAMESPACE, PHASE_DATA, PHASE_POST = 1, 2, 3
#: written by a rollback before it replays the journal; writers stop at their next entry
ABORT_MARKER = "ABORTED"
#: the token of the apply that owns a journal directory (see :func:`start_run`)
RUN_FILE = "RUN"


def journal_dir(warehouse: str, target: str, epoch: int) -> str:
    """Returns the local folder of ``target``'s undo journal for ``epoch``."""
    return local_path(Warehouse(warehouse).undo(target, epoch))


def repair_journal_dir(warehouse: str, target: str) -> str:
    """Returns the local folder of ``target``'s repair undo journal (``epochsync audit --repair``)."""
    return local_path(Warehouse(warehouse).repair_undo(target))


def unfinished_repair(warehouse: str, target: str) -> bool:
    """Did a repair of ``target`` start writing and not finish (its journal is there)?"""
    return journal_exists(repair_journal_dir(warehouse, target))


def plan_dir(warehouse: str, target: str, epoch: int) -> str:
    """Returns the local plan folder of ``target``'s ``epoch``."""
    return local_path(Warehouse(warehouse).plan(target, epoch))


class UndoJournal:
    """Appends undo entries for one writer; every append is durable before it returns."""

    def __init__(
        self,
        directory: str,
        writer: str,
        phase: int,
        faults: FaultCounter | None = None,
        *,
        tick: bool = True,
        run: str | None = None,
    ):
        self.directory = directory
        # ``run``: the token of the apply this writer belongs to (:func:`start_run`); a
        # writer whose apply is over (rolled back, or replaced by a newer run) refuses
        # before it creates or writes anything
        self.run = run
        self._check_run()
        self.writer = writer
        self.phase = phase
        self.faults = faults
        self.tick_enabled = tick
        preimages = os.path.join(directory, "preimages")
        if run is None:
            os.makedirs(preimages, exist_ok=True)
        else:
            # the run's directory exists (start_run made it); never create it again behind a
            # rollback that has already removed it
            try:
                os.mkdir(preimages)
            except FileExistsError:
                pass
            except FileNotFoundError:
                raise EpochsyncError(f"apply stopped: {directory} is gone (the epoch was rolled back)") from None
        self.path = os.path.join(directory, f"{writer}.jsonl")
        self.seq = _count_lines(self.path)
        existed = os.path.exists(self.path)
        self._f = open(self.path, "a", encoding="utf-8")
        # held while this writer lives: a rollback waits for it (wait_for_writers), so it never
        # undoes a mutation that a straggling executor task is still making
        fcntl.flock(self._f.fileno(), fcntl.LOCK_EX)
        self._lock = threading.Lock()
        if run is not None:
            # A rollback writes ABORTED, then waits for the writers whose files it finds. A
            # writer that opened its file after that listing (a thread of an executor task
            # starting late) is not waited for, so it checks again now that it holds its
            # lock, and leaves no journal file behind for the rolled-back epoch.
            try:
                self._check_live()
            except EpochsyncError:
                if not existed:
                    try:
                        os.unlink(self.path)
                    except FileNotFoundError:
                        pass
                self._f.close()
                raise

    def append(self, entry: dict) -> dict:
        """Write ``entry`` durably, then give the fault injector its chance to fire; returns the entry
        with its writer and sequence number.

        Refuses once a rollback of this epoch has started (``ABORTED`` marker), so a
        straggling writer cannot mutate the target behind the rollback's back.
        """
        self._check_live()
        with self._lock:  # threads of one writer (s3 namespace operations) share the file
            self.seq += 1
            entry = {"phase": self.phase, "writer": self.writer, "seq": self.seq, **entry}
            self._f.write(json.dumps(entry, sort_keys=True) + "\n")
            self._f.flush()
            os.fsync(self._f.fileno())
        if self.faults is not None and self.tick_enabled:
            self.faults.tick(f"{entry['op']} {entry.get('path') or entry.get('key') or ''}".strip())
        return entry

    def append_many(self, entries: list[dict]) -> list[dict]:
        """:meth:`append` of several entries with one fsync (one request mutates them all, e.g. an
        S3 DeleteObjects); the fault injector then gets its chance after each one."""
        self._check_live()
        out = []
        with self._lock:
            for entry in entries:
                self.seq += 1
                out.append({"phase": self.phase, "writer": self.writer, "seq": self.seq, **entry})
            self._f.write("".join(json.dumps(e, sort_keys=True) + "\n" for e in out))
            self._f.flush()
            os.fsync(self._f.fileno())
        if self.faults is not None and self.tick_enabled:
            for entry in out:
                self.faults.tick(f"{entry['op']} {entry.get('path') or entry.get('key') or ''}".strip())
        return out

    def _check_live(self) -> None:
        """Refuse once a rollback of this epoch has started (``ABORTED``) or the run is over."""
        if os.path.exists(os.path.join(self.directory, ABORT_MARKER)):
            raise EpochsyncError(f"apply stopped: a rollback of {self.directory} is running")
        self._check_run()

    def _check_run(self) -> None:
        if self.run is None:
            return
        try:
            with open(os.path.join(self.directory, RUN_FILE), encoding="utf-8") as f:
                current = f.read().strip()
        except FileNotFoundError:
            current = None
        if current != self.run:
            raise EpochsyncError(
                f"apply stopped: the apply that started this writer of {self.directory} is over"
                " (rolled back, or a newer run took the epoch)"
            )

    def tick(self, what: str) -> None:
        """A mutation that needs no undo entry of its own (a multipart part)."""
        if self.faults is not None and self.tick_enabled:
            self.faults.tick(what)

    def save_preimage(self, name: str, data: bytes) -> str:
        """Store bytes an overwrite will destroy; durable before returning its path."""
        path = os.path.join(self.directory, "preimages", name)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return path

    def close(self) -> None:
        """Close the writer's journal file."""
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _count_lines(path: str) -> int:
    try:
        with open(path, encoding="utf-8") as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def read_journal(directory: str) -> list[dict]:
    """Every entry of an epoch's journal, in the order the mutations happened.

    A torn last line (a process killed while writing it) is ignored: its mutation
    had not started, because a mutation only starts after its entry is durable.
    """
    entries: list[dict] = []
    if not os.path.isdir(directory):
        return entries
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".jsonl"):
            continue
        with open(os.path.join(directory, name), encoding="utf-8") as f:
            for line in f:
                if not line.endswith("\n"):
                    break
                entries.append(json.loads(line))
    entries.sort(key=lambda e: (e["phase"], e["writer"], e["seq"]))
    return entries


#: the entries a rollback has undone, one ``writer seq`` line each, durable before the next
UNDONE_LOG = "undone.txt"


class UndoneLog:
    """What a rollback has undone so far, so a rollback run again after a crash skips it.

    Each undo step is idempotent on its own, but the journal as a whole is not: replaying
    ``create f`` again after ``rename f -> scratch`` was undone would remove the restored
    original (an epoch that replaced a file by another of the same name).
    """

    def __init__(self, directory: str):
        self.path = os.path.join(directory, UNDONE_LOG)
        self.done: set[tuple[str, int]] = set()
        try:
            with open(self.path, encoding="utf-8") as f:
                for line in f:
                    if line.endswith("\n") and " " in line:
                        writer, seq = line.split()
                        self.done.add((writer, int(seq)))
        except FileNotFoundError:
            pass
        self._f: TextIO | None = None
        # the s3 target replays keys in threads (S3Target.undo_all), each reporting here
        self._lock = threading.Lock()

    def __contains__(self, entry: dict) -> bool:
        return (entry["writer"], entry["seq"]) in self.done

    def add(self, entry: dict) -> None:
        """Record ``entry`` as undone, durably, before the next one is replayed (thread-safe)."""
        with self._lock:
            if self._f is None:
                self._f = open(self.path, "a", encoding="utf-8")
            self._f.write(f"{entry['writer']} {entry['seq']}\n")
            self._f.flush()
            os.fsync(self._f.fileno())
            self.done.add((entry["writer"], entry["seq"]))

    def close(self) -> None:
        """Close the log file, if one was opened."""
        with self._lock:
            if self._f is not None:
                self._f.close()


def mark_aborted(directory: str) -> None:
    """Write the ``ABORTED`` marker (durably): writers still running see it and stop."""
    path = os.path.join(directory, ABORT_MARKER)
    with open(path, "w") as f:
        f.write(f"{time.time()}\n")
        f.flush()
        os.fsync(f.fileno())


def wait_for_writers(directory: str, timeout: float = 300.0) -> None:
    """Block until no writer holds a journal file of ``directory`` (each holds an flock while alive).

    Called by a rollback after the ``ABORTED`` marker: a writer still running stops at its
    next entry and releases its lock; a dead writer's lock is gone with its process.
    """
    if not os.path.isdir(directory):
        return
    deadline = time.monotonic() + timeout
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".jsonl"):
            continue
        with open(os.path.join(directory, name), "a", encoding="utf-8") as f:
            while True:
                try:
                    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.flock(f.fileno(), fcntl.LOCK_UN)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise EpochsyncError(
                            f"a writer of {os.path.join(directory, name)} is still running {timeout:.0f}s after "
                            "the rollback asked it to stop; not rolling back under it"
                        ) from None
                    time.sleep(0.1)


def journal_exists(directory: str) -> bool:
    """Returns whether ``directory`` holds any writer's journal file."""
    return os.path.isdir(directory) and any(n.endswith(".jsonl") for n in os.listdir(directory))


def start_run(directory: str) -> str:
    """Give the journal directory a new owner token and return it (written atomically).

    Executor tasks of an apply carry the token; one that starts late, after its driver is
    gone and a rollback or a newer run has taken the epoch, finds another token (or none)
    and refuses before it writes the target.
    """
    import uuid

    os.makedirs(directory, exist_ok=True)
    token = uuid.uuid4().hex
    tmp = os.path.join(directory, f".{RUN_FILE}.{token}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(token)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(directory, RUN_FILE))
    return token


def remove_journal(directory: str) -> None:
    """Remove an undo journal folder and everything in it (missing is fine).

    The folder is first renamed out of the way (atomically), then deleted: deleting it in
    place takes its files one by one, and a straggling writer that checked the run token
    before the ``RUN`` file went could still create its journal file there, leaving an
    epoch that looks unfinished after its rollback or commit (seen in the chaos test once
    apply ran threads). After the rename a writer finds no folder to write in.
    """
    import uuid

    parent, name = os.path.split(directory.rstrip("/"))
    doomed = os.path.join(parent, f".{name}.removed-{uuid.uuid4().hex[:12]}")
    try:
        os.rename(directory, doomed)
    except FileNotFoundError:
        return
    for _ in range(5):  # a writer's file created inside while it is deleted: delete again
        shutil.rmtree(doomed, ignore_errors=True)
        if not os.path.exists(doomed):
            return
        time.sleep(0.1)


def fault_counter(warehouse: str, target: str, epoch: int, spec: FaultSpec | None) -> FaultCounter | None:
    """The counter for one apply run of (target, epoch), or None when no spec applies."""
    if spec is None or not spec.applies(target, epoch):
        return None
    jdir = journal_dir(warehouse, target, epoch)
    pdir = plan_dir(warehouse, target, epoch)
    os.makedirs(jdir, exist_ok=True)
    os.makedirs(pdir, exist_ok=True)
    if spec.at is not None:  # a share of the plan's operations
        plan = read_json(os.path.join(pdir, "plan.json")) or {}
        total = sum(len(plan.get(k) or []) for k in ("namespace", "data", "post"))
        spec = dataclasses.replace(spec, after=int(spec.at * total))
    counter = os.path.join(jdir, "faults.count")
    # a fresh apply run counts from zero
    if os.path.exists(counter):
        os.remove(counter)
    return FaultCounter(spec, counter, os.path.join(pdir, "fault.fired"))


def fault_point(warehouse: str, target: str, epoch: int, stage: str):
    """``tick(what)`` for the steps of a commit or rollback of (target, epoch) (see :mod:`epochsync.journal.faults`).

    A no-op unless ``$EPOCHSYNC_INJECT_FAILURE`` names this stage; each call is one step.
    """
    from epochsync.journal.faults import resolve

    spec = resolve(None)
    if spec is None or not spec.applies(target, epoch, stage):
        return lambda what: None
    pdir = plan_dir(warehouse, target, epoch)
    os.makedirs(pdir, exist_ok=True)
    counter = os.path.join(pdir, f"faults-{stage}.count")
    if os.path.exists(counter):
        os.remove(counter)
    return FaultCounter(spec, counter, os.path.join(pdir, f"fault-{stage}.fired")).tick


# --------------------------------------------------------------------------- manifest


def manifest_doc(target: str, source: str, epoch: int, snapshot_uri: str) -> dict:
    """The manifest (docs/INTERNALS.md "Target manifest")."""
    return {
        "target": target,
        "source": source,
        "epoch": epoch,
        "snapshot": snapshot_uri,
        "committed_at": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
    }


def manifest_epoch(doc: dict | None) -> int:
    """A missing manifest means epoch 0 (an empty target)."""
    if doc is None:
        return 0
    try:
        return int(doc["epoch"])
    except (KeyError, TypeError, ValueError):
        raise EpochsyncError(f"target manifest is unreadable: {doc!r}") from None


# --------------------------------------------------------------------------- files in the warehouse


def advance_cursor(warehouse: str, source: str, consumer: str, epoch: int, servers: dict[str, int]) -> dict:
    """Move a consumer's cursor to ``epoch``; per-server indexes only ever grow. Returns the cursor document written."""
    path = local_path(Warehouse(warehouse).cursor(source, consumer))
    old = read_json(path, {}) or {}
    merged = dict(old.get("servers") or {})
    for server, index in servers.items():
        if index is not None and (server not in merged or index > merged[server]):
            merged[server] = int(index)
    doc = {"epoch": max(int(old.get("epoch") or 0), epoch), "servers": merged}
    write_json_atomic(path, doc)
    return doc


def write_stage_stats(warehouse: str, target: str, epoch: int, stage: str, stats: dict) -> None:
    """One stage's figures, assembled into the stats row at commit."""
    path = os.path.join(plan_dir(warehouse, target, epoch), "stages", f"{stage}.json")
    write_json_atomic(path, {"stage": stage, "written_at": time.time(), **stats})


def mark_closed_seen(warehouse: str, target: str, epoch: int) -> float:
    """Record the moment the pipeline first saw ``epoch`` closed for ``target``; returns it.

    The report's replication delay counts from here to the commit (``closed_seen_at`` in
    the stats row). A later sighting (a retry, the next poke) keeps the first moment.
    """
    path = os.path.join(plan_dir(warehouse, target, epoch), "stages", "closed.json")
    seen = (read_json(path) or {}).get("seen_at")
    if seen is None:
        seen = time.time()
        write_json_atomic(path, {"stage": "closed", "written_at": seen, "seen_at": seen})
    return seen


def read_stage_stats(warehouse: str, target: str, epoch: int) -> dict[str, dict]:
    """Returns stage name → figures of each stage that ran for ``target``'s ``epoch`` (``stages/<stage>.json``)."""
    d = os.path.join(plan_dir(warehouse, target, epoch), "stages")
    out = {}
    if os.path.isdir(d):
        for name in sorted(os.listdir(d)):
            if name.endswith(".json"):
                out[name[:-5]] = read_json(os.path.join(d, name))
    return out
