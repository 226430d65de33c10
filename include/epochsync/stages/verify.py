"""Verify: every path an epoch touched is, in the target, what the source holds at E.

Files: size, then the target's bytes compared byte for byte with the source's bytes at E,
read from the pinned versions of the source objects (the frozen state of the epoch) and
reassembled through the source layout; on the Spark executors when there are many
(:func:`check_contents`). Every path: type, permission bits, symlink
target, xattrs (the ones the target can hold) and, as root on posix, ownership.
Paths the epoch removed must be gone. A sampling ratio (``verify.sample``) checks a
deterministic subset of the files' contents (attributes are always checked).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time

from epochsync.core.errors import EpochsyncError, VerifyError
from epochsync.core.layout import assemble_file, object_size
from epochsync.core.probes import mutant, took
from epochsync.core.schema import Layout
from epochsync.journal.lease import holds_target_lease
from epochsync.journal.undo import (
    plan_dir,
    read_json,
    write_json_atomic,
    write_stage_stats,
)
from epochsync.stages.context import APPLIED_FACTS, _config, _target_cfg, load_plan, source_access
from epochsync.targets import open_target
from epochsync.targets.posix import XATTR_NAMESPACE


def sampled(path: str, ratio: float) -> bool:
    """A stable choice of paths (the same on every run) for a ratio in [0, 1]."""
    if ratio >= 1.0:
        return True
    if ratio <= 0.0:
        return False
    h = int.from_bytes(hashlib.sha256(path.encode("utf-8", "surrogateescape")).digest()[:4], "big")
    return h < ratio * 2**32


def have_stripes(head: dict) -> bool:
    """Is ``head`` (a HEAD's or a listing's answer) a striped target's head object (its bytes are elsewhere)?"""
    return bool((head.get("Metadata") or {}).get("es-stripe"))


def single_object(src: dict, size: int) -> dict | None:
    """The source object that holds all of a file's ``size`` bytes at object offsets = file offsets
    (unstriped, or striped with every byte in the first stripe), else None."""
    objects = src.get("objects") or []
    if not objects or objects[0] is None:
        return None
    if src.get("layout") is not None:
        ss, sc = src["layout"]
        if any(object_size(ss, sc, i, size) for i in range(1, sc)):
            return None
    return objects[0]


def covered(item: dict, key: str, facts: dict, current: str | None = None, _depth: int = 0) -> bool:
    """Do the checksums the store gave cover this file's contents at E, with no read of it?

    ``facts`` are the apply's (key -> what its write's response said, with what the writer knew
    of the bytes; ``S3Target._wrote``); ``current`` is the version the attributes check found
    current (of the item's size and metadata): none of this holds unless it is the fact's.
    Covered, when the key's version is:

    - a PUT of a body read whole from the item's own source objects (``fact["source"]`` is the
      plan's ``source`` item: apply built the body with :func:`source_bytes`, what this stage
      would read) whose MD5, computed by the writer and sent as ``Content-MD5``, is the ETag the
      store answered with;
    - a server-side copy of the pinned source object version that holds the whole file
      (:func:`single_object`; a version never changes, and its length is the object length
      checked with the attributes);
    - a copy of a version with the same ETag (the store's checksum of the same bytes) that is
      covered itself: the version this apply wrote at a hard link's first path, or the key's
      version at E-1 for a file whose source objects and size did not change (``unchanged``:
      a rename or an attribute change), checked when that version was written;
    - a multipart upload of the item's file whose parts make the whole file, as a posix
      file's written ranges do (:func:`parts_cover`).

    Anything else (a range patch, an ETag that is not the MD5, no fact) is read.
    """
    fact = facts.get(key)
    src = item.get("source")
    if not fact or src is None:
        return False
    # the version current now is the one the fact is of (a hard link's first path: checked there)
    fresh = _depth > 0 or (current is not None and fact.get("version") == current)
    etag = fact.get("etag")
    if fact.get("md5") and etag == fact["md5"] and fact.get("source") == src:
        return _rule("verify.s3.checksum", fresh or mutant("verify-checksum-stale"))
    if fact.get("parts") is not None:
        # a multipart upload of this file: its uploaded bytes were pulled from the file's
        # source versions at E (the ones verify would read) and its parts make the file
        at_e = {(o["key"], o.get("version")) for o in src.get("objects") or [] if o}
        pulled = fact.get("pulled_from")
        return _rule(
            "verify.s3.parts",
            (fresh or mutant("verify-parts-stale"))
            and pulled is not None
            and all((k, v) in at_e and v for k, v in pulled)
            and parts_cover(fact["parts"], etag, item),
        )
    copied = fact.get("copied_from")
    if copied:
        obj = single_object(src, int(item["attrs"].get("size") or 0))
        return _rule(
            "verify.s3.copy",
            (fresh or mutant("verify-copy-stale"))
            and obj is not None
            and (copied["key"], copied["version"]) == (obj["key"], obj["version"]),
        )
    copy_of = fact.get("copy_of")
    if not fresh or not copy_of or not etag or copy_of.get("etag") != etag:
        return False
    first = facts.get(copy_of["key"])
    if first is not None and first.get("version") == copy_of["version"]:
        # a hard link's copy of the path written just before it (same source, same item otherwise)
        return _rule("verify.s3.link_copy", _depth < 2 and covered(item, copy_of["key"], facts, None, _depth + 1))
    return _rule("verify.s3.unchanged", bool(item.get("unchanged")))


