"""The seeded workload: a striped file system's operations epoch by epoch, its changelogs and ground truth."""

from __future__ import annotations

import hashlib
import random
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from epochsync.core.errors import EpochsyncError
from epochsync.core.layout import gather_object, layout_file_range_to_objects, object_size
from epochsync.core.model import DIR, FILE
from epochsync.core.schema import Extent, Layout, LayoutObject, ObjectRef, Record, record_to_json
from epochsync_dev.oracle import FsModel, Node

#: The simulated source's root directory fid (Lustre's well-known root).


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
    #: stripe sizes a striped file's layout picks from: small ones by default, so that the tests'
    #: small files span several objects (the layout translation's cases); the benchmarks
    #: take Lustre's default of 1 MiB (``lfs setstripe -S``: at least 64 KiB, a multiple of it)
    stripe_sizes: tuple[int, ...] = STRIPE_SIZES

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

    #: the operations after epoch 1's initial tree and their weights (a subclass may add its own ``op_<name>``)
    op_weights: dict[str, int] = OP_WEIGHTS
    #: labels of operations not applied (:meth:`_op`; the net's shrinker sets them)
    skip: frozenset[str] = frozenset()
    #: when a list, :meth:`_op` appends every operation's (label, name), skipped or not
    op_log: list[tuple[str, str]] | None = None
    #: when a dict, :meth:`_op` records in it the random streams' states after each operation
    marks: dict[str, tuple] | None = None
    #: those of the whole history (``marks`` of a run without ``skip``): with them, each
    #: operation of a history with ``skip`` starts where it started in the whole history
    resume: dict[str, tuple] | None = None

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
        self._epoch_start(epoch)
        budget = None
        if cfg.records is not None:
            budget = cfg.records // cfg.epochs + (cfg.records % cfg.epochs if epoch == cfg.epochs else 0)
            budget -= len(self.next_index)  # the EPOCH records
        elif cfg.records_per_epoch is not None and epoch > 1:
            budget = cfg.records_per_epoch - len(self.next_index)
        ops = cfg.ops_per_epoch if cfg.ops_per_epoch is not None else max(6, cfg.files // 2)
        names = list(self.op_weights)
        weights = list(self.op_weights.values())
        data_ops = ("overwrite", "append")
        other = [n for n in names if n not in data_ops]
        other_weights = [self.op_weights[n] for n in other]
        done = 0
        while (self.epoch_records < budget) if budget is not None else (done < ops):
            if cfg.write_share is None:
                op = self.rng.choices(names, weights)[0]
            elif self.epoch_writes < cfg.write_share * self.epoch_records:
                op = self.rng.choice(data_ops)
            else:
                op = self.rng.choices(other, other_weights)[0]
            self._op(f"{epoch}.{done}", getattr(self, "op_" + op), op)
            done += 1
        for server in sorted(self.next_index):
            self.emit(server, "EPOCH")
        window_end = window_start + EPOCH_INTERVAL_S * _NS
        if self.clock >= window_end:
            raise EpochsyncError(f"simulate: epoch {epoch} overflows its time window; use fewer records per epoch")

    def _op(self, label: str, op: Callable[[], None], name: str | None = None) -> None:
        """Run one operation of the history, ``label`` naming it (``E.I``: the I-th operation
        drawn in epoch E; ``1.init.K``: the K-th of the initial tree).

        A label in :attr:`skip` is not applied: nothing is emitted, uploaded or told the
        oracle. After every operation, applied or not, the random streams go on from where the
        whole history had them after it (:attr:`resume`): the operations after a skipped one
        are drawn as in the whole history (the same operation, the same numbers, on what is
        there), although an operation's draws depend on the state it finds."""
        if self.op_log is not None:
            self.op_log.append((label, name or op.__name__.removeprefix("op_")))
        if label not in self.skip:
            op()
        if self.marks is not None:
            self.marks[label] = (self.rng.getstate(), self.bytes_rng.getstate())
        if self.resume is not None and label in self.resume:
            rng, bytes_rng = self.resume[label]
            self.rng.setstate(rng)
            self.bytes_rng.setstate(bytes_rng)

    def _epoch_start(self, epoch: int) -> None:
        """Operations a subclass makes at the start of every epoch, before the random ones (none)."""

    def _initial_tree(self) -> None:
        ndirs = max(1, self.cfg.files // 8)
        for k in range(ndirs):
            self._op(f"1.init.{k}", self.op_mkdir)
        for k in range(ndirs, ndirs + self.cfg.files):
            self._op(f"1.init.{k}", self.op_create)

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
        length = self._object_length(node, index, node.size or 0)
        self.stored_len[(ost, oid)] = length
        if self.cfg.data:
            self.uploads.append(Upload(token, key, gather_object(node.layout, index, node.data)))
        self.touched.add(node.fid)

    @staticmethod
    def _object_length(node: Node, index: int, size: int) -> int:
        """The length of object ``index`` of ``node`` when the file is ``size`` bytes (what
        :meth:`_store` uploads)."""
        if node.layout is None:
            return size
        return object_size(node.layout.stripe_size, node.layout.stripe_count, index, size)

    def write(self, fid: str, offset: int, length: int) -> None:
        """Write ``length`` random bytes at ``offset`` of file ``fid``: WRITE per object, then MTIME."""
        node = self.model.nodes[fid]
        pieces = layout_file_range_to_objects(node.layout, offset, length)
        mtime = self.rng.random() < 0.3
        refs = {i: self._object_ref(node, i) for i in sorted(pieces)}
        servers = {ref[0] for ref in refs.values()} | ({self._mdt_of(fid)} if mtime else set())
        cookie = self._cookie(servers)
        tokens = {}
        # each object's version is stored once the write is whole (_store): its length is the
        # object's at the file's size after the write, which the records say
        size_after = max(node.size or 0, offset + length)
        for index, (ost, oid, _key) in refs.items():
            obj_off, obj_len = pieces[index]
            tokens[index] = self._token()
            self.emit(
                ost,
                "WRITE",
                tfid=fid,
                object=ObjectRef(ost, oid, tokens[index], self._object_length(node, index, size_after)),
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
            length = self.stored_len[(ost, oid)]
            self.emit(ost, "WRITE", tfid=fid, object=ObjectRef(ost, oid, token, length), extents=(), cookie=cookie)

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
        return Layout(self.rng.choice(self.cfg.stripe_sizes), count, tuple(objs))

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
                r.object = ObjectRef(r.object.ost, r.object.oid, versions[r.object.version], r.object.size)
        for fid in self.touched:
            node = self.model.nodes.get(fid)
            if node is not None:
                node.objects = {k: (versions.get(v, v), n) for k, (v, n) in node.objects.items()}

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

    versions = {(ost, oid): v for ost, oid, v, *_ in row["objects"]}
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

    head = f'{{"server":"{r.server}","index":{r.index},"epoch":{r.epoch},"type":"{r.type}","time_ns":{r.time_ns}'
    if r.type == "WRITE" and r.object is not None and r.flags is None and r.mtime_ns is None:
        ext = ",".join(f'{{"offset":{e.offset},"length":{e.length}}}' for e in r.extents or ())
        o = r.object
        ver = "null" if o.version is None else f'"{o.version}"'
        size = "" if o.size is None else f',"size":{o.size}'
        cookie = "" if r.cookie is None else f',"cookie":"{r.cookie}"'
        return (
            f'{head},"tfid":"{r.tfid}","object":{{"ost":"{o.ost}","oid":"{o.oid}","version":{ver}{size}}},'
            f'"extents":[{ext}]{cookie}}}'
        )
    if r.type == "MTIME" and r.mtime_ns is None and r.flags is None:
        cookie = "" if r.cookie is None else f',"cookie":"{r.cookie}"'
        return f'{head},"tfid":"{r.tfid}"{cookie}}}'
    if r.type == "EPOCH":
        return head + "}"
    return record_to_json(r)
