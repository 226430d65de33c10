"""Apply a plan to a target: namespace on the driver, data on executors, then post ops.

Order (DESIGN section 5 "Namespace application"): the plan's namespace operations run
on the driver one by one in plan order; data operations run in parallel on Spark
executors (one S3 client per partition for the source and one for the target); post
operations (hard links, attributes, s3 deletes) run on the driver last. Every mutation
is preceded by its undo entry, made durable (see :mod:`epochsync.journal.undo`).

Pulls read the source store with ranged GETs of the pinned object versions; the S3
access retries throttling, 5xx and dropped connections with exponential backoff and
fails with a clear error after ``max_attempts``.
"""

from __future__ import annotations

import contextlib
import os
import time

from epochsync.core.errors import EpochError, EpochsyncError, FenceError
from epochsync.core.layout import object_range_to_file
from epochsync.core.probes import mutant
from epochsync.journal.lease import holds_target_lease
from epochsync.journal.undo import (
    PHASE_DATA,
    PHASE_NAMESPACE,
    PHASE_POST,
    UndoJournal,
    fault_counter,
    journal_dir,
    plan_dir,
    start_run,
    write_json_atomic,
    write_stage_stats,
)
from epochsync.spark import executor_slots, run_report_tasks
from epochsync.stages.context import APPLIED_FACTS, _config, _target_cfg, check_preconditions, load_plan, source_access
from epochsync.stages.rollback import run_rollback
from epochsync.targets import open_target
from epochsync.warehouse.paths import Warehouse, local_path


class Pulled:
    """File bytes pulled from the source for one data operation (zeros where none)."""

    def __init__(self) -> None:
        self.chunks: list[tuple[int, bytes]] = []
        self.bytes = 0

    @classmethod
    def fetch(cls, op: dict, source_io, bucket: str) -> Pulled:
        """Returns the bytes of ``op``'s pulls, read from the source store as file offsets (striped
        objects mapped back)."""
        out = cls()
        layout = op.get("src_layout")
        for pull in op["pulls"]:
            for oo, on in pull["ranges"]:
                data = source_io.get_range(bucket, pull["key"], pull.get("version"), oo, on)
                out.bytes += len(data)
                if layout:
                    pos = 0
                    for fo, n in object_range_to_file(layout[0], layout[1], pull["index"], oo, on):
                        out.chunks.append((fo, data[pos : pos + n]))
                        pos += n
                else:
                    out.chunks.append((oo, data))
        out.chunks.sort(key=lambda c: c[0])
        return out

    def read(self, offset: int, length: int) -> bytes:
        """Returns ``length`` file bytes from ``offset``: what was pulled there, zeros elsewhere."""
        buf = bytearray(length)
        end = offset + length
        for fo, data in self.chunks:
            if fo >= end:
                break
            ce = fo + len(data)
            if ce <= offset:
                continue
            a, b = max(fo, offset), min(ce, end)
            buf[a - offset : b - offset] = data[a - fo : b - fo]
        return bytes(buf)


def _compose(target, op: dict, state: dict, pulled: Pulled, a: int, b: int, to_file=None) -> bytes:
    """Bytes ``[a, b)`` of the new object: base version, overlaid with pulled changes."""
    base_len = int(op.get("base_size") or 0) if op.get("base") else 0
    buf = bytearray(b - a)
    if op.get("base") and a < base_len:
        cur = (state.get(op["base"]) or {}).get("current")
        data = target.io.get_range(
            target.bucket, target._full(op["base"]), cur and cur["version"], a, min(b, base_len) - a
        )
        buf[: len(data)] = data
    ranges = op.get("obj_ranges") if to_file else op["ranges"]
    if ranges is None:  # a plan translate did not write: never apply less than it says
        raise EpochError(f"plan entry for {op.get('base')!r} has no object ranges")
    for o, n in ranges:
        s, e = max(o, a), min(o + n, b)
        if s >= e:
            continue
        if to_file is None:
            got = pulled.read(s, e - s)
            if mutant("patch-keeps-stale-tail"):  # test-only: E-1's bytes kept where nothing was pulled
                got = got.rstrip(b"\0")
            buf[s - a : s - a + len(got)] = got
        else:
            pos = s
            for fo, fn in to_file(s, e - s):
                buf[pos - a : pos - a + fn] = pulled.read(fo, fn)
                pos += fn
    return bytes(buf)


