"""Apply's and verify's source reader for a gluster source: a file's bytes as one cut holds them.

The same duck type as :class:`epochsync.stores.s3_access.S3Access` (``get_range``, ``get_all``,
``counters``, ``client``, ``kind``): the key is a gfid (``store.unstriped_key`` is ``{fid}``),
and every read comes from the brick snapshots of the plan's epoch, never from the live
volume. A version pinned in the plan (the epoch a file was last written) is at or before
that cut, and the file has not changed since, so the cut holds exactly those bytes: a retry,
a rollback and retry, or a catch-up days later write the same bytes.

A sharded file is assembled: block 0 is the base file, block N ≥ 1 is ``.shard/<gfid>.N`` on
whichever brick holds it (missing blocks are holes: zeros).
"""

from __future__ import annotations

import os
import threading
from collections import Counter

from epochsync.core.errors import EpochError
from epochsync.sources.gluster.backend import BrickView
from epochsync.warehouse.fs import read_json
from epochsync.warehouse.paths import Warehouse, local_path


def cut_record(warehouse: str, source: str, epoch: int) -> dict | None:
    """Returns the record of ``source``'s cut ``epoch`` (``cuts/source=S/epoch=E.json``), or None."""
    return read_json(local_path(Warehouse(warehouse).cut(source, epoch)))


def cut_reader(warehouse: str, source: str, epoch: int, *, agents=None, config: str = "FILE") -> CutReader:
    """The reader of ``epoch``'s cut of ``source`` (apply's and verify's bytes); an EpochError when that
    cut was never taken, naming the command that takes it (with ``config``, the config's path). A cut
    its servers' agents took is read through them (``agents``: the source's
    :class:`epochsync.stores.connections.AgentSettings`)."""
    rec = cut_record(warehouse, source, epoch)
    if rec is None:
        raise EpochError(
            f"source {source} has no cut {epoch}: take it first (epochsync cut --config {config} --source {source})"
        )
    remote = data_agents(rec)
    if remote and agents is not None:
        return AgentCutReader(source, epoch, sorted(remote.items()), agents)
    return CutReader(source, epoch, sorted(data_roots(rec).items()))


def data_agents(rec: dict) -> dict[str, dict]:
    """``{server: {"url", "brick", "snapshot"}}`` of the bricks :func:`data_roots` names, when agents
    took the cut (empty otherwise)."""
    names = {s: v["reader"] for s, v in rec["sets"].items()} if rec.get("sets") else {b: b for b in rec["bricks"]}
    out = {s: rec["bricks"][b].get("agent") for s, b in names.items()}
    return out if all(out.values()) else {}


def data_bricks(rec: dict) -> dict[str, str]:
    """``{server: brick}``: the brick each server of a cut (a replica set, or a brick of a distribute
    volume) is read through (see :func:`data_roots`)."""
    if rec.get("sets"):
        return {s: v["reader"] for s, v in rec["sets"].items()}
    return {b: b for b in rec["bricks"]}


def data_roots(rec: dict) -> dict[str, str]:
    """``{server: directory in the cut}`` a cut's bytes are read from: every brick of a distribute
    volume; each replica set's reader of a replicated one (``sets``: never an arbiter)."""
    if rec.get("sets"):
        return {s: rec["bricks"][v["reader"]]["root"] for s, v in rec["sets"].items()}
    return {b: v["root"] for b, v in rec["bricks"].items()}


class ReadCounters:
    """Counts a reader's work in the shape of the S3 counters (``as_dict``/``add``)."""

    def __init__(self) -> None:
        self.requests: Counter = Counter()
        self.bytes_received = 0

    def as_dict(self) -> dict:
        """Returns the figures as the stats row records them."""
        return {
            "requests": dict(self.requests),
            "bytes_sent": 0,
            "bytes_received": self.bytes_received,
            "bytes_copied": 0,
            "retries": 0,
        }

    def add(self, other: dict) -> None:
        """Adds another counter's :meth:`as_dict`."""
        for k, v in (other.get("requests") or {}).items():
            self.requests[k] += v
        self.bytes_received += other.get("bytes_received", 0)


#: a located file: where its data is, its shard block size (None: not sharded) and its size. The
#: place is a path in the cut (CutReader) or the agent's ``{"url", "brick", "snapshot"}`` (AgentCutReader)
Located = tuple[str | dict, int | None, int]


