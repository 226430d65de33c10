"""``epochsync changes``: what differs between a target's committed states at two epochs.

Like ``git diff --name-status E1 E2`` or glusterfind's output, in paths, one line per change::

    DELETE path            gone at E2 (a directory: with everything under it)
    RENAME old new         the same file or directory under a new name
    NEW path               created (or moved into the target's fileset)
    LINK path existing     one more name (hard link) of the file at ``existing``
    MODIFY path what       data, attrs and/or xattrs changed (comma-separated)

It is a *diff*, not a script: paths on the left of RENAME and the path of DELETE are as
at E1, every other path as at E2. A line about a directory covers everything under it
unless another line names a deeper path, so a directory move is one RENAME and a file
with several names (hard links) is one NEW (plus a LINK per other name) and one MODIFY.
:func:`apply_to_listing` is the reference reading of these rules (tests hold the output
to it against the simulator's ground truth; consumers can use it).

``MODIFY ... data``: some bytes or the size may differ (``ranges`` in the JSON form: every
file range that may differ from E1, growth included; ``whole_file`` when the source logs
no extents). ``attrs``: mode, owner, or (without a data change) mtime; atime and ctime
are not reported. ``xattrs``: any extended attribute set, changed or removed.

It reads only the warehouse: the snapshots at E1 and E2 and the change sets of the
committed windows between them (the merge's output); it never replays records. Any two
committed states work: epoch 0 (the empty tree) and every epoch the target committed
(a catch-up run of several epochs commits only its last one). Snapshots older than the
target's ``snapshot_retention`` are pruned; asking for one is an error naming the
epochs still available.

The same records, one window at a time, are what a feed target publishes
(:mod:`epochsync.stages.publish`). ``--format glusterfind`` tells them in the lines
``glusterfind pre`` writes (:func:`glusterfind_lines`), for scripts written for it.
"""

from __future__ import annotations

import base64
import json
import os
import posixpath
import sys
from typing import Any

from epochsync.core.config import Config, TargetConfig, load_config
from epochsync.core.errors import EpochError, EpochsyncError, SnapshotError
from epochsync.core.model import FILE
from epochsync.warehouse.paths import Warehouse, epoch_partitions, local_path

#: line kinds, in the order they are listed
KINDS = ("DELETE", "RENAME", "NEW", "LINK", "MODIFY")
#: what a MODIFY says changed
CHANGED = ("data", "attrs", "xattrs")
#: columns of the record state (values at E2; at E1 for DELETE)
STATE_FIELDS = ("size", "mode", "uid", "gid", "mtime_ns", "symlink", "xattrs")


# --------------------------------------------------------------------------- committed windows


def committed_windows(cfg: Config, tcfg: TargetConfig, e1: int, e2: int, committed: int) -> list[tuple[int, int]]:
    """The committed windows ``(first, last)`` that tile ``e1+1 .. e2``, oldest first.

    Walks back from ``e2`` through the stats rows (each commit writes one naming its
    window), so a stale row left by a run that never committed is never followed.
    Raises :class:`EpochError` naming the epoch that is not a committed state.
    """
    from epochsync.journal.undo import read_json

    if e1 < 0 or e2 <= e1:
        raise EpochError(f"--from {e1} --to {e2}: need 0 <= from < to")
    if e2 > committed:
        raise EpochError(
            f"target {tcfg.name} is at epoch {committed}: epoch {e2} is not committed yet "
            f"(replicate it first: epochsync replicate --config {cfg.file} --target {tcfg.name} --through {e2})"
        )
    wh = Warehouse(cfg.warehouse)
    windows: list[tuple[int, int]] = []
    cur = e2
    while cur > e1:
        row = read_json(local_path(wh.stats(tcfg.name, cur)))
        if not row:
            raise EpochError(
                f"target {tcfg.name}: no stats row for committed epoch {cur} ({wh.stats(tcfg.name, cur)}): "
                "the warehouse does not say which epochs its commit covered"
            )
        first = int(row.get("first_epoch") or cur)
        windows.append((first, cur))
        if first - 1 < e1:
            raise EpochError(
                f"target {tcfg.name}: epoch {e1} is not a committed state: epochs {first}..{cur} were committed "
                f"together (one catch-up run); use --from {first - 1} or --from {cur}"
            )
        cur = first - 1
    return windows[::-1]