def run_data_op(op: dict, target, journal, source_io, source_bucket: str) -> dict:
    """One data operation on an executor (or the driver in tests)."""
    state = op.get("state") or {}
    written = 0
    if target.kind == "posix":
        pulled = Pulled.fetch(op, source_io, source_bucket)
        chunks = [(o, pulled.read(o, n)) for o, n in op["ranges"]]
        target.run_data_op(op, journal, chunks)
        written = sum(len(c) for _, c in chunks)
        return {"pulled": pulled.bytes, "written": written}
    from epochsync.targets.s3 import encode_meta

    if op.get("stripes"):
        # a striped target: the pulled file bytes feed each target stripe object
        pulled = Pulled.fetch(op, source_io, source_bucket)
        ss, sc = int(target.cfg.stripe_size), int(target.cfg.stripe_count)
        for sp in op["stripes"]:

            def to_file(o, n, ss=ss, sc=sc, idx=sp["stripe_index"]):
                return object_range_to_file(ss, sc, idx, o, n)

            written += _write_object(target, journal, state, pulled, sp, sp["key"], int(sp["new_len"]), {}, to_file)
        return {"pulled": pulled.bytes, "written": written}
    meta = encode_meta(op["attrs"])
    key = op["key"]
    length = int(op["new_size"])
    how = _whole_file_how(op, target, source_io)
    pulled = Pulled() if how else Pulled.fetch(op, source_io, source_bucket)
    if how == "copy":
        target.copy_from_source(journal, state, key, source_bucket, op["copy_from"], meta, length)
    elif how == "source":
        # the body is the file at E as verify reads it (the same function, the same pinned
        # versions): the PUT's checksum then covers the file (stages.verify)
        from epochsync.stages.verify import source_bytes

        body = source_bytes(op["source"], length, source_io, source_bucket)
        if mutant("small-whole-drops-hole"):  # test-only: the zeros past the version's end dropped
            body = body.rstrip(b"\0")
        pulled.bytes = len(body)
        target.put(journal, state, key, body, meta, source=op["source"])
        written = len(body)
    else:
        written += _write_object(target, journal, state, pulled, op, key, length, meta, None)
    made = target.last_written(key) if op.get("extra_keys") else None
    for extra in op.get("extra_keys") or []:
        # hard links of an s3 path: one object per path, copied server-side from the first (the
        # version just written, from the write's response; else a listing of the key)
        state.pop(key, None)
        if made:
            state[key] = {
                "known": [],
                "current": {"version": made["version"], "size": made["size"], "etag": made.get("etag")},
            }
        target.copy(journal, state, extra, key, meta, length)
    return {"pulled": pulled.bytes, "written": written}


def _whole_file_how(op: dict, target, source_io) -> str | None:
    """How a whole-file write of ``op`` is made: ``"copy"`` (one server-side copy of its pinned
    source version: the source reader is the S3 store of the target's endpoint), ``"source"``
    (its bytes read whole from the source and put in one PUT), or None (the operation's parts
    and ranges, as planned)."""
    if op.get("copy_from") and op["write"]["mode"] in ("put", "multipart") and same_store(source_io, target):
        return "copy"
    if op.get("source") is not None and op["write"]["mode"] == "put":
        return "source"
    return None


def same_store(source_io, target) -> bool:
    """Can the target copy server-side from the source store: the source reader is S3
    (``source_io.kind``, see the source reader contract) on the target's endpoint with the
    same credentials?"""
    if getattr(source_io, "kind", "s3") != "s3" or not hasattr(target, "io"):
        return False
    a, b = getattr(source_io, "settings", None), getattr(target.io, "settings", None)
    if a is None or b is None:
        return False
    return (a.endpoint_url, a.access_key, a.region) == (b.endpoint_url, b.access_key, b.region)


