"""The driver's verdict and commit: closure, bad records and continuity judged, epochs swapped in under a lock, markers."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass

from epochsync.core.errors import EpochError, EpochsyncError, NotClosedError, ParseError

#: Bytes a fast-path chunk holds (cut at a line end); bounds an executor's memory per file.
from epochsync.stages.ingest.closure import Closure
from epochsync.stages.ingest.cursors import IndexSpan, find_index_gaps, read_cursor_indexes
from epochsync.stages.ingest.executor import IngestJob
from epochsync.stages.ingest.files import list_changelog_files
from epochsync.warehouse.paths import Warehouse, local_path


class IngestError(EpochError):
    """The epoch cannot be ingested: bad records, an index gap, or an open epoch."""

    def __init__(self, problems: list[str], total: int | None = None, hint: str = ""):
        self.problems = problems
        total = len(problems) if total is None else total
        more = f" (and {total - 1} more)" if total > 1 else ""
        super().__init__(problems[0] + more + (f"; {hint}" if hint else ""))


class IngestNotClosedError(IngestError, NotClosedError):
    """The epoch to ingest is not closed yet (a server's ``EPOCH`` record is missing)."""


@dataclass
class _Judgement:
    bad: list[tuple[int | None, dict]]
    bad_total: int
    records: dict[int, int]


def _judge(src, job: IngestJob, reports: list[dict], skipped_closed: Mapping[str, int]) -> _Judgement:
    """Closure, bad records and continuity; raises IngestError when the run must not commit."""
    closed: dict[str, int | None] = {s: skipped_closed.get(s) for s in src.servers}
    for r in reports:
        c = r["closed_through"]
        if c is not None and (closed[r["server"]] is None or c > closed[r["server"]]):
            closed[r["server"]] = c
    closure = Closure(job.last, closed, src.name)
    if not closure.closed:
        raise IngestNotClosedError(
            [closure.describe()], hint="ingest runs only on closed epochs (the sensor waits for them)"
        )

    bad = [(e, d) for r in reports for e, d in r["errors"]]
    bad_total = len(bad) + sum(r["errors_dropped"] for r in reports)
    if bad and src.on_bad_record != "quarantine":
        d = bad[0][1]
        first = ParseError(d["file"], d["line"], d["reason"], offset=d["offset"])
        raise IngestError(
            [f"bad record of server {d['server']}: {first}"],
            total=bad_total,
            hint="fix the changelog, or set on_bad_record: quarantine for the source to set bad records aside",
        )
    gaps = [g for r in reports for g in r["gaps"]]
    if job.continuity:
        spans = [
            IndexSpan(
                r["server"],
                r["file"],
                r["span_first"],
                r["span_last"],
                r["bad_before"],
                r["bad_after"],
                r["last_is_mark"],
                r["first_is_epoch"],
            )
            for r in reports
        ]
        gaps += find_index_gaps(spans, job.after_index)
    if gaps:
        raise IngestError(gaps, hint="records were lost: the epoch cannot be replicated exactly")
    records: dict[int, int] = {}
    for r in reports:
        for e, n in r["records"].items():
            records[int(e)] = records.get(int(e), 0) + n
    return _Judgement(bad, bad_total, records)


#: in ``records/source=S/``: ingests of the source commit one at a time while they hold it
COMMIT_LOCK = "_ingest.lock"


def _commit(wh: Warehouse, src, job: IngestJob, staging: str, files, result: _Judgement) -> list[int]:
    """Quarantine first, then each epoch's directory swapped in; returns the epochs left in place.

    Under the source's commit lock, so two ingests of one epoch (two targets, a retry)
    never interleave their swaps. An epoch whose committed data files are byte for byte the
    staged ones is not swapped: only its marker is replaced (one rename), so a reader of
    those files (another target's merge) is not disturbed. Otherwise the staged directory,
    marker included, replaces the committed one in one atomic exchange where the file
    system can (Linux ``renameat2``), else by two renames.
    """
    from epochsync.warehouse import fs as warehouse_fs

    by_epoch: dict[int, list[dict]] = {}
    for epoch, d in result.bad:
        by_epoch.setdefault(job.first if epoch is None else epoch, []).append(d)
    markers = _markers(src, job, files, result)
    unchanged = []
    base = local_path(wh.records(src.name))
    with warehouse_fs.lock_file(os.path.join(base, COMMIT_LOCK)):
        for epoch in range(job.first, job.last + 1):
            qfile = os.path.join(local_path(wh.quarantine(src.name, epoch)), "part-00000.jsonl")
            entries = by_epoch.get(epoch)
            if entries:
                text = "".join(json.dumps(d, ensure_ascii=False, separators=(",", ":")) + "\n" for d in entries)
                warehouse_fs.write_text_atomic(qfile, text)
            else:
                warehouse_fs.delete(os.path.dirname(qfile))
        for epoch in range(job.first, job.last + 1):
            staged = os.path.join(local_path(staging), f"epoch={epoch}")
            final = local_path(wh.records(src.name, epoch))
            os.makedirs(staged, exist_ok=True)  # an epoch with no records is still ingested
            if same_data_files(staged, final):
                warehouse_fs.write_text_atomic(os.path.join(final, INGEST_MARKER), markers[epoch])
                unchanged.append(epoch)
            else:
                warehouse_fs.write_text_atomic(os.path.join(staged, INGEST_MARKER), markers[epoch])
                warehouse_fs.move_replacing(staged, final)
    return unchanged


def _data_files(root: str) -> dict[str, int]:
    """Relative path → size of the files readers read under ``root`` (names starting with
    ``_`` or ``.`` aside, as Spark and pyarrow skip them)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(("_", "."))]
        for name in filenames:
            if not name.startswith(("_", ".")):
                path = os.path.join(dirpath, name)
                out[os.path.relpath(path, root)] = os.path.getsize(path)
    return out


def same_data_files(a: str, b: str) -> bool:
    """True if directories ``a`` and ``b`` both exist and hold the same data files, byte for byte."""
    if not (os.path.isdir(a) and os.path.isdir(b)):
        return False
    fa, fb = _data_files(a), _data_files(b)
    if fa != fb:
        return False
    for rel in fa:
        with open(os.path.join(a, rel), "rb") as x, open(os.path.join(b, rel), "rb") as y:
            while True:
                bx, by = x.read(1 << 20), y.read(1 << 20)
                if bx != by:
                    return False
                if not bx:
                    break
    return True


#: in each ingested epoch's records directory (Spark's readers skip ``_`` files): what was read
INGEST_MARKER = "_epochsync_ingest.json"


def _markers(src, job: IngestJob, files, result: _Judgement) -> dict[int, str]:
    """Per epoch: the window, the consumer cursor it started from and the changelog files
    read (with sizes): the inputs that decide the result, so :func:`ingest_is_current`
    can tell a second target's ingest of the same closed epoch that there is nothing to redo."""
    out = {}
    for epoch in range(job.first, job.last + 1):
        marker = {
            "source": src.name,
            "epoch": epoch,
            "window": [job.first, job.last],
            "records": result.records.get(epoch, 0),
            "quarantined": sum(1 for e, _ in result.bad if (job.first if e is None else e) == epoch),
            "after_index": dict(job.after_index) if job.after_index is not None else None,
            "files": {f.uri: f.size for fl in files.values() for f in fl},
            "ingested_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        out[epoch] = json.dumps(marker, sort_keys=True)
    return out


def ingest_is_current(cfg, source: str, first_epoch: int, last_epoch: int, consumer: str | None = None) -> str | None:
    """Why epochs ``first..last`` need no new ingest, or None (then run it).

    Current means: a ``file://`` warehouse holds a marker for every epoch of the window
    written by an ingest of exactly that window; every changelog file it read is still
    there with the same size; and ``consumer``'s cursor (what the ingest keeps records
    above and checks continuity from) is the one that ingest started from. Then a new
    ingest would write the same records. Pure Python, no
    Spark: the Airflow task asks before it pays for a spark-submit. Anything unusual
    (another warehouse scheme, a changed or missing file, a different window) says None.
    """
    if not str(cfg.warehouse).startswith("file://"):
        return None
    src = cfg.source(source)
    wh = Warehouse(cfg.warehouse)
    markers = []
    for epoch in range(first_epoch, last_epoch + 1):
        path = os.path.join(local_path(wh.records(source, epoch)), INGEST_MARKER)
        try:
            with open(path, encoding="utf-8") as fh:
                marker = json.load(fh)
        except (OSError, ValueError):
            return None
        if marker.get("window") != [first_epoch, last_epoch] or marker.get("source") != source:
            return None
        markers.append(marker)
    try:
        listed = {f.uri: f.size for fl in list_changelog_files(src).values() for f in fl}
    except EpochsyncError:
        return None
    if any(listed.get(uri) != size for uri, size in markers[0]["files"].items()):
        return None
    if read_cursor_indexes(cfg.warehouse, source, consumer) != markers[0]["after_index"]:
        return None
    records = sum(m["records"] for m in markers)
    window = f"epoch {first_epoch}" if first_epoch == last_epoch else f"epochs {first_epoch}..{last_epoch}"
    return (
        f"{window} of source {source!r} already ingested at {markers[0]['ingested_at']} ({records} records; "
        f"its {len(markers[0]['files'])} changelog file(s) unchanged): nothing to redo"
    )


def _stats(src, job: IngestJob, files, reports: list[dict], result: _Judgement, seconds: float) -> dict:
    servers = {}
    for s in src.servers:
        rs = [r for r in reports if r["server"] == s]
        closed = [r["closed_through"] for r in rs if r["closed_through"] is not None]
        servers[s] = {
            "files": len(files.get(s, [])),
            "bytes": sum(f.size for f in files.get(s, [])),
            "records": sum(sum(r["records"].values()) for r in rs),
            "bad_records": sum(len(r["errors"]) + r["errors_dropped"] for r in rs),
            "closed_through": max(closed) if closed else None,
            "fast_path_records": sum(r["fast_lines"] for r in rs),
            "reference_path_records": sum(r["slow_lines"] for r in rs),
        }
    return {
        "source": src.name,
        "first_epoch": job.first,
        "last_epoch": job.last,
        "records": sum(result.records.values()),
        "records_per_epoch": {e: result.records.get(e, 0) for e in range(job.first, job.last + 1)},
        "quarantined": result.bad_total,
        #: time the executors spent reading, parsing and checking (summed over tasks)
        "parse_seconds": round(sum(r["seconds"] for r in reports), 3),
        "write_seconds": round(sum(r.get("write_seconds", 0.0) for r in reports), 3),
        "servers": servers,
        "seconds": round(seconds, 3),
    }
