"""The ingest stage: raw changelogs of one or more epochs → canonical records in the warehouse.

What it does, for a source and epochs ``first..last``:

1. Lists every configured server's changelog files under ``<changelogs.uri>/<server>/``
   (any names, read in name order; hidden files, starting with ``.``, are skipped so a
   writer can stage a file before renaming it). The caller lists (a local directory, or an
   ``s3://bucket/prefix/`` with boto3); the executors read.
2. Parses them on the executors (one Spark job, ``mapInArrow`` over a few task ids; Spark
   Connect and classic sessions alike): no per-record Python UDF. Canonical JSON Lines take
   a fast path (pyarrow's strict JSON reader and vectorised checks, equivalent to the
   importer's checks); any chunk the fast path has a doubt about, and every other format,
   goes through the importers' ``parse_stream`` — the reference, which names ``FILE:LINE``.
3. The executors write ``records/source=S/epoch=E/server=X/`` Parquet with pyarrow into a
   staging directory of the warehouse (``file://``: local, or a file system shared by the
   executors and the caller) and return one report row per file. The caller then checks
   them: bad records (the epoch fails, or with ``on_bad_record: quarantine`` they go to
   ``quarantine/source=S/epoch=E/`` and the run goes on), per-server index continuity
   against the consumer cursor, and that every server has closed ``last``. Only then are
   the epochs' directories swapped in, one commit at a time per source (a lock file), so
   a failed run leaves the warehouse as it was and a re-run overwrites its own output. An
   epoch whose committed files already hold exactly the staged bytes (a retry, a second
   target's ingest, two runs at once) is left in place: its readers are never disturbed.

This module is the driver (:func:`run_ingest`, :func:`read_records`); the rest of the
stage is in its modules: ``files`` (listing and opening changelog files), ``cursors``
(consumer cursors, index gaps), ``executor`` (what a Spark task runs: parsing into
Parquet parts), ``closure`` (which servers have closed an epoch; the Airflow sensor asks
before ingest) and ``commit`` (the verdict, the swap under a lock, the markers). Nothing
heavy is imported at module level.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
import uuid
from collections.abc import Callable

from epochsync.core.errors import EpochError, EpochsyncError, StoreError
from epochsync.stages.ingest.closure import _require_epochs
from epochsync.stages.ingest.commit import _commit, _judge, _stats
from epochsync.stages.ingest.cursors import read_cursor_indexes
from epochsync.stages.ingest.executor import IngestJob, _epoch_grid, _task_runner

#: Bytes a fast-path chunk holds (cut at a line end); bounds an executor's memory per file.
from epochsync.stages.ingest.files import ChangelogFile, _changelog_s3, file_tail, list_changelog_files, settled_files
from epochsync.warehouse.paths import Warehouse, local_path

#: JSON Lines tasks per core: files are packed into this many tasks per core at most.
TASKS_PER_CORE = 4


#: changelog bytes one ingest task is worth (about 40,000 JSON Lines records)
BYTES_PER_TASK = 16 * 1024 * 1024


#: cores assumed when the session says neither spark.default.parallelism nor a local[N] master
DEFAULT_CORES = 2


def task_slots(spark) -> int:
    """How many tasks an ingest job may have: :data:`TASKS_PER_CORE` per core of the session.

    Cores: ``spark.default.parallelism`` when set, else ``spark.cores.max``, else the N of
    a ``local[N]`` master, else :data:`DEFAULT_CORES`. Read through ``spark.conf``, which
    Spark Connect serves too.
    """

    def conf(key: str) -> str | None:
        try:
            return spark.conf.get(key, None)
        except Exception:  # a key the server refuses to show: not set, as far as we know
            return None

    cores = None
    for key in ("spark.default.parallelism", "spark.cores.max"):
        value = conf(key)
        if value and value.strip().isdigit() and int(value) > 0:
            cores = int(value)
            break
    if cores is None:
        m = re.fullmatch(r"local(?:\[(\d+|\*)(?:,\s*\d+)?\])?", (conf("spark.master") or "").strip())
        if m:
            n = m.group(1)
            cores = 1 if n is None else (os.cpu_count() or DEFAULT_CORES) if n == "*" else int(n)
    return max(1, cores or DEFAULT_CORES) * TASKS_PER_CORE


def run_ingest(
    cfg,
    source: str,
    first_epoch: int,
    last_epoch: int | None = None,
    spark=None,
    *,
    consumer: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Ingest epochs ``first_epoch..last_epoch`` of ``source`` into the warehouse; returns figures.

    Raises :class:`IngestError` (nothing written) when a server has not closed
    ``last_epoch``, an index is missing, or a record is bad and the source does not say
    ``on_bad_record: quarantine``. ``consumer`` picks the cursor continuity starts from
    (default: the minimum over the source's consumers). The parse is one Spark job
    (``spark``, a classic or a Spark Connect session; one is started if None and there
    is a file to read); its executors write the Parquet into the warehouse, which must be
    ``file://`` on a file system they share with this process. Two ingests of the same
    epochs may run at once (two targets, a retry): their commits take turns, and an epoch
    whose committed files hold the same bytes is left in place (``unchanged_epochs``).
    """
    from epochsync.warehouse import fs as warehouse_fs

    last_epoch = first_epoch if last_epoch is None else last_epoch
    if first_epoch < 1 or last_epoch < first_epoch:
        raise EpochError(f"epochs to ingest must satisfy 1 ≤ first ≤ last, got {first_epoch}..{last_epoch}")
    if not warehouse_fs.is_local(cfg.warehouse):
        raise EpochError(
            f"ingest needs a file:// warehouse (local, or a file system shared by the Spark executors "
            f"at the same path), not {cfg.warehouse}"
        )
    say = progress or (lambda line: None)
    started = time.perf_counter()
    src = cfg.source(source)
    _require_epochs(src)
    wh = Warehouse(cfg.warehouse)
    fmt = src.changelogs.format
    after = read_cursor_indexes(cfg.warehouse, source, consumer)
    start_ns, interval_ns = _epoch_grid(src)
    job = IngestJob(
        source=source,
        fmt=fmt,
        epochs_from=src.changelogs.epochs_from,
        first=first_epoch,
        last=last_epoch,
        continuity=fmt != "gluster",  # Gluster has no native index (INTERNALS "Epochs")
        after_index=after,
        s3=_changelog_s3(src),
        start_ns=start_ns,
        interval_ns=interval_ns,
    )
    phases: dict[str, float] = {}
    try:
        files = list_changelog_files(src)  # on the caller: a few LISTs per server
    except StoreError as exc:
        raise StoreError(f"ingest of source {source!r}: {exc}") from None
    phases["list"] = time.perf_counter() - started
    for server in src.servers:
        fl = files.get(server, [])
        say(f"{server}: {len(fl)} changelog file(s), {sum(f.size for f in fl)} bytes")

    listed = files
    skipped_closed: dict[str, int] = {}
    if fmt == "jsonl" and job.epochs_from == "records" and first_epoch > 1:
        # skip what earlier epochs' runs already read: the last line of each file says
        every = [f for fl in files.values() for f in fl]
        if job.s3 is None:
            tails = {f.uri: file_tail(f) for f in every}
        else:
            from concurrent.futures import ThreadPoolExecutor

            s3 = job.s3
            try:
                with ThreadPoolExecutor(8) as pool:
                    tails = dict(zip((f.uri for f in every), pool.map(lambda f: file_tail(f, s3), every)))
            except StoreError as exc:
                raise StoreError(f"ingest of source {source!r}: {exc}") from None
        files = settled_files(files, tails, first_epoch, after)
        for server, fl in listed.items():
            # a skipped file's closing EPOCH still counts for the closure
            for f in fl[: len(fl) - len(files[server])]:
                tail = tails[f.uri]
                if tail is not None and tail[2] == "EPOCH" and tail[1] > skipped_closed.get(server, -1):
                    skipped_closed[server] = tail[1]
    tasks: list[list[ChangelogFile]] = []
    to_read = sum(f.size for fl in files.values() for f in fl)
    # a few changelog bytes are parsed here, by the same task code: a Spark job would cost more
    limit = local_max_bytes()
    here = 0 < limit and to_read <= limit
    if any(files.values()):
        if spark is None and not here:
            from epochsync.spark import spark_session

            spark = spark_session("epochsync-ingest")
        # jsonl files stand alone: packed into a few balanced tasks per core; other formats
        # carry MARK epochs and index order from file to file: one task per server.
        if fmt == "jsonl":
            every = [f for fl in files.values() for f in fl]
            # a task costs a Python worker's start on a fresh session: small epochs take few
            by_size = max(1, -(-sum(f.size for f in every) // BYTES_PER_TASK))
            tasks = pack_files(every, by_size if here else min(task_slots(spark), by_size))
        else:
            tasks = [fl for fl in files.values() if fl]
    staging = f"{wh.records(source)}/_ingest-{uuid.uuid4().hex[:12]}"
    # executors write Parquet with pyarrow straight into the (local or shared) staging
    # directory: no Arrow → row conversion and no sort in the JVM
    job = dataclasses.replace(job, staging_dir=local_path(staging))
    try:
        reports: list[dict] = []
        if tasks and here:
            reports = _dedupe(_run_here(_task_runner(tasks, job), len(tasks), source))
        elif tasks:
            ids = spark.range(0, len(tasks), 1, numPartitions=len(tasks))
            try:
                rows = ids.mapInArrow(_task_runner(tasks, job), "report string").collect()
            except Exception as exc:  # Py4J, PySpark and Spark Connect wrap what the executor raised
                raise _executor_failure(exc, source) from None
            reports = _dedupe([json.loads(r["report"]) for r in rows])
        phases["here" if here else "spark_job"] = time.perf_counter() - started - phases["list"]
        result = _judge(src, job, reports, skipped_closed)
        unchanged = _commit(wh, src, job, staging, files, result)
    finally:
        warehouse_fs.delete(staging)
    phases["check_and_commit"] = time.perf_counter() - started - sum(phases.values())

    stats = _stats(src, job, files, reports, result, time.perf_counter() - started)
    stats["unchanged_epochs"] = unchanged
    stats["in_process"] = here
    for server, s in stats["servers"].items():
        # files before the run's epochs (and below the cursor) are listed but not read
        s["files_skipped"] = len(listed.get(server, [])) - len(files.get(server, []))
        if server in skipped_closed and (s["closed_through"] or -1) < skipped_closed[server]:
            s["closed_through"] = skipped_closed[server]
    stats["phase_seconds"] = {k: round(v, 3) for k, v in phases.items()}
    for server, s in stats["servers"].items():
        say(
            f"{server}: {s['records']} records of epochs {first_epoch}..{last_epoch}, "
            f"closed through epoch {s['closed_through']}, {s['bad_records']} bad"
        )
    if unchanged:
        say(f"epoch(s) {', '.join(map(str, unchanged))}: already ingested with the same bytes, left in place")
    return stats


#: changelog bytes up to which an ingest parses here, not in a Spark job
#: (``EPOCHSYNC_INGEST_LOCAL_MAX_BYTES``; 0: always Spark). Measured on a Gluster cut of 38 MB
#: (150,173 records, 2 bricks; load 3, side by side): 1.8-2.7 s here (330 MB peak RSS)
#: against 1.4-5.9 s on a warm local[2] server, and 37.6 s in bench-gluster's loaded set-up
LOCAL_MAX_BYTES = 64 * 1024 * 1024


def local_max_bytes() -> int:
    """:data:`LOCAL_MAX_BYTES`, or ``EPOCHSYNC_INGEST_LOCAL_MAX_BYTES`` when set."""
    raw = os.environ.get("EPOCHSYNC_INGEST_LOCAL_MAX_BYTES", "").strip()
    if not raw:
        return LOCAL_MAX_BYTES
    if not raw.isdigit():
        raise EpochError(f"EPOCHSYNC_INGEST_LOCAL_MAX_BYTES must be a number of bytes (0 or more), not {raw!r}")
    return int(raw)


def _run_here(run, n: int, source: str) -> list[dict]:
    """The tasks' function (:func:`_task_runner`) in this process, one task after the other;
    its errors read as they do from an executor (:func:`_executor_failure`)."""
    import pyarrow as pa

    from epochsync.core.arrow import array

    try:
        batches = list(run([pa.record_batch([array(range(n), pa.int64())], names=["id"])]))
    except EpochsyncError as exc:
        cls = StoreError if isinstance(exc, StoreError) else EpochError
        raise cls(f"ingest of source {source!r}: {exc}") from None
    return [json.loads(r) for b in batches for r in b.column(0).to_pylist()]


_EXECUTOR_ERROR = re.compile(r"epochsync\.core\.errors\.(\w+): (.+)")


def _executor_failure(exc: Exception, source: str) -> EpochsyncError:
    """One line for a failed Spark job: the executor's own epochsync error if it raised one."""
    text = str(exc)
    found = _EXECUTOR_ERROR.findall(text)
    if found:
        kind, message = found[-1]
        cls = StoreError if kind == "StoreError" else EpochError
        return cls(f"ingest of source {source!r}: {message.strip()}")
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), repr(exc))
    return EpochError(f"ingest of source {source!r} failed on an executor: {first[:500]}")