def conditional_keys(plan: dict, target, source_io) -> set[str]:
    """The plan's keys a conditional write may fence (``S3Target.fence_check``'s ``conditional``):
    each written by one data operation that replaces it whole (``_whole_file_how``: a PUT of
    the file read whole from the source, or a copy of its source version), with no stripes or
    hard links, and touched by no other operation of the plan (nothing reads it, moves it,
    deletes it or patches it: their keys stay listed, as their undo needs the versions)."""
    uses: dict[str, int] = {}

    def use(*keys) -> None:
        for k in keys:
            if k:
                uses[k] = uses.get(k, 0) + 1

    whole = []
    for op in plan["namespace"] + plan["post"]:
        use(op.get("key"), op.get("src"))
    for op in plan["data"]:
        if not op.get("stripes") and not op.get("extra_keys") and _whole_file_how(op, target, source_io):
            whole.append(op["key"])
            use(op["key"])
            continue
        use(op.get("key"), op.get("base"), *(op.get("extra_keys") or []))
        for sp in op.get("stripes") or []:
            use(sp.get("key"), sp.get("base"))
    return {k for k in whole if uses[k] == 1}


def write_fence(
    plan: dict, target, source_io, cache_path: str | None = None, *, since: int | None = None
) -> tuple[list[str], dict, dict]:
    """The write fence of ``plan`` on ``target`` (DESIGN section 5): returns the problems, the
    state the apply's undo entries start from, and what the fence did (the stats' ``fence``).

    On an s3 target whose store honours conditional writes (``S3Target.conditional_writes``,
    probed once and kept at ``cache_path``) the keys of :func:`conditional_keys` are not
    listed: each write carries the fence itself and the store refuses it (412) if the key
    changed since the fence instant; the rest are listed as before. ``since``: the fence
    instant, if the caller has just read it (``target.fence_time_ns()``)."""
    if since is None:
        since = target.fence_time_ns()
    how, conditional = None, set()
    if since is not None and hasattr(target, "conditional_writes"):
        conditional = conditional_keys(plan, target, source_io)
        if conditional:
            how = target.conditional_writes(cache_path)
            if how is None:
                conditional = set()
    if not conditional:
        problems, state = target.fence_check(plan["fence"], since)
        return problems, state, {"conditional_writes": how, "keys_conditional": 0, "keys": len(plan["fence"])}
    problems, state = target.fence_check(plan["fence"], since, conditional)
    deferred = [k for k, v in state.items() if "condition" in v]
    waited = target.after_fence_second(since) if deferred and not problems else 0.0
    figures = {"conditional_writes": how, "keys_conditional": len(deferred), "keys": len(plan["fence"])}
    if waited:
        figures["waited_seconds"] = waited
    return problems, state, figures


def _write_object(target, journal, state, pulled, spec: dict, key: str, length: int, meta: dict, to_file) -> int:
    """Write one target object as ``spec["write"]`` says (put, patch, multipart, delete)."""
    mode = spec["write"]["mode"]
    if mode == "delete":
        target.delete(journal, state, key)
        return 0
    if mode in ("put", "patch"):
        body = _compose(target, spec, state, pulled, 0, length, to_file)
        target.put(journal, state, key, body, meta)
        return len(body)
    parts = [dict(p, base=spec.get("base")) if "copy" in p else p for p in spec["write"]["parts"]]
    target.multipart(
        journal,
        state,
        key,
        parts,
        meta,
        lambda a, b: _compose(target, spec, state, pulled, a, b, to_file),
        # the versions its uploaded bytes came from (a file's object: verify ties them to the file at E)
        pulled_from=None if to_file else [[p["key"], p.get("version")] for p in spec.get("pulls") or []],
    )
    return sum(p["upload"][1] - p["upload"][0] for p in parts if "upload" in p)


#: posix: creates of new files and small overwrites journaled together, one fsync for up to this
#: many (``journal_ahead``)
CREATES_PER_FSYNC = 256


