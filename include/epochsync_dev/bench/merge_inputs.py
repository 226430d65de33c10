"""Merge benchmark inputs, vectorized: an epoch-1 namespace and an epoch-2 history of N records.

The simulator (``python -m epochsync_dev simulate --no-data``) replays every operation on its Python file
system model: 17 minutes for 10 M records. This draws the same mix with numpy and builds
the columns with Arrow, in seconds:

- epoch 1 (the namespace dump, ``snapshot/epoch=1/part-0.jsonl``, what the merge starts
  from): ``files`` files (RAID-0 layouts of 1-4 objects over 4 OSTs, stripe size 4/16/64 KiB,
  each object with a version) in ``files // 8`` directories two levels deep, spread over 2 MDTs;
- epoch 2 (``records/server=X/part-0.parquet``, the canonical record schema, what ingest
  writes): about 70% ``WRITE`` records (overwrites and appends touching 1-3 objects of a
  file, one record per object; 30% of them followed by an ``MTIME`` on the MDT; the records
  of one operation that span servers share a ``cookie``) and 30% namespace and attribute
  operations in the simulator's proportions (``simulate.OP_WEIGHTS``): creates (with a
  first write), file renames (across MDTs too: a ``CTIME`` on the old parent's MDT shares
  the rename's cookie), renames over an existing file, renames away and back, directory
  renames, mkdir, hard links, unlinks, symlinks, mknod, xattrs (set, and set then removed),
  truncates (``TRUNC`` and a ``WRITE`` without extents for the object it shrank, one cookie),
  chmod/chown/utime, create-and-delete. Each server's records end with its ``EPOCH`` record.

The history is consistent by construction, as the merge requires: every operation that
changes names works on fids of its own (files drawn without replacement from the epoch-1
files, or fids it creates), new names are unique, a directory moves only when it has no
sub-directory (so never into its own subtree), and each operation's records are in time
order (one time slot per operation, operations in random order). Writes and attribute
changes may hit any file; one that reaches a file an unlink removed before is ignored, as
the oracle ignores it. tests/unit/test_bench_merge_inputs.py checks the merge of a small
generated epoch against :func:`epochsync_dev.oracle.replay`.
"""

from __future__ import annotations

import json
import stat
from dataclasses import dataclass
from pathlib import Path

from epochsync_dev.simulate.workload import EPOCH_INTERVAL_S, EPOCH_START, OP_WEIGHTS, ROOT_FID, STRIPE_SIZES

MDTS = ("MDT0000", "MDT0001")
OSTS = ("OST0000", "OST0001", "OST0002", "OST0003")
SERVERS = MDTS + OSTS
_NS = 1_000_000_000
_TICK = 7  # ns between two records: room for 4e10 records in an epoch
_SLOT = 8  # records an operation may have (time slots per operation)
#: the namespace and attribute operations drawn, with their weights (the simulator's,
#: swap and rmtree folded into renames and unlinks, lyout left out)
NS_OPS = {
    "create": OP_WEIGHTS["create"],
    "truncate": OP_WEIGHTS["truncate"],
    "rename_file": OP_WEIGHTS["rename_file"] + OP_WEIGHTS["swap"],
    "rename_over": OP_WEIGHTS["rename_over"],
    "rename_back": OP_WEIGHTS["rename_back"],
    "rename_dir": OP_WEIGHTS["rename_dir"],
    "mkdir": OP_WEIGHTS["mkdir"],
    "hlink": OP_WEIGHTS["hlink"],
    "unlink": OP_WEIGHTS["unlink"] + OP_WEIGHTS["rmtree"],
    "symlink": OP_WEIGHTS["symlink"],
    "mknod": OP_WEIGHTS["mknod"],
    "xattr_set": OP_WEIGHTS["xattr_set"],
    "xattr_remove": OP_WEIGHTS["xattr_remove"],
    "chmod": OP_WEIGHTS["chmod"],
    "chown": OP_WEIGHTS["chown"],
    "utime": OP_WEIGHTS["utime"],
    "create_delete": OP_WEIGHTS["create_delete"],
}
#: namespace operations per record: with ~1.2 records each, and a write operation's
#: ~1.5 WRITE and 0.3 MTIME records, this makes 70% of the records WRITE records
NS_SHARE = 0.16 / 1.25


@dataclass
class Generated:
    """What :func:`generate_epoch` made: counts for the benchmark row."""

    files: int
    dirs: int
    records: int
    writes: int
    ops: dict


