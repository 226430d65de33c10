"""The net: short seeded file-system histories replicated through a posix and an s3 target.

Each history (:class:`NetConfig`, one seed) is a few epochs of the simulator's workload
(:class:`epochsync_dev.simulate.workload.Workload`) steered to the cases the fast paths
must get right: truncates down and up within an epoch and across epochs, sparse writes past
the end, sizes on each side of the targets' thresholds (``small_file``, ``small_object``,
the multipart part size), renames onto existing names, hard links and the unlink of one of
them, attributes, xattrs, symlinks, directories made and removed, a file replaced by a
directory and back, files created and deleted in one epoch. Its bytes go to a versioned
bucket of the given S3 endpoint (SeaweedFS in the tests).

Every epoch, for each target: ``replicate`` with a failure injected late in its apply (the
rollback must leave the replica equal to the oracle's tree at E-1), then translate, apply,
verify and commit (the replica must equal the oracle's tree at E, with its bytes). The
oracle is :class:`epochsync_dev.oracle.FsModel`, which the workload drives.

``python -m epochsync_dev.net --minutes N`` (``make soak``) runs fresh seeds for N minutes;
``--seed S`` runs one history (the command a failure prints).

The shrinker: ``--seed S --shrink`` (``make soak SEED=S SHRINK=1``; ``--target``,
``--no-rollback`` and ``EPOCHSYNC_MUTANT`` as for the run that failed) looks for the smallest
history that fails as seed S does (the same ``NetFailure.check`` on the same target):
:func:`shrink` tries the failing target alone, fewer epochs, then drops chunks of operations
(delta debugging, at most ``--max-tries`` histories). Every operation of a history has a label
(``E.I``: the I-th drawn in epoch E; ``1.init.K``: the initial tree; ``E.start.*``: the
operations of every epoch) and a :class:`NetConfig` may skip some: they are not applied, and
the random streams go on after each operation from where the whole history had them, so the
others are drawn as in the whole history. The result is written as a regression case, a JSON
file under ``tests/fixtures/net/`` (seed, config, the labels skipped, the failure, and the
labels kept with the names drawn: an operation may fall back to another on what it finds);
``--case FILE`` (``make soak CASE=FILE``) replays one, and ``tests/integration/test_net.py``
replays them all (each must pass; one found with a mutant must still fail with it).
"""

from __future__ import annotations

import argparse
import base64
import functools
import json
import os
import random
import shutil
import stat
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from epochsync_dev.simulate.workload import OP_WEIGHTS, SimConfig, Workload

MIB = 1024 * 1024

#: the thresholds of the net's s3 target: small, so the histories stay small; the part size is
#: S3's least (``core.config.MIN_PART_SIZE``), so only a big history crosses it
SMALL_FILE = 4096
SMALL_OBJECT = 64 * 1024
PART_SIZE = 5 * MIB