def _chunks(items, n: int):
    """Lists of up to ``n`` of ``items`` (an iterator), in order, taken as they are needed."""
    chunk: list = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= n:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _data_partition(index: int, ops, target, source_io, source_bucket: str, jdir: str, faults, run=None):
    """Executor side: one journal file and one pair of clients per partition."""
    t0 = time.monotonic()
    result: dict = {"pulled": 0, "written": 0, "ops": 0}
    ahead = getattr(target, "journal_ahead", None)
    with UndoJournal(jdir, f"data-{index:05d}", PHASE_DATA, faults, run=run) as journal:
        for chunk in _chunks(ops, CREATES_PER_FSYNC if ahead is not None else 1):
            for op in ahead(chunk, journal) if ahead is not None else chunk:
                r = run_data_op(op, target, journal, source_io, source_bucket)
                result["pulled"] += r["pulled"]
                result["written"] += r["written"]
                result["ops"] += 1
    flush = getattr(target, "flush_written", None)
    if flush is not None and result["ops"]:
        flush()  # posix: the partition's files durable before it reports done (one syncfs)
    result["source"] = source_io.counters.as_dict()
    result["target"] = target.io.counters.as_dict() if hasattr(target, "io") else {}
    result["facts"] = target.take_written() if hasattr(target, "take_written") else {}
    result["seconds"] = time.monotonic() - t0
    yield result


def apply_plan(plan: dict, target, source_io, source_bucket: str, jdir: str, state: dict, *, spark=None, faults=None):
    """Run a plan's three phases. Returns figures for the stats row."""
    from epochsync.stores.s3_access import Counters

    t0 = time.monotonic()
    if spark is not None:
        task_apply_threads()  # a bad EPOCHSYNC_APPLY_TASK_THREADS fails here, before anything changes
    executor_min_ops()  # and a bad EPOCHSYNC_APPLY_EXECUTOR_MIN_OPS
    target.prepare(plan["epoch"])
    # a posix target keeps the times of the directories the plan changes only as a side effect
    keep_times = getattr(target, "dir_times_before", None)
    dir_times = keep_times(plan) if keep_times else None
    take = getattr(target, "take_written", dict)
    facts: dict = take()  # nothing of an earlier apply in this process
    many = getattr(target, "delete_many", None)
    with UndoJournal(jdir, "ns", PHASE_NAMESPACE, faults) as journal:
        # posix: moves to scratch journaled in batches (run_namespace_ops)
        _run_phase(target, "namespace", plan["namespace"], journal, state, many)
    facts = take()
    t1 = time.monotonic()
    token = start_run(jdir)  # the data tasks' owner token (a late straggler finds another)
    ops = []
    for op in plan["data"]:
        keys = [k for k in (op.get("key"), op.get("base"), *(op.get("extra_keys") or [])) if k]
        keys += [k for sp in op.get("stripes") or [] for k in (sp["key"], sp.get("base")) if k]
        ops.append(dict(op, state={k: state[k] for k in keys if k in state}))
    results = []
    if ops:
        if spark is not None and _client_ops(ops, target, source_io) >= executor_min_ops(target):
            results = _apply_on_executors(spark, ops, plan, target, source_io, source_bucket, jdir, faults, token)
        else:
            # posix: the data phase creates and writes files and moves no directory, so each
            # parent directory is resolved once (PosixTarget.reading), not twice per operation
            steady = getattr(target, "reading", None)
            with steady() if steady is not None else contextlib.nullcontext():
                results = _apply_in_threads(ops, target, source_io, source_bucket, jdir, faults, plan, token)
    t2 = time.monotonic()
    for r in results:
        facts.update(r.pop("facts", None) or {})
    with UndoJournal(jdir, "post", PHASE_POST, faults) as journal:
        _run_phase(target, "post", plan["post"], journal, state, many)  # posix: journaled in batches
    for op in plan["post"]:
        if op.get("op") == "delete":
            facts.pop(op["key"], None)
    facts.update(take())
    if dir_times is not None:
        target.restore_dir_times(dir_times, plan)
    settle = getattr(target, "settle_facts", None)
    if settle is not None:
        # posix: the written ranges' checksums and each file's identity after the apply's last change
        facts = settle(facts, plan)
    t3 = time.monotonic()
    src, tgt = Counters(), Counters()
    src.add(source_io.counters.as_dict())
    if hasattr(target, "io"):
        tgt.add(target.io.counters.as_dict())
    pulled = written = 0
    for r in results:
        src.add(r["source"])
        tgt.add(r["target"])
        pulled += r["pulled"]
        written += r["written"]
    return {
        "bytes_pulled": src.bytes_received,
        "bytes_pulled_ops": pulled,
        "bytes_written": tgt.bytes_sent if target.kind == "s3" else written,
        "bytes_copied": tgt.bytes_copied,
        "source_requests": src.as_dict(),
        "target_requests": tgt.as_dict(),
        "durations": {"namespace": t1 - t0, "data": t2 - t1, "post": t3 - t2},
        "ops": {"namespace": len(plan["namespace"]), "data": len(ops), "post": len(plan["post"])},
        # verify's facts. s3: key -> the version the apply wrote, its metadata and size (from the
        # responses); posix: path -> the file's identity after apply and the ranges it wrote, hashed
        "facts": facts,
    }