def snapshot_epochs(cfg: Config, target: str) -> list[int]:
    """Epochs with a snapshot of ``target`` in the warehouse, ascending."""
    return epoch_partitions(Warehouse(cfg.warehouse).snapshots(target))


def check_inputs(cfg: Config, tcfg: TargetConfig, e1: int, e2: int, windows: list[tuple[int, int]]) -> None:
    """Snapshots ``e1`` and ``e2`` and every window's change set exist, or one error naming what is missing."""
    wh = Warehouse(cfg.warehouse)
    have = snapshot_epochs(cfg, tcfg.name)
    missing = [e for e in (e1, e2) if e and e not in have]  # epoch 0 without a snapshot: the empty tree
    if missing:
        kept = ", ".join(map(str, have)) or "none"
        raise SnapshotError(
            f"target {tcfg.name}: no snapshot at epoch {' and '.join(map(str, missing))}: pruned "
            f"(snapshot_retention: {tcfg.snapshot_retention} keeps the newest; snapshots kept: {kept}). "
            f"Choose --from/--to among those (or 0), or raise targets.{tcfg.name}.snapshot_retention "
            "to keep more history"
        )
    gone = [last for _, last in windows if not _exists(wh.changes(tcfg.name, last))]
    if gone:
        raise EpochError(
            f"target {tcfg.name}: no change set for committed epoch(s) {', '.join(map(str, gone))} "
            f"({wh.changes(tcfg.name, gone[0])}): the warehouse lost the merge output of those epochs"
        )


def _exists(uri: str) -> bool:
    return os.path.isdir(local_path(uri))


# --------------------------------------------------------------------------- Spark: candidates


def gather_entries(
    spark, cfg: Config, tcfg: TargetConfig, e1: int, e2: int, windows: list[tuple[int, int]]
) -> list[dict]:
    """One dict per fid whose visible names or contents may differ between ``e1`` and ``e2``.

    ``{"fid", "type", "old_paths", "new_paths", "old", "new", "windows"}``: visible paths
    at each side (the target's fileset applies), the snapshot rows (``None`` when absent
    or not visible) and the fid's change rows of every window. A fid is a candidate when
    one of the windows changed it or its visible (parent, name) links differ; a fid
    under a renamed directory whose own link is the same is not (the directory's line
    covers it). DataFrame API only.
    """
    from pyspark.sql import functions as F

    from epochsync.core.model import change_struct_type
    from epochsync.warehouse.snapshots import read_snapshot, resolve_links, visible

    src = cfg.source_of(tcfg)
    wh = Warehouse(cfg.warehouse)
    old = read_snapshot(spark, wh, tcfg.name, e1, src.root_fid)
    new = read_snapshot(spark, wh, tcfg.name, e2, src.root_fid)
    changes = spark.read.schema(change_struct_type()).parquet(*(wh.changes(tcfg.name, last) for _, last in windows))

    def side(snap, tag: str):
        lk = visible(resolve_links(snap, src.root_fid), tcfg.fileset)
        return lk.groupBy("fid").agg(
            F.array_sort(F.collect_list(F.struct("pfid", "name"))).alias(f"{tag}_keys"),
            F.array_sort(F.collect_set("path")).alias(f"{tag}_paths"),
        )

    per_fid = changes.groupBy("fid").agg(
        F.collect_list(F.struct("data_changed", "whole_file", "ranges", "old_size", "new_size")).alias("windows")
    )
    joined = side(old, "old").join(side(new, "new"), "fid", "full_outer").join(per_fid, "fid", "left")
    cand = joined.filter(
        (F.col("windows").isNotNull() | ~F.coalesce(F.col("old_keys") == F.col("new_keys"), F.lit(False)))
        & (F.col("old_paths").isNotNull() | F.col("new_paths").isNotNull())
    ).drop("old_keys", "new_keys")
    cols = ["type", "size", "mode", "uid", "gid", "mtime_ns", "symlink", "xattrs"]
    old_rows = old.select("fid", F.struct(*cols).alias("old"))
    new_rows = new.select("fid", F.struct(*cols).alias("new"))
    rows = cand.join(old_rows, "fid", "left").join(new_rows, "fid", "left").collect()
    entries = []
    for r in rows:
        d = r.asDict(recursive=True)
        d["old_paths"] = list(d.get("old_paths") or [])
        d["new_paths"] = list(d.get("new_paths") or [])
        if not d["old_paths"]:
            d["old"] = None
        if not d["new_paths"]:
            d["new"] = None
        d["windows"] = d.get("windows") or []
        d["type"] = (d["new"] or d["old"])["type"]
        entries.append(d)
    entries.sort(key=lambda e: e["fid"])
    return entries


