"""Changelog files: listing a source's servers (a directory or an S3 prefix), their tails, opening them."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, cast

from epochsync.core.errors import SourceError, StoreError
from epochsync.warehouse.paths import local_path

#: Bytes a fast-path chunk holds (cut at a line end); bounds an executor's memory per file.


@dataclass(frozen=True)
class ChangelogFile:
    """One changelog file of a server: where it is and how errors name it."""

    server: str
    ordinal: int
    #: ``/abs/path`` or ``s3://bucket/key``
    uri: str
    size: int = 0


def _is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


def _split_s3(uri: str) -> tuple[str, str]:
    rest = uri[len("s3://") :]
    bucket, _, prefix = rest.partition("/")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    return bucket, prefix


def _changelog_s3(src):
    """S3 settings for an ``s3://`` changelog URI (``changelogs.conn_id``, else the store's)."""
    if not _is_s3(src.changelogs.uri):
        return None
    from epochsync.stores.connections import resolve_s3

    return resolve_s3(src.changelogs.conn_id or src.store.conn_id)


def _list_local(base: str, server: str) -> list[ChangelogFile]:
    directory = os.path.join(base, server)
    if not os.path.isdir(directory):
        return []
    names = sorted(n for n in os.listdir(directory) if not n.startswith("."))
    out: list[ChangelogFile] = []
    for n in names:
        path = os.path.join(directory, n)
        if os.path.isfile(path):
            out.append(ChangelogFile(server, len(out), path, os.path.getsize(path)))
    return out


def _list_s3(s3, bucket: str, prefix: str, server: str) -> list[ChangelogFile]:
    client = s3.client()
    keys = []
    try:
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=f"{prefix}{server}/", Delimiter="/"
        ):
            for obj in page.get("Contents", []):
                name = obj["Key"].rsplit("/", 1)[-1]
                if name and not name.startswith("."):
                    keys.append((obj["Key"], obj["Size"]))
    except Exception as exc:  # botocore raises many types; the message names them
        raise StoreError(f"cannot list s3://{bucket}/{prefix}{server}/ via {s3.describe()}: {exc}") from None
    keys.sort()
    return [ChangelogFile(server, i, f"s3://{bucket}/{k}", size) for i, (k, size) in enumerate(keys)]


#: bytes read from the end of a JSON Lines file to find its last record
TAIL_BYTES = 64 * 1024


def file_tail(f: ChangelogFile, s3=None) -> tuple[int, int, str | None] | None:
    """(index, epoch, type) of the last line of a JSON Lines file, or None if it cannot tell."""
    if f.size <= 0:
        return None
    try:
        if _is_s3(f.uri):
            bucket, _, key = f.uri[len("s3://") :].partition("/")
            data = s3.client().get_object(Bucket=bucket, Key=key, Range=f"bytes=-{TAIL_BYTES}")["Body"].read()
        else:
            with open(f.uri, "rb") as fh:
                fh.seek(max(0, f.size - TAIL_BYTES))
                data = fh.read()
    except Exception as exc:  # the file's own run reports unreadable files; here: no shortcut
        del exc
        return None
    data = data.rstrip(b"\n")
    cut = data.rfind(b"\n")
    if cut < 0 and f.size > len(data) + 1:
        return None  # the last line is longer than the tail read
    try:
        last = json.loads(data[cut + 1 :])
    except ValueError:
        return None
    if not isinstance(last, dict):
        return None
    index, epoch = last.get("index"), last.get("epoch")
    if not isinstance(index, int) or not isinstance(epoch, int) or isinstance(index, bool) or isinstance(epoch, bool):
        return None
    kind = last.get("type")
    return index, epoch, kind if isinstance(kind, str) else None


def settled_files(
    files: dict[str, list[ChangelogFile]],
    tails: dict[str, tuple | None],
    first: int,
    after_index: Mapping[str, int] | None,
) -> dict[str, list[ChangelogFile]]:
    """Returns the files without the leading ones of each server that cannot hold anything this run judges.

    JSON Lines epochs never go down along a server's files (a late record is an error)
    and indexes only go up, so a file whose last record is of an epoch before ``first``
    and, when the server has a cursor, at or below it holds only what earlier runs
    ingested and checked. Only a leading run of such files is dropped.
    """
    out = {}
    for server, fl in files.items():
        cursor = (after_index or {}).get(server)
        keep_from = 0
        for i, f in enumerate(fl):
            tail = tails.get(f.uri)
            if tail is None or tail[1] >= first or (cursor is not None and tail[0] > cursor):
                break
            keep_from = i + 1
        out[server] = fl[keep_from:]
    return out


def missing_changelog_folder(src) -> SourceError | None:
    """The error to give instead of "not closed" when a source's local ``changelogs.uri`` folder is
    not there at all (a wrong path, or a mount that is not up: waiting will not close an epoch);
    None when it is there, or the changelogs are in a bucket or a gluster source's cuts."""
    uri = src.changelogs.uri
    if _is_s3(uri) or getattr(src, "kind", "changelogs") == "gluster" or os.path.isdir(local_path(uri)):
        return None
    return SourceError(
        f"source {src.name}: changelogs.uri {uri}: no such directory here (the servers' changelog files are "
        "read from it; check the path, or that it is mounted)"
    )


def list_changelog_files(src) -> dict[str, list[ChangelogFile]]:
    """Per configured server, its changelog files in name order (listed by the caller: a
    few LISTs per server, no Spark job)."""
    uri = src.changelogs.uri
    if not _is_s3(uri):
        base = local_path(uri)
        return {s: _list_local(base, s) for s in src.servers}
    s3 = _changelog_s3(src)
    bucket, prefix = _split_s3(uri)
    return {s: _list_s3(s3, bucket, prefix, s) for s in src.servers}


def _open(f: ChangelogFile, s3) -> IO[bytes]:
    """A binary stream of the file (a local file, or the body of an S3 GET)."""
    if not _is_s3(f.uri):
        try:
            return open(f.uri, "rb")
        except OSError as exc:  # e.g. purged or renamed since it was listed
            raise StoreError(f"cannot read {f.uri}: {exc.strerror or exc}") from None
    bucket, _, key = f.uri[len("s3://") :].partition("/")
    try:
        body = s3.client().get_object(Bucket=bucket, Key=key)["Body"]
    except Exception as exc:
        raise StoreError(f"cannot read {f.uri} via {s3.describe()}: {exc}") from None
    return cast("IO[bytes]", _ClosingBody(body))


class _ClosingBody(io.RawIOBase):
    """A botocore StreamingBody as a context-managed raw stream."""

    def __init__(self, body):
        self.body = body

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        return self.body.read(None if size is None or size < 0 else size)

    def readinto(self, b) -> int:
        data = self.body.read(len(b))
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self.body.close()
        super().close()


class _Chain(io.RawIOBase):
    """``head`` bytes, then the rest of ``tail``: resumes a stream at a chunk already read."""

    def __init__(self, head: bytes, tail: IO[bytes]):
        self.head = memoryview(head)
        self.tail = tail

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        if self.head.nbytes:
            n = min(len(b), self.head.nbytes)
            b[:n] = self.head[:n]
            self.head = self.head[n:]
            return n
        data = self.tail.read(len(b))
        b[: len(data)] = data
        return len(data)