#: namespace and post operations in flight on a target whose operations are one key each (s3)
ORDERED_OPS_THREADS = 8


def independent_batches(ops: list[dict], keys_of) -> list[list[dict]]:
    """Returns ``ops`` (in plan order) cut into runs whose operations may execute in any order.

    ``keys_of(op)`` gives the keys an operation reads and writes. An operation starts a
    new batch when it writes a key the batch reads or writes, reads a key the batch
    writes, or when one of its keys is a directory prefix of a key the batch writes or
    the other way round (a filer-backed store cannot hold ``a`` and ``a/x`` at once, which
    is why the plan deletes before it writes). Inside a batch no operation can see
    another's effect, so running a batch concurrently ends where the plan's order does.
    """
    batches: list[list[dict]] = []
    batch: list[dict] = []
    reads: set[str] = set()
    writes: set[str] = set()
    parents: set[str] = set()  # directory prefixes of the batch's written keys

    def dirs(key: str) -> list[str]:
        parts = key.split("/")
        return ["/".join(parts[:i]) for i in range(1, len(parts))]

    for op in ops:
        r, w = keys_of(op)
        conflict = any(
            k in writes or k in reads or k in parents or any(d in writes for d in dirs(k)) for k in w
        ) or any(k in writes for k in r)
        if conflict and batch:
            batches.append(batch)
            batch, reads, writes, parents = [], set(), set(), set()
        batch.append(op)
        reads.update(r)
        writes.update(w)
        for k in w:
            parents.update(dirs(k))
    if batch:
        batches.append(batch)
    return batches


#: a batch's deletes go to ``delete_many`` (S3 DeleteObjects) in groups of this many keys
DELETE_BATCH = 1000


def _run_phase(target, phase: str, ops: list[dict], journal, state: dict, many) -> None:
    """The plan's ``namespace`` or ``post`` operations: the target's ``run_<phase>_ops`` when it
    journals them in batches (posix), else :func:`run_in_order` of ``run_<phase>_op``."""
    batched = getattr(target, f"run_{phase}_ops", None)
    if batched is not None:
        batched(ops, journal, state)
        return
    one = getattr(target, f"run_{phase}_op")
    run_in_order(
        target, ops, lambda op: one(op, journal, state), (lambda keys: many(journal, state, keys)) if many else None
    )


def run_in_order(target, ops: list[dict], run_one, delete_many=None) -> None:
    """Run namespace or post operations with the effect of plan order.

    One after the other on targets whose operations depend on each other's paths
    (posix renames); on a target that says its operations are one key each
    (``target.op_keys``), :func:`independent_batches` run in ``ORDERED_OPS_THREADS``
    threads, batch after batch. A directory rename on s3 is then two batches (the old
    keys' deletes, the copies of their pinned versions) instead of 2,000 round trips in
    a row. After a failure the running operations finish, no other one starts, and the
    first error is raised: every mutation already had its undo entry, so a rollback
    reverses exactly what ran. With ``delete_many(keys)``, the deletes of a batch go
    ``DELETE_BATCH`` keys to a call (one DeleteObjects request on s3) instead of one each.
    """
    keys_of = getattr(target, "op_keys", None)
    if keys_of is None or len(ops) < 2:
        for op in ops:
            run_one(op)
        return
    from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

    with ThreadPoolExecutor(ORDERED_OPS_THREADS, thread_name_prefix="epochsync-ordered") as pool:
        for batch in independent_batches(ops, keys_of):
            if len(batch) == 1:
                run_one(batch[0])
                continue
            deletes = [op["key"] for op in batch if op.get("op") == "delete"] if delete_many else []
            if len(deletes) >= 2:
                rest = [op for op in batch if op.get("op") != "delete"]
                futures = [
                    pool.submit(delete_many, deletes[i : i + DELETE_BATCH])
                    for i in range(0, len(deletes), DELETE_BATCH)
                ]
                futures += [pool.submit(run_one, op) for op in rest]
            else:
                futures = [pool.submit(run_one, op) for op in batch]
            _, pending = wait(futures, return_when=FIRST_EXCEPTION)
            for f in pending:
                f.cancel()
            wait(futures)
            for f in futures:
                exc = None if f.cancelled() else f.exception()
                if exc is not None:
                    raise exc


