"""The source simulator: a seeded random workload → changelogs, stripe objects, ground truth.

Two entry points, one engine (:class:`Workload`):

``simulate_history(seed, epochs, files, ...) -> History`` (in memory, no S3; for property tests)
    ``History.epochs[i]`` (epoch ``i+1``) has ``records`` (every server's records in true
    order, each server's ``EPOCH`` record at the end), ``truth`` (ground-truth rows, see
    below), ``contents`` (``{fid: bytes}`` of every file), ``snapshot`` (the oracle's snapshot
    rows, :mod:`epochsync_dev.oracle` format) at the end of the epoch. ``History.snapshot_before(E)``
    is snapshot E-1 (epoch 0: the root alone). Object versions are fake (``v<n>``).

``epochsync simulate --out DIR ...`` (the CLI verb) writes the layout of docs/INTERNALS.md
"Simulator output": ``DIR/changelogs/<server>/<EEEEEE>.jsonl``, ``DIR/truth/epoch=E.jsonl``,
``DIR/snapshot/epoch=E/part-0.jsonl``, ``DIR/epochsync.yaml``, and the file data in a
versioned S3 bucket (``WRITE`` records carry the real ``VersionId``). ``--no-data`` writes
records only, with fake versions, streaming (for merge benchmarks of millions of records).

Examples::

    # a demo source: 2 MDTs, 4 OSTs, 2000 files, 6 epochs, data in a versioned bucket
    export AIRFLOW_CONN_SOURCE_S3='{"conn_type": "aws", "login": "KEY", "password": "SECRET",
                                    "extra": {"endpoint_url": "http://127.0.0.1:8333"}}'
    epochsync simulate --out var/sim --seed 1 --epochs 6 --files 2000 --mdts 2 --osts 4
    # a merge benchmark input: records only, an epoch of 10 million records, 70% WRITE
    epochsync simulate --out var/bench --no-data --epochs 2 --files 100000 --records-per-epoch 10000000 --write-share 0.7

The source being simulated: MDTs ``MDT0000..`` and OSTs ``OST0000..``; root fid
:data:`ROOT_FID`; Lustre-like fids ``[0x<seq>:0x<n>:0x0]`` with one sequence per MDT.
Namespace and attribute records go to the MDT owning the parent directory (entry
operations) or the fid (attribute operations); a directory lives on a random MDT. Regular
files get a RAID-0 layout (stripe size 4/16/64 KiB, 1-4 objects ``{ost, oid}`` with key
``{ost}/{oid}``) or, with ``unstriped_ratio``, none: the file is then one object
``data/{fid}`` whose ``WRITE`` records name ``{ost: <the OST that logs it>, oid: <fid>}``
with file offsets. Every write logs one ``WRITE`` per object touched (object offsets, the
object's version after the write), sometimes then an ``MTIME`` on the MDT; the records of
one operation that span several servers share a ``cookie`` (``op-<n>``). A truncate that shrinks an
object re-stores it and logs a ``WRITE`` without extents carrying the new version, so the
latest version of an object in an epoch never holds bytes past the file's size (a pull of
``[min size, final size)`` reads zeros, not stale bytes). The objects a file loses with its
last link are deleted (a delete marker; old versions stay readable). Every record gets a
strictly increasing ``time_ns`` inside its epoch's window (``2026-01-01T00:00:00Z`` + 5 min
per epoch), so time order is the true order; per-server indexes start at 1 and have no gap.

Ground-truth rows (``truth``), one per path, sorted by path: ``path`` (relative to the
root, no leading ``/``), ``type`` (file, dir, symlink, other), ``size`` (files; None
otherwise), ``sha256`` (files, hex; None with ``--no-data``), ``mode`` (st_mode with the
type bits), ``uid``, ``gid``, ``symlink`` (target), ``xattrs`` (``{name: base64 value}``),
plus ``fid`` and ``mtime_ns``. Hard links appear once per path.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import stat
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from epochsync.core.errors import EpochsyncError, StoreError
from epochsync.core.layout import gather_object, layout_file_range_to_objects, object_size
from epochsync.core.model import DIR, FILE
from epochsync.core.schema import Extent, Layout, LayoutObject, ObjectRef, Record, record_to_json
from epochsync_dev.oracle import FsModel, Node, snapshot_row_to_json

#: The simulated source's root directory fid (Lustre's well-known root).
ROOT_FID = "[0x200000007:0x1:0x0]"
#: Epoch 1 starts here; every epoch is :data:`EPOCH_INTERVAL_S` long.
EPOCH_START = datetime(2026, 1, 1, tzinfo=UTC)
EPOCH_INTERVAL_S = 300
STRIPE_SIZES = (4096, 16384, 65536)
#: key templates of the simulated store (the config's defaults)
STRIPED_KEY = "{ost}/{oid}"
UNSTRIPED_KEY = "data/{fid}"

_NS = 1_000_000_000
_RANDOM = object()  # "choose at random" default
_TICK_NS = 1000  # time between two records: room for 3e8 records per epoch

#: relative weights of the operations after epoch 1's initial tree
OP_WEIGHTS: dict[str, int] = {
    "overwrite": 22,
    "append": 14,
    "create": 9,
    "truncate": 5,
    "rename_file": 5,
    "rename_over": 3,
    "swap": 2,
    "rename_back": 2,
    "rename_dir": 2,
    "mkdir": 3,
    "hlink": 3,
    "unlink": 5,
    "symlink": 2,
    "mknod": 1,
    "xattr_set": 3,
    "xattr_remove": 2,
    "chmod": 2,
    "chown": 2,
    "utime": 2,
    "rmtree": 1,
    "create_delete": 2,
    "lyout": 1,
}


@dataclass
class SimConfig:
    """What to simulate. ``records`` (a total over all epochs) overrides ``ops_per_epoch``."""

    seed: int = 0
    epochs: int = 5
    files: int = 30
    mdts: int = 1
    osts: int = 4
    ops_per_epoch: int | None = None
    records: int | None = None
    #: records of every epoch after the first (epoch 1 is the initial tree plus ops_per_epoch ops)
    records_per_epoch: int | None = None
    data: bool = True
    unstriped_ratio: float = 0.1
    #: files are trimmed back below this size (bytes)
    max_file_size: int = 256 * 1024
    #: when set, the share of WRITE records per epoch the workload steers to (e.g. 0.7)
    write_share: float | None = None
    root_fid: str = ROOT_FID

    def __post_init__(self):
        if self.epochs < 1 or self.files < 0 or not 1 <= self.mdts <= 16 or not 1 <= self.osts <= 64:
            raise EpochsyncError(
                f"simulate: need epochs >= 1, files >= 0, 1..16 MDTs, 1..64 OSTs "
                f"(got epochs={self.epochs}, files={self.files}, mdts={self.mdts}, osts={self.osts})"
            )
        checks = [
            (self.records is None or self.records >= 1, f"--records must be at least 1, got {self.records}"),
            (
                self.records_per_epoch is None or self.records_per_epoch >= 1,
                f"--records-per-epoch must be at least 1, got {self.records_per_epoch}",
            ),
            (
                self.records is None or self.records_per_epoch is None,
                "give --records or --records-per-epoch, not both",
            ),
            (
                self.ops_per_epoch is None or self.ops_per_epoch >= 0,
                f"--ops-per-epoch must be 0 or more, got {self.ops_per_epoch}",
            ),
            (0.0 <= self.unstriped_ratio <= 1.0, f"--unstriped-ratio must be in [0, 1], got {self.unstriped_ratio}"),
            (self.max_file_size >= 1024, f"--max-file-size must be at least 1024 bytes, got {self.max_file_size}"),
            (
                self.write_share is None or 0.0 < self.write_share < 0.9,
                f"--write-share must be in (0, 0.9), got {self.write_share}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise EpochsyncError(f"simulate: {message}")

    @property
    def servers(self) -> tuple[str, ...]:
        return tuple(f"MDT{i:04d}" for i in range(self.mdts)) + tuple(f"OST{i:04d}" for i in range(self.osts))


@dataclass
class EpochResult:
    """One epoch of a :class:`History` (state at the end of the epoch)."""

    epoch: int
    records: list[Record]
    truth: list[dict[str, Any]]
    contents: dict[str, bytes]
    snapshot: list[dict[str, Any]]

    def truth_by_path(self) -> dict[str, dict[str, Any]]:
        """The ground truth keyed by path."""
        return {t["path"]: t for t in self.truth}


@dataclass
class History:
    """An in-memory simulated source: see the module docstring."""

    root_fid: str
    servers: tuple[str, ...]
    config: SimConfig
    initial_snapshot: list[dict[str, Any]]
    epochs: list[EpochResult] = field(default_factory=list)

    def at(self, epoch: int) -> EpochResult:
        """Epoch ``epoch`` (1-based)."""
        return self.epochs[epoch - 1]

    def snapshot_before(self, epoch: int) -> list[dict[str, Any]]:
        """Snapshot ``epoch - 1`` (for epoch 1: the root alone)."""
        return self.initial_snapshot if epoch == 1 else self.epochs[epoch - 2].snapshot


class _RandomSet:
    """A set with O(1) add, remove and uniform random choice."""

    def __init__(self):
        self.items: list[str] = []
        self.pos: dict[str, int] = {}

    def add(self, x: str) -> None:
        if x not in self.pos:
            self.pos[x] = len(self.items)
            self.items.append(x)

    def discard(self, x: str) -> None:
        i = self.pos.pop(x, None)
        if i is None:
            return
        last = self.items.pop()
        if i < len(self.items):
            self.items[i] = last
            self.pos[last] = i

    def choice(self, rng: random.Random) -> str | None:
        return self.items[rng.randrange(len(self.items))] if self.items else None

    def __len__(self) -> int:
        return len(self.items)

    def __contains__(self, x: str) -> bool:
        return x in self.pos


@dataclass
class Upload:
    """One object version to store: the version token the records carry until S3 answers."""

    token: str
    key: str
    data: bytes


class Workload:
    """The engine: a seeded workload driving an :class:`FsModel` (with bytes when ``data``).

    ``sink(record)`` receives every record as it is emitted (after the model applied it).
    Per epoch, ``uploads`` and ``deletes`` list the object versions to store and the keys
    to delete, in order; :meth:`finish_epoch` clears them.
    """

    def __init__(self, cfg: SimConfig, sink: Callable[[Record], None]):
        self.cfg = cfg
        self.sink = sink
        self.rng = random.Random(cfg.seed)
        # bytes come from their own stream so the namespace does not depend on --no-data
        self.bytes_rng = random.Random(cfg.seed * 7919 + 1)
        self.model = FsModel(cfg.root_fid, track_data=cfg.data)
        self.mdts = [f"MDT{i:04d}" for i in range(cfg.mdts)]
        self.osts = [f"OST{i:04d}" for i in range(cfg.osts)]
        self.next_index = {s: 1 for s in cfg.servers}
        self.fid_seq = [0] * cfg.mdts
        self.oid_seq = [0] * cfg.osts
        self.name_seq = 0
        self.version_seq = 0
        self.cookie_seq = 0
        self.epoch = 0
        self.clock = int(EPOCH_START.timestamp()) * _NS
        self.epoch_records = 0
        self.epoch_writes = 0
        self.home_mdt: dict[str, int] = {cfg.root_fid: 0}  # fid -> MDT holding its inode
        self.unstriped_ost: dict[str, str] = {}
        #: (ost, oid) -> bytes the store holds for it now (to know when a truncate must punch)
        self.stored_len: dict[tuple[str, str], int] = {}
        self.files = _RandomSet()
        self.dirs = _RandomSet()
        self.dirs.add(cfg.root_fid)
        self.others = _RandomSet()  # symlinks and special files
        #: fid -> its layout, kept until its objects are deleted with its last link
        self.layouts: dict[str, Layout | None] = {}
        self.touched: set[str] = set()  # fids whose object versions changed this epoch
        self.uploads: list[Upload] = []
        self.deletes: list[str] = []
        self.records_total = 0

    # ------------------------------------------------------------------ records

    def emit(self, server: str, type_: str, **fields: Any) -> Record:
        """Make the next record of ``server``, apply it to the model, hand it to the sink."""
        self.clock += _TICK_NS
        idx = self.next_index[server]
        self.next_index[server] = idx + 1
        rec = Record(server=server, index=idx, epoch=self.epoch, type=type_, time_ns=self.clock, **fields)
        self.model.apply(rec)
        self.epoch_records += 1
        if type_ == "WRITE":
            self.epoch_writes += 1
        self.records_total += 1
        self.sink(rec)
        return rec

    def _mdt_of(self, fid: str) -> str:
        return self.mdts[self.home_mdt[fid]]

    def _new_fid(self, mdt: int) -> str:
        self.fid_seq[mdt] += 1
        return f"[0x{0x200000400 + mdt:x}:0x{self.fid_seq[mdt]:x}:0x0]"

    def _new_name(self, kind: str) -> str:
        self.name_seq += 1
        n = self.name_seq
        if kind == "dir":
            return f"dir {n:05d}" if n % 11 == 0 else f"d{n:05d}"
        if kind == "tmp":
            return f".tmp-{n}"
        r = n % 13
        if r == 0:
            return f"report {n}.txt"  # spaces
        if r == 1:
            return f"données-{n}.bin"  # non-ASCII
        return f"f{n:06d}.dat"

    def _owner(self) -> dict[str, int]:
        return {"uid": self.rng.choice((0, 1000, 1001, 1002)), "gid": self.rng.choice((0, 100, 1000))}

    def _times(self) -> dict[str, int]:
        t = self.clock + _TICK_NS  # the time the next record will get
        return {"atime_ns": t, "mtime_ns": t, "ctime_ns": t}

    # ------------------------------------------------------------------ epochs

    def run_epoch(self, epoch: int) -> None:
        """Generate every record of ``epoch``, ending with each server's EPOCH record."""
        self.epoch = epoch
        window_start = (int(EPOCH_START.timestamp()) + (epoch - 1) * EPOCH_INTERVAL_S) * _NS
        self.clock = max(self.clock, window_start)
        self.epoch_records = 0
        self.epoch_writes = 0
        cfg = self.cfg
        if epoch == 1:
            self._initial_tree()
        budget = None
        if cfg.records is not None:
            budget = cfg.records // cfg.epochs + (cfg.records % cfg.epochs if epoch == cfg.epochs else 0)
            budget -= len(self.next_index)  # the EPOCH records
        elif cfg.records_per_epoch is not None and epoch > 1:
            budget = cfg.records_per_epoch - len(self.next_index)
        ops = cfg.ops_per_epoch if cfg.ops_per_epoch is not None else max(6, cfg.files // 2)
        names = list(OP_WEIGHTS)
        weights = list(OP_WEIGHTS.values())
        data_ops = ("overwrite", "append")
        other = [n for n in names if n not in data_ops]
        other_weights = [OP_WEIGHTS[n] for n in other]
        done = 0
        while (self.epoch_records < budget) if budget is not None else (done < ops):
            if cfg.write_share is None:
                op = self.rng.choices(names, weights)[0]
            elif self.epoch_writes < cfg.write_share * self.epoch_records:
                op = self.rng.choice(data_ops)
            else:
                op = self.rng.choices(other, other_weights)[0]
            getattr(self, "op_" + op)()
            done += 1
        for server in sorted(self.next_index):
            self.emit(server, "EPOCH")
        window_end = window_start + EPOCH_INTERVAL_S * _NS
        if self.clock >= window_end:
            raise EpochsyncError(f"simulate: epoch {epoch} overflows its time window; use fewer records per epoch")

    def _initial_tree(self) -> None:
        ndirs = max(1, self.cfg.files // 8)
        for _ in range(ndirs):
            self.op_mkdir()
        for _ in range(self.cfg.files):
            self.op_create()

    # ------------------------------------------------------------------ data

    def _object_ref(self, node: Node, index: int) -> tuple[str, str, str]:
        """(ost, oid, store key) of object ``index`` of a file."""
        if node.layout is None:
            return self.unstriped_ost[node.fid], node.fid, UNSTRIPED_KEY.format(fid=node.fid)
        o = node.layout.objects[index]
        return o.ost, o.oid, STRIPED_KEY.format(ost=o.ost, oid=o.oid)

    def _token(self) -> str:
        self.version_seq += 1
        return f"v{self.version_seq}"

    def _store(self, node: Node, index: int, ost: str, oid: str, key: str, token: str) -> None:
        """Register the object's current bytes for upload as version ``token``."""
        size = node.size or 0
        if node.layout is None:
            length = size
        else:
            length = object_size(node.layout.stripe_size, node.layout.stripe_count, index, size)
        self.stored_len[(ost, oid)] = length
        if self.cfg.data:
            self.uploads.append(Upload(token, key, gather_object(node.layout, index, node.data)))
        self.touched.add(node.fid)

    def write(self, fid: str, offset: int, length: int) -> None:
        """Write ``length`` random bytes at ``offset`` of file ``fid``: WRITE per object, then MTIME."""
        node = self.model.nodes[fid]
        pieces = layout_file_range_to_objects(node.layout, offset, length)
        mtime = self.rng.random() < 0.3
        refs = {i: self._object_ref(node, i) for i in sorted(pieces)}
        servers = {ref[0] for ref in refs.values()} | ({self._mdt_of(fid)} if mtime else set())
        cookie = self._cookie(servers)
        tokens = {}
        for index, (ost, oid, _key) in refs.items():
            obj_off, obj_len = pieces[index]
            tokens[index] = self._token()
            self.emit(
                ost,
                "WRITE",
                tfid=fid,
                object=ObjectRef(ost, oid, tokens[index]),
                extents=(Extent(obj_off, obj_len),),
                cookie=cookie,
            )
        if self.cfg.data:
            # the WRITE records grew the model's size (and zero-filled); now the bytes
            node.data[offset : offset + length] = self.bytes_rng.randbytes(length)
        for index, token in tokens.items():
            self._store(node, index, *refs[index], token)
        if mtime:
            self.emit(self._mdt_of(fid), "MTIME", tfid=fid, cookie=cookie)

    def _cookie(self, servers: set[str]) -> str | None:
        """A cookie for the records of one operation when they span several servers."""
        if len(servers) < 2:
            return None
        self.cookie_seq += 1
        return f"op-{self.cookie_seq}"

    def truncate(self, fid: str, size: int) -> None:
        """TRUNC on the MDT, then re-store every object the truncate shrank."""
        node = self.model.nodes[fid]
        count = 1 if node.layout is None else node.layout.stripe_count
        punch = []
        for index in range(count):
            ost, oid, key = self._object_ref(node, index)
            stored = self.stored_len.get((ost, oid))
            keep = size if node.layout is None else object_size(node.layout.stripe_size, count, index, size)
            if stored is not None and stored > keep:
                punch.append((index, ost, oid, key))
        cookie = self._cookie({self._mdt_of(fid)} | {p[1] for p in punch})
        t = self._times()
        self.emit(
            self._mdt_of(fid),
            "TRUNC",
            tfid=fid,
            size=size,
            mtime_ns=t["mtime_ns"],
            ctime_ns=t["ctime_ns"],
            cookie=cookie,
        )
        for index, ost, oid, key in punch:
            token = self._token()
            self._store(node, index, ost, oid, key, token)
            self.emit(ost, "WRITE", tfid=fid, object=ObjectRef(ost, oid, token), extents=(), cookie=cookie)

    def _forget(self, fid: str) -> None:
        """Bookkeeping once ``fid`` lost its last link: its objects are deleted from the store."""
        if fid in self.model.nodes:
            return
        self.files.discard(fid)
        self.dirs.discard(fid)
        self.others.discard(fid)
        objects = []
        if fid in self.unstriped_ost:
            objects.append((self.unstriped_ost.pop(fid), fid, UNSTRIPED_KEY.format(fid=fid)))
        layout = self.layouts.pop(fid, None)
        for o in layout.objects if layout is not None else ():
            objects.append((o.ost, o.oid, STRIPED_KEY.format(ost=o.ost, oid=o.oid)))
        for ost, oid, key in objects:
            if self.stored_len.pop((ost, oid), None) is not None:
                self.deletes.append(key)
        self.home_mdt.pop(fid, None)

    # ------------------------------------------------------------------ helpers for ops

    def _pick_dir(self) -> str:
        return self.dirs.choice(self.rng)

    def _new_layout(self) -> Layout | None:
        if self.rng.random() < self.cfg.unstriped_ratio:
            return None
        count = min(self.rng.choice((1, 1, 2, 3, 4)), len(self.osts))
        first = self.rng.randrange(len(self.osts))
        objs = []
        for k in range(count):
            o = (first + k) % len(self.osts)
            self.oid_seq[o] += 1
            objs.append(LayoutObject(self.osts[o], f"0x{self.oid_seq[o]:x}"))
        return Layout(self.rng.choice(STRIPE_SIZES), count, tuple(objs))

    def _file_size(self) -> int:
        r = self.rng.random()
        cap = self.cfg.max_file_size
        if r < 0.08:
            return 0
        if r < 0.55:
            return self.rng.randrange(1, min(4096, cap) + 1)
        if r < 0.85:
            return self.rng.randrange(1, min(65536, cap) + 1)
        return self.rng.randrange(1, cap + 1)

    def _any_link(self, fid: str) -> tuple[str, str]:
        links = sorted(self.model.nodes[fid].links)
        return links[self.rng.randrange(len(links))]

    def _create_file(self, parent: str | None = None, name: str | None = None, layout: Any = _RANDOM) -> str:
        parent = parent or self._pick_dir()
        mdt = self.home_mdt[parent]
        fid = self._new_fid(mdt)
        self.home_mdt[fid] = mdt
        lay = self._new_layout() if layout is _RANDOM else layout
        self.layouts[fid] = lay
        if lay is None:
            self.unstriped_ost[fid] = self.osts[self.fid_seq[mdt] % len(self.osts)]
        mode = stat.S_IFREG | self.rng.choice((0o644, 0o640, 0o600, 0o755))
        self.emit(
            self.mdts[mdt],
            "CREAT",
            tfid=fid,
            pfid=parent,
            name=name or self._new_name("file"),
            mode=mode,
            layout=lay,
            **self._owner(),
            **self._times(),
        )
        self.files.add(fid)
        return fid

    def _unlink_name(self, pfid: str, name: str) -> None:
        fid = self.model.lookup(pfid, name)
        node = self.model.nodes[fid]
        last = len(node.links) == 1
        rtype = "RMDIR" if node.type == DIR else "UNLNK"
        self.emit(self.mdts[self.home_mdt[pfid]], rtype, tfid=fid, pfid=pfid, name=name, flags=1 if last else 0)
        self._forget(fid)

    def _rename(self, fid: str, old: tuple[str, str], new: tuple[str, str]) -> None:
        victim = self.model.lookup(*new)
        last = victim is not None and len(self.model.nodes[victim].links) == 1
        self.emit(
            self.mdts[self.home_mdt[new[0]]],
            "RENME",
            tfid=victim,
            pfid=new[0],
            name=new[1],
            sfid=fid,
            spfid=old[0],
            sname=old[1],
            flags=1 if last else 0,
        )
        if victim is not None:
            self._forget(victim)

    # ------------------------------------------------------------------ operations

    def op_create(self) -> None:
        fid = self._create_file()
        size = self._file_size()
        if size:
            self.write(fid, 0, size)

    def op_mkdir(self) -> None:
        parent = self._pick_dir()
        mdt = self.rng.randrange(len(self.mdts))
        fid = self._new_fid(mdt)
        self.home_mdt[fid] = mdt
        self.emit(
            self.mdts[self.home_mdt[parent]],
            "MKDIR",
            tfid=fid,
            pfid=parent,
            name=self._new_name("dir"),
            mode=stat.S_IFDIR | self.rng.choice((0o755, 0o750, 0o700)),
            **self._owner(),
            **self._times(),
        )
        self.dirs.add(fid)

    def _some_file(self) -> str | None:
        fid = self.files.choice(self.rng)
        if fid is None:
            self.op_create()
        return fid

    def op_overwrite(self) -> None:
        fid = self._some_file()
        if fid is None:
            return
        size = self.model.nodes[fid].size or 0
        offset = self.rng.randrange(0, size + 1)
        length = self.rng.randrange(1, 16385)
        if self.rng.random() < 0.1:
            offset = size + self.rng.randrange(1, 65536)  # a sparse hole
        if offset + length > self.cfg.max_file_size:
            self.truncate(fid, self.rng.randrange(0, self.cfg.max_file_size // 2))
            return
        self.write(fid, offset, length)

    def op_append(self) -> None:
        fid = self._some_file()
        if fid is None:
            return
        size = self.model.nodes[fid].size or 0
        length = self.rng.randrange(1, 8193)
        if size + length > self.cfg.max_file_size:
            self.truncate(fid, self.rng.randrange(0, size // 2 + 1))
            return
        self.write(fid, size, length)

    def op_truncate(self) -> None:
        fid = self._some_file()
        if fid is None:
            return
        size = self.model.nodes[fid].size or 0
        if size and self.rng.random() < 0.6:
            new = self.rng.randrange(0, size)
            self.truncate(fid, new)
            if self.rng.random() < 0.5:  # down then up again: the stale bytes must read as zeros
                self.truncate(fid, min(self.cfg.max_file_size, new + self.rng.randrange(1, 3 * (size - new) + 2)))
        else:
            self.truncate(fid, min(self.cfg.max_file_size, size + self.rng.randrange(1, 20000)))

    def _movable(self) -> str | None:
        """A file, symlink or special file (not a directory)."""
        pool = self.files if (not self.others or self.rng.random() < 0.85) else self.others
        return pool.choice(self.rng)

    def op_rename_file(self) -> None:
        fid = self._movable()
        if fid is None:
            return self.op_create()
        old = self._any_link(fid)
        new_parent = self._pick_dir() if self.rng.random() < 0.6 else old[0]
        self._rename(fid, old, (new_parent, self._new_name("file")))

    def op_rename_over(self) -> None:
        """Rename a file over another existing file (the other loses that name)."""
        a, b = self.files.choice(self.rng), self.files.choice(self.rng)
        if a is None or a == b:
            return self.op_create()
        self._rename(a, self._any_link(a), self._any_link(b))

    def op_swap(self) -> None:
        """Swap two files' names through a temp name: a→tmp, b→a, tmp→b."""
        a, b = self.files.choice(self.rng), self.files.choice(self.rng)
        if a is None or a == b:
            return self.op_create()
        la, lb = self._any_link(a), self._any_link(b)
        tmp = (la[0], self._new_name("tmp"))
        self._rename(a, la, tmp)
        self._rename(b, lb, la)
        self._rename(a, tmp, lb)

    def op_rename_back(self) -> None:
        """Rename a file away and back to its original name (maybe writing in between)."""
        fid = self.files.choice(self.rng)
        if fid is None:
            return self.op_create()
        old = self._any_link(fid)
        away = (self._pick_dir(), self._new_name("file"))
        self._rename(fid, old, away)
        if self.rng.random() < 0.5:
            size = self.model.nodes[fid].size or 0
            self.write(fid, self.rng.randrange(0, size + 1), self.rng.randrange(1, 4097))
        self._rename(fid, away, old)

    def op_rename_dir(self) -> None:
        for _ in range(5):
            d = self.dirs.choice(self.rng)
            if d == self.cfg.root_fid:
                continue
            parent = self._pick_dir()
            if self.model.is_ancestor(d, parent):
                continue
            self._rename(d, next(iter(self.model.nodes[d].links)), (parent, self._new_name("dir")))
            return

    def op_hlink(self) -> None:
        fid = self.files.choice(self.rng)
        if fid is None:
            return self.op_create()
        parent = self._pick_dir()
        self.emit(self.mdts[self.home_mdt[parent]], "HLINK", tfid=fid, pfid=parent, name=self._new_name("file"))

    def op_unlink(self) -> None:
        fid = self._movable()
        if fid is None:
            return
        self._unlink_name(*self._any_link(fid))

    def op_symlink(self) -> None:
        parent = self._pick_dir()
        mdt = self.home_mdt[parent]
        fid = self._new_fid(mdt)
        self.home_mdt[fid] = mdt
        paths = ["../" + self._new_name("file"), "/etc/hostname", "target with space", "d00001/f000002.dat"]
        self.emit(
            self.mdts[mdt],
            "SLINK",
            tfid=fid,
            pfid=parent,
            name=self._new_name("file") + ".lnk",
            symlink=self.rng.choice(paths),
            mode=stat.S_IFLNK | 0o777,
            **self._owner(),
            **self._times(),
        )
        self.others.add(fid)

    def op_mknod(self) -> None:
        parent = self._pick_dir()
        mdt = self.home_mdt[parent]
        fid = self._new_fid(mdt)
        self.home_mdt[fid] = mdt
        self.emit(
            self.mdts[mdt],
            "MKNOD",
            tfid=fid,
            pfid=parent,
            name=self._new_name("file") + ".fifo",
            mode=stat.S_IFIFO | 0o644,
            **self._owner(),
            **self._times(),
        )
        self.others.add(fid)

    def _attr_target(self) -> str:
        pool = self.files if self.rng.random() < 0.8 else self.dirs
        return pool.choice(self.rng) or self.cfg.root_fid

    def op_xattr_set(self) -> None:
        fid = self._attr_target()
        name = f"user.{self.rng.choice(('tag', 'owner', 'checksum', 'note'))}"
        value = self.rng.randbytes(self.rng.randrange(0, 40))
        self.emit(self._mdt_of(fid), "XATTR", tfid=fid, xattr_name=name, xattr_value=value)
        if self.rng.random() < 0.3:  # set then removed in the same epoch
            self.emit(self._mdt_of(fid), "XATTR", tfid=fid, xattr_name=name, xattr_value=None)

    def op_xattr_remove(self) -> None:
        fid = self._attr_target()
        names = sorted(self.model.nodes[fid].xattrs)
        if not names:
            return self.op_xattr_set()
        self.emit(self._mdt_of(fid), "XATTR", tfid=fid, xattr_name=self.rng.choice(names), xattr_value=None)

    def op_chmod(self) -> None:
        fid = self._attr_target()
        node = self.model.nodes[fid]
        perm = self.rng.choice((0o600, 0o640, 0o644, 0o664, 0o700, 0o750, 0o755))
        self.emit(
            self._mdt_of(fid),
            "SATTR",
            tfid=fid,
            mode=stat.S_IFMT(node.mode or 0) | perm,
            ctime_ns=self.clock + _TICK_NS,
        )

    def op_chown(self) -> None:
        fid = self._attr_target() if self.rng.random() < 0.8 else (self.others.choice(self.rng) or self.cfg.root_fid)
        self.emit(self._mdt_of(fid), "SATTR", tfid=fid, ctime_ns=self.clock + _TICK_NS, **self._owner())

    def op_utime(self) -> None:
        fid = self._attr_target()
        past = int(EPOCH_START.timestamp()) * _NS - self.rng.randrange(1, 10**6) * _NS
        self.emit(self._mdt_of(fid), "SATTR", tfid=fid, atime_ns=past, mtime_ns=past, ctime_ns=self.clock + _TICK_NS)

    def op_rmtree(self) -> None:
        """Remove a small directory tree bottom-up (UNLNK the entries, RMDIR the directories)."""
        for _ in range(4):
            d = self.dirs.choice(self.rng)
            if d == self.cfg.root_fid:
                continue
            order: list[tuple[str, str]] = []
            if self._post_order(d, order, limit=25):
                for pfid, name in order:
                    self._unlink_name(pfid, name)
                self._unlink_name(*next(iter(self.model.nodes[d].links)))
                return

    def _post_order(self, d: str, out: list[tuple[str, str]], limit: int) -> bool:
        for name, fid in sorted(self.model.entries_of(d).items()):
            if self.model.nodes[fid].type == DIR and not self._post_order(fid, out, limit):
                return False
            out.append((d, name))
            if len(out) > limit:
                return False
        return True

    def op_create_delete(self) -> None:
        """A file created, written, maybe renamed, and deleted within the epoch."""
        fid = self._create_file()
        self.write(fid, 0, self.rng.randrange(1, 30000))
        link = next(iter(self.model.nodes[fid].links))
        if self.rng.random() < 0.5:
            new = (self._pick_dir(), self._new_name("file"))
            self._rename(fid, link, new)
            link = new
        self._unlink_name(*link)

    def op_lyout(self) -> None:
        """Delayed layout: create without a layout, then LYOUT gives it one before the first write."""
        fid = self._create_file(layout=None)
        lay = self._new_layout() or Layout(65536, 1, (LayoutObject(self.osts[0], self._next_oid(0)),))
        self.layouts[fid] = lay
        self.unstriped_ost.pop(fid, None)
        self.emit(self._mdt_of(fid), "LYOUT", tfid=fid, layout=lay)
        if self.rng.random() < 0.7:
            self.write(fid, 0, self.rng.randrange(1, 50000))

    def _next_oid(self, ost: int) -> str:
        self.oid_seq[ost] += 1
        return f"0x{self.oid_seq[ost]:x}"

    # ------------------------------------------------------------------ end of epoch

    def remap_versions(self, versions: dict[str, str], records: list[Record]) -> None:
        """Replace version tokens by the store's version ids, in the records and the model."""
        for r in records:
            if r.object is not None and r.object.version in versions:
                r.object = ObjectRef(r.object.ost, r.object.oid, versions[r.object.version])
        for fid in self.touched:
            node = self.model.nodes.get(fid)
            if node is not None:
                node.objects = {k: versions.get(v, v) for k, v in node.objects.items()}

    def finish_epoch(self) -> None:
        self.uploads = []
        self.deletes = []
        self.touched = set()

    def truth(self) -> list[dict[str, Any]]:
        """Ground-truth rows of the current state (see the module docstring)."""
        return list(self.iter_truth())

    def iter_truth(self) -> Iterator[dict[str, Any]]:
        """:meth:`truth` one row at a time (large namespaces)."""
        import base64

        for path, fid in sorted(self.model.paths().items()):
            node = self.model.nodes[fid]
            sha = None
            if node.type == FILE and node.data is not None:
                sha = hashlib.sha256(node.data).hexdigest()
            yield (
                {
                    "path": path,
                    "type": node.type,
                    "size": node.size if node.type == FILE else None,
                    "sha256": sha,
                    "mode": node.mode,
                    "uid": node.uid,
                    "gid": node.gid,
                    "symlink": node.symlink,
                    "xattrs": {k: base64.b64encode(v).decode("ascii") for k, v in sorted(node.xattrs.items())},
                    "fid": fid,
                    "mtime_ns": node.mtime_ns,
                }
            )

    def contents(self) -> dict[str, bytes]:
        return {fid: bytes(n.data) for fid, n in self.model.nodes.items() if n.type == FILE and n.data is not None}


def simulate_history(
    seed: int = 0,
    epochs: int = 5,
    files: int = 30,
    *,
    mdts: int = 1,
    osts: int = 4,
    ops_per_epoch: int | None = None,
    records: int | None = None,
    records_per_epoch: int | None = None,
    data: bool = True,
    unstriped_ratio: float = 0.1,
    max_file_size: int = 256 * 1024,
    write_share: float | None = None,
) -> History:
    """Simulate ``epochs`` epochs in memory (no S3); see the module docstring and :class:`SimConfig`."""
    cfg = SimConfig(
        seed=seed,
        epochs=epochs,
        files=files,
        mdts=mdts,
        osts=osts,
        ops_per_epoch=ops_per_epoch,
        records=records,
        records_per_epoch=records_per_epoch,
        data=data,
        unstriped_ratio=unstriped_ratio,
        max_file_size=max_file_size,
        write_share=write_share,
    )
    collected: list[Record] = []
    w = Workload(cfg, collected.append)
    hist = History(cfg.root_fid, cfg.servers, cfg, w.model.snapshot_rows())
    for e in range(1, epochs + 1):
        collected.clear()
        w.run_epoch(e)
        w.finish_epoch()
        hist.epochs.append(EpochResult(e, list(collected), w.truth(), w.contents(), w.model.snapshot_rows()))
    return hist


def read_file_at(
    row: dict[str, Any],
    fetch: Callable[[str, str], bytes],
    *,
    key: str = STRIPED_KEY,
    unstriped_key: str = UNSTRIPED_KEY,
) -> bytes:
    """The bytes of the file of snapshot ``row`` as the source store holds them at that snapshot.

    ``fetch(key, version)`` returns one stored object version. Each object of the layout is
    read at the version the row records (an object with no version was never written: zeros)
    and the file is assembled through the RAID-0 layout, clipped to the row's size.
    """
    from epochsync.core.layout import assemble_file

    versions = {(ost, oid): v for ost, oid, v in row["objects"]}
    lay = row["layout"]
    if lay is None:
        layout = None
        entries = [(k, v) for k, v in versions.items() if k[1] == row["fid"]]
        keys = [(unstriped_key.format(fid=row["fid"]), entries[0][1] if entries else None)]
    else:
        layout = Layout(lay[0], lay[1], tuple(LayoutObject(o, i) for o, i in lay[2]))
        keys = [(key.format(ost=o, oid=i, fid=row["fid"]), versions.get((o, i))) for o, i in lay[2]]
    objects = [None if v is None else fetch(k, v) for k, v in keys]
    return assemble_file(layout, row["size"] or 0, objects)


def fast_record_json(r: Record) -> str:
    """``record_to_json(r)`` for the simulator's hot record types, several times faster.

    Only for records whose strings the simulator made (fids, OST names, oids, version
    tokens: no quotes, backslashes or control characters); other records go through
    :func:`epochsync.core.schema.record_to_json`. A unit test checks both give the same text.
    """
    from epochsync.core.schema import record_to_json

    head = f'{{"server":"{r.server}","index":{r.index},"epoch":{r.epoch},"type":"{r.type}","time_ns":{r.time_ns}'
    if r.type == "WRITE" and r.object is not None and r.flags is None and r.mtime_ns is None:
        ext = ",".join(f'{{"offset":{e.offset},"length":{e.length}}}' for e in r.extents or ())
        o = r.object
        ver = "null" if o.version is None else f'"{o.version}"'
        cookie = "" if r.cookie is None else f',"cookie":"{r.cookie}"'
        return (
            f'{head},"tfid":"{r.tfid}","object":{{"ost":"{o.ost}","oid":"{o.oid}","version":{ver}}},'
            f'"extents":[{ext}]{cookie}}}'
        )
    if r.type == "MTIME" and r.mtime_ns is None and r.flags is None:
        cookie = "" if r.cookie is None else f',"cookie":"{r.cookie}"'
        return f'{head},"tfid":"{r.tfid}"{cookie}}}'
    if r.type == "EPOCH":
        return head + "}"
    return record_to_json(r)


# --------------------------------------------------------------------------- the S3 source store


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


# --------------------------------------------------------------------------- the CLI verb


#: ``--cache``: the master's own layout (a striped s3 target), different from the cache's
MASTER_STRIPE_SIZE, MASTER_STRIPE_COUNT = 64 * 1024, 4


def write_config(
    out: Path,
    *,
    bucket: str,
    conn_id: str,
    servers: tuple[str, ...],
    root_fid: str,
    start: datetime = EPOCH_START,
    interval_s: float = EPOCH_INTERVAL_S,
    cache: bool = False,
) -> Path:
    """``DIR/epochsync.yaml``: source ``sim``, a posix target ``local`` and an s3 target ``s3``.

    ``cache``: the history is a write-back cache's (docs/reintegration.md): source ``cache``
    and one target, ``master``, striped with the master's own layout.
    """
    import yaml

    cfg = {
        "warehouse": f"file://{out / 'warehouse'}",
        "sources": [
            {
                "name": "sim",
                "root_fid": root_fid,
                "servers": list(servers),
                "changelogs": {"uri": f"file://{out / 'changelogs'}/", "format": "jsonl"},
                "store": {"conn_id": conn_id, "bucket": bucket, "key": STRIPED_KEY, "unstriped_key": UNSTRIPED_KEY},
                "epoch": {"interval": f"{interval_s:g}s", "start": start.strftime("%Y-%m-%dT%H:%M:%SZ")},
            }
        ],
        "targets": [
            {"name": "local", "source": "sim", "kind": "posix", "path": str(out / "replica")},
            {
                "name": "s3",
                "source": "sim",
                "kind": "s3",
                "conn_id": "replica_s3",
                "bucket": "replica",
                "prefix": "sim/",
            },
        ],
    }
    if cache:
        cfg["sources"][0]["name"] = "cache"
        cfg["targets"] = [
            {
                "name": "master",
                "source": "cache",
                "kind": "s3",
                "conn_id": "replica_s3",
                "bucket": "master",
                "prefix": "",
                "stripe_size": MASTER_STRIPE_SIZE,
                "stripe_count": MASTER_STRIPE_COUNT,
            }
        ]
    path = out / "epochsync.yaml"
    header = (
        "# Written by `epochsync simulate`. Keys come from AIRFLOW_CONN_SOURCE_S3 and\n"
        "# AIRFLOW_CONN_REPLICA_S3 (or Airflow connections), never from this file.\n"
    )
    path.write_text(header + yaml.safe_dump(cfg, sort_keys=False, allow_unicode=True))
    return path


def configure_simulate(parser) -> None:
    """Options of ``epochsync simulate``."""
    from epochsync.core.config import parse_size

    parser.add_argument("--out", required=True, metavar="DIR", help="output directory (changelogs, truth, config)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (same seed, same history)")
    parser.add_argument("--epochs", type=int, default=6, help="number of epochs (default 6)")
    parser.add_argument("--files", type=int, default=200, help="files created in epoch 1 (default 200)")
    parser.add_argument("--mdts", type=int, default=1, help="metadata servers (default 1)")
    parser.add_argument("--osts", type=int, default=4, help="object servers (default 4)")
    parser.add_argument("--records", type=int, help="target record count over all epochs (sets the ops per epoch)")
    parser.add_argument(
        "--records-per-epoch",
        type=int,
        help="records of each epoch after the first (epoch 1: the initial tree plus --ops-per-epoch operations)",
    )
    parser.add_argument("--ops-per-epoch", type=int, help="operations per epoch (default files/2)")
    parser.add_argument(
        "--write-share", type=float, help="steer each epoch to this share of WRITE records (e.g. 0.7 for benchmarks)"
    )
    parser.add_argument("--no-data", action="store_true", help="records only, fake object versions, nothing stored")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--endpoint", metavar="URL", help="S3 endpoint of the source store (keys from AWS_* env)")
    where.add_argument(
        "--conn-id", default=None, help="connection of the source store (AIRFLOW_CONN_<ID>; default source_s3)"
    )
    parser.add_argument("--bucket", default="sim-source", help="source data bucket (default sim-source)")
    parser.add_argument("--threads", type=int, default=16, help="parallel uploads (default 16)")
    parser.add_argument(
        "--unstriped-ratio",
        type=float,
        default=None,
        help="share of files with no layout (default 0.1; 1.0 with --cache)",
    )
    parser.add_argument(
        "--cache",
        action="store_true",
        help="a write-back cache's history for reintegration: every file unstriped (unless "
        "--unstriped-ratio says otherwise), config with source cache and a striped s3 "
        "target master (docs/reintegration.md)",
    )
    parser.add_argument(
        "--max-file-size", type=parse_size, default=256 * 1024, help="files stay below this size (default 256KiB)"
    )
    parser.add_argument(
        "--live",
        action="store_true",
        help="produce the epochs in real time: epoch E's changelogs appear (closed) at the end of its window",
    )
    parser.add_argument("--interval", default=None, help="epoch length (default 5m; 30s with --live)")
    parser.add_argument(
        "--start", default=None, help="start of epoch 1, ISO time (default: 2026-01-01; with --live the next boundary)"
    )


def _epoch_grid_of(args, live: bool) -> tuple[datetime, float]:
    """Start of epoch 1 and the epoch length: as given, else 2026-01-01 and 5 minutes, or, live,
    30 s epochs from the next whole interval at least 10 s away."""
    from epochsync.core.config import parse_datetime, parse_duration

    interval_s = (
        parse_duration(args.interval) if getattr(args, "interval", None) else (30.0 if live else EPOCH_INTERVAL_S)
    )
    if getattr(args, "start", None):
        start = parse_datetime(args.start)
    elif live:
        now = time.time() + 10
        start = datetime.fromtimestamp((int(now // interval_s) + 1) * interval_s, tz=UTC)
    else:
        start = EPOCH_START
    return start, interval_s


def _sleep_until(when: float) -> None:
    while (left := when - time.time()) > 0:
        time.sleep(min(left, 1.0))


def run_simulate(args) -> int:
    """Run the simulator and write the on-disk layout; progress on stderr, summary on stdout."""
    from epochsync.stores.connections import S3Settings, resolve_s3

    out = Path(args.out).resolve()
    live = bool(getattr(args, "live", False))
    if live and args.no_data:
        raise EpochsyncError("simulate: --live writes a source with data; drop --no-data")
    start, interval_s = _epoch_grid_of(args, live)
    cfg = SimConfig(
        seed=args.seed,
        epochs=args.epochs,
        files=args.files,
        mdts=args.mdts,
        osts=args.osts,
        ops_per_epoch=args.ops_per_epoch,
        records=args.records,
        records_per_epoch=args.records_per_epoch,
        data=not args.no_data,
        unstriped_ratio=args.unstriped_ratio if args.unstriped_ratio is not None else (1.0 if args.cache else 0.1),
        max_file_size=args.max_file_size,
        write_share=args.write_share,
    )
    conn_id = args.conn_id or "source_s3"
    store = None
    if cfg.data:
        if args.endpoint:
            settings = S3Settings(
                conn_id="--endpoint",
                endpoint_url=args.endpoint,
                access_key=os.environ.get("AWS_ACCESS_KEY_ID"),
                secret_key=os.environ.get("AWS_SECRET_ACCESS_KEY"),
                region=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
            )
        else:
            settings = resolve_s3(conn_id)
        store = SourceStore(settings, args.bucket, threads=args.threads)
        store.ensure_versioned_bucket()

    # this run owns these folders: a rerun replaces them, never mixes two histories
    stale = [p for p in (out / "warehouse", out / "replica") if p.exists()]
    if stale:
        print(
            f"simulate: note: {', '.join(map(str, stale))} hold an earlier replication; remove them to start afresh",
            file=sys.stderr,
        )
    for sub in ("changelogs", "truth", "snapshot"):
        shutil.rmtree(out / sub, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "truth").mkdir()
    for server in cfg.servers:
        (out / "changelogs" / server).mkdir(parents=True)

    collected: list[Record] = []
    handles: dict[str, Any] = {}
    progress_every = 1_000_000

    def stream(rec: Record) -> None:
        handles[rec.server].write(fast_record_json(rec) + "\n")
        if w.records_total % progress_every == 0:
            print(f"simulate: {w.records_total:,} records...", file=sys.stderr, flush=True)

    w = Workload(cfg, collected.append if cfg.data else stream)
    started = time.monotonic()
    stored_bytes = stored_versions = 0
    if live:
        # the config first: a scheduler reads the epoch grid before the first epoch closes
        config = write_config(
            out,
            bucket=args.bucket,
            conn_id=conn_id,
            servers=cfg.servers,
            root_fid=cfg.root_fid,
            start=start,
            interval_s=interval_s,
        )
        print(
            f"simulate: live: config {config}; epoch 1 starts {start.isoformat()}, every {interval_s:g}s",
            file=sys.stderr,
            flush=True,
        )
        _sleep_until(start.timestamp())
    for e in range(1, cfg.epochs + 1):
        t0 = time.monotonic()
        name = f"{e:06d}.jsonl"
        if not cfg.data:
            handles = {s: open(out / "changelogs" / s / name, "w", encoding="utf-8") for s in cfg.servers}
        collected.clear()
        try:
            w.run_epoch(e)
        finally:
            for h in handles.values():
                h.close()
        n_records = w.epoch_records
        if store is not None:
            versions = store.put_versions(w.uploads, lambda m: print(f"simulate: {m}", file=sys.stderr, flush=True))
            store.delete(w.deletes)
            stored_versions += len(w.uploads)
            stored_bytes += sum(len(u.data) for u in w.uploads)
            w.remap_versions(versions, collected)
            by_server: dict[str, list[Record]] = {s: [] for s in cfg.servers}
            for r in collected:
                by_server[r.server].append(r)
            if live:  # the epoch closes at the end of its window, not before
                _sleep_until(start.timestamp() + e * interval_s)
            for s, recs in by_server.items():
                # whole or not at all: a reader listing the folder never sees half a file
                tmp = out / "changelogs" / s / f".{name}.tmp"
                with open(tmp, "w", encoding="utf-8") as f:
                    for r in recs:
                        f.write(record_to_json(r) + "\n")
                os.replace(tmp, out / "changelogs" / s / name)
        n_paths = 0
        with open(out / "truth" / f"epoch={e}.jsonl", "w", encoding="utf-8") as f:
            for row in w.iter_truth():
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
                n_paths += 1
        snap_dir = out / "snapshot" / f"epoch={e}"
        snap_dir.mkdir(parents=True)
        with open(snap_dir / "part-0.jsonl", "w", encoding="utf-8") as f:
            for row in w.model.iter_snapshot_rows():
                f.write(json.dumps(snapshot_row_to_json(row), ensure_ascii=False) + "\n")
        if live:
            with open(out / "closed.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps({"epoch": e, "closed_at": time.time()}) + "\n")
        uploaded = f", {len(w.uploads)} object versions stored, {len(w.deletes)} deleted" if store else ""
        print(
            f"simulate: epoch {e}/{cfg.epochs}: {n_records:,} records, {n_paths:,} paths{uploaded} "
            f"({time.monotonic() - t0:.1f}s)",
            file=sys.stderr,
            flush=True,
        )
        w.finish_epoch()
    config = write_config(
        out,
        bucket=args.bucket,
        conn_id=conn_id,
        servers=cfg.servers,
        root_fid=cfg.root_fid,
        start=start,
        interval_s=interval_s,
        cache=args.cache,
    )
    data = (
        f"; {stored_versions:,} object versions ({stored_bytes / 1e6:.1f} MB) in bucket {args.bucket}" if store else ""
    )
    print(
        f"simulated {cfg.epochs} epochs, {w.records_total:,} records{data} in {time.monotonic() - started:.1f}s; "
        f"config {config}"
    )
    return 0