# --------------------------------------------------------------------------- the diff (pure Python)


def _depth(path: str) -> int:
    return path.count("/") + 1


def _mapped(path: str, lines: dict[str, str | None]) -> str | None:
    """Where an E1 path is at E2 after the lines so far (the deepest line at or above it wins)."""
    q = path
    while True:
        if q in lines:
            to = lines[q]
            return None if to is None else to + path[len(q) :]
        if "/" not in q:
            return path
        q = q.rsplit("/", 1)[0]


def _xattrs(row: dict | None) -> dict[str, str]:
    out = {}
    for x in (row or {}).get("xattrs") or []:
        if x.get("value") is not None:
            out[x["name"]] = base64.b64encode(bytes(x["value"])).decode()
    return out


def _state(row: dict) -> dict[str, Any]:
    return {
        "size": row.get("size") if row.get("type") == FILE else None,
        "mode": row.get("mode"),
        "uid": row.get("uid"),
        "gid": row.get("gid"),
        "mtime_ns": row.get("mtime_ns"),
        "symlink": row.get("symlink"),
        "xattrs": _xattrs(row),
    }


def _merge(ranges: list[tuple[int, int]]) -> list[list[int]]:
    out: list[list[int]] = []
    for o, n in sorted(r for r in ranges if r[1] > 0):
        if out and o <= out[-1][0] + out[-1][1]:
            out[-1][1] = max(out[-1][0] + out[-1][1], o + n) - out[-1][0]
        else:
            out.append([o, n])
    return out


def _modified(entry: dict) -> tuple[list[str], dict[str, Any]]:
    """What a MODIFY of a fid present at both ends says changed, and its data detail."""
    old, new, windows = entry["old"], entry["new"], entry["windows"]
    what: list[str] = []
    detail: dict[str, Any] = {}
    data = False
    if new["type"] == FILE:
        old_size, new_size = int(old.get("size") or 0), int(new.get("size") or 0)
        data = old_size != new_size or any(w.get("data_changed") for w in windows)
        if data:
            what.append("data")
            whole = any(w.get("whole_file") for w in windows)
            if whole:
                ranges = [[0, new_size]] if new_size else []
            else:
                # every window's ranges, plus everything from the smallest size at any
                # committed boundary up (a shrink then a regrowth leaves zeros there)
                low = min(
                    [old_size, new_size]
                    + [int(w[k]) for w in windows for k in ("old_size", "new_size") if w.get(k) is not None]
                )
                spans = [(int(r["offset"]), int(r["length"])) for w in windows for r in w.get("ranges") or []]
                spans.append((low, new_size - low))
                ranges = [[o, min(n, new_size - o)] for o, n in _merge(spans) if o < new_size]
            detail = {"old_size": old_size, "whole_file": whole, "ranges": ranges}
    if any(old.get(k) != new.get(k) for k in ("mode", "uid", "gid")) or (
        not data and old.get("mtime_ns") != new.get("mtime_ns")
    ):
        what.append("attrs")
    if _xattrs(old) != _xattrs(new):
        what.append("xattrs")
    return what, detail