#: data operations in flight when a plan is applied without a Spark session (the target contract tests)
LOCAL_APPLY_THREADS = 8

#: data operations in flight in each executor task (``EPOCHSYNC_APPLY_TASK_THREADS``): the
#: operations wait on S3 and fsync more than on the CPU, so a task keeps several going
TASK_APPLY_THREADS = 4


#: fewer data operations than this run in this process's threads even with a Spark session
#: (``EPOCHSYNC_APPLY_EXECUTOR_MIN_OPS``): a Spark job costs more than a few dozen operations
EXECUTOR_MIN_OPS = 64
#: the same into a posix target: the target is a file system this process writes anyway (the
#: namespace and post phases run here), and an operation is one or two ranged GETs and a few
#: system calls. On a 2-core machine with a warm local[2] server this process's threads beat
#: the executors at 500 operations (bench-warm's epoch 2) and at 1,916 (its epoch 1, 62 MB):
#: no job, no Python workers importing the package and building clients, and an epoch that
#: needs no other Spark job never connects (docs/INTERNALS.md "Apply of a small epoch into a
#: posix target"); above this the executors' second process pays for itself, not measured
POSIX_EXECUTOR_MIN_OPS = 2048


def _client_ops(ops: list[dict], target, source_io) -> int:
    """The data operations that move bytes through the client: all but the server-side copies
    of pinned source versions (``_whole_file_how`` ``"copy"``), what :func:`executor_min_ops`
    weighs. A copy is one request whose bytes never leave the store; 1,000 of them in this
    process's threads took 2.35-2.54 s against 2.61-2.80 on the executors (bench e2e's 1,000
    changed files of 10,000, 2026-11-29), and 5.3 CPU-s in all against 5.8."""
    if ops and getattr(target, "kind", None) == "s3" and same_store(source_io, target):
        return sum(
            1
            for op in ops
            if op.get("stripes") or op.get("extra_keys") or _whole_file_how(op, target, source_io) != "copy"
        )
    return len(ops)


def executor_min_ops(target=None) -> int:
    """:data:`EXECUTOR_MIN_OPS` (:data:`POSIX_EXECUTOR_MIN_OPS` into a posix target), or
    ``EPOCHSYNC_APPLY_EXECUTOR_MIN_OPS`` when set (0: always on the executors)."""
    text = os.environ.get("EPOCHSYNC_APPLY_EXECUTOR_MIN_OPS", "").strip()
    if not text:
        return POSIX_EXECUTOR_MIN_OPS if getattr(target, "kind", None) == "posix" else EXECUTOR_MIN_OPS
    if not text.isdigit():
        raise EpochsyncError(f"EPOCHSYNC_APPLY_EXECUTOR_MIN_OPS must be a whole number of operations, got {text!r}")
    return int(text)


def task_apply_threads() -> int:
    """Data operations in flight per executor task (``EPOCHSYNC_APPLY_TASK_THREADS``, default 4, at most 99)."""
    text = os.environ.get("EPOCHSYNC_APPLY_TASK_THREADS", "").strip() or str(TASK_APPLY_THREADS)
    try:
        n = int(text)
    except ValueError:
        raise EpochsyncError(f"EPOCHSYNC_APPLY_TASK_THREADS must be a whole number of threads, got {text!r}") from None
    # at most 99: a thread's journal writer is data-<task * 100 + thread>
    return min(99, max(1, n))