def _rule(name: str, holds: bool) -> bool:
    """``holds``, counted under ``name`` when it does (:data:`epochsync.core.probes.PATHS`)."""
    if holds:
        took(name)
    return holds


def parts_cover(parts: list[dict], etag: str | None, item: dict) -> bool:
    """Do a multipart upload's parts (its fact's, :meth:`epochsync.targets.s3.S3Target.multipart`)
    make ``item``'s file at E? The same proof as a posix file's ``ranges`` (:func:`posix_contents`):

    - the completed version's ETag is the one its parts' ETags make (the MD5 of their digests,
      ``-N``), so the version is those parts in that order;
    - the parts' ranges run from 0 to the file's size without a gap;
    - every uploaded part's ETag is the MD5 apply computed of the bytes it sent (the store
      checked them against ``Content-MD5``): E-1's bytes of the key with the source's changed
      ranges at E laid over them, read from pinned versions (``stages.apply._compose``);
    - every copied part names the pinned version it was copied from: the key's version at E-1,
      which E-1's verify proved and the write fence found untouched since E-1's commit, and
      translate copies only ranges the source's change detection says did not change at E.

    As on posix, the bytes apply did not write are taken from E-1's proof and the source's
    change detection, not read again."""
    pos, digests = 0, []
    try:
        for part in parts:
            span = part.get("copy") or part.get("upload")
            if span is None or int(span[0]) != pos or int(span[1]) <= pos:
                return False
            pos = int(span[1])
            tag = part.get("etag") or ""
            if "upload" in part and part.get("md5") != tag:
                return False
            if "copy" in part:
                if not (part.get("from") or {}).get("version"):
                    return False
                # a copied part's ETag is the store's word for the part, not a checksum this
                # proof uses: S3 gives the MD5 of the range, SeaweedFS its chunks' "<md5>-<n>",
                # and either goes into the version's ETag by its hex digest
                tag = tag.split("-")[0]
            digest = bytes.fromhex(tag)
            if len(digest) != 16:
                return False
            digests.append(digest)
    except (TypeError, ValueError):
        return False
    if not digests or pos != int(item["attrs"].get("size") or 0):
        return False
    return etag == f"{hashlib.md5(b''.join(digests)).hexdigest()}-{len(digests)}"


def posix_contents(item: dict, fact: dict | None, identity: list | None) -> str:
    """How verify checks the contents of a posix file whose attributes and size are right, from
    apply's fact of it (:meth:`PosixTarget.settle_facts`) and its :meth:`PosixTarget.identity` now:

    - ``"ranges"``: apply wrote it and nobody changed it since (the identity is the one apply
      left): read back only the ranges apply wrote and compare them with the checksums of the
      bytes it wrote there (the source's at E, in hand when it wrote them). The ranges it did
      not write hold what E-1's verify proved, and the source's change detection says they did
      not change at E; the write fence proved them untouched since E-1's commit.
    - ``"covered"``: apply did not write it, its bytes are those of E-1 (translate's
      ``unchanged``: a rename, a new link, an attribute change) and nobody changed it since
      the apply (the fence: nor before it, since E-1's commit): no read.
    - ``"whole"``: anything else (no fact, another identity): read whole and compared with the
      source's bytes at E.
    """
    if not fact or identity is None:
        return "whole"
    if list(fact.get("id") or ()) != list(identity) and not (
        mutant("verify-ranges-stale") and fact.get("ranges") is not None
    ):
        return "whole"
    if fact.get("ranges") is not None:
        return "ranges"
    return "covered" if item.get("unchanged") else "whole"