class _Cols:
    """Record columns under construction: numpy arrays per field, concatenated at the end."""

    INT = (
        "slot",
        "sub",
        "server",
        "tfid",
        "pfid",
        "name",
        "sfid",
        "spfid",
        "sname",
        "flags",
        "mode",
        "uid",
        "gid",
        "size",
        "atime_ns",
        "mtime_ns",
        "ctime_ns",
        "xattr",
        "xvalue",
        "obj_file",
        "obj_index",
        "version",
        "ext_off",
        "ext_len",
        "cookie",
        "symlink",
    )

    def __init__(self):
        self.parts: list[tuple[str, int, dict]] = []

    def add(self, rtype: str, n: int, **cols) -> None:
        if n:
            self.parts.append((rtype, n, cols))

    def build(self, np):
        total = sum(n for _, n, _ in self.parts)
        # int32 ids and values (sizes stay below 2 GiB here); int64 for offsets
        out = {k: np.full(total, -1, np.int64 if k in ("ext_off", "ext_len") else np.int32) for k in self.INT}
        types = []
        at = 0
        for rtype, n, cols in self.parts:
            for k, v in cols.items():
                out[k][at : at + n] = v
            types.append((rtype, at, n))
            at += n
        return out, types, total


class _Dealer:
    """Hands out consecutive, never repeated runs of ``items``."""

    def __init__(self, items):
        self.items, self.at = items, 0

    def take(self, k: int):
        got = self.items[self.at : self.at + k]
        self.at += k
        return got

    def left(self) -> int:
        return len(self.items) - self.at