def diff_entries(entries: list[dict]) -> list[dict]:
    """The change records of :func:`gather_entries`' entries, in listing order.

    Fids are visited parents first (by the depth of their E1 paths), so a directory's
    line exists before its descendants are mapped through it: a name whose E1 path
    already maps (through an ancestor's RENAME) onto one of its E2 paths needs no line.
    """
    lines: dict[str, str | None] = {}
    out: list[dict] = []

    def emit(kind: str, entry: dict, path: str, **extra) -> None:
        row = entry["old"] if kind == "DELETE" else entry["new"]
        rec = {"kind": kind, "path": path, "fid": entry["fid"], "type": entry["type"], **_state(row), **extra}
        out.append(rec)

    with_old = sorted(
        (e for e in entries if e["old_paths"]),
        key=lambda e: (min(_depth(p) for p in e["old_paths"]), min(e["old_paths"])),
    )
    without_old = sorted((e for e in entries if not e["old_paths"]), key=lambda e: min(e["new_paths"]))
    for e in with_old + without_old:
        old_paths, new_paths = sorted(e["old_paths"]), sorted(e["new_paths"])
        where = {p: _mapped(p, lines) for p in old_paths}
        new_set = set(new_paths)
        kept = sorted({m for p in old_paths if (m := where[p]) is not None and m in new_set})
        # a source that still maps somewhere is renamed before one its ancestor already took away
        unmatched = sorted((p for p in old_paths if where[p] not in new_set), key=lambda p: (where[p] is None, p))
        added = sorted(new_set - set(kept))
        pairs = list(zip(unmatched, added))
        for src, dst in pairs:
            emit("RENAME", e, dst, old_path=src)
            lines[src] = dst
        for src in unmatched[len(pairs) :]:
            if where[src] is not None:  # else it went with a deleted ancestor
                emit("DELETE", e, src)
                lines[src] = None
        anchor = kept[0] if kept else (pairs[0][1] if pairs else None)
        for dst in added[len(pairs) :]:
            if anchor is None:
                emit("NEW", e, dst)
                anchor = dst
            else:
                emit("LINK", e, dst, link_to=anchor)
        if old_paths and new_paths:
            what, detail = _modified(e)
            if what:
                emit("MODIFY", e, new_paths[0], changed=what, **detail)
    order = {k: i for i, k in enumerate(KINDS)}
    out.sort(key=lambda r: (order[r["kind"]], r.get("old_path") or r["path"], r["path"]))
    return out


def apply_to_listing(listing: dict[str, str], records: list[dict]) -> dict[str, str]:
    """The reference reading of a listing: ``{path: fid}`` at E1 plus the records → at E2.

    DELETE and RENAME act on E1 paths at once (the deepest line at or above a path wins),
    then NEW and LINK add E2 paths. Raises ``ValueError`` on a contradiction (two files
    on one path), which would be a bug in the records.
    """
    lines: dict[str, str | None] = {}
    for r in records:
        if r["kind"] == "DELETE":
            lines[r["path"]] = None
        elif r["kind"] == "RENAME":
            lines[r["old_path"]] = r["path"]
    out: dict[str, str] = {}
    for path, fid in listing.items():
        to = _mapped(path, lines)
        if to is None:
            continue
        if to in out:
            raise ValueError(f"{path} and another path both land on {to}")
        out[to] = fid
    for r in records:
        if r["kind"] in ("NEW", "LINK"):
            if r["path"] in out:
                raise ValueError(f"{r['kind']} {r['path']}: the path is already taken by fid {out[r['path']]}")
            out[r["path"]] = r["fid"]
    return out


# --------------------------------------------------------------------------- the API