def source_bytes(src: dict, size: int, source_io, bucket: str) -> bytes:
    """A file's bytes at E from its source objects (pinned versions)."""
    if src["layout"] is None:
        obj = src["objects"][0]
        if obj is None:  # never written by E: zeros
            return bytes(size)
        return source_io.get_range(bucket, obj["key"], obj["version"], 0, size) if size else b""
    ss, sc = src["layout"]
    objs = []
    for i, obj in enumerate(src["objects"]):
        n = object_size(ss, sc, i, size)
        objs.append(source_io.get_range(bucket, obj["key"], obj["version"], 0, n) if obj and n else None)
    return assemble_file(Layout(ss, sc), size, objs)


#: paths checked at once in one process: target stats (HEADs on s3) on the driver, file contents
#: in each content task (and on the driver when no Spark session is given)
VERIFY_THREADS = 8

#: below this many files to hash the contents are read on the driver, even with a Spark session:
#: a Spark job of a warm session costs more than a few dozen source reads
EXECUTOR_MIN_FILES = 64


def verify_plan(
    plan: dict,
    target,
    source_io,
    bucket: str,
    *,
    sample: float = 1.0,
    facts: dict | None = None,
    spark=None,
    contents: str = "changed",
) -> dict:
    """Check the target against the plan's ``verify`` items; returns figures and problems.

    Attributes are checked here, paths in ``VERIFY_THREADS`` threads when there are many;
    problems are reported in the plan's order. On s3 the entries come from
    ``target.stat_many``: one version listing per directory, and for a key whose current
    version is the one the apply wrote (``facts``, the apply's ``facts`` figure: version ids
    from its PUT and copy responses) the metadata that write sent; any other key costs a
    HEAD. A key rewritten by someone else after the apply has another version and is
    checked by its HEAD, as before.

    File contents (the sampled files whose size is right) are compared byte for byte with
    the source's bytes at E (:func:`check_contents`): on the Spark executors when ``spark``
    is given and at least ``EXECUTOR_MIN_FILES`` files are to be read (their botocore
    requests are CPU-bound: one interpreter is one core), else here. Paths whose source
    bytes are the same objects (hard links) share one read of them.

    With ``contents="changed"`` (``verify.contents``) facts spare reads: on s3 the files the
    store's checksums cover (:func:`covered`); on posix the ranges apply did not write and the
    files it only moved or re-attributed (:func:`posix_contents`), whose written ranges are read
    back and compared with apply's checksums instead (:func:`check_written_ranges`). With
    ``"full"`` every sampled file is read whole from both sides.
    """
    t0 = time.monotonic()
    posix = target.kind == "posix"
    owners = not posix or getattr(target, "as_root", False)
    present, gone = plan["verify"]["present"], plan["verify"]["absent"]
    facts = facts or {}
    use_facts = bool(facts) and contents == "changed"
    idents: dict = {}  # posix: path -> the file's identity now, where apply left a fact of it
    stats: dict = {}
    heads: dict = {}
    exists: dict = {}
    if hasattr(target, "stat_many"):
        wanted = [(i["path"], i["attrs"]["type"]) for i in present]
        # "full" trusts no write's answer for what is current: every key written is listed
        trusted = facts if use_facts else {k: dict(v, conditional=False) for k, v in facts.items()}
        got = target.stat_many(wanted, trusted)
        stats = {w: e for w, (e, _) in zip(wanted, got)}
        heads = {p: h for (p, _), (_, h) in zip(wanted, got) if h}
        exists = dict(zip(gone, target.exists_many(gone)))

    def stat(path: str, hint: str | None):
        if (path, hint) in stats:
            return stats[(path, hint)]
        return target.stat(path, hint)

    def check(item) -> tuple[list[str], int, bool]:
        """Problems of the item's attributes, 1 if its entry was checked, True if its contents are to be read."""
        path, want = item["path"], item["attrs"]
        have = stat(path, want["type"] if target.kind == "s3" else None)
        if have is None:
            return [f"{path}: missing (expected a {want['type']})"], 0, False
        if have.type != want["type"]:
            return [f"{path}: is a {have.type}, expected a {want['type']}"], 0, False
        problems: list[str] = []
        if want["type"] != "symlink" and want.get("mode") is not None and have.mode != int(want["mode"]) & 0o7777:
            problems.append(f"{path}: mode {oct(have.mode or 0)}, expected {oct(int(want['mode']) & 0o7777)}")
        if owners and want.get("uid") is not None and (have.uid, have.gid) != (want["uid"], want["gid"]):
            problems.append(f"{path}: owner {have.uid}:{have.gid}, expected {want['uid']}:{want['gid']}")
        if want["type"] == "symlink" and have.symlink != want.get("symlink"):
            problems.append(f"{path}: symlink to {have.symlink!r}, expected {want.get('symlink')!r}")
        if want["type"] != "symlink":
            wx = {k: bytes.fromhex(v) for k, v in (want.get("xattrs") or {}).items()}
            if posix:
                wx = {k: v for k, v in wx.items() if k.startswith(XATTR_NAMESPACE)}
            if have.xattrs != wx:
                problems.append(f"{path}: xattrs {sorted(have.xattrs)} differ from the source's {sorted(wx)}")
        if want["type"] != "file":
            return problems, 1, False
        size = int(want.get("size") or 0)
        if have.size != size:
            return [*problems, f"{path}: size {have.size}, expected {size}"], 1, False
        head = heads.get(path)
        if head and not have_stripes(head) and int(head.get("ContentLength", size)) != size:
            # the object's own length (a listing's or a HEAD's), not only the size its metadata says
            return [*problems, f"{path}: object of {head.get('ContentLength')} bytes, expected {size}"], 1, False
        if use_facts and posix and path in facts:
            idents[path] = target.identity(path)  # here, in the threads: one lstat more per file
        return problems, 1, True

    def absent(path: str) -> list[str]:
        there = exists[path] if path in exists else target.stat(path) is not None
        return [f"{path}: still present, but the source removed it"] if there else []

    if len(present) + len(gone) >= 16:
        from concurrent.futures import ThreadPoolExecutor

        # in slices, a few per thread: a task per path cost more than the lstat it waits for
        # (24,000 submits took 1.9 s of a 12,000-path verify)
        def sliced(items: list) -> list[list]:
            n = max(1, -(-len(items) // (VERIFY_THREADS * 4)))
            return [items[i : i + n] for i in range(0, len(items), n)]

        with ThreadPoolExecutor(VERIFY_THREADS, thread_name_prefix="epochsync-verify") as pool:
            results = [r for part in pool.map(lambda xs: [check(i) for i in xs], sliced(present)) for r in part]
            missing = [m for part in pool.map(lambda xs: [absent(p) for p in xs], sliced(gone)) for m in part]
    else:
        results = [check(i) for i in present]
        missing = [absent(p) for p in gone]

    # the files whose contents a checksum the store gave covers (see :func:`covered`) are not read;
    # the others that ``sample`` picks are read, grouped by their source bytes (hard links share them)
    by_checksum = by_identity = 0
    groups: dict[str, dict] = {}
    written: list[tuple[int, str, list]] = []  # posix: (index, path, ranges apply wrote) to read back
    for index, (item, (_, _, right)) in enumerate(zip(present, results)):
        if not right:
            continue
        if use_facts and posix:
            fact = facts.get(item["path"])
            how = posix_contents(item, fact, idents.get(item["path"]))
            if how == "covered":
                by_identity += 1
                took("verify.posix.covered")
                continue
            if how == "ranges":
                took("verify.posix.ranges")
                assert fact is not None  # posix_contents says "ranges" only with one
                if sampled(item["path"], sample):
                    written.append((index, item["path"], fact["ranges"]))
                continue
        current = (heads.get(item["path"]) or {}).get("VersionId")
        if (
            use_facts
            and hasattr(target, "key_of")
            and covered(item, target.key_of(item["path"], "file"), facts, current)
        ):
            by_checksum += 1
            continue
        if sampled(item["path"], sample):
            took("verify.posix.read" if posix else "verify.s3.read")
            size = int(item["attrs"].get("size") or 0)
            key = json.dumps([item["source"], size], sort_keys=True)
            group = groups.setdefault(key, {"source": item["source"], "size": size, "paths": []})
            # the bytes of the version whose attributes were just checked (no second HEAD on s3)
            group["paths"].append([index, item["path"], heads.get(item["path"])])
    t1 = time.monotonic()
    read = check_contents(list(groups.values()), target, source_io, bucket, plan["epoch"], spark=spark)
    ranges = check_written_ranges(written, target, plan["epoch"])
    t2 = time.monotonic()
    late = read.pop("problems")
    for index, found in ranges.pop("problems").items():
        late.setdefault(index, []).extend(found)
    read["bytes_read_target"] += ranges["bytes_read_target"]
    problems = [p for index, r in enumerate(results) for p in r[0] + late.get(index, [])]
    problems += [p for m in missing for p in m]
    return {
        "ok": not problems,
        "paths_checked": sum(r[1] for r in results),
        "files_by_checksum": by_checksum,
        "files_by_write_checksum": ranges["files"],
        "files_by_identity": by_identity,
        "bytes_by_write_checksum": ranges["bytes_read_target"],
        **read,
        "durations": {"attributes": round(t1 - t0, 3), "contents": round(t2 - t1, 3)},
        "problems": problems[:200],
        "problem_count": len(problems),
    }


def check_contents(groups: list[dict], target, source_io, bucket: str, epoch: int, *, spark=None) -> dict:
    """Compare each group's target files with its source bytes at ``epoch``; returns the figures and
    ``problems`` (``{path index: [problem]}``).

    A group is ``{"source": plan source item, "size": n, "paths": [[index, path, head or None]]}``:
    its source objects are read once (ranged GETs of the pinned versions, reassembled through
    the source layout) and every path's bytes must equal them. On the executors (``spark``
    given, ``EXECUTOR_MIN_FILES`` or more files): one Spark job, ``mapInArrow`` over task
    numbers, each task reading its share of the groups with its own S3 client in
    ``VERIFY_THREADS`` threads and returning one report row. ``source_requests`` counts
    the requests of every task and of this process.
    """
    from epochsync.stores.s3_access import Counters

    files = sum(len(g["paths"]) for g in groups)
    before = source_io.counters.as_dict()
    if spark is not None and files >= EXECUTOR_MIN_FILES:
        reports = _contents_on_executors(spark, groups, target, source_io, bucket, epoch)
        where = "executors"
    else:
        reports = [contents_task(groups, target, source_io, bucket, epoch)]
        reports[0]["source"] = {}  # counted by this process's counters, below
        where = "driver"
    total = Counters()  # this process's requests since ``before``, then every task's
    total.add(source_io.counters.as_dict())
    total.add({k: {op: -n for op, n in v.items()} if k == "requests" else -v for k, v in before.items()})
    problems: dict[int, list[str]] = {}
    for r in reports:
        total.add(r["source"])
        for index, problem in r["problems"]:
            problems.setdefault(index, []).append(problem)
    requests = total.as_dict()
    requests["requests"] = {k: v for k, v in requests["requests"].items() if v}
    requests["total_requests"] = sum(requests["requests"].values())
    return {
        "files_hashed": sum(r["files"] for r in reports),
        "bytes_read_target": sum(r["bytes_read_target"] for r in reports),
        "source_reads_shared": files - len(groups),
        "contents_on": where,
        "content_tasks": len(reports),
        "source_requests": requests,
        "problems": problems,
    }


def check_written_ranges(jobs: list[tuple[int, str, list]], target, epoch: int) -> dict:
    """Read back the ranges apply wrote (``jobs``: ``(path index, path, [[offset, length,
    checksum], ...])``) from a posix target and compare each with the checksum apply computed of
    the bytes it wrote there; returns ``files``, ``bytes_read_target`` and ``problems`` (``{path
    index: [problem]}``). On the driver, in ``VERIFY_THREADS`` threads (hashing releases the GIL)."""

    def one(job) -> tuple[list[str], int]:
        index, path, ranges = job
        got = _target_read(path, target.range_checksums, path, [(o, n) for o, n, _ in ranges])
        found = [
            f"{path}: bytes {o}..{o + n} differ from what apply wrote there at epoch {epoch} (its checksum)"
            for (o, n, want), have in zip(ranges, got)
            if have != want
        ]
        return found, sum(n for _, n, _ in ranges)

    if len(jobs) >= 2:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(VERIFY_THREADS, thread_name_prefix="epochsync-verify-ranges") as pool:
            results = list(pool.map(one, jobs))
    else:
        results = [one(j) for j in jobs]
    problems: dict[int, list[str]] = {}
    for (index, _, _), (found, _) in zip(jobs, results):
        if found:
            problems[index] = found
    return {"files": len(jobs), "bytes_read_target": sum(r[1] for r in results), "problems": problems}


def contents_task(groups: list[dict], target, source_io, bucket: str, epoch: int) -> dict:
    """One task's share of :func:`check_contents` (an executor's, or the driver's): its report."""

    def one(group: dict) -> tuple[list, int, int]:
        paths = [p for _, p, _ in group["paths"]]
        try:
            expected = source_bytes(group["source"], group["size"], source_io, bucket)
        except EpochsyncError:
            raise
        except Exception as exc:
            keys = ", ".join(f"{o['key']}@{o['version']}" for o in group["source"]["objects"] if o)
            raise EpochsyncError(
                f"verify: {', '.join(paths)}: cannot read the source's bytes at epoch {epoch} "
                f"(s3://{bucket}: {keys}): {type(exc).__name__}: {exc}"
            ) from exc
        found, read = [], 0
        for index, path, head in group["paths"]:
            data = _target_read(path, target.read_file, path, **({"head": head} if head else {}))
            read += len(data)
            if data != expected:
                where = _first_difference(data, expected)
                found.append([index, f"{path}: content differs from the source at epoch {epoch} ({where})"])
        return found, len(paths), read

    if len(groups) >= 2:
        from concurrent.futures import ThreadPoolExecutor

        _ = source_io.client  # made once, before the threads share it
        with ThreadPoolExecutor(VERIFY_THREADS, thread_name_prefix="epochsync-verify-contents") as pool:
            results = list(pool.map(one, groups))
    else:
        results = [one(g) for g in groups]
    return {
        "problems": [p for r in results for p in r[0]],
        "files": sum(r[1] for r in results),
        "bytes_read_target": sum(r[2] for r in results),
        "source": source_io.counters.as_dict(),
    }


def _target_read(path: str, read, *args, **kwargs):
    """``read(*args, **kwargs)``: a read of the target's bytes at ``path``; a failure is an
    EpochsyncError naming the path."""
    try:
        return read(*args, **kwargs)
    except EpochsyncError:
        raise
    except Exception as exc:
        raise EpochsyncError(f"verify: {path}: cannot read the target's bytes: {type(exc).__name__}: {exc}") from exc


def _first_difference(data: bytes, expected: bytes) -> str:
    """Where ``data`` departs from ``expected``, in words."""
    if len(data) != len(expected):
        return f"{len(data)} bytes, the source has {len(expected)}"
    lo, hi = 0, len(data)
    while hi - lo > 4096:  # halve on slices: bytes compare in C
        mid = (lo + hi) // 2
        if data[lo:mid] != expected[lo:mid]:
            hi = mid
        else:
            lo = mid
    offset = next(i for i in range(lo, hi) if data[i] != expected[i])
    return f"first difference at byte {offset}"


def _contents_on_executors(spark, groups: list[dict], target, source_io, bucket: str, epoch: int) -> list[dict]:
    """:func:`contents_task` of each share of ``groups`` as one Spark job; returns the task reports.

    The groups travel with the function; a task takes its share by its number. Shares are
    balanced by their expected requests (source objects and target files). Verify writes
    nothing, so a task Spark re-runs does no harm.
    """
    import heapq

    from epochsync.spark import executor_slots, run_report_tasks

    n = max(1, min(len(groups), executor_slots(spark)))
    shares: list[list[dict]] = [[] for _ in range(n)]
    load = [(0, i) for i in range(n)]
    for g in sorted(groups, key=lambda g: -_group_cost(g)):
        cost, i = heapq.heappop(load)
        shares[i].append(g)
        heapq.heappush(load, (cost + _group_cost(g), i))

    return run_report_tasks(
        spark,
        n,
        lambda index: [contents_task(shares[index], target, source_io, bucket, epoch)],
        tag=f"verify-contents-{epoch}-{os.getpid()}-{time.monotonic_ns()}",
        what=f"verify of epoch {epoch}",
    )


def _group_cost(group: dict) -> int:
    """Requests a group costs, about: its source objects and its target files."""
    return sum(1 for o in group["source"]["objects"] if o) + len(group["paths"])


def compare_with_snapshot(target, expected: dict[str, dict], *, posix_xattrs: bool = True) -> list[str]:
    """Returns the problems of a namespace check (no contents): the target holds exactly ``expected`` (path → attrs)."""
    problems = []
    seen = set()
    owners = target.kind != "posix" or getattr(target, "as_root", False)
    for e in target.walk(hashes=False):
        seen.add(e.path)
        want = expected.get(e.path)
        if want is None:
            problems.append(f"{e.path}: present, but not in the snapshot")
            continue
        if e.type != want["type"]:
            problems.append(f"{e.path}: is a {e.type}, snapshot says {want['type']}")
            continue
        if e.type == "file" and e.size != int(want.get("size") or 0):
            problems.append(f"{e.path}: size {e.size}, snapshot says {want.get('size')}")
        if e.type != "symlink" and want.get("mode") is not None and e.mode != int(want["mode"]) & 0o7777:
            problems.append(f"{e.path}: mode {oct(e.mode or 0)}, snapshot says {oct(int(want['mode']) & 0o7777)}")
        if owners and want.get("uid") is not None and (e.uid, e.gid) != (want["uid"], want["gid"]):
            problems.append(f"{e.path}: owner {e.uid}:{e.gid}, snapshot says {want['uid']}:{want['gid']}")
        if e.type == "symlink" and e.symlink != want.get("symlink"):
            problems.append(f"{e.path}: symlink {e.symlink!r}, snapshot says {want.get('symlink')!r}")
        if e.type != "symlink":
            wx = {k: bytes.fromhex(v) for k, v in (want.get("xattrs") or {}).items()}
            if target.kind == "posix":
                wx = {k: v for k, v in wx.items() if k.startswith(XATTR_NAMESPACE)}
            if e.xattrs != wx:
                problems.append(f"{e.path}: xattrs differ from the snapshot")
    for p in sorted(expected.keys() - seen):
        problems.append(f"{p}: missing")
    return problems


# --------------------------------------------------------------------------- the stage function


@holds_target_lease
def run_verify(cfg, target, epoch: int, spark=None, first_epoch: int | None = None) -> dict:
    """Verify the applied epoch against the source; returns the figures (also written to
    ``verify.json``), raises EpochError on any difference."""
    from epochsync.stages.verify import verify_plan

    t0 = time.monotonic()
    cfg = _config(cfg)
    tcfg = _target_cfg(cfg, target)
    plan = load_plan(cfg, tcfg.name, epoch)
    tgt = open_target(tcfg)
    source_io, bucket = source_access(cfg, tcfg, epoch)
    applied = read_json(os.path.join(plan_dir(cfg.warehouse, tcfg.name, epoch), APPLIED_FACTS)) or {}
    # a posix replica's parent directories are resolved once for all its paths (nothing moves now)
    with tgt.reading() if hasattr(tgt, "reading") else contextlib.nullcontext():
        result = verify_plan(
            plan,
            tgt,
            source_io,
            bucket,
            sample=tcfg.verify.sample,
            facts=applied.get("facts"),
            spark=spark,
            contents=tcfg.verify.contents,
        )
    result["seconds"] = round(time.monotonic() - t0, 3)
    write_json_atomic(os.path.join(plan_dir(cfg.warehouse, tcfg.name, epoch), "verify.json"), result)
    write_stage_stats(cfg.warehouse, tcfg.name, epoch, "verify", result)
    if not result["ok"]:
        raise VerifyError(
            f"verify of target {tcfg.name} epoch {epoch}: {result['problem_count']} difference(s) with the source: "
            + "; ".join(result["problems"][:10])
        )
    return result