def pack_files(files: list[ChangelogFile], slots: int) -> list[list[ChangelogFile]]:
    """At most ``slots`` tasks of similar total size (largest file first into the lightest task).

    One task per file would cost more in scheduling than in work when a source has many
    small files (one per server per epoch); a few tasks per core keep both cores busy.
    """
    import heapq

    bins: list[tuple[int, int, list[ChangelogFile]]] = [(0, i, []) for i in range(min(slots, len(files)))]
    for f in sorted(files, key=lambda f: (-f.size, f.uri)):
        size, i, members = heapq.heappop(bins)
        members.append(f)
        heapq.heappush(bins, (size + max(f.size, 1), i, members))
    return [members for _, _, members in sorted(bins, key=lambda b: -b[0])]


def _dedupe(reports: list[dict]) -> list[dict]:
    """One report per file (a retried task reports twice), in server, file order."""
    by_file = {(r["server"], r["ordinal"]): r for r in reports}
    return [by_file[k] for k in sorted(by_file)]


def read_records(
    spark,
    warehouse: str,
    source: str,
    first_epoch: int,
    last_epoch: int | None = None,
    *,
    read_token: str | None = None,
):
    """Ingested records of epochs ``first..last`` as a DataFrame in the canonical schema.

    ``read_token`` makes this read's plan differ from every other read of the same files
    (an option the Parquet source ignores): a Connect session's plan cache, when a stage
    turns it on, then never serves a file listing from before a rewrite.
    """
    from pyspark.sql import functions as F

    from epochsync.core.schema import record_struct_type

    last_epoch = first_epoch if last_epoch is None else last_epoch
    wh = Warehouse(warehouse)
    schema = record_struct_type()
    paths = [wh.records(source, e) for e in range(first_epoch, last_epoch + 1)]
    from epochsync.warehouse import fs as warehouse_fs

    missing = [p for p in paths if not warehouse_fs.exists(p)]
    if missing:
        raise EpochError(f"not ingested yet: {', '.join(missing)}")
    reader = spark.read.schema(schema).option("basePath", wh.records(source))
    if read_token:
        reader = reader.option("epochsync.read", read_token)
    df = reader.parquet(*paths)
    return df.filter(F.col("epoch").between(first_epoch, last_epoch)).select(*schema.fieldNames())