def entries_between(cfg, target, e1: int, e2: int, spark=None) -> list[dict]:
    """The :func:`gather_entries` entries between committed epochs ``e1`` and ``e2`` of ``target``
    (the windows and inputs checked first; a local Spark session when none is given)."""
    from epochsync.journal.undo import manifest_epoch
    from epochsync.targets import open_target

    cfg = cfg if isinstance(cfg, Config) else load_config(cfg)
    tcfg = target if isinstance(target, TargetConfig) else cfg.target(target)
    committed = manifest_epoch(open_target(tcfg).read_manifest())
    windows = committed_windows(cfg, tcfg, e1, e2, committed)
    check_inputs(cfg, tcfg, e1, e2, windows)
    if spark is None:
        from epochsync.spark import spark_session

        spark = spark_session(f"epochsync-changes-{tcfg.name}", cfg=cfg)
    return gather_entries(spark, cfg, tcfg, e1, e2, windows)


def changes_between(cfg, target, e1: int, e2: int, spark=None) -> list[dict]:
    """The change records between committed epochs ``e1`` and ``e2`` of ``target``."""
    return diff_entries(entries_between(cfg, target, e1, e2, spark))


# --------------------------------------------------------------------------- glusterfind's format

#: what glusterfind encodes in a path (its ``utils.quote_plus_space_newline``), in this order;
#: nothing else is (tabs, other control characters and non-ASCII stay as they are)
GLUSTERFIND_ESCAPES = (("%", "%25"), (" ", "%20"), ("\n", "%0A"))


def glusterfind_path(path: str, *, encode: bool = True, prefix: str = ".") -> str:
    """A path as glusterfind writes it: under ``prefix`` (its ``--output-prefix``; ``.``: none),
    then encoded as glusterfind encodes (unless ``encode`` is false: its ``--no-encode``)."""
    if prefix != ".":
        path = posixpath.join(prefix, path).replace("//", "/").removesuffix("/")
    if encode:
        for raw, quoted in GLUSTERFIND_ESCAPES:
            path = path.replace(raw, quoted)
    return path


def glusterfind_lines(
    entries: list[dict], *, encode: bool = True, prefix: str = ".", separator: str = " "
) -> list[str]:
    """The listing of :func:`gather_entries`' entries in glusterfind's line format.

    ``NEW path``, ``MODIFY path``, ``DELETE path``, ``RENAME old new`` (glusterfind's only
    kinds, fields joined by ``separator``), the entries of :func:`diff_entries` told the way
    ``glusterfind pre`` tells them:

    - a hard link (``LINK``) is a ``NEW`` of its path;
    - a ``MODIFY`` (data, attributes or xattrs alike) is listed for every name of the file;
    - a deleted directory's entries are each listed too, children before their directory;
    - a path on the left (``DELETE``, the first of ``RENAME``) names the entry as at E1 but
      under the E2 name of a renamed ancestor, as glusterfind resolves an old parent by its
      gfid when it lists.

    Deletes come first (deepest first), then renames (parents first), ``NEW`` and ``MODIFY``.
    """
    records = diff_entries(entries)
    renames = {r["old_path"]: r["path"] for r in records if r["kind"] == "RENAME"}
    lines_at = {**renames, **{r["path"]: None for r in records if r["kind"] == "DELETE"}}

    def old_name(path: str) -> str:
        parent, _, name = path.rpartition("/")
        return f"{_mapped(parent, renames)}/{name}" if parent else path

    deletes = {r["path"] for r in records if r["kind"] == "DELETE"}
    for e in entries:
        deletes.update(p for p in e["old_paths"] if _mapped(p, lines_at) is None)
    by_fid = {e["fid"]: e for e in entries}
    modified = sorted({p for r in records if r["kind"] == "MODIFY" for p in by_fid[r["fid"]]["new_paths"]})

    def out(*fields: str) -> str:
        return separator.join(fields)

    def name(path: str) -> str:
        return glusterfind_path(path, encode=encode, prefix=prefix)

    lines = [out("DELETE", name(old_name(p))) for p in sorted(deletes, key=lambda p: (-_depth(p), p))]
    lines += [
        out("RENAME", name(old_name(src)), name(dst))
        for src, dst in sorted(renames.items(), key=lambda x: (_depth(x[0]), x))
    ]
    lines += [
        out("NEW", name(r["path"])) for r in sorted(records, key=lambda r: r["path"]) if r["kind"] in ("NEW", "LINK")
    ]
    lines += [out("MODIFY", name(p)) for p in modified]
    return lines