def generate_epoch(records: int, seed: int, files: int | None = None):
    """The epoch-2 records (an Arrow table in the record schema, each server's records
    together, in index order, its EPOCH record last), about ``records`` of them. Returns
    ``(dump, records_table, Generated)``; ``dump()`` makes the epoch-1 namespace dump
    (JSON Lines text: one string, then string arrays)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    files = files if files is not None else max(1000, records // 10)
    ndirs = max(8, files // 8)
    n_top = max(4, ndirs // 16)

    # ---------------------------------------------------------------- epoch 1
    # fids: 0 = root, 1..ndirs = directories, then the files, then fids epoch 2 creates
    dir_mdt = rng.integers(0, 2, ndirs + 1)
    dir_mdt[0] = 0
    dir_parent = np.zeros(ndirs + 1, np.int64)
    dir_parent[1 : n_top + 1] = 0
    dir_parent[n_top + 1 :] = rng.integers(1, n_top + 1, ndirs - n_top)
    file_parent = rng.integers(1, ndirs + 1, files)
    file_mdt = dir_mdt[file_parent]
    counts = rng.choice([1, 1, 2, 3, 4], files)
    first_ost = rng.integers(0, 4, files)
    stripe = rng.choice(np.asarray(STRIPE_SIZES), files)
    r = rng.random(files)
    size = np.where(
        r < 0.08, 0, np.where(r < 0.55, rng.integers(1, 4097, files), rng.integers(1, 1 << 20, files))
    ).astype(np.int64)
    mode = stat.S_IFREG | rng.choice(np.asarray([0o644, 0o640, 0o600, 0o755]), files)
    uid = rng.choice(np.asarray([0, 1000, 1001, 1002]), files)
    gid = rng.choice(np.asarray([0, 100, 1000]), files)
    t1 = int(EPOCH_START.timestamp()) * _NS + 1000

    # ---------------------------------------------------------------- epoch 2: operations
    ns_names = list(NS_OPS)
    weights = np.asarray([NS_OPS[k] for k in ns_names], float)
    weights /= weights.sum()
    # namespace ops average ~1.3 non-WRITE records and ~0.3 WRITE records; write ops ~1.6
    # WRITE records and 0.3 MTIME: solve for the counts that give 70% WRITE records
    budget = records - len(SERVERS)
    n_ns = max(20, int(budget * NS_SHARE))
    ops = rng.choice(len(ns_names), n_ns, p=weights)
    op_count = {k: int((ops == i).sum()) for i, k in enumerate(ns_names)}
    # files the name-changing operations own (disjoint), drawn without replacement
    owners = ("rename_file", "rename_back", "hlink", "unlink", "rename_over", "rename_over")
    need = sum(op_count[k] for k in owners)
    if need > files:
        raise ValueError(f"{records} records need more than {files} files")
    own = _Dealer(rng.permutation(files)).take

    # leaf directories (no sub-directory) may move anywhere under a top directory
    leaf = np.arange(n_top + 1, ndirs + 1)
    movers = rng.permutation(leaf)[: op_count["rename_dir"]]
    op_count["rename_dir"] = len(movers)

    next_fid = 1 + ndirs + files
    next_name = 1 + ndirs + files

    def fresh_names(k: int):
        nonlocal next_name
        out = np.arange(next_name, next_name + k)
        next_name += k
        return out

    # every op gets a random time slot: operations interleave, an op's records keep their order
    n_write_ops_est = int((budget - n_ns * 1.6) / 1.9)
    n_ops_total = n_ns + max(1, n_write_ops_est)
    slots = _Dealer(rng.permutation(n_ops_total))
    slot = slots.take

    cols = _Cols()
    cookie_seq = 0

    def cookies(mask):
        nonlocal cookie_seq
        out = np.full(len(mask), -1, np.int64)
        k = int(mask.sum())
        out[mask] = np.arange(cookie_seq, cookie_seq + k)
        cookie_seq += k
        return out

    version_seq = 1

    # new files' layouts: rows appended to the file arrays
    extra = {"counts": [], "first": [], "stripe": [], "size": [], "mdt": [], "parent": []}

    def new_files(k: int):
        """``k`` new files in random directories: (file row indexes, fids, parents)."""
        nonlocal next_fid
        base = files + sum(len(a) for a in extra["counts"])
        parents = rng.integers(1, ndirs + 1, k)
        extra["counts"].append(rng.choice([1, 1, 2, 3, 4], k))
        extra["first"].append(rng.integers(0, 4, k))
        extra["stripe"].append(rng.choice(np.asarray(STRIPE_SIZES), k))
        extra["size"].append(np.zeros(k, np.int64))
        extra["mdt"].append(dir_mdt[parents])
        extra["parent"].append(parents)
        fids = np.arange(next_fid, next_fid + k)
        next_fid += k
        return np.arange(base, base + k), fids, parents

    def file_fid(rows):
        return 1 + ndirs + rows  # epoch-1 files; new files' rows map to their own fids below

    # ---- creates: CREAT, then a first write (below, with the write ops)
    k = op_count["create"]
    c_rows, c_fids, c_par = new_files(k)
    c_slot = slot(k)
    cols.add(
        "CREAT",
        k,
        slot=c_slot,
        sub=0,
        server=dir_mdt[c_par],
        tfid=c_fids,
        pfid=c_par,
        name=fresh_names(k),
        mode=stat.S_IFREG | 0o644,
        uid=1000,
        gid=100,
        atime_ns=0,
        mtime_ns=0,
        ctime_ns=0,
        obj_file=c_rows,
    )
    # ---- create and delete
    k = op_count["create_delete"]
    d_rows, d_fids, d_par = new_files(k)
    s = slot(k)
    nm = fresh_names(k)
    cols.add(
        "CREAT",
        k,
        slot=s,
        sub=0,
        server=dir_mdt[d_par],
        tfid=d_fids,
        pfid=d_par,
        name=nm,
        mode=stat.S_IFREG | 0o600,
        uid=0,
        gid=0,
        atime_ns=0,
        mtime_ns=0,
        ctime_ns=0,
        obj_file=d_rows,
    )
    cols.add("UNLNK", k, slot=s, sub=1, server=dir_mdt[d_par], tfid=d_fids, pfid=d_par, name=nm, flags=1)
    # ---- symlinks, mknod, mkdir (new fids, no data)
    for kind, rtype, fmode in (
        ("symlink", "SLINK", stat.S_IFLNK | 0o777),
        ("mknod", "MKNOD", stat.S_IFIFO | 0o644),
        ("mkdir", "MKDIR", stat.S_IFDIR | 0o755),
    ):
        k = op_count[kind]
        par = rng.integers(1, ndirs + 1, k)
        fids = np.arange(next_fid, next_fid + k)
        next_fid += k
        cols.add(
            rtype,
            k,
            slot=slot(k),
            sub=0,
            server=dir_mdt[par],
            tfid=fids,
            pfid=par,
            name=fresh_names(k),
            mode=fmode,
            uid=1000,
            gid=1000,
            atime_ns=0,
            mtime_ns=0,
            ctime_ns=0,
            symlink=0 if rtype == "SLINK" else -1,
        )
    # ---- file renames (some across MDTs: a CTIME on the old parent's MDT, one cookie)
    k = op_count["rename_file"]
    f = own(k)
    new_par = rng.integers(1, ndirs + 1, k)
    s = slot(k)
    cross = dir_mdt[new_par] != file_mdt[f]
    ck = cookies(cross)
    cols.add(
        "RENME",
        k,
        slot=s,
        sub=0,
        server=dir_mdt[new_par],
        pfid=new_par,
        name=fresh_names(k),
        sfid=file_fid(f),
        spfid=file_parent[f],
        sname=1 + ndirs + f,
        flags=0,
        cookie=ck,
    )
    kc = int(cross.sum())
    cols.add("CTIME", kc, slot=s[cross], sub=1, server=file_mdt[f][cross], tfid=file_fid(f)[cross], cookie=ck[cross])
    # ---- rename away and back
    k = op_count["rename_back"]
    f = own(k)
    away = rng.integers(1, ndirs + 1, k)
    nm = fresh_names(k)
    s = slot(k)
    cols.add(
        "RENME",
        k,
        slot=s,
        sub=0,
        server=dir_mdt[away],
        pfid=away,
        name=nm,
        sfid=file_fid(f),
        spfid=file_parent[f],
        sname=1 + ndirs + f,
        flags=0,
    )
    cols.add(
        "RENME",
        k,
        slot=s,
        sub=1,
        server=dir_mdt[file_parent[f]],
        pfid=file_parent[f],
        name=1 + ndirs + f,
        sfid=file_fid(f),
        spfid=away,
        sname=nm,
        flags=0,
    )
    # ---- rename over an existing file (the other file loses its only name: deleted)
    k = op_count["rename_over"]
    a, b = own(k), own(k)
    cols.add(
        "RENME",
        k,
        slot=slot(k),
        sub=0,
        server=dir_mdt[file_parent[b]],
        tfid=file_fid(b),
        pfid=file_parent[b],
        name=1 + ndirs + b,
        sfid=file_fid(a),
        spfid=file_parent[a],
        sname=1 + ndirs + a,
        flags=1,
    )
    # ---- hard links, unlinks
    k = op_count["hlink"]
    f = own(k)
    par = rng.integers(1, ndirs + 1, k)
    cols.add("HLINK", k, slot=slot(k), sub=0, server=dir_mdt[par], tfid=file_fid(f), pfid=par, name=fresh_names(k))
    k = op_count["unlink"]
    f = own(k)
    cols.add(
        "UNLNK",
        k,
        slot=slot(k),
        sub=0,
        server=dir_mdt[file_parent[f]],
        tfid=file_fid(f),
        pfid=file_parent[f],
        name=1 + ndirs + f,
        flags=1,
    )
    # ---- directory renames: a leaf directory into a top directory under a new name
    k = len(movers)
    dest = rng.integers(1, n_top + 1, k)
    cols.add(
        "RENME",
        k,
        slot=slot(k),
        sub=0,
        server=dir_mdt[dest],
        pfid=dest,
        name=fresh_names(k),
        sfid=movers,
        spfid=dir_parent[movers],
        sname=movers,
        flags=0,
    )
    # ---- attribute and xattr changes on any epoch-1 file
    for kind in ("chmod", "chown", "utime"):
        k = op_count[kind]
        f = rng.integers(0, files, k)
        extra_cols = {
            "chmod": {"mode": stat.S_IFREG | 0o600},
            "chown": {"uid": 1001, "gid": 1000},
            "utime": {"atime_ns": 0, "mtime_ns": 0},
        }[kind]
        cols.add("SATTR", k, slot=slot(k), sub=0, server=file_mdt[f], tfid=file_fid(f), **extra_cols)
    k = op_count["xattr_set"] + op_count["xattr_remove"]
    f = rng.integers(0, files, k)
    s = slot(k)
    xname = rng.integers(0, 4, k)
    cols.add(
        "XATTR", k, slot=s, sub=0, server=file_mdt[f], tfid=file_fid(f), xattr=xname, xvalue=rng.integers(0, 64, k)
    )
    rm = np.arange(k) >= op_count["xattr_set"]  # set, then removed
    cols.add("XATTR", int(rm.sum()), slot=s[rm], sub=1, server=file_mdt[f][rm], tfid=file_fid(f)[rm], xattr=xname[rm])
    # ---- truncates: TRUNC on the MDT, a WRITE without extents for object 0 (one cookie)
    k = op_count["truncate"]
    f = rng.integers(0, files, k)
    s = slot(k)
    new_size = (size[f] * rng.random(k)).astype(np.int64)
    ck = cookies(np.ones(k, bool))
    cols.add(
        "TRUNC",
        k,
        slot=s,
        sub=0,
        server=file_mdt[f],
        tfid=file_fid(f),
        size=new_size,
        mtime_ns=0,
        ctime_ns=0,
        cookie=ck,
    )
    ver = np.arange(version_seq, version_seq + k)
    version_seq += k
    cols.add(
        "WRITE",
        k,
        slot=s,
        sub=1,
        server=2 + first_ost[f],
        tfid=file_fid(f),
        obj_file=f,
        obj_index=0,
        version=ver,
        cookie=ck,
    )

    # ---------------------------------------------------------------- writes
    all_counts = np.concatenate([counts, *extra["counts"]])
    all_first = np.concatenate([first_ost, *extra["first"]])
    all_stripe = np.concatenate([stripe, *extra["stripe"]])
    all_size = np.concatenate([size, *extra["size"]])
    all_mdt = np.concatenate([file_mdt, *extra["mdt"]])
    n_extra = len(all_counts) - files
    row_fid = np.concatenate([1 + ndirs + np.arange(files), np.full(n_extra, -1)])
    # new files' fids: creates, then create-and-deletes
    row_fid[files : files + len(c_fids)] = c_fids
    row_fid[files + len(c_fids) : files + len(c_fids) + len(d_fids)] = d_fids

    ns_total = sum(n for _, n, _ in cols.parts)
    writes_left = max(0, budget - ns_total)
    # write ops: the creates' first writes (in the create's slot), then overwrites and appends
    wrows = [c_rows]
    wslots = [c_slot]
    wsub0 = [np.ones(len(c_rows), np.int64)]
    est = max(1, int(writes_left / 1.4))
    rows = rng.integers(0, files, est)
    wrows.append(rows)
    wslots.append(slot(min(est, slots.left())))
    if len(wslots[-1]) < est:
        extra_slots = np.arange(n_ops_total, n_ops_total + est - len(wslots[-1]))
        wslots[-1] = np.concatenate([wslots[-1], extra_slots])
    wsub0.append(np.zeros(est, np.int64))
    wr = np.concatenate(wrows)
    ws = np.concatenate(wslots)
    w0 = np.concatenate(wsub0)
    n_w = len(wr)
    cnt = all_counts[wr]
    k_obj = np.minimum(cnt, rng.choice([1, 1, 1, 2, 2, 3], n_w))
    S = all_stripe[wr]
    fsize = all_size[wr]
    append = rng.random(n_w) < 0.4
    st0 = np.where(append, fsize // S, rng.integers(0, np.maximum(fsize // S, 0) + 1))
    a = np.where(append, fsize % S, rng.integers(0, S))
    b = rng.integers(1, S + 1)
    b = np.where(k_obj == 1, np.maximum(b, a + 1), b)  # one stripe: [a, b)
    mtime = rng.random(n_w) < 0.3
    osts = (all_first[wr][:, None] + ((st0[:, None] + np.arange(3)) % cnt[:, None])) % 4
    spans = (k_obj > 1) | mtime
    ck = cookies(spans)
    # records: one WRITE per object touched, cut to the budget
    per_op = k_obj
    ends = np.cumsum(per_op + mtime)
    keep_ops = int(np.searchsorted(ends, writes_left, side="right"))
    keep_ops = max(keep_ops, len(c_rows))
    W = []
    for j in range(3):
        sel = np.flatnonzero((k_obj > j) & (np.arange(n_w) < keep_ops))
        stn = st0[sel] + j
        kk = k_obj[sel]
        start = np.where(j == 0, a[sel], 0)
        stop = np.where(j == kk - 1, b[sel], S[sel])
        stop = np.where((j == 0) & (kk == 1), b[sel], stop)
        obj_off = (stn // cnt[sel]) * S[sel] + start
        ver = np.arange(version_seq, version_seq + len(sel))
        version_seq += len(sel)
        W.append(len(sel))
        cols.add(
            "WRITE",
            len(sel),
            slot=ws[sel],
            sub=w0[sel] + j,
            server=2 + osts[sel, j],
            tfid=row_fid[wr[sel]],
            obj_file=wr[sel],
            obj_index=stn % cnt[sel],
            version=ver,
            ext_off=obj_off,
            ext_len=np.maximum(stop - start, 1),
            cookie=ck[sel],
        )
    sel = np.flatnonzero(mtime & (np.arange(n_w) < keep_ops))
    cols.add(
        "MTIME", len(sel), slot=ws[sel], sub=w0[sel] + 4, server=all_mdt[wr[sel]], tfid=row_fid[wr[sel]], cookie=ck[sel]
    )

    # ---------------------------------------------------------------- order and indexes
    c, types, total = cols.build(np)
    type_names = sorted({t for t, _, _ in types})
    type_of = np.empty(total, np.int8)
    for rtype, at, n in types:
        type_of[at : at + n] = type_names.index(rtype)
    # time order: each operation's slot, then its records; rows grouped by server (each
    # server's records a contiguous run, in time order: its index)
    g = np.argsort(c["slot"].astype(np.int64) * _SLOT + c["sub"], kind="stable")
    rank = np.empty(total, np.int64)
    rank[g] = np.arange(total)
    del g
    order = np.lexsort((rank, c["server"]))
    window = (int(EPOCH_START.timestamp()) + EPOCH_INTERVAL_S) * _NS  # epoch 2 starts here
    time_ns = window + 1000 + rank[order] * _TICK
    del rank
    for key in c:
        c[key] = c[key][order]
    type_of = type_of[order]
    del order
    per_server = np.bincount(c["server"], minlength=len(SERVERS))
    starts = np.concatenate(([0], np.cumsum(per_server)))
    index = np.arange(total, dtype=np.int64) - starts[c["server"]] + 1
    meta = Generated(
        files=files,
        dirs=ndirs,
        records=total + len(SERVERS),
        writes=int(sum(W) + op_count["truncate"]),
        ops={**op_count, "write": int(keep_ops)},
    )
    # the write plan's arrays are in the columns now: free them before the Arrow columns are built
    del wr, ws, w0, cnt, k_obj, S, fsize, append, st0, a, b, mtime, osts, spans, ck, ends, sel
    table = _records_table(
        np,
        c,
        type_names,
        type_of,
        time_ns,
        index,
        total,
        lay=(all_counts, all_first, all_stripe),
        row_fid=row_fid,
        ndirs=ndirs,
        files=files,
        per_server=per_server,
    )
    del c, type_of, time_ns, index

    def dump():
        return _dump(
            np,
            ndirs,
            n_top,
            dir_parent,
            dir_mdt,
            files,
            file_parent,
            counts,
            first_ost,
            stripe,
            size,
            mode,
            uid,
            gid,
            t1,
        )

    return dump, table, meta


def fid_strings(n: int):
    """Lustre-like fid text of fids 0..n-1 (0 = the root)."""
    return [ROOT_FID, *(f"[0x200000400:0x{i:x}:0x0]" for i in range(1, n))]


def hex_strings(n: int):
    """``0x<k+1>`` for k in 0..n-1: the object ids of file row k (one object per OST)."""
    return [f"0x{k + 1:x}" for k in range(n)]


def name_strings(n: int, ndirs: int):
    """Entry names by name id (the simulator's spellings: spaces and non-ASCII among them)."""
    out = []
    for i in range(n):
        if 1 <= i <= ndirs:
            out.append(f"dir {i:05d}" if i % 11 == 0 else f"d{i:05d}")
        elif i % 13 == 0:
            out.append(f"report {i}.txt")
        elif i % 13 == 1:
            out.append(f"données-{i}.bin")
        else:
            out.append(f"f{i:07d}.dat")
    return out


def _records_table(np, c, type_names, type_of, time_ns, index, total, *, lay, row_fid, ndirs, files, per_server):
    import pyarrow as pa
    import pyarrow.compute as pc

    from epochsync.stages.ingest.executor import _arrow_schemas

    schema, _ = _arrow_schemas()
    counts, first, stripe = lay
    n_fid = int(max(c["tfid"].max(initial=0), c["sfid"].max(initial=0), c["pfid"].max(initial=0), row_fid.max())) + 1
    fid_text = pa.array(fid_strings(n_fid))
    n_name = int(max(c["name"].max(initial=0), c["sname"].max(initial=0))) + 1
    names = pa.array(name_strings(n_name, ndirs))

    def take(table, idx):
        return pc.take(table, pa.array(idx, mask=idx < 0))

    def ints(key, zero_means=None):
        v = c[key]
        if zero_means is not None:
            v = np.where(v == 0, zero_means, v)
        return pa.array(v, pa.int64(), mask=c[key] < 0)

    n = total
    server_names = pa.array(SERVERS)
    # a record's times (0 = "the record's own time")
    cols = {
        "server": take(server_names, c["server"]),
        "index": pa.array(index),
        "epoch": pa.array(np.full(n, 2, np.int64)),
        "type": pc.take(pa.array(type_names), pa.array(type_of)),
        "time_ns": pa.array(time_ns),
        "flags": pa.array(c["flags"].astype(np.int32), pa.int32(), mask=c["flags"] < 0),
        "tfid": take(fid_text, c["tfid"]),
        "pfid": take(fid_text, c["pfid"]),
        "name": take(names, c["name"]),
        "sfid": take(fid_text, c["sfid"]),
        "spfid": take(fid_text, c["spfid"]),
        "sname": take(names, c["sname"]),
        "mode": ints("mode"),
        "uid": ints("uid"),
        "gid": ints("gid"),
        "size": ints("size"),
        "atime_ns": ints("atime_ns", time_ns),
        "mtime_ns": ints("mtime_ns", time_ns),
        "ctime_ns": ints("ctime_ns", time_ns),
        "xattr_name": take(pa.array(["user.tag", "user.owner", "user.checksum", "user.note"]), c["xattr"]),
        "xattr_value": take(pa.array([bytes(range(k % 40)) for k in range(64)], pa.binary()), c["xvalue"]),
        "symlink": take(pa.array(["../target with space"]), c["symlink"]),
        "cookie": pc.if_else(
            pa.array(c["cookie"] >= 0),
            pc.binary_join_element_wise("op-", pc.cast(pa.array(c["cookie"]), pa.string()), ""),
            pa.nulls(n, pa.string()),
        ),
    }
    # XATTR records with no value (-1) remove the xattr: null; set ones carry a value
    # layout of CREAT records (the new file's): objects (ost, oid) per stripe
    is_creat = type_of == (type_names.index("CREAT") if "CREAT" in type_names else -1)
    frow = np.where(is_creat, c["obj_file"], 0)
    cnt = counts[frow]
    lens = np.where(is_creat, cnt, 0)
    offs = np.concatenate(([0], np.cumsum(lens)))
    rec_of = np.repeat(np.arange(n), lens)
    j = np.arange(offs[-1]) - offs[:-1][rec_of]
    ost_i = (first[frow[rec_of]] + j) % 4
    oids = pa.array(hex_strings(len(counts)))
    oid_txt = pc.take(oids, pa.array(frow[rec_of]))
    lay_objs = pa.StructArray.from_arrays([take(pa.array(OSTS), ost_i), oid_txt], names=["ost", "oid"])
    layout_type = schema.field("layout").type
    objects = pa.ListArray.from_arrays(pa.array(offs.astype(np.int32)), lay_objs)
    cols["layout"] = pa.StructArray.from_arrays(
        [pa.array(np.where(is_creat, stripe[frow], 0)), pa.array(cnt.astype(np.int32)), objects],
        fields=list(layout_type),
        mask=pa.array(~is_creat),
    )
    # object and extents of WRITE records
    is_write = type_of == (type_names.index("WRITE") if "WRITE" in type_names else -1)
    wrow = np.where(is_write, c["obj_file"], 0)
    w_ost = (first[wrow] + np.maximum(c["obj_index"], 0)) % 4
    obj_type = schema.field("object").type
    cols["object"] = pa.StructArray.from_arrays(
        [
            take(pa.array(OSTS), w_ost),
            pc.take(oids, pa.array(wrow)),
            pc.binary_join_element_wise("v", pc.cast(pa.array(c["version"]), pa.string()), ""),
            pa.nulls(len(type_of), pa.int64()),  # no version lengths: a merge bench, no store
        ],
        fields=list(obj_type),
        mask=pa.array(~is_write),
    )
    has_ext = is_write & (c["ext_off"] >= 0)
    e_offs = np.concatenate(([0], np.cumsum(has_ext))).astype(np.int32)
    ext_type = schema.field("extents").type
    ext_vals = pa.StructArray.from_arrays(
        [pa.array(c["ext_off"][has_ext]), pa.array(c["ext_len"][has_ext])], fields=list(ext_type.value_type)
    )
    cols["extents"] = pa.ListArray.from_arrays(pa.array(e_offs), ext_vals, mask=pa.array(~is_write))
    arrays = [cols[f.name] if f.name in cols else pa.nulls(n, f.type) for f in schema]
    arrays = [a if a.type == f.type else a.cast(f.type) for a, f in zip(arrays, schema)]
    table = pa.Table.from_arrays(arrays, schema=schema)
    # each server's EPOCH record closes epoch 2, after its last record
    end = int(time_ns.max(initial=0))
    pieces, at = [], 0
    for i, s in enumerate(SERVERS):
        k = int(per_server[i])
        pieces.append(table.slice(at, k))
        at += k
        row = {"server": s, "index": k + 1, "epoch": 2, "type": "EPOCH", "time_ns": end + 1 + i}
        pieces.append(pa.Table.from_pylist([row], schema=schema))
    return pa.concat_tables(pieces)


def _dump(
    np, ndirs, n_top, dir_parent, dir_mdt, files, file_parent, counts, first_ost, stripe, size, mode, uid, gid, t1
):
    """The epoch-1 namespace dump as JSON Lines text (snapshot rows, ``oracle.snapshot_row_to_json``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n_fid = 1 + ndirs + files
    fids = pa.array(fid_strings(n_fid))
    names = pa.array(name_strings(n_fid, ndirs))
    join = pc.binary_join_element_wise

    def s(v):
        return pc.cast(pa.array(np.asarray(v, np.int64)), pa.string())

    t = str(t1)
    root = json.dumps(
        {
            "fid": ROOT_FID,
            "type": "dir",
            "links": [],
            "mode": stat.S_IFDIR | 0o755,
            "uid": 0,
            "gid": 0,
            "size": None,
            "atime_ns": t1,
            "mtime_ns": t1,
            "ctime_ns": t1,
            "xattrs": [],
            "symlink": None,
            "layout": None,
            "objects": [],
        },
        ensure_ascii=False,
    )
    d = np.arange(1, ndirs + 1)
    dirs = join(
        '{"fid":"',
        pc.take(fids, pa.array(d)),
        '","type":"dir","links":[{"pfid":"',
        pc.take(fids, pa.array(dir_parent[1:])),
        '","name":"',
        pc.take(names, pa.array(d)),
        f'"}}],"mode":{stat.S_IFDIR | 0o755},"uid":0,"gid":0,"size":null,"atime_ns":{t},"mtime_ns":{t},'
        f'"ctime_ns":{t},"xattrs":[],"symlink":null,"layout":null,"objects":[]}}',
        "",
    )
    f = np.arange(files)
    oid = pa.array(hex_strings(files))
    objs = vers = None
    # the layout lists objects by stripe; the snapshot's objects are sorted (by OST here: one oid)
    for key, j_of in (("layout", lambda j: (first_ost + j) % 4), ("objects", lambda j: np.full(files, j))):
        acc = None
        for j in range(4):
            ost_i = j_of(j)
            has = ((ost_i - first_ost) % 4) < counts
            ost = pc.take(pa.array(OSTS), pa.array(ost_i))
            if key == "layout":
                item = join('{"ost":"', ost, '","oid":"', oid, '"}', "")
            else:
                item = join('{"ost":"', ost, '","oid":"', oid, '","version":"v0"}', "")
            if acc is None:
                acc = pc.if_else(pa.array(has), item, "")
            else:
                sep = pc.if_else(pc.equal(acc, ""), "", ",")
                acc = pc.if_else(pa.array(has), join(acc, sep, item, ""), acc)
        if key == "layout":
            objs = acc
        else:
            vers = acc
    fid_col = pc.take(fids, pa.array(1 + ndirs + f))
    rows = join(
        '{"fid":"',
        fid_col,
        '","type":"file","links":[{"pfid":"',
        pc.take(fids, pa.array(file_parent)),
        '","name":"',
        pc.take(names, pa.array(1 + ndirs + f)),
        '"}],"mode":',
        s(mode),
        ',"uid":',
        s(uid),
        ',"gid":',
        s(gid),
        ',"size":',
        s(size),
        f',"atime_ns":{t},"mtime_ns":{t},"ctime_ns":{t},"xattrs":[],"symlink":null,"layout":{{"stripe_size":',
        s(stripe),
        ',"stripe_count":',
        s(counts),
        ',"objects":[',
        objs,
        ']},"objects":[',
        vers,
        "]}",
        "",
    )
    return [root, dirs, rows]


def write_inputs(work: Path, records: int, seed: int, files: int | None = None) -> Generated:
    """Generate and write ``work/snapshot/epoch=1/part-0.jsonl`` and
    ``work/records/server=X/part-0.parquet`` (records of epoch 2, without the partition
    columns ``epoch`` and ``server``, as ingest writes them)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    dump, table, meta = generate_epoch(records, seed, files)
    data_fields = [f.name for f in table.schema if f.name not in ("epoch", "server")]
    at = 0
    for s in SERVERS:  # each server's records (and its EPOCH record) are one run of rows
        k = int(pc.sum(pc.equal(table.column("server"), s)).as_py() or 0)
        d = work / "records" / f"server={s}"
        d.mkdir(parents=True, exist_ok=True)
        pq.write_table(table.slice(at, k).select(data_fields), d / "part-0.parquet", row_group_size=1 << 20)
        at += k
    del table
    snap = work / "snapshot" / "epoch=1"
    snap.mkdir(parents=True, exist_ok=True)
    with open(snap / "part-0.jsonl", "wb") as fh:
        lines = dump()
        fh.write(lines[0].encode() + b"\n")
        for part in lines[1:]:
            for chunk in part.chunks if isinstance(part, pa.ChunkedArray) else [part]:
                data = pc.binary_join_element_wise(chunk, "\n", "")
                buf = data.buffers()[2]
                offs = np.frombuffer(data.buffers()[1], np.int32)
                fh.write(memoryview(buf)[offs[data.offset] : offs[data.offset + len(data)]])
    (work / "generated.json").write_text(json.dumps(meta.__dict__) + "\n")
    return meta
