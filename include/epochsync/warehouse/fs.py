"""Warehouse file operations without a JVM (a Spark Connect client has no Py4J gateway).

``file://`` URIs and bare paths go through ``os`` (renames are atomic, no ``.crc``
files); any other scheme through ``pyarrow.fs`` (``FileSystem.from_uri``: hdfs://,
s3://, gs://, ...). The caller, not a Spark driver, runs these: under Spark Connect the
warehouse must therefore be a file system that the client and the server both see at the
same path (local on one machine, or a shared file system).

Only the local side has the stronger operations ingest relies on: :func:`exchange_dirs`
(an atomic swap of two directories) and :func:`lock_file` (``flock``).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

from epochsync.warehouse.paths import local_path


def is_local(uri: str) -> bool:
    """A ``file://`` URI or a bare path."""
    return uri.startswith("file://") or "://" not in uri


def filesystem(uri: str):
    """``(pyarrow.fs.FileSystem, path)`` of ``uri``."""
    from pyarrow import fs

    if is_local(uri):
        return fs.LocalFileSystem(), local_path(uri)
    return fs.FileSystem.from_uri(uri)


def exists(uri: str) -> bool:
    """True if ``uri`` (a file or a directory) exists."""
    if is_local(uri):
        return os.path.lexists(local_path(uri))
    from pyarrow import fs

    filesys, path = filesystem(uri)
    return filesys.get_file_info(path).type != fs.FileType.NotFound


def delete(uri: str) -> None:
    """Delete the file or the directory tree at ``uri``; nothing there is fine."""
    if is_local(uri):
        path = local_path(uri)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=False, onerror=_ignore_missing)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        return
    from pyarrow import fs

    filesys, path = filesystem(uri)
    kind = filesys.get_file_info(path).type
    if kind == fs.FileType.Directory:
        filesys.delete_dir(path)
    elif kind != fs.FileType.NotFound:
        filesys.delete_file(path)


def _ignore_missing(func, path, exc_info) -> None:
    """rmtree's error handler: a file another process removed first is gone, as wanted."""
    if not isinstance(exc_info[1], FileNotFoundError):
        raise exc_info[1]


def move_replacing(src: str, dst: str) -> None:
    """Put ``src`` at ``dst``, replacing what was there (a rename: file://, hdfs://)."""
    if is_local(src) and is_local(dst):
        s, d = local_path(src), local_path(dst)
        os.makedirs(os.path.dirname(d) or ".", exist_ok=True)
        if os.path.isdir(d) and not os.path.islink(d):
            if exchange_dirs(s, d):
                delete(s)  # the old table, now at the source's name
                return
            delete(d)
        os.replace(s, d)
        return
    filesys, d = filesystem(dst)
    _, s = filesystem(src)
    parent = d.rstrip("/").rsplit("/", 1)[0]
    if parent and parent != d:
        filesys.create_dir(parent, recursive=True)
    delete(dst)
    filesys.move(s, d)


def list_dirs(uri: str) -> list[str]:
    """Names of the sub-directories of ``uri`` (none if it does not exist)."""
    if is_local(uri):
        path = local_path(uri)
        if not os.path.isdir(path):
            return []
        return sorted(e.name for e in os.scandir(path) if e.is_dir())
    from pyarrow import fs

    filesys, path = filesystem(uri)
    infos = filesys.get_file_info(fs.FileSelector(path, allow_not_found=True))
    return sorted(i.base_name for i in infos if i.type == fs.FileType.Directory)


def write_text_atomic(path: str, text: str, *, durable: bool = False) -> None:
    """Write a local file so that a reader sees the old or the new content, never half;
    ``durable``: its bytes are on disk before it takes the name (fsync), for a file that a
    state committed next points at.

    The temporary name is unique: two writers of the same file at once each rename a
    whole file into place (the last one wins).
    """
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp-{uuid.uuid4().hex[:12]}")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


def fsync_dir(path: str) -> None:
    """Make the names in local folder ``path`` durable (after a rename into it)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: documents up to this size are written indented, for people; larger ones (the plan of a
#: big epoch) compact: json's C encoder only runs without ``indent``, 6x faster
PRETTY_JSON_MAX = 64 * 1024


def write_json_atomic(path: str, doc) -> None:
    """Write ``doc`` to ``path`` so a reader sees the old or the new file, never half."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    if len(text) <= PRETTY_JSON_MAX:
        text = json.dumps(doc, indent=1, sort_keys=True)
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: str, default=None):
    """Returns the JSON document at local ``path``, or ``default`` when there is no such file."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return default


# --------------------------------------------------------------------------- swap and lock

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
# None: not looked up yet; False: this libc has no renameat2
_renameat2: Callable[..., int] | Literal[False] | None = None


def exchange_dirs(a: str, b: str) -> bool:
    """Swap two local paths in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``).

    A reader resolving ``b`` sees the old directory or the new one, never none. False when
    the system or the file system cannot (then the caller falls back to two renames).
    """
    global _renameat2
    if _renameat2 is None:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            fn = libc.renameat2
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
            fn.restype = ctypes.c_int
            _renameat2 = fn
        except (OSError, AttributeError):
            _renameat2 = False
    if not _renameat2:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EXDEV, errno.EPERM):
        return False  # not supported here (NFS, older kernels, other file systems)
    raise OSError(err, os.strerror(err), b)


@contextlib.contextmanager
def lock_file(path: str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the ``with`` block.

    Processes and threads alike wait for each other (each ``open`` is its own lock); the
    kernel releases the lock when its holder dies, so a killed run leaves no stale lock.
    """
    import fcntl

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