def quote_path(path: str) -> str:
    """A path as one whitespace-free token: ``%``, whitespace and control characters as ``%XX``."""
    out = []
    for ch in path:
        if ch == "%" or ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append("".join(f"%{b:02X}" for b in ch.encode("utf-8")))
        else:
            out.append(ch)
    return "".join(out)


def to_text(rec: dict) -> str:
    """One line of the text listing."""
    kind = rec["kind"]
    if kind == "RENAME":
        return f"RENAME {quote_path(rec['old_path'])} {quote_path(rec['path'])}"
    if kind == "LINK":
        return f"LINK {quote_path(rec['path'])} {quote_path(rec['link_to'])}"
    if kind == "MODIFY":
        return f"MODIFY {quote_path(rec['path'])} {','.join(rec['changed'])}"
    return f"{kind} {quote_path(rec['path'])}"


def to_json_line(rec: dict) -> str:
    """One line of the JSON Lines listing: the record, keys sorted, nulls left out."""
    return json.dumps(
        {k: v for k, v in rec.items() if v is not None}, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )


# --------------------------------------------------------------------------- the verb


def configure_changes(parser) -> None:
    """Add the ``changes`` verb's options to ``parser``."""
    parser.add_argument("--config", required=True, metavar="FILE", help="epochsync YAML config")
    parser.add_argument("--target", required=True, metavar="NAME", help="target whose committed states to compare")
    parser.add_argument(
        "--from",
        dest="from_epoch",
        type=int,
        required=True,
        metavar="E1",
        help="committed epoch to compare from (0: the empty tree)",
    )
    parser.add_argument("--to", dest="to_epoch", type=int, required=True, metavar="E2", help="committed epoch, > E1")
    parser.add_argument(
        "--format",
        choices=("text", "jsonl", "glusterfind"),
        default="text",
        help="text: KIND path [path|what] per line (default); jsonl: one JSON record per line; glusterfind: "
        "the lines glusterfind pre writes (NEW, MODIFY, DELETE, RENAME), paths encoded as it encodes them",
    )
    gf = parser.add_argument_group("glusterfind's options (with --format glusterfind)")
    gf.add_argument("--no-encode", action="store_true", help="paths as they are (glusterfind pre --no-encode)")
    gf.add_argument(
        "--output-prefix",
        default=".",
        metavar="PREFIX",
        help="put PREFIX in front of every path (glusterfind pre --output-prefix); default: none",
    )
    gf.add_argument(
        "--field-separator",
        default=" ",
        metavar="SEP",
        help="between a line's fields (glusterfind pre --field-separator); default: a space",
    )


def run_changes(args) -> int:
    """The ``changes`` verb: print the change records between two committed epochs; returns 0."""
    if args.format != "glusterfind" and (args.no_encode or args.output_prefix != "." or args.field_separator != " "):
        raise EpochsyncError("--no-encode, --output-prefix and --field-separator go with --format glusterfind")
    entries = entries_between(args.config, args.target, args.from_epoch, args.to_epoch)
    if args.format == "glusterfind":
        lines = glusterfind_lines(
            entries, encode=not args.no_encode, prefix=args.output_prefix, separator=args.field_separator
        )
    else:
        write = to_json_line if args.format == "jsonl" else to_text
        lines = [write(rec) for rec in diff_entries(entries)]
    out = sys.stdout
    for line in lines:
        out.write(line + "\n")
    out.flush()
    return 0