def _partitions_in_threads(
    parts: list[tuple[int, list[dict]]], target, source_io, source_bucket: str, jdir: str, faults, plan: dict, token
) -> list[dict]:
    """:func:`_data_partition` of each ``(index, ops)`` of ``parts`` in its own thread; returns their results.

    Each thread has its own journal file (``data-<index>``), as an executor task would; the
    threads share the caller's S3 clients (thread-safe, and a client costs about 10 ms to
    build) and so its counters: the results' ``source`` and ``target`` figures are this
    process's, not each thread's. After the first failure the other threads finish the
    operation they are in and stop, so a rollback never races a writer.
    """
    import threading
    from concurrent.futures import ThreadPoolExecutor

    stop = threading.Event()
    for io in (source_io, getattr(target, "io", None)):
        if io is not None:
            _ = io.client  # made once, before the threads share it

    def until_stopped(part):
        for op in part:
            if stop.is_set():
                return
            yield op

    def run(index: int, part: list[dict]):
        try:
            return list(
                _data_partition(index, until_stopped(part), target, source_io, source_bucket, jdir, faults, token)
            )
        except BaseException:
            stop.set()
            raise

    if len(parts) == 1:  # no thread for a single partition
        return run(*parts[0])
    with ThreadPoolExecutor(len(parts), thread_name_prefix="epochsync-apply") as pool:
        futures = [pool.submit(run, index, part) for index, part in parts]
    errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:
        exc = errors[0]
        if isinstance(exc, EpochsyncError):
            raise exc
        raise EpochsyncError(f"apply of epoch {plan['epoch']} failed: {type(exc).__name__}: {exc}") from exc
    return [r for f in futures for r in f.result()]


def _apply_in_threads(
    ops: list[dict], target, source_io, source_bucket: str, jdir: str, faults, plan: dict, token=None
):
    """The executors' work in this process: ``LOCAL_APPLY_THREADS`` partitions, one thread each
    (:func:`_partitions_in_threads`); the shared counters are the caller's, counted there."""
    n = max(1, min(LOCAL_APPLY_THREADS, len(ops)))
    out = _partitions_in_threads(
        [(i, ops[i::n]) for i in range(n)], target, source_io, source_bucket, jdir, faults, plan, token
    )
    for r in out:
        r["source"], r["target"] = {}, {}
    return out


def _task_in_threads(
    index: int, ops: list[dict], threads: int, target, source_io, source_bucket: str, jdir: str, faults, plan, token
) -> dict:
    """One executor task's operations in up to ``threads`` threads (journals ``data-<index * 100
    + thread>``); returns the task's one report: the threads' sums, this process's request
    counters and the facts of what it wrote."""
    n = max(1, min(threads, len(ops)))
    started = time.monotonic()
    results = _partitions_in_threads(
        [(index * 100 + j, ops[j::n]) for j in range(n)],
        target,
        source_io,
        source_bucket,
        jdir,
        faults,
        plan,
        token,
    )
    report = {k: sum(r[k] for r in results) for k in ("pulled", "written", "ops")}
    report["source"] = source_io.counters.as_dict()
    report["target"] = target.io.counters.as_dict() if hasattr(target, "io") else {}
    facts: dict = {}
    for r in results:
        facts.update(r.get("facts") or {})
    report["facts"] = facts
    report["seconds"] = time.monotonic() - started
    return report