#: the net's operations: the simulator's, the ones the fast paths depend on weighted up
NET_WEIGHTS: dict[str, int] = {
    **{k: max(1, v // 3) for k, v in OP_WEIGHTS.items()},
    "overwrite": 6,
    "append": 6,
    "truncate_down_up": 8,
    "truncate": 4,
    "sparse_write": 4,
    "rename_over": 3,
    "hlink": 3,
    "unlink_one_link": 3,
    "file_to_dir": 2,
    "dir_to_file": 2,
    "create_delete": 2,
    "big": 4,
    "rename_dir": 3,
}


@dataclass(frozen=True)
class NetConfig:
    """One history: its seed and shape. ``big``: a file past two part sizes, appended to and
    truncated (the multipart paths: uploaded and copied parts); off, the history stays under
    a few hundred KiB."""

    seed: int
    epochs: int = 3
    files: int = 6
    ops: int = 10
    big: bool = False
    #: labels of operations drawn but not applied (:meth:`Workload._op`): a shrunk history
    skip: frozenset[str] = frozenset()

    @classmethod
    def of_seed(cls, seed: int) -> NetConfig:
        """The history of ``seed``: every fourth seed is a big one."""
        return cls(seed=seed, big=seed % 4 == 0)


def threshold_sizes(big: bool) -> list[int]:
    """File sizes on each side of every threshold of the net's targets (and of 0)."""
    sizes = [0, 1, SMALL_FILE - 1, SMALL_FILE, SMALL_FILE + 1, SMALL_OBJECT - 1, SMALL_OBJECT, SMALL_OBJECT + 1]
    if big:
        sizes += [PART_SIZE - 1, PART_SIZE, PART_SIZE + 1]
    return sizes


class NetWorkload(Workload):
    """The simulator's workload with the net's operations and sizes (:data:`NET_WEIGHTS`)."""

    op_weights = NET_WEIGHTS

    def __init__(self, net: NetConfig, sink):
        cap = 3 * PART_SIZE if net.big else 3 * SMALL_OBJECT
        super().__init__(
            SimConfig(
                seed=net.seed,
                epochs=net.epochs,
                files=net.files,
                osts=2,
                ops_per_epoch=net.ops,
                unstriped_ratio=0.6,
                max_file_size=cap,
                stripe_sizes=(4096, 65536),
            ),
            sink,
        )
        self.net = net
        self.big_fid: str | None = None
        self.skip = frozenset(net.skip)
        self.op_log = []
        if self.skip:
            self.resume = whole_history_marks(replace(net, skip=frozenset()))

    def _file_size(self) -> int:
        r = self.rng.random()
        if r < 0.6:
            return self.rng.choice(threshold_sizes(False))
        return self.rng.randrange(1, 2 * SMALL_FILE)

    def _initial_tree(self) -> None:
        super()._initial_tree()
        if self.net.big:
            self._op("1.init.big", self._make_big, "big")

    def _make_big(self) -> None:
        self.big_fid = self._create_file(parent=self.cfg.root_fid, layout=None)
        self.files.discard(self.big_fid)  # only op_big changes it: it stays past two parts
        self.write(self.big_fid, 0, 2 * PART_SIZE + self.rng.randrange(1, 64 * 1024))

    def _epoch_start(self, epoch: int) -> None:
        """What every history holds, so that its few operations reach the paths: from epoch 2 a
        file written through one of two links, and the big file (in the root: no tree removal takes it) changed; at epoch 2 a directory
        of files renamed (on posix its files are carried)."""
        if epoch == 1:
            self._op("1.start", self._full_dir, "full_dir")
            return
        self._op(f"{epoch}.start.link", self.op_link_and_write)
        if self.net.big:
            self._op(f"{epoch}.start.big", self.op_big)
        if epoch == 2:
            self._op("2.start.rename", self.op_rename_full_dir)

    def op_link_and_write(self) -> None:
        """A second name for a file, then a write to it: on s3 the second key is a copy of the first's new version."""
        fid = self.files.choice(self.rng)
        if fid is None or fid == self.big_fid:
            return self.op_create()
        parent = self._pick_dir()
        self.emit(self.mdts[self.home_mdt[parent]], "HLINK", tfid=fid, pfid=parent, name=self._new_name("file"))
        size = self.model.nodes[fid].size or 0
        self.write(fid, self.rng.randrange(0, size + 1), self.rng.randrange(1, 300))

    def _full_dir(self) -> None:
        if not self._full_dirs():
            self.op_rename_full_dir()  # none yet: it makes one

    def _full_dirs(self) -> list[str]:
        return [
            d
            for d in sorted(self.model.nodes)
            if d in self.dirs and d != self.cfg.root_fid and self.model.entries_of(d)
        ]

    def op_rename_full_dir(self) -> None:
        """Rename a directory that holds files (made here when none does)."""
        full = self._full_dirs()
        if not full:
            self.op_mkdir()
            d = next(d for d in sorted(self.model.nodes) if d in self.dirs and d != self.cfg.root_fid)
            for _ in range(2):
                fid = self._create_file(parent=d)
                self.write(fid, 0, self.rng.randrange(1, 3000))
            return
        d = self.rng.choice(full)
        parent = self._pick_dir()
        if self.model.is_ancestor(d, parent):
            parent = self.cfg.root_fid
        self._rename(d, next(iter(self.model.nodes[d].links)), (parent, self._new_name("dir")))

    def _near(self, size: int) -> int:
        """A size near ``size``'s threshold neighbours or a little off it."""
        return max(0, self.rng.choice([*threshold_sizes(False), size // 2, size + self.rng.randrange(1, 9000)]))

    def op_truncate_down_up(self) -> None:
        """Down, then up past where it was, within the epoch: a hole the last version does not hold."""
        fid = self._some_file()
        if fid is None:
            return
        size = self.model.nodes[fid].size or 0
        down = self.rng.choice([0, size // 3, max(0, size - 1)])
        self.truncate(fid, down)
        if self.rng.random() < 0.4:
            self.write(fid, down, self.rng.randrange(1, 200))
        self.truncate(fid, min(self.cfg.max_file_size, max(down + 1, self._near(size))))

    def op_sparse_write(self) -> None:
        """A write past the end: a hole between the old size and the write."""
        fid = self._some_file()
        if fid is None:
            return
        size = self.model.nodes[fid].size or 0
        offset = size + self.rng.choice([1, 100, SMALL_FILE, SMALL_OBJECT])
        if offset + 64 <= self.cfg.max_file_size:
            self.write(fid, offset, self.rng.randrange(1, 64))

    def op_unlink_one_link(self) -> None:
        """A second name for a file, then one of its names removed (the first or the new one)."""
        fid = self.files.choice(self.rng)
        if fid is None:
            return self.op_create()
        parent = self._pick_dir()
        self.emit(self.mdts[self.home_mdt[parent]], "HLINK", tfid=fid, pfid=parent, name=self._new_name("file"))
        self._unlink_name(*self._any_link(fid))

    def op_file_to_dir(self) -> None:
        """``rm f; mkdir f``: a file's name becomes a directory (with a file in it, sometimes)."""
        fid = self.files.choice(self.rng)
        if fid is None or fid == self.big_fid:
            return self.op_create()
        pfid, name = self._any_link(fid)
        self._unlink_name(pfid, name)
        mdt = self.home_mdt[pfid]
        d = self._new_fid(mdt)
        self.home_mdt[d] = mdt
        self.emit(self.mdts[mdt], "MKDIR", tfid=d, pfid=pfid, name=name, mode=stat.S_IFDIR | 0o755,
                  **self._owner(), **self._times())  # fmt: skip
        self.dirs.add(d)
        if self.rng.random() < 0.5:
            new = self._create_file(parent=d)
            self.write(new, 0, self._file_size() or 1)

    def op_dir_to_file(self) -> None:
        """``rm -r d; touch d``: a directory's name becomes a file (written)."""
        for _ in range(4):
            d = self.dirs.choice(self.rng)
            if d == self.cfg.root_fid:
                continue
            order: list[tuple[str, str]] = []
            if self._post_order(d, order, limit=10):
                for pfid, name in order:
                    self._unlink_name(pfid, name)
                pfid, name = next(iter(self.model.nodes[d].links))
                self._unlink_name(pfid, name)
                fid = self._create_file(parent=pfid, name=name)
                size = self._file_size()
                if size:
                    self.write(fid, 0, size)
                return

    def op_big(self) -> None:
        """The big file: appended to (a multipart upload with a copied part of E-1's object),
        or truncated down and up (a hole inside the uploaded region), or overwritten near its start."""
        if self.big_fid is None or self.big_fid not in self.model.nodes:
            return self.op_truncate_down_up()
        fid, size = self.big_fid, self.model.nodes[self.big_fid].size or 0
        r = self.rng.random()
        if r < 0.4 and size + 8192 <= self.cfg.max_file_size:
            self.write(fid, size, self.rng.randrange(1, 8192))
        elif r < 0.7:
            down = size - self.rng.randrange(1, 200_000)
            self.truncate(fid, down)
            self.truncate(fid, min(self.cfg.max_file_size, down + self.rng.randrange(1, 400_000)))
        elif r < 0.85:
            self.write(fid, self.rng.randrange(0, 1000), self.rng.randrange(1, 4096))
        else:
            self.truncate(fid, min(self.cfg.max_file_size, size + self.rng.randrange(1, 100_000)))


def _workload_alone(net: NetConfig, *, marks: bool = False) -> NetWorkload:
    """``net``'s history generated without S3 (records and bytes dropped)."""
    w = NetWorkload(net, lambda _record: None)
    if marks:
        w.marks = {}
    for e in range(1, net.epochs + 1):
        w.run_epoch(e)
        w.finish_epoch()
    return w


@functools.lru_cache(maxsize=8)
def whole_history_marks(net: NetConfig) -> dict[str, tuple]:
    """The random streams' states after each operation of ``net``'s history, which a history
    skipping some of them starts each operation from."""
    return _workload_alone(net, marks=True).marks


def history_ops(net: NetConfig) -> list[tuple[str, str]]:
    """(label, name) of every operation of ``net``'s history, in order, skipped ones too."""
    return _workload_alone(net).op_log


@dataclass
class Source:
    """A generated history: its changelogs, config and the oracle's tree after every epoch."""

    out: Path
    config: Path
    truths: list[dict[str, tuple]]  # index e-1: path -> entry at epoch e
    records: int


def _truth(w: NetWorkload) -> dict[str, dict]:
    return {r["path"]: r for r in w.iter_truth() if r["path"] not in ("", ".")}


def make_source(net: NetConfig, out: Path, endpoint, conn_id: str = "net_s3") -> Source:
    """Generate ``net``'s history: changelogs under ``out``, bytes in a new versioned bucket of
    ``endpoint`` (an :class:`epochsync_dev.embedded.S3Endpoint`), a config with the targets
    ``posix`` and ``s3`` (the net's thresholds)."""
    import yaml

    from epochsync.core.schema import record_to_json
    from epochsync.stores.connections import resolve_s3
    from epochsync_dev.simulate.store import SourceStore
    from epochsync_dev.simulate.verb import write_config

    os.environ[f"AIRFLOW_CONN_{conn_id.upper()}"] = endpoint.airflow_conn_json()
    bucket = "net-" + uuid.uuid4().hex[:10]
    store = SourceStore(resolve_s3(conn_id), bucket, threads=4)
    store.ensure_versioned_bucket()
    collected: list = []
    w = NetWorkload(net, collected.append)
    truths = []
    for server in w.cfg.servers:
        (out / "changelogs" / server).mkdir(parents=True, exist_ok=True)
    for e in range(1, net.epochs + 1):
        collected.clear()
        w.run_epoch(e)
        versions = store.put_versions(w.uploads)
        store.delete(w.deletes)
        w.remap_versions(versions, collected)
        for server in w.cfg.servers:
            with open(out / "changelogs" / server / f"{e:06d}.jsonl", "w", encoding="utf-8") as f:
                f.writelines(record_to_json(r) + "\n" for r in collected if r.server == server)
        truths.append(_truth(w))
        w.finish_epoch()
    path = write_config(out, bucket=bucket, conn_id=conn_id, servers=w.cfg.servers, root_fid=w.cfg.root_fid)
    doc = yaml.safe_load(path.read_text())
    doc["targets"] = [
        {"name": "posix", "source": "sim", "kind": "posix", "path": str(out / "replica"), "coalesce_gap": 0},
        {
            "name": "s3",
            "source": "sim",
            "kind": "s3",
            "conn_id": conn_id,
            "bucket": "rep-" + bucket,
            "prefix": "tree/",
            "coalesce_gap": 1024,
            "small_file": SMALL_FILE,
            "small_object": SMALL_OBJECT,
            "part_size": PART_SIZE,
        },
    ]
    path.write_text(yaml.safe_dump(doc))
    return Source(out, path, truths, w.records_total)


def expected_tree(rows: dict[str, dict], *, posix: bool) -> dict[str, tuple]:
    """The oracle's tree as a target of that kind holds it (posix: ``user.*`` xattrs only)."""
    out = {}
    for p, r in rows.items():
        xattrs = {k: base64.b64decode(v) for k, v in (r.get("xattrs") or {}).items()}
        if posix:
            xattrs = {k: v for k, v in xattrs.items() if k.startswith("user.")}
        kind = r["type"]
        out[p] = (
            kind,
            r["size"] if kind == "file" else 0,
            None if kind == "symlink" else stat.S_IMODE(r["mode"]),
            r["uid"],
            r["gid"],
            r.get("symlink") if kind == "symlink" else None,
            tuple(sorted(xattrs.items())) if kind != "symlink" else (),
            r["sha256"] if kind == "file" else None,
        )
    return out


def replica_tree(target) -> dict[str, tuple]:
    """What ``target`` holds, in :func:`expected_tree`'s form (bytes hashed)."""
    return {
        e.path: (
            e.type,
            e.size if e.type == "file" else 0,
            e.mode,
            e.uid,
            e.gid,
            e.symlink,
            tuple(sorted(e.xattrs.items())) if e.type != "symlink" else (),
            e.sha256,
        )
        for e in target.walk()
    }


class NetFailure(AssertionError):
    """The net found a replica that is not the oracle's tree, or a stage that failed: ``check``
    says which, ``target`` and ``epoch`` where (:func:`replicate_history` sets them)."""

    def __init__(self, check: str, message: str):
        super().__init__(f"{check}: {message}")
        self.check = check
        self.message = message
        self.target: str | None = None
        self.epoch: int | None = None


def compare(target, want: dict[str, dict], what: str) -> None:
    """Raise :class:`NetFailure` (check ``oracle``) naming the first differences."""
    got = replica_tree(target)
    exp = expected_tree(want, posix=target.kind == "posix")
    diff = sorted(p for p in set(got) | set(exp) if got.get(p) != exp.get(p))
    if diff:
        shown = "; ".join(f"{p}: replica {got.get(p)!r:.160} oracle {exp.get(p)!r:.160}" for p in diff[:4])
        raise NetFailure("oracle", f"{what}: {len(diff)} paths differ from the oracle: {shown}")


def _quiet(_line: str) -> None:
    pass


def replicate_history(
    source: Source, *, spark=None, tamper=None, rollback: bool = True, targets=("posix", "s3")
) -> dict[str, Any]:
    """Every epoch of ``source`` through both targets, checked as the module docstring says.

    ``spark``: the session the stages may ask for (a rollback reads the snapshot on it; default:
    :func:`epochsync.spark.spark_session`, opened when first asked). ``tamper(cfg, target, epoch)``, when given, runs between each apply and its verify (a
    mutant test changes a replica's byte behind verify's back there). Raises
    :class:`NetFailure`: check ``oracle`` (the replica differs), ``verify`` (verify refused the
    epoch), ``stage`` (another stage failed), ``rollback`` (the rollback did not restore E-1)."""
    from epochsync.core.config import load_config
    from epochsync.spark import LazySession, spark_session

    cfg = load_config(source.config)
    if spark is None:
        spark = LazySession(lambda: spark_session("epochsync-net", cfg=cfg))
    stats = {"epochs": 0, "rollbacks": 0}
    for e in range(1, len(source.truths) + 1):
        for name in targets:
            try:
                _replicate_epoch(source, cfg, name, e, spark, tamper, rollback, stats)
            except NetFailure as exc:
                exc.target, exc.epoch = name, e
                raise
        stats["epochs"] += 1
    return stats


def _replicate_epoch(source: Source, cfg, name: str, e: int, spark, tamper, rollback: bool, stats: dict) -> None:
    """Epoch ``e`` of ``source`` through target ``name``, checked (:func:`replicate_history`)."""
    from epochsync.core.errors import EpochError, EpochsyncError
    from epochsync.stages.apply import run_apply
    from epochsync.stages.commit import run_commit
    from epochsync.stages.replicate import replicate
    from epochsync.stages.translate import run_translate
    from epochsync.stages.verify import run_verify
    from epochsync.targets import open_target

    want = source.truths[e - 1]
    what = f"{name} epoch {e}"
    rolled = False
    if rollback:
        try:
            replicate(cfg, name, epoch=e, spark=spark, inject=f"at=0.7,epoch={e}", progress=_quiet)
        except EpochError as exc:
            if "injected failure" not in str(exc):
                raise NetFailure("verify" if "verify" in str(exc) else "stage", f"{what}: {exc}") from exc
            rolled = True
            stats["rollbacks"] += 1
            target = open_target(cfg.target(name))
            try:
                compare(target, source.truths[e - 2] if e > 1 else {}, f"{what} rolled back")
            except NetFailure as exc2:
                raise NetFailure("rollback", str(exc2)) from None
    if not rolled:
        if rollback:  # no operation to fail at: replicate ran the epoch whole
            compare(open_target(cfg.target(name)), want, what)
            return
        replicate_prefix(cfg, name, e, spark)
    try:
        run_translate(cfg, name, e, spark)
        run_apply(cfg, name, e, spark)
        if tamper is not None:
            tamper(cfg, name, e)
        run_verify(cfg, name, e, spark)
        run_commit(cfg, name, e)
    except EpochsyncError as exc:
        check = "verify" if "verify" in str(exc).lower() else "stage"
        raise NetFailure(check, f"{what}: {exc}") from exc
    compare(open_target(cfg.target(name)), want, what)


def replicate_prefix(cfg, name: str, e: int, spark) -> None:
    """Ingest and merge of epoch ``e`` for target ``name`` (what ``replicate`` does before translate)."""
    from epochsync.stages.merge import run_merge
    from epochsync.stages.replicate import _ingest

    _ingest(cfg, cfg.source_of(cfg.target(name)).name, e, e, spark, name)
    run_merge(cfg, name, e, e, spark)


def run_seed(
    seed: int, endpoint, workdir: Path, *, spark=None, net: NetConfig | None = None, **replicate_kw
) -> dict[str, Any]:
    """Generate and replicate the history of ``seed`` under ``workdir`` (removed after a pass)."""
    net = net or NetConfig.of_seed(seed)
    out = workdir / f"seed-{seed}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    source = make_source(net, out, endpoint)
    stats = replicate_history(source, spark=spark, **replicate_kw)
    shutil.rmtree(out, ignore_errors=True)
    return {**stats, "records": source.records}


def repro_command(seed: int) -> str:
    """The one command that replays the history of ``seed`` (printed with every failure)."""
    return f"make soak SEED={seed}"


# ---------------------------------------------------------------------- the shrinker

#: the shrinker's regression cases, which ``tests/integration/test_net.py`` replays
CASES_DIR = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "net"


def applied_ops(net: NetConfig) -> list[tuple[str, str]]:
    """(label, name) of the operations ``net``'s history applies (what a shrink counts)."""
    return [(label, name) for label, name in history_ops(net) if label not in net.skip]


@dataclass
class Shrunk:
    """What :func:`shrink` kept: the smallest history it found failing as the original did."""

    seed: int
    net: NetConfig
    failure: NetFailure  # the kept history's
    original: NetFailure  # the whole history's
    original_ops: int
    kept: list[tuple[str, str]]
    tries: int
    targets: tuple[str, ...]
    rollback: bool


def shrink(
    seed: int,
    endpoint,
    workdir: Path,
    *,
    spark=None,
    net: NetConfig | None = None,
    targets: tuple[str, ...] = ("posix", "s3"),
    rollback: bool = True,
    max_tries: int = 200,
    progress=print,
    **replicate_kw,
) -> Shrunk:
    """Shrink the failing history of ``seed`` (``net``: default :meth:`NetConfig.of_seed`).

    A candidate is kept only when it fails with the original's ``NetFailure.check`` on the same
    target. First the failing target alone (when there are two), the epochs past the failing
    one (they never ran) and then each last epoch while that still fails; then delta debugging
    over the operations (ddmin's complements: drop one of n chunks, n doubling up to one
    operation a chunk). Ends after ``max_tries`` runs of a history at most; each try is one
    :func:`run_seed`, ``progress`` gets a line for each. Raises ``ValueError`` when the
    history does not fail with a :class:`NetFailure`."""
    net = net or NetConfig.of_seed(seed)
    tries = 0

    def attempt(cand: NetConfig, on: tuple[str, ...], what: str) -> NetFailure | None:
        nonlocal tries
        tries += 1
        started = time.monotonic()
        try:
            run_seed(seed, endpoint, workdir, spark=spark, net=cand, targets=on, rollback=rollback, **replicate_kw)
            got, failure = "passes", None
        except NetFailure as exc:
            got, failure = f"fails: {exc.check} on {exc.target} epoch {exc.epoch}", exc
        except Exception as exc:  # noqa: BLE001 - another failure is not the one shrunk
            got, failure = f"another failure: {type(exc).__name__}: {str(exc)[:120]}", None
        ops = len(applied_ops(cand))
        progress(
            f"shrink: try {tries}/{max_tries} ({what}): {cand.epochs} epochs, {ops} operations: "
            f"{got} ({time.monotonic() - started:.1f} s)"
        )
        return failure

    first = attempt(net, targets, "the original")
    if first is None:
        raise ValueError(f"net: seed {seed}'s history does not fail with a NetFailure: nothing to shrink")

    def same(f: NetFailure | None) -> bool:
        return f is not None and f.check == first.check and f.target == first.target

    best, failure = net, first
    if len(targets) > 1 and tries < max_tries:
        f = attempt(best, (first.target,), f"{first.target} alone")
        if same(f):
            targets, failure = (first.target,), f
    best = replace(best, epochs=min(best.epochs, first.epoch))  # the epochs past the failing one never ran
    while best.epochs > 1 and tries < max_tries:
        cand = replace(best, epochs=best.epochs - 1)
        f = attempt(cand, targets, "one epoch less")
        if not same(f):
            break
        best, failure = cand, f
    labels = [label for label, _ in history_ops(replace(best, skip=frozenset()))]
    kept = [label for label in labels if label not in best.skip]
    n = 2
    while kept and tries < max_tries:
        size = -(-len(kept) // n)
        for start in range(0, len(kept), size):
            rest = kept[:start] + kept[start + size :]
            cand = replace(best, skip=frozenset(label for label in labels if label not in rest))
            f = attempt(cand, targets, f"without {len(kept) - len(rest)} of {len(kept)}")
            if same(f):
                best, failure, kept = cand, f, rest
                n = max(n - 1, 2)
                break
            if tries >= max_tries:
                break
        else:
            if size == 1:
                break  # no single operation can go
            n = min(2 * n, len(kept))
    kept_ops = applied_ops(best)
    progress(f"shrink: kept {len(kept_ops)} of {len(applied_ops(net))} operations in {tries} tries")
    return Shrunk(seed, best, failure, first, len(applied_ops(net)), kept_ops, tries, tuple(targets), rollback)


def write_case(shrunk: Shrunk, directory: Path = CASES_DIR) -> Path:
    """Write ``shrunk`` as a regression case (JSON) under ``directory``; returns its path."""
    f = shrunk.failure
    mutant = os.environ.get("EPOCHSYNC_MUTANT")
    config = {k: v for k, v in asdict(shrunk.net).items() if k not in ("seed", "skip")}
    labels = [label for label, _ in history_ops(replace(shrunk.net, skip=frozenset()))]
    doc = {
        "seed": shrunk.seed,
        "config": config,
        "skip": [label for label in labels if label in shrunk.net.skip],
        "kept": [f"{label} {name}" for label, name in shrunk.kept],
        "targets": list(shrunk.targets),
        "rollback": shrunk.rollback,
        "failure": {"check": f.check, "target": f.target, "epoch": f.epoch, "message": f.message[:2000]},
        "mutant": mutant,
        "operations": {"original": shrunk.original_ops, "kept": len(shrunk.kept)},
    }
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{mutant + '-' if mutant else ''}seed-{shrunk.seed}-{f.target}-{f.check}.json"
    path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def load_case(path: Path) -> tuple[NetConfig, dict[str, Any], dict[str, Any]]:
    """A regression case: its history, the keywords of :func:`run_seed` and the whole document."""
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    net = NetConfig(seed=doc["seed"], skip=frozenset(doc["skip"]), **doc["config"])
    return net, {"targets": tuple(doc["targets"]), "rollback": doc["rollback"]}, doc


def run_case(path: Path, endpoint, workdir: Path, *, spark=None) -> dict[str, Any]:
    """Replay the regression case at ``path`` (raises :class:`NetFailure` as :func:`run_seed`)."""
    net, kw, _doc = load_case(path)
    return run_seed(net.seed, endpoint, workdir, spark=spark, net=net, **kw)


def case_command(path: Path) -> str:
    """The command that replays a regression case (its path relative to here when under here)."""
    path = Path(path).resolve()
    shown = path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path
    return f"make soak CASE={shown}"


def coverage_table(paths: dict[str, int], wanted: list[str]) -> str:
    """The net's coverage table: how often each plan path and verify rule was taken."""
    lines = [f"{'path or rule':<28} {'taken':>7}"]
    lines += [f"{p:<28} {paths.get(p, 0):>7}{'   NEVER' if not paths.get(p) else ''}" for p in wanted]
    return "\n".join(lines)


#: every plan path and verify rule the net must reach (a name :func:`epochsync.core.probes.took` counts)
WANTED_PATHS = [
    "plan.patch",
    "plan.patch_large",
    "plan.small_file_whole",
    "plan.source_put",
    "plan.copy_from",
    "plan.multipart",
    "plan.part_upload",
    "plan.part_copy",
    "plan.link_copy",
    "plan.rename_copy",
    "plan.posix_whole",
    "plan.posix_ranges",
    "plan.carried",
    "verify.s3.checksum",
    "verify.s3.parts",
    "verify.s3.copy",
    "verify.s3.link_copy",
    "verify.s3.unchanged",
    "verify.s3.read",
    "verify.posix.ranges",
    "verify.posix.covered",
]


def main(argv: list[str] | None = None) -> int:
    """``make soak``: fresh seeds for ``--minutes``, or one ``--seed`` (``--shrink``: shrunk to a
    regression case), or one ``--case``; prints histories per minute."""
    from epochsync.core.probes import PATHS
    from epochsync.spark import LazySession, spark_session
    from epochsync_dev.embedded import SeaweedFS

    p = argparse.ArgumentParser(prog="python -m epochsync_dev.net", description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=10.0, help="how long to run fresh seeds (default 10)")
    p.add_argument("--seed", type=int, help="run only this seed's history (a failure prints its command)")
    p.add_argument("--shrink", action="store_true", help="with --seed: shrink its failure, write a regression case")
    p.add_argument("--max-tries", type=int, default=200, help="--shrink runs at most this many histories")
    p.add_argument("--target", action="append", choices=("posix", "s3"), help="only this target (repeatable)")
    p.add_argument("--no-rollback", action="store_true", help="no rollback round before each epoch")
    p.add_argument("--case", type=Path, help="replay a regression case (a JSON file that --shrink wrote)")
    args = p.parse_args(argv)
    if args.shrink and args.seed is None:
        p.error("--shrink needs --seed")
    if args.case is not None:
        return _replay_case(args.case)
    kw = {"targets": tuple(args.target or ("posix", "s3")), "rollback": not args.no_rollback}
    server = SeaweedFS()
    endpoint = server.start()
    work = Path(tempfile.mkdtemp(prefix="epochsync-net-"))
    failures = done = 0
    spark = LazySession(lambda: spark_session("epochsync-net"))  # one for the run: a rollback reads on it
    started = time.monotonic()
    try:
        if args.shrink:
            try:
                shrunk = shrink(args.seed, endpoint, work, spark=spark, max_tries=args.max_tries, **kw)
            except ValueError as exc:
                print(exc)
                return 1
            path = write_case(shrunk)
            print(f"net: wrote {path} ({shrunk.failure.check} on {shrunk.failure.target}: {str(shrunk.failure)[:300]})")
            print(f"  replay: {case_command(path)}")
            return 0
        seeds = [args.seed] if args.seed is not None else None
        rng = random.SystemRandom()
        while True:
            if seeds is not None:
                if not seeds:
                    break
                seed = seeds.pop()
            else:
                if time.monotonic() - started >= args.minutes * 60:
                    break
                seed = rng.randrange(10**9)
            try:
                run_seed(seed, endpoint, work, spark=spark, **kw)
                done += 1
            except Exception as exc:  # noqa: BLE001 - every failure is the net's finding, reported with its seed
                failures += 1
                print(
                    f"net: seed {seed} FAILED: {exc}\n  reproduce: {repro_command(seed)}"
                    f"\n  shrink to a regression case: {repro_command(seed)} SHRINK=1",
                    flush=True,
                )
                if args.seed is not None:
                    raise
            minutes = (time.monotonic() - started) / 60
            if seeds is None and done % 5 == 0:
                print(
                    f"net: {done} histories, {failures} failed, {done / max(minutes, 1e-9):.1f} per minute", flush=True
                )
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    minutes = (time.monotonic() - started) / 60
    print(
        f"net: {done} histories passed, {failures} failed in {minutes:.1f} min ({done / max(minutes, 1e-9):.1f} per minute)"
    )
    print(coverage_table(dict(PATHS), WANTED_PATHS))
    return 1 if failures else 0


def _replay_case(path: Path) -> int:
    from epochsync.spark import LazySession, spark_session
    from epochsync_dev.embedded import SeaweedFS

    net, _kw, doc = load_case(path)
    print(
        f"net: case {path}: seed {net.seed}, {doc['operations']['kept']} operations, once failed {doc['failure']['check']}"
    )
    server = SeaweedFS()
    endpoint = server.start()
    work = Path(tempfile.mkdtemp(prefix="epochsync-net-"))
    try:
        run_case(path, endpoint, work, spark=LazySession(lambda: spark_session("epochsync-net")))
    except NetFailure as exc:
        print(f"net: case {path} FAILED: {exc}")
        return 1
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"net: case {path} passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