class CutReader:
    """Reads files by gfid from one cut of a gluster source (see the module docstring)."""

    kind = "gluster"
    #: the counter each read adds to (``requests``)
    read_kind = "read"

    def __init__(self, source: str, epoch: int, roots: list[tuple[str, str]]):
        self.source = source
        self.epoch = epoch
        self.roots = roots  # (brick, the brick's directory in the cut)
        self.counters = ReadCounters()
        self._where: dict[str, Located] = {}
        self._lock = threading.Lock()

    def __getstate__(self):
        return {"source": self.source, "epoch": self.epoch, "roots": self.roots}

    def __setstate__(self, d):
        self.__init__(d["source"], d["epoch"], d["roots"])

    @property
    def client(self):
        """Nothing to build (the S3 reader builds its client here); returns the reader."""
        return self

    def _views(self) -> list[BrickView]:
        return [BrickView(name, root) for name, root in self.roots]

    def _locate(self, gfid: str) -> Located:
        """Returns ``(path of the data, shard block size or None, size)`` of ``gfid`` in the cut."""
        found = self._where.get(gfid)
        if found is not None:
            return found
        views = self._views()
        if not all(os.path.isdir(r) for _, r in self.roots):
            missing = [b for b, r in self.roots if not os.path.isdir(r)]
            raise EpochError(
                f"cut {self.epoch} of source {self.source} is gone on {', '.join(missing)} (purged?): its bytes "
                "cannot be read; this epoch cannot be replicated from it (hydrate the target again)"
            )
        for v in views:
            node = v.lookup(gfid, full=False)
            if node is not None and node.type != "dir":
                found = (node.path, node.shard_block, node.size)
                with self._lock:
                    self._where[gfid] = found
                return found
        raise EpochError(f"gfid {gfid} is not in cut {self.epoch} of source {self.source}: nothing to read")

    def get_range(self, bucket: str, key: str, version: str | None, offset: int, length: int) -> bytes:
        """Bytes ``[offset, offset+length)`` of file ``key`` (a gfid) in the cut; zeros past its end."""
        if length <= 0:
            return b""
        where, block, _size = self._locate(key)
        data = self._read(key, where, block, offset, length)
        self.counters.requests[self.read_kind] += 1
        self.counters.bytes_received += length
        return data + bytes(length - len(data))

    def _read(self, gfid: str, path, block: int | None, offset: int, length: int) -> bytes:
        """The bytes of the located file (fewer past its end)."""
        return _pread(path, offset, length) if not block else self._sharded(gfid, path, block, offset, length)

    def get_all(self, bucket: str, key: str, version: str | None = None) -> bytes:
        """Returns the whole file ``key`` as the cut holds it."""
        _path, _block, size = self._locate(key)
        return self.get_range(bucket, key, version, 0, size) if size else b""

    def _sharded(self, gfid: str, base: str, block: int, offset: int, length: int) -> bytes:
        out = bytearray(length)
        pos, end = offset, offset + length
        views = self._views()
        while pos < end:
            index, within = divmod(pos, block)
            n = min(block - within, end - pos)
            path: str | None
            if index == 0:
                path = base
            else:
                path = next((p for v in views if (p := v.shard_path(gfid, index))), None)
            if path:
                data = _pread(path, within, n)
                out[pos - offset : pos - offset + len(data)] = data
            pos += n
        return bytes(out)


def _pread(path: str, offset: int, length: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        chunks = []
        got = 0
        while got < length:
            b = os.pread(fd, length - got, offset + got)
            if not b:
                break
            chunks.append(b)
            got += len(b)
        return b"".join(chunks)
    finally:
        os.close(fd)


#: the xattrs of a sharded file's base: its block size and its logical size (8-byte big-endian first)
_SHARD_BLOCK = "trusted.glusterfs.shard.block-size"
_SHARD_SIZE = "trusted.glusterfs.shard.file-size"


class AgentCutReader(CutReader):
    """Reads files by gfid from one cut that its servers' agents took, through those agents: the
    pipeline needs no access to the bricks (see :mod:`epochsync.agent`)."""

    read_kind = "agent-read"

    def __init__(self, source: str, epoch: int, remote: list[tuple[str, dict]], agents):
        self.remote = remote  # (server, {"url", "brick", "snapshot"})
        self.agents = agents
        self._clients: dict[str, object] = {}
        super().__init__(source, epoch, [])

    def __getstate__(self):
        return {"source": self.source, "epoch": self.epoch, "remote": self.remote, "agents": self.agents}

    def __setstate__(self, d):
        self.__init__(d["source"], d["epoch"], d["remote"], d["agents"])

    def _client(self, url: str):
        with self._lock:
            if url not in self._clients:
                self._clients[url] = self.agents.client(url)
            return self._clients[url]

    def _locate(self, gfid: str) -> Located:
        from epochsync.agent.protocol import AgentGone, AgentNotFound

        found = self._where.get(gfid)
        if found is not None:
            return found
        for _server, where in self.remote:
            try:
                st = self._client(where["url"]).stat(where["brick"], where["snapshot"], gfid)
            except AgentNotFound:
                continue
            except AgentGone as exc:
                raise EpochError(
                    f"cut {self.epoch} of source {self.source} is gone ({exc}): its bytes cannot be read; this "
                    "epoch cannot be replicated from it (hydrate the target again)"
                ) from None
            if st["mode"] & 0o170000 == 0o040000:
                continue
            x = st.get("xattrs") or {}
            block = int.from_bytes(bytes.fromhex(x[_SHARD_BLOCK])[:8], "big") if _SHARD_BLOCK in x else None
            size = (
                int.from_bytes(bytes.fromhex(x[_SHARD_SIZE])[:8], "big") if block and _SHARD_SIZE in x else st["size"]
            )
            found = (where, block, size)
            with self._lock:
                self._where[gfid] = found
            return found
        raise EpochError(f"gfid {gfid} is not in cut {self.epoch} of source {self.source}: nothing to read")

    def _read(self, gfid: str, path, block: int | None, offset: int, length: int) -> bytes:
        """The bytes of the located file, from its agent (fewer past its end)."""
        if not block:
            return self._client(path["url"]).read(path["brick"], path["snapshot"], gfid, offset, length)
        return self._sharded_remote(gfid, path, block, offset, length)

    def _sharded_remote(self, gfid: str, base: dict, block: int, offset: int, length: int) -> bytes:
        from epochsync.agent.protocol import AgentNotFound

        out = bytearray(length)
        pos, end = offset, offset + length
        while pos < end:
            index, within = divmod(pos, block)
            n = min(block - within, end - pos)
            wheres = [base] if index == 0 else [w for _s, w in self.remote]
            for w in wheres:  # a block is on whichever brick its name hashes to
                try:
                    data = self._client(w["url"]).read(w["brick"], w["snapshot"], gfid, within, n, shard=index)
                except AgentNotFound:
                    continue
                out[pos - offset : pos - offset + len(data)] = data
                break
            pos += n
        return bytes(out)
