"""The ``posix`` target: a directory tree under ``path`` (DESIGN section 4).

Namespace operations are renames (zero copy), so a delete is a rename into the
epoch's scratch area ``<control_dir>/tmp/<E>/`` (same file system; ``control_dir`` is
``.epochsync`` unless configured) that the commit removes and a rollback renames back. Overwritten byte ranges are saved as pre-images
in the undo journal before ``pwrite``. Ownership is set only when running as root;
xattrs in the ``user.`` namespace only.

Path safety: every path is checked with :func:`epochsync.targets.base.safe_relpath`
and no parent component may be a symlink (a replicated symlink must never let a
later write land outside the tree); final components are never followed.

The committed view (``view``, docs/INTERNALS.md "Committed view"): the replica is changed in
place while an epoch applies, so where ``path`` is a btrfs subvolume every committed epoch is
also published as a read-only snapshot ``<view folder>/epoch-NNNNNNNNNN``, and the symlink
``<view folder>/current`` is flipped to it (after the manifest, the commit point; again before
the next epoch changes anything, should a commit have died in between). Readers of
``current`` see whole epochs only; the newest ``view.keep`` snapshots are kept.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import stat as st
from typing import TYPE_CHECKING, Any

from epochsync.core import btrfs
from epochsync.core.errors import EpochsyncError, StoreError
from epochsync.targets.base import (
    CONTROL_DIR,
    Entry,
    Target,
    UnsafePathError,
    drain,
    moved_control_dir_error,
    safe_relpath,
)
from epochsync.warehouse.fs import fsync_dir, write_json_atomic

if TYPE_CHECKING:
    import ctypes

XATTR_NAMESPACE = "user."
#: bytes read at once when a range of a replica file is hashed
READ_BLOCK = 8 << 20
#: in the view folder: the link readers open, and the snapshots' names
VIEW_LINK = "current"
_VIEW_NAME = re.compile(r"epoch-(\d{10})")


def view_name(epoch: int) -> str:
    """Returns the name of an epoch's snapshot in a posix target's view folder."""
    return f"epoch-{int(epoch):010d}"


def range_checksum(data: bytes) -> str:
    """The checksum of a written range that verify compares with a read-back (SHA-256: 1.7 GB/s
    here, with the CPU's SHA instructions)."""
    return hashlib.sha256(data).hexdigest()


def _nearest_existing(path: str) -> str:
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def _type_of(mode: int) -> str:
    if st.S_ISREG(mode):
        return "file"
    if st.S_ISDIR(mode):
        return "dir"
    if st.S_ISLNK(mode):
        return "symlink"
    return "other"


def _parent(path: str) -> str | None:
    """The parent of a plan path (``""``: the root); None for the epoch's scratch area."""
    if path.startswith("@tmp"):
        return None
    return path.rsplit("/", 1)[0] if "/" in path else ""


def _to_scratch(op: dict) -> bool:
    """Is ``op`` a move of a replica entry into the epoch's scratch area (``@tmp/<epoch>/<n>``)?"""
    return op.get("op") == "rename" and op["dst"].startswith("@tmp/") and not op["src"].startswith("@tmp/")


def _syncfs(fd: int) -> int:
    """``syncfs(2)`` of the file system holding ``fd``; -1 where it is not available (the caller then syncs all)."""
    global _LIBC
    try:
        if _LIBC is None:
            import ctypes
            import ctypes.util

            _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return int(_LIBC.syncfs(fd))
    except (OSError, AttributeError):
        return -1


_LIBC: ctypes.CDLL | None = None


class PosixTarget(Target):
    """A replica as a directory tree; its control directory sits at the top of it."""

    kind = "posix"

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        if not cfg.path:
            raise EpochsyncError(f"target {cfg.name}: a posix target needs 'path'")
        self.root = os.path.abspath(cfg.path)
        self.control = os.path.join(self.root, self.control_dir)
        self.as_root = os.geteuid() == 0
        view = getattr(cfg, "view", None)
        self.view_mode = getattr(view, "snapshots", "never")
        self.view_keep = int(getattr(view, "keep", 2))
        self.view_dir = os.path.abspath(getattr(view, "path", None) or self.root.rstrip("/") + ".epochs")
        #: path -> the ranges this process's data operations wrote there (:meth:`take_written`)
        self._written: dict[str, list[list]] = {}
        # resolved parent directories during a read-only pass (:meth:`reading`), else None
        self._parents: dict[str, str] | None = None

    def describe(self) -> str:
        """Returns ``posix:<root>``."""
        return f"posix:{self.root}"

    # ------------------------------------------------------------------ paths
    def _abs(self, rel: str, *, root_ok: bool = False) -> str:
        """Absolute path of a replica path; refuses escapes and symlinked parents.

        ``""`` is the replica's root directory, accepted only where ``root_ok`` says so
        (its attributes and xattrs; nothing may move or remove the root).
        """
        if rel.startswith("@tmp/"):
            return self._tmp_abs(rel)
        if rel == "" and root_ok:
            return self.root
        safe_relpath(rel, control_dir=self.control_dir)
        path = os.path.join(self.root, rel)
        parent = os.path.dirname(path)
        if self._real(parent) != os.path.join(self._real(self.root), os.path.dirname(rel)).rstrip("/"):
            raise UnsafePathError(f"refusing path {rel!r}: a parent directory is a symlink or missing")
        return path

    def _real(self, path: str) -> str:
        """``os.path.realpath(path)``, once per path during a read-only pass (:meth:`reading`)."""
        memo = self._parents
        if memo is None:
            return os.path.realpath(path)
        real = memo.get(path)
        if real is None:
            real = memo[path] = os.path.realpath(path)
        return real

    @contextlib.contextmanager
    def reading(self):
        """A pass that moves no directory of the replica (the write fence, verify's checks, the data
        phase of an apply in this process's threads: it creates and writes files only): each
        parent directory is resolved once, not once per path under it (a realpath is a system
        call per component; a renamed directory of 10,000 files had its parents resolved 10,000
        times). Nothing may rename, replace or remove directories of the replica inside it; the
        threads of one pass share what was resolved."""
        outer = self._parents is not None
        if not outer:
            self._parents = {}
        try:
            yield self
        finally:
            if not outer:
                self._parents = None

    def _existing(self, rel: str) -> str | None:
        """Absolute path of ``rel`` when every parent component is a real directory of the
        replica; None when one is not (missing, a file or a symlink): the replica then holds
        no entry ``rel``, whatever lies behind that parent. Hostile paths are still refused.

        An epoch that replaces a directory ``d`` by a file or a symlink leaves its old
        children ``d/x`` absent this way (verify, the write fence and undo ask about them).
        """
        try:
            return self._abs(rel, root_ok=True)
        except UnsafePathError:
            parts = rel.split("/")
            for i in range(1, len(parts)):
                try:
                    s = os.lstat(os.path.join(self.root, *parts[:i]))
                except (FileNotFoundError, NotADirectoryError):
                    return None
                if not st.S_ISDIR(s.st_mode):
                    return None
            raise

    def _lstat(self, rel: str) -> tuple[str, os.stat_result] | None:
        """``(absolute path, lstat)`` of the entry at ``rel``, None when the replica holds none."""
        path = self._existing(rel)
        if path is None:
            return None
        try:
            return path, os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None

    def tmp_dir(self, epoch: int) -> str:
        """Returns the scratch folder of ``epoch`` (moved-aside originals until the commit)."""
        return os.path.join(self.control, "tmp", str(int(epoch)))

    def _tmp_abs(self, ref: str) -> str:
        # "@tmp/<epoch>/<n>": the per-epoch scratch area, names made by translate
        parts = ref.split("/")
        if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
            raise UnsafePathError(f"refusing scratch reference {ref!r}")
        return os.path.join(self.control, "tmp", parts[1], parts[2])

    # ------------------------------------------------------------------ manifest
    def read_manifest(self) -> dict | None:
        """Returns the manifest, or None when there is none; raises if the control directory moved without it."""
        try:
            with open(os.path.join(self.control, "manifest.json"), encoding="utf-8") as f:
                return json.load(f)
        except FileNotFoundError:
            legacy = os.path.join(self.root, CONTROL_DIR)
            if self.control_dir != CONTROL_DIR and os.path.exists(os.path.join(legacy, "manifest.json")):
                raise moved_control_dir_error(self, f"mv {legacy} {self.control}") from None
            return None
        except (OSError, ValueError) as exc:
            raise StoreError(f"{self.describe()}: manifest unreadable: {exc}") from None

    def write_manifest(self, doc: dict) -> None:
        """Replace the manifest atomically and fsync its folder."""
        os.makedirs(self.control, exist_ok=True)
        write_json_atomic(os.path.join(self.control, "manifest.json"), doc)
        fsync_dir(self.control)

    def fence_time_ns(self) -> int | None:
        """Returns the later mtime of the manifest and the rollback marker (ns), None if neither exists."""
        times = []
        for name in ("manifest.json", "rollback.json"):
            try:
                times.append(os.lstat(os.path.join(self.control, name)).st_mtime_ns)
            except FileNotFoundError:
                pass
        return max(times) if times else None

    def mark_rollback(self, epoch: int) -> None:
        """Write ``rollback.json`` atomically: its mtime is the new fence instant."""
        os.makedirs(self.control, exist_ok=True)
        path = os.path.join(self.control, "rollback.json")
        with open(path + ".tmp", "w") as f:
            json.dump({"rolled_back_epoch": epoch}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)

    # ------------------------------------------------------------------ reading
    def _entry(self, rel: str, path: str, s: os.stat_result, hashes: bool) -> Entry:
        kind = _type_of(s.st_mode)
        e = Entry(
            path=rel,
            type=kind,
            size=s.st_size if kind == "file" else 0,
            mode=st.S_IMODE(s.st_mode),
            uid=s.st_uid,
            gid=s.st_gid,
            mtime_ns=s.st_mtime_ns,
            ino=s.st_ino,
        )
        if kind == "symlink":
            e.symlink = os.readlink(path)
            e.mode = None  # Linux symlink modes are meaningless
        else:
            e.xattrs = self._xattrs(path)
        if kind == "file" and hashes:
            h = hashlib.sha256()
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            e.sha256 = h.hexdigest()
        return e

    def _xattrs(self, path: str) -> dict[str, bytes]:
        try:
            names = os.listxattr(path, follow_symlinks=False)
        except OSError:
            return {}
        return {n: os.getxattr(path, n, follow_symlinks=False) for n in names if n.startswith(XATTR_NAMESPACE)}

    def walk(self, *, hashes: bool = True):
        """Returns an iterator over every entry under the root, depth first, without the control directory."""
        if not os.path.isdir(self.root):
            return
        stack = [""]
        while stack:
            rel_dir = stack.pop()
            base = os.path.join(self.root, rel_dir) if rel_dir else self.root
            for name in sorted(os.listdir(base)):
                if not rel_dir and name == self.control_dir:
                    continue
                rel = f"{rel_dir}/{name}" if rel_dir else name
                path = os.path.join(base, name)
                s = os.lstat(path)
                e = self._entry(rel, path, s, hashes)
                yield e
                if e.type == "dir":
                    stack.append(rel)

    def read_file(self, path: str) -> bytes:
        """Returns the bytes of the file at ``path``."""
        with open(self._abs(path), "rb") as f:
            return f.read()

    def range_checksums(self, path: str, ranges: list[tuple[int, int]]) -> list[str]:
        """The :func:`range_checksum` of each ``(offset, length)`` of the file at ``path``, read in
        blocks (a range may be a whole large file)."""
        out = []
        fd = os.open(self._abs(path), os.O_RDONLY | os.O_NOFOLLOW)
        try:
            for offset, length in ranges:
                h = hashlib.sha256()
                pos, end = int(offset), int(offset) + int(length)
                while pos < end:
                    block = os.pread(fd, min(READ_BLOCK, end - pos), pos)
                    if not block:  # past the end: the file is shorter than the range
                        break
                    h.update(block)
                    pos += len(block)
                out.append(h.hexdigest() if pos == end else "")
        finally:
            os.close(fd)
        return out

    def identity(self, path: str) -> list[int] | None:
        """What proves nobody changed the file at ``path`` since it was taken: ``[st_dev, st_ino,
        st_size, st_mtime_ns, st_ctime_ns]`` (a write, a truncate, ``utime``, ``chmod``, an xattr or a
        link sets the ctime to now, and no caller can set it back), None when it is not a file."""
        found = self._lstat(path)
        if found is None or not st.S_ISREG(found[1].st_mode):
            return None
        s = found[1]
        return [s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns]

    # ------------------------------------------------------------------ verify's facts
    def take_written(self) -> dict[str, list[list]]:
        """The ranges this process's data operations wrote since the last call, path ->
        ``[[offset, length, sha256 of the bytes written], ...]``, and forget them (threads may be
        writing: one atomic ``popitem`` at a time)."""
        return drain(self._written)

    def settle_facts(self, written: dict[str, list[list]], plan: dict) -> dict[str, dict]:
        """Verify's facts of an apply that has made its last change (``written``: the data
        operations' :meth:`take_written`): for each file the plan's ``verify`` names, its
        :meth:`identity` now and, where the apply wrote it (at this path or another link of the
        same inode), the ranges it wrote with their checksums; for a file the apply did not write
        whose bytes are those of E-1 (``unchanged``: a rename, a new link, an attribute change),
        the identity alone. Other files get no fact (verify reads them whole)."""
        with self.reading():  # the apply has made its last change: nothing moves any more
            return self._settled(written, plan)

    def _settled(self, written: dict[str, list[list]], plan: dict) -> dict[str, dict]:
        by_inode = {}
        for path, ranges in written.items():
            ident = self.identity(path)
            if ident is not None:
                by_inode[(ident[0], ident[1])] = ranges
        facts = {}
        for item in plan["verify"]["present"]:
            if item["attrs"].get("type") != "file":
                continue
            ident = self.identity(item["path"])
            if ident is None:
                continue
            written_ranges = by_inode.get((ident[0], ident[1]))
            if written_ranges is not None:
                facts[item["path"]] = {"id": ident, "ranges": written_ranges}
            elif item.get("unchanged"):
                facts[item["path"]] = {"id": ident}
        return facts

    def stat(self, path: str, type_hint: str | None = None) -> Entry | None:
        """The entry at ``path`` (``""``: the root), None when the replica holds none."""
        found = self._lstat(path)
        return None if found is None else self._entry(path, found[0], found[1], hashes=False)

    # ------------------------------------------------------------------ fence
    def fence_check(self, expect: list[dict], since_ns: int | None) -> tuple[list[str], dict[str, Any]]:
        """Returns one problem line per fenced path that differs from the last commit (type, size,
        ctime), and no state."""
        problems: list[str] = []
        with self.reading():
            self._fence_items(expect, since_ns, problems)
        return problems, {}

    def _fence_items(self, expect: list[dict], since_ns: int | None, problems: list[str]) -> None:
        for item in expect:
            rel = item["path"]
            try:
                found = self._lstat(rel)
            except UnsafePathError as exc:
                problems.append(f"{rel}: {exc}")
                continue
            s = None if found is None else found[1]
            want = item.get("type")
            if want is None:
                if s is not None:
                    problems.append(f"{rel}: exists but the replica at the last epoch did not have it")
                continue
            if s is None:
                problems.append(f"{rel}: missing (expected a {want})")
                continue
            have = _type_of(s.st_mode)
            if have != want:
                problems.append(f"{rel}: is a {have}, expected a {want}")
            elif want == "file" and item.get("size") is not None and s.st_size != item["size"]:
                problems.append(f"{rel}: size {s.st_size}, expected {item['size']}")
            elif want != "dir" and since_ns is not None and s.st_ctime_ns > since_ns:
                problems.append(f"{rel}: changed after the last commit (ctime)")

    # ------------------------------------------------------------------ mutations
    def prepare(self, epoch: int) -> None:
        """Create the epoch's scratch folder and the parents of the fileset's subtrees; before that,
        a new replica on btrfs becomes a subvolume, and the committed epoch's view is published if
        a commit died before it was (the replica is still at that epoch here)."""
        self.make_root()
        why = self.view_unavailable()
        if why is None:
            self.publish_view()
        elif self.view_mode == "required":
            raise EpochsyncError(f"target {self.name}: view.snapshots is required, but {why}")
        os.makedirs(self.tmp_dir(epoch), exist_ok=True)
        # parents of the fileset's subtrees are scaffolding, not replicated entries
        for sub in self.cfg.fileset:
            parent = os.path.dirname(sub.strip("/"))
            if parent:
                parent = safe_relpath(parent, "fileset parent", self.control_dir)
                os.makedirs(os.path.join(self.root, parent), exist_ok=True)

    #: moves into the scratch area journaled together: one fsync for up to this many
    SCRATCH_MOVES_PER_FSYNC = 512

    def run_namespace_ops(self, ops: list[dict], journal, state: dict) -> None:
        """The plan's namespace operations, in order. A run of moves into the epoch's scratch area
        (the plan's first phase: what is deleted or moved away, children first) is journaled
        ``SCRATCH_MOVES_PER_FSYNC`` at a time with one fsync, then made: 10,000 deletes cost 10,000
        fsyncs before. Still write-ahead: a move runs only after its entry is durable, and the undo
        of a move whose unique scratch name does not exist is a no-op, so the entries of a batch
        whose moves never ran undo nothing. Validating a batch's paths first is the same as before
        each move: children go first, so no move of a batch is under another's source."""
        i = 0
        while i < len(ops):
            j = i
            while j < len(ops) and j - i < self.SCRATCH_MOVES_PER_FSYNC and _to_scratch(ops[j]):
                j += 1
            if j - i >= 2:
                self._scratch_moves(ops[i:j], journal)
                i = j
            else:
                self.run_namespace_op(ops[i], journal, state)
                i += 1

    def _scratch_moves(self, ops: list[dict], journal) -> None:
        with self.reading():  # nothing moves while the batch's paths are checked
            paths = [(self._abs(op["src"]), self._abs(op["dst"])) for op in ops]
        journal.append_many([{"op": "rename", "src": op["src"], "dst": op["dst"]} for op in ops])
        for op, (src, dst) in zip(ops, paths):
            if os.path.lexists(dst):
                raise StoreError(f"{self.describe()}: cannot move {op['src']} to {op['dst']}: destination exists")
            os.rename(src, dst)

    def run_namespace_op(self, op: dict, journal, state: dict) -> None:
        """Run one namespace operation (rename, mkdir, symlink, mknod, ...), journaled first."""
        kind = op["op"]
        if kind == "rename":
            src, dst = self._abs(op["src"]), self._abs(op["dst"])
            journal.append({"op": "rename", "src": op["src"], "dst": op["dst"]})
            if os.path.lexists(dst):
                raise StoreError(f"{self.describe()}: cannot move {op['src']} to {op['dst']}: destination exists")
            os.rename(src, dst)
        elif kind == "mkdir":
            path = self._abs(op["path"])
            journal.append({"op": "mkdir", "path": op["path"]})
            os.mkdir(path, 0o700)
        elif kind == "symlink":
            path = self._abs(op["path"])
            journal.append({"op": "create", "path": op["path"]})
            os.symlink(op["target"], path)
        elif kind == "mknod":
            path = self._abs(op["path"])
            journal.append({"op": "create", "path": op["path"]})
            mode = int(op.get("mode") or 0o600)
            if st.S_ISFIFO(mode):
                os.mkfifo(path, st.S_IMODE(mode) or 0o600)
            else:
                try:
                    os.mknod(path, mode, int(op.get("rdev") or 0))
                except PermissionError:
                    # device nodes need privileges: keep a placeholder of the right name
                    os.mkfifo(path, 0o600)
        else:
            raise EpochsyncError(f"posix target: unknown namespace operation {kind!r}")

    #: post operations journaled together: one fsync for up to this many
    POST_OPS_PER_FSYNC = 512

    def run_post_ops(self, ops: list[dict], journal, state: dict) -> None:
        """The plan's post operations (hard links, attributes), in order, their entries journaled
        up to ``POST_OPS_PER_FSYNC`` at a time with one fsync, then made. Still write-ahead; the
        undo of a link that never ran finds no path, that of attributes never set puts back the
        ones the path still has. An attributes operation on a path this batch links, or on one
        that cannot be read now, ends the batch and runs on its own (journaled alone, failing
        as it always did). 174 post operations of bench-warm's epoch paid 174 fsyncs before."""
        i = 0
        while i < len(ops):
            entries: list[dict] = []
            linked: set[str] = set()
            j = i
            while j < len(ops) and j - i < self.POST_OPS_PER_FSYNC:
                entry = self._post_entry(ops[j], linked)
                if entry is None:
                    break
                entries.append(entry)
                j += 1
            if len(entries) >= 2:
                journal.append_many(entries)
                for op in ops[i:j]:
                    self.run_post_op(op, journal, state, journaled=True)
                i = j
            else:
                self.run_post_op(ops[i], journal, state)
                i += 1

    def _post_entry(self, op: dict, linked: set[str]) -> dict | None:
        """The undo entry of a post operation, read now; None when it must be journaled alone."""
        kind = op.get("op")
        try:
            if kind == "link":
                for rel in (op["path"], op["existing"]):
                    self._abs(rel)  # a bad path: journaled alone, refused as before
                linked.add(op["path"])
                return {"op": "create", "path": op["path"]}
            if kind == "attrs" and op["path"] not in linked:
                return {"op": "attrs", "path": op["path"], "old": self._attrs_of(self._abs(op["path"], root_ok=True))}
        except (OSError, EpochsyncError):
            return None
        return None

    def run_post_op(self, op: dict, journal, state: dict, *, journaled: bool = False) -> None:
        """Run one post operation (hard link, attributes, delete), journaled first (``journaled``:
        its entry is durable already, :meth:`run_post_ops`)."""
        kind = op["op"]
        if kind == "link":
            path, existing = self._abs(op["path"]), self._abs(op["existing"])
            if not journaled:
                journal.append({"op": "create", "path": op["path"]})
            os.link(existing, path, follow_symlinks=False)
        elif kind == "attrs":
            path = self._abs(op["path"], root_ok=True)
            if not journaled:
                journal.append({"op": "attrs", "path": op["path"], "old": self._attrs_of(path)})
            self._set_attrs(path, op["attrs"])
        else:
            raise EpochsyncError(f"posix target: unknown post operation {kind!r}")

    def run_data_op(self, op: dict, journal, chunks: list[tuple[int, bytes]]) -> None:
        """Write one file: create it, or patch ranges in place with pre-images saved first."""
        rel = op["path"]
        path = self._abs(rel)
        new_size = int(op["new_size"])
        if op.get("create"):
            if not op.get("journaled"):
                journal.append({"op": "create", "path": rel})
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        elif op.get("journaled"):  # its pre-images are in the journal already (journal_ahead)
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        else:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
            old_size = os.fstat(fd).st_size
            pre = []
            spans = [(o, len(b)) for o, b in chunks]
            if new_size < old_size:
                spans.append((new_size, old_size - new_size))
            for i, (o, n) in enumerate(spans):
                n = min(n, old_size - o)
                if n <= 0:
                    continue
                data = os.pread(fd, n, o)
                name = f"{journal.writer}-{journal.seq + 1}-{i}"
                journal.save_preimage(name, data)
                pre.append({"offset": o, "length": len(data), "file": name})
            journal.append(
                {"op": "write", "path": rel, "old_size": old_size, "preimages": pre, "old": self._attrs_of(path)}
            )
        wrote = []
        try:
            if os.fstat(fd).st_size != new_size:
                os.ftruncate(fd, new_size)
            for offset, data in chunks:
                if offset < new_size:
                    data = data[: new_size - offset]
                    os.pwrite(fd, data, offset)
                    if data:
                        wrote.append([offset, len(data), range_checksum(data)])
        finally:
            os.close(fd)
        # durable with the others of its partition, in one syncfs (:meth:`flush_written`), not one
        # fsync each: an undo needs only the journal (fsynced before this write), and the commit
        # comes after every partition has flushed
        # verify's fact: what this operation wrote, hashed from the bytes in hand (the source's at E)
        self._written[rel] = wrote
        if op.get("attrs"):
            self._set_attrs(path, op["attrs"])

    #: a modification's pre-images up to this many bytes go into its journal entry (base64), so a
    #: batch of small overwrites is journaled with one fsync; larger ones are saved as files
    INLINE_PREIMAGE_MAX = 64 * 1024

    def journal_ahead(self, ops: list[dict], journal) -> list[dict]:
        """Journal the creates and the small overwrites among ``ops`` (data operations about to run,
        in order) in one entry batch with one fsync; returns the ops, those marked ``journaled``.

        Still write-ahead: each file is created or changed after its entry is durable. A
        create's path holds nothing before it (the write fence checked it was absent, or the
        first phase moved what was there into the scratch area), so the undo of an entry whose
        create never ran finds nothing and does nothing. An overwrite's entry holds the bytes
        its ranges (and a truncation) will destroy, read now, with the file's size and
        attributes: the target is leased and one operation writes a path, so nothing changes
        them before the operation runs, and the undo of an entry whose write never ran puts
        back the bytes the file still holds. An untar of 20,281 files paid an fsync for each
        create, 500 small writes two fsyncs each (the pre-image file and the entry), before."""
        entries: list[dict] = []
        out: list[dict] = []
        for op in ops:
            if op.get("create"):
                entries.append({"op": "create", "path": op["path"]})
                out.append(dict(op, journaled=True))
                continue
            entry = self._overwrite_entry(op)
            if entry is None:  # large pre-images, or an error the operation itself will report
                out.append(op)
            else:
                entries.append(entry)
                out.append(dict(op, journaled=True))
        if len(entries) < 2:
            return ops
        journal.append_many(entries)
        return out

    def _overwrite_entry(self, op: dict) -> dict | None:
        """The undo entry of a data operation that patches an existing file, its pre-images inline;
        None when they pass :data:`INLINE_PREIMAGE_MAX` or the file cannot be read now."""
        rel = op["path"]
        new_size = int(op["new_size"])
        spans = [(int(o), int(n)) for o, n in op.get("ranges") or []]
        try:
            path = self._abs(rel)
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except (OSError, EpochsyncError):
            return None
        try:
            old_size = os.fstat(fd).st_size
            if new_size < old_size:
                spans.append((new_size, old_size - new_size))
            pre = []
            total = 0
            for o, n in spans:
                n = min(n, old_size - o)
                if n <= 0:
                    continue
                total += n
                if total > self.INLINE_PREIMAGE_MAX:
                    return None
                data = os.pread(fd, n, o)
                pre.append({"offset": o, "length": len(data), "data": base64.b64encode(data).decode("ascii")})
            old = self._attrs_of(path)
        except OSError:
            return None
        finally:
            os.close(fd)
        return {"op": "write", "path": rel, "old_size": old_size, "preimages": pre, "old": old}

    def flush_written(self) -> None:
        """Make what this process's data operations wrote durable: one ``syncfs`` of the replica's
        file system (every dirty page of it, on this host) instead of an fsync per file, which
        cost an untar of 20,281 files more than its writes did. Called by each partition of data
        operations at its end (threads of one process may each call it: no state is shared)."""
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            if _syncfs(fd) != 0:
                os.sync()
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ directory times
    def dir_times_before(self, plan: dict) -> dict:
        """The times of every directory the plan's operations change as a side effect (the parents of
        what they create, move, link or delete), by inode, before apply: creating an entry sets its
        directory's mtime to now, which the source did not do in this epoch unless the plan says so."""
        touched = {_parent(op[k]) for op in plan["namespace"] for k in ("src", "dst", "path") if op.get(k)}
        touched |= {_parent(op["path"]) for op in plan["data"] if op.get("create")}
        touched |= {_parent(op["path"]) for op in plan["post"] if op["op"] == "link"}
        parents = {p for p in touched if p is not None}  # None: the scratch area's
        times = {}
        for p in parents:
            found = self._dir_stat(p)
            if found is not None:
                s = found[1]
                times[f"{s.st_dev}:{s.st_ino}"] = (s.st_atime_ns, s.st_mtime_ns)
        return {"parents": sorted(parents), "times": times}

    def restore_dir_times(self, before: dict, plan: dict) -> None:
        """Puts back the times :meth:`dir_times_before` saved on the directories the plan does not set
        attributes of itself (found by inode: a directory moved in the epoch is found at its new path)."""
        explicit = {op["path"] for op in plan["post"] if op["op"] == "attrs"}
        parents = set(before["parents"])
        parents |= {_parent(op["dst"]) for op in plan["namespace"] if op["op"] == "rename"}
        for p in sorted(q for q in parents if q is not None and q not in explicit):
            found = self._dir_stat(p)
            if found is None:
                continue
            path, s = found
            times = before["times"].get(f"{s.st_dev}:{s.st_ino}")
            if times is not None and s.st_mtime_ns != times[1]:
                os.utime(path, ns=tuple(times), follow_symlinks=False)

    def _dir_stat(self, rel: str) -> tuple[str, os.stat_result] | None:
        """The absolute path and lstat of the directory ``rel`` (``""``: the root), None when it is not one."""
        path = self.root if rel == "" else self._existing(rel)
        if path is None:
            return None
        try:
            s = os.lstat(path)
        except FileNotFoundError:
            return None
        return (path, s) if st.S_ISDIR(s.st_mode) else None

    # ------------------------------------------------------------------ attributes
    def _attrs_of(self, path: str) -> dict | None:
        try:
            s = os.lstat(path)
        except FileNotFoundError:
            return None
        is_link = st.S_ISLNK(s.st_mode)
        return {
            "mode": None if is_link else st.S_IMODE(s.st_mode),
            "uid": s.st_uid,
            "gid": s.st_gid,
            "atime_ns": s.st_atime_ns,
            "mtime_ns": s.st_mtime_ns,
            "xattrs": {} if is_link else {k: v.hex() for k, v in self._xattrs(path).items()},
        }

    def _set_attrs(self, path: str, attrs: dict) -> None:
        s = os.lstat(path)
        is_link = st.S_ISLNK(s.st_mode)
        if attrs.get("xattrs") is not None and not is_link:
            want = {k: bytes.fromhex(v) for k, v in attrs["xattrs"].items() if k.startswith(XATTR_NAMESPACE)}
            have = self._xattrs(path)
            for k in have.keys() - want.keys():
                os.removexattr(path, k, follow_symlinks=False)
            for k, v in want.items():
                if have.get(k) != v:
                    os.setxattr(path, k, v, follow_symlinks=False)
        if self.as_root and attrs.get("uid") is not None and attrs.get("gid") is not None:
            os.chown(path, int(attrs["uid"]), int(attrs["gid"]), follow_symlinks=False)
        if attrs.get("mode") is not None and not is_link:
            os.chmod(path, st.S_IMODE(int(attrs["mode"])))
        if attrs.get("mtime_ns") is not None:
            atime = attrs.get("atime_ns")
            atime = int(atime) if atime is not None else s.st_atime_ns
            os.utime(path, ns=(atime, int(attrs["mtime_ns"])), follow_symlinks=False)

    # ------------------------------------------------------------------ undo
    def undo(self, entry: dict, journal_dir: str) -> None:
        """Reverse one journal entry. Idempotent: an entry whose effect is gone (or whose
        path the replica no longer holds, its parent being a file or a symlink now) is a no-op."""
        op = entry["op"]
        if op == "rename":
            dst = self._existing(entry["dst"])
            if dst is not None and os.path.lexists(dst):
                src = self._abs(entry["src"])
                if not os.path.lexists(src):
                    os.rename(dst, src)
        elif op == "mkdir":
            path = self._existing(entry["path"])
            if path is not None and os.path.isdir(path) and not os.path.islink(path):
                try:
                    os.rmdir(path)
                except OSError as exc:
                    if exc.errno == errno.ENOTEMPTY:
                        raise StoreError(
                            f"{self.describe()}: cannot undo mkdir {entry['path']}: it holds entries the journal "
                            "does not account for"
                        ) from None
                    raise
        elif op == "create":
            found = self._lstat(entry["path"])
            # what a create made is never a directory (mkdir has its own entry): a directory
            # there is one an earlier undo of this journal already put back
            if found is not None and not st.S_ISDIR(found[1].st_mode):
                os.unlink(found[0])
        elif op == "write":
            found = self._lstat(entry["path"])
            if found is None or not st.S_ISREG(found[1].st_mode):
                return
            path = found[0]
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
            try:
                os.ftruncate(fd, int(entry["old_size"]))
                for p in entry["preimages"]:
                    if "data" in p:  # inline (journal_ahead)
                        data = base64.b64decode(p["data"])
                        what = f"of {entry['path']} at {p['offset']}"
                    else:
                        with open(os.path.join(journal_dir, "preimages", p["file"]), "rb") as f:
                            data = f.read()
                        what = p["file"]
                    if len(data) != p["length"]:
                        raise StoreError(f"undo journal: pre-image {what} is damaged")
                    os.pwrite(fd, data, int(p["offset"]))
                os.fsync(fd)
            finally:
                os.close(fd)
            if entry.get("old"):
                self._set_attrs(path, entry["old"])
        elif op == "attrs":
            path = self._existing(entry["path"])
            if path is not None and entry.get("old") and os.path.lexists(path):
                self._set_attrs(path, entry["old"])
        else:
            raise EpochsyncError(f"posix target: unknown undo entry {op!r}")

    def finish_commit(self, epoch: int) -> None:
        """Drop the epoch's scratch folder, then touch the manifest so the fence instant passes the cleanup."""
        shutil.rmtree(self.tmp_dir(epoch), ignore_errors=False) if os.path.exists(self.tmp_dir(epoch)) else None
        if os.path.isdir(os.path.dirname(self.tmp_dir(epoch))):
            fsync_dir(os.path.dirname(self.tmp_dir(epoch)))
        # Removing a moved-aside name of a file that keeps another hard link changes that
        # file's ctime after the manifest was written; the cleanup is ours, so the fence
        # instant (the manifest's mtime) moves past it (found by make demo, epoch 4).
        manifest = os.path.join(self.control, "manifest.json")
        if os.path.exists(manifest):
            os.utime(manifest)

    # ------------------------------------------------------------------ committed view
    def make_root(self) -> None:
        """Makes a replica directory that does not exist yet a btrfs subvolume (it can then be
        snapshotted) when its parent is on btrfs, unless ``view.snapshots`` is ``never``; the lease
        calls it before it makes the control directory, and :meth:`prepare` before an apply."""
        if os.path.lexists(self.root) or self.view_mode == "never":
            return
        parent = os.path.dirname(self.root)
        os.makedirs(parent, exist_ok=True)
        if btrfs.mount_of(parent)[1] == "btrfs" and shutil.which("btrfs"):
            btrfs.create_subvolume(self.root)

    def view_unavailable(self) -> str | None:
        """None when this replica can publish its committed view; else why not, in a phrase."""
        if self.view_mode == "never":
            return "view.snapshots is never"
        probe = _nearest_existing(self.root)
        point, fstype = btrfs.mount_of(probe)
        if fstype != "btrfs":
            return f"{self.root} is on {fstype or 'an unknown file system'}, not btrfs: it has no snapshots"
        if os.path.exists(self.root) and not btrfs.is_subvolume(self.root):
            return (
                f"{self.root} is a directory on btrfs, not a subvolume: it has no snapshots (make it one: "
                "btrfs subvolume create NEW, cp -a --reflink=always the replica into it, swap the two)"
            )
        view = self.view_dir.rstrip("/")
        if view == self.root or view.startswith(self.root.rstrip("/") + "/"):
            return f"the view folder {self.view_dir} is inside the replica"
        if btrfs.mount_of(_nearest_existing(self.view_dir))[0] != point:
            return f"the view folder {self.view_dir} is not on the replica's btrfs file system ({point})"
        if shutil.which("btrfs") is None:
            return "the btrfs command is not installed here (btrfs-progs)"
        return None

    def _view_epochs(self) -> dict[int, str]:
        try:
            names = os.listdir(self.view_dir)
        except FileNotFoundError:
            return {}
        return {int(m.group(1)): n for n in names if (m := _VIEW_NAME.fullmatch(n))}

    def _view_current(self) -> str | None:
        try:
            return os.readlink(os.path.join(self.view_dir, VIEW_LINK))
        except OSError:
            return None

    def _snapshot_matches(self, snap: str, manifest: dict) -> bool | None:
        """Is the snapshot at ``snap`` of the commit ``manifest`` names? None: it holds no manifest
        where one is looked for (the control directory, then the default one: a relocated replica)."""
        for control in dict.fromkeys((self.control_dir, CONTROL_DIR)):
            try:
                with open(os.path.join(snap, control, "manifest.json"), encoding="utf-8") as f:
                    doc = json.load(f)
            except (OSError, ValueError):
                continue
            return doc.get("epoch") == manifest.get("epoch") and doc.get("committed_at") == manifest.get("committed_at")
        return None

    def publish_view(self) -> dict | None:
        """Publish the committed epoch (the manifest's) as the view: a read-only snapshot of the
        replica, ``current`` flipped to it, then the snapshots past ``view.keep`` deleted. Idempotent;
        run at commit (after the manifest) and before an epoch's first change. Returns what it did
        (``epoch``, ``snapshot``, ``made``, ``deleted``), or None when there is no view to publish."""
        if self.view_unavailable() is not None:
            return None
        manifest = self.read_manifest()
        epoch = int((manifest or {}).get("epoch") or 0)
        if manifest is None or epoch <= 0:
            return None
        name = view_name(epoch)
        dest = os.path.join(self.view_dir, name)
        current = self._view_current()
        made = False
        if current != name or self._snapshot_matches(dest, manifest) is False:
            if os.path.lexists(dest) and (
                not btrfs.is_subvolume(dest) or self._snapshot_matches(dest, manifest) is False
            ):
                if current == name or not btrfs.is_subvolume(dest):
                    raise EpochsyncError(
                        f"target {self.name}: {dest} is not the snapshot of the committed epoch {epoch} (another "
                        f"replica's view?); move {self.view_dir} away (readers of {VIEW_LINK} keep theirs), then run "
                        "again"
                    )
                btrfs.delete_subvolume(dest)
            if not os.path.lexists(dest):
                os.makedirs(self.view_dir, exist_ok=True)
                btrfs.snapshot(self.root, dest)
                made = True
            tmp = os.path.join(self.view_dir, f".{VIEW_LINK}.tmp")
            if os.path.lexists(tmp):
                os.unlink(tmp)
            os.symlink(name, tmp)
            os.replace(tmp, os.path.join(self.view_dir, VIEW_LINK))
            fsync_dir(self.view_dir)
        deleted = []
        newest = sorted((e for e in self._view_epochs() if e <= epoch), reverse=True)[: self.view_keep]
        for e, n in sorted(self._view_epochs().items()):
            if e not in newest and n != name:
                btrfs.delete_subvolume(os.path.join(self.view_dir, n))
                deleted.append(e)
        return {"epoch": epoch, "snapshot": dest, "made": made, "deleted": deleted}

    def view_status(self) -> dict:
        """The committed view as ``epochsync status`` shows it: ``available`` and, when it is,
        ``current`` (the epoch readers of the link see) and ``kept`` (epochs with a snapshot);
        when not, ``reason``. Reads only."""
        out: dict[str, Any] = {"snapshots": self.view_mode, "folder": self.view_dir, "keep": self.view_keep}
        why = self.view_unavailable()
        if why is not None:
            return {**out, "available": False, "reason": why}
        current = self._view_current()
        found = _VIEW_NAME.fullmatch(current or "")
        return {
            **out,
            "available": True,
            "link": os.path.join(self.view_dir, VIEW_LINK),
            "current": int(found.group(1)) if found else None,
            "kept": sorted(self._view_epochs()),
        }

    def move_control_dir(self, old: str) -> str:
        """Move the control directory from ``old`` to ``control_dir``; returns a line saying what moved."""
        src = os.path.join(self.root, old)
        if old == self.control_dir:
            raise EpochsyncError(f"target {self.name}: the control directory is already {old!r}")
        if not os.path.isdir(src) or os.path.islink(src):
            if os.path.exists(os.path.join(self.control, "manifest.json")):
                return f"{self.control} already holds the manifest; nothing to move"
            raise EpochsyncError(f"target {self.name}: no control directory {src} to move")
        if os.path.lexists(self.control):
            raise EpochsyncError(f"target {self.name}: {self.control} exists already; move it away first")
        os.rename(src, self.control)
        fsync_dir(self.root)
        return f"moved {src} to {self.control}"

    def finish_rollback(self, epoch: int) -> None:
        """Remove the epoch's scratch folder, if any is left."""
        shutil.rmtree(self.tmp_dir(epoch), ignore_errors=True)