def _apply_on_executors(spark, ops: list[dict], plan: dict, target, source_io, source_bucket, jdir, faults, token=None):
    """The data operations as one Spark job: ``mapInArrow`` over partition numbers, one report row each.

    Each partition takes every n-th operation (the plan travels with the function) and runs
    them in :func:`task_apply_threads` threads, each writing its own journal file
    (:func:`_task_in_threads`). A task that Spark re-runs after a failure refuses at once
    (``spark.task.maxFailures`` may be above 1 on a cluster): a half-done partition must be
    rolled back, never re-applied behind the journal. After a failure the job's other
    tasks are interrupted through the session tag; a straggler still running stops at its
    next journal entry once the rollback has written the ``ABORTED`` marker, and the
    rollback waits for every writer's journal lock (:func:`epochsync.journal.undo.wait_for_writers`).
    """

    # one task per slot, more only for plans large enough to balance (a task on a fresh
    # session pays a Python worker's start)
    n = max(1, min(len(ops), executor_slots(spark) * (2 if len(ops) > 2000 else 1)))
    parts = [ops[i::n] for i in range(n)]
    threads = task_apply_threads()

    def task(index: int):
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is not None and ctx.attemptNumber() > 0:
            raise EpochsyncError("apply: Spark re-ran a failed data task; the epoch is rolled back instead")
        yield _task_in_threads(
            index, parts[index], threads, target, source_io, source_bucket, jdir, faults, plan, token
        )

    return run_report_tasks(
        spark,
        n,
        task,
        tag=f"apply-data-{plan['target']}-{plan['epoch']}-{os.getpid()}-{time.monotonic_ns()}",
        what=f"apply of epoch {plan['epoch']}",
    )


# --------------------------------------------------------------------------- the stage function


@holds_target_lease
def run_apply(cfg, target, epoch: int, spark=None, inject=None, first_epoch: int | None = None) -> dict:
    """Apply the stored plan (see the module docstring); returns the apply figures."""
    from epochsync.journal.faults import resolve
    from epochsync.stages.apply import apply_plan

    t0 = time.monotonic()
    cfg = _config(cfg)
    tcfg = _target_cfg(cfg, target)
    pre = check_preconditions(cfg, tcfg, epoch, first_epoch)
    if pre["action"] == "noop":
        return {"noop": True, "message": pre["message"]}
    if pre["action"] == "rollback_first":
        run_rollback(cfg, tcfg, spark=spark)
    plan = load_plan(cfg, tcfg.name, epoch)
    tgt = open_target(tcfg)
    from epochsync.targets.s3 import S3Target

    if isinstance(tgt, S3Target):
        tgt.ensure_bucket()
        # a replica of the old layout moves before anything of this epoch is fenced or written
        tgt.upgrade_layout(progress=lambda line: print(f"apply: {line}", flush=True))
    source_io, bucket = source_access(cfg, tcfg, epoch)
    probe_path = local_path(Warehouse(cfg.warehouse).store_probe(tcfg.name))
    problems, state, fence = write_fence(plan, tgt, source_io, probe_path)
    if problems:
        shown = "; ".join(problems[:20]) + (f"; and {len(problems) - 20} more" if len(problems) > 20 else "")
        raise FenceError(
            f"write fence: target {tcfg.name} ({tgt.describe()}) was changed by someone else since epoch "
            f"{pre['committed']}: {shown}. Nothing was written. Restore those paths or re-hydrate the target."
        )
    jdir = journal_dir(cfg.warehouse, tcfg.name, epoch)
    os.makedirs(jdir, exist_ok=True)
    # the Airflow run that writes (its rollback task undoes only its own run's journal)
    meta = {
        "epoch": epoch,
        "first_epoch": plan.get("first_epoch"),
        "airflow_run": os.environ.get("AIRFLOW_CTX_DAG_RUN_ID"),
    }
    write_json_atomic(os.path.join(jdir, "meta.json"), meta)
    faults = fault_counter(cfg.warehouse, tcfg.name, epoch, resolve(inject))
    facts_path = os.path.join(plan_dir(cfg.warehouse, tcfg.name, epoch), APPLIED_FACTS)
    if os.path.exists(facts_path):  # an earlier attempt's: never verify against it
        os.remove(facts_path)
    figures = apply_plan(plan, tgt, source_io, bucket, jdir, state, spark=spark, faults=faults)
    # verify's facts (s3: the versions the apply wrote, from its responses), beside the plan
    write_json_atomic(facts_path, {"epoch": epoch, "facts": figures.pop("facts", {})})
    figures["fence"] = fence
    figures["seconds"] = round(time.monotonic() - t0, 3)
    write_stage_stats(cfg.warehouse, tcfg.name, epoch, "apply", figures)
    return figures
