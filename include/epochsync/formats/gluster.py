"""GlusterFS changelog files (versions 1.1 and 1.2, ascii and binary) → canonical records.

Layout, as the changelog translator writes it (``xlators/features/changelog/src``:
``changelog-encoders.c`` and the ``CHANGELOG_STORE_*``/``CHANGELOG_FILL_*`` macros):

- a header line ``GlusterFS Changelog | version: v1.N | encoding : E\\n`` (E 1 = binary,
  2 = ascii), then records with no newline between them;
- a record is one type byte (``E``, ``M``, ``D``) and the GFID, then each extra field
  preceded by a NUL byte, then a closing NUL. ascii: the GFID is the 36-character UUID
  text and numbers are decimal text; binary: the GFID is 16 raw bytes and numbers (fop,
  mode, uid, gid) are raw 4-byte native-endian integers (``ParseOptions.gluster_byteorder``,
  little-endian by default). An entry field is ``PARGFID/basename`` (binary: 16 raw bytes,
  ``/``, the name);
- ``D``: no extra field. ``M``: the fop number. ``E``: the fop number, then per fop:
  CREATE (23), MKNOD (3), MKDIR (4): mode, uid, gid, entry; LINK (9), SYMLINK (7): entry;
  UNLINK (5), RMDIR (6): entry and, in v1.2 only, one more field: the full path when path
  capture is on, else a NUL standing for the empty path; RENAME (8): old entry, new entry.

Mapping (DESIGN section 3):

- ``E`` → CREAT, MKNOD, MKDIR (``mode``, ``uid``, ``gid``; ``tfid`` = the GFID,
  ``pfid``/``name`` = the entry), HLINK, SLINK (the symlink target is not logged:
  ``symlink`` stays null, read it from the source), UNLNK, RMDIR (the v1.2 full path is
  checked to be text and not kept: the parent GFID and basename say the same), RENME
  (``sfid`` = the GFID, ``spfid``/``sname`` = the old entry, ``pfid``/``name`` = the new
  one; ``tfid`` null: Gluster does not log an overwritten GFID).
- ``M`` → ``XATTR`` for SETXATTR (17), FSETXATTR (36), REMOVEXATTR (19), FREMOVEXATTR (45),
  XATTROP (33), FXATTROP (34); ``SATTR`` for SETATTR (38), FSETATTR (39) and any other
  fop. The record says which kind of attribute changed, never the new value: ``mode``,
  ``uid``, ``gid``, ``size``, times, ``xattr_name`` and ``xattr_value`` stay null and are
  read from the source store at the end of the epoch (for this format, a null
  ``xattr_value`` does not mean "removed").
- ``D`` → ``WRITE`` with no ``extents`` and no ``object``: the whole file changed.
- ``index`` = ``rollover_unix_time * 1_000_000 + ordinal`` (ordinal 1, 2, … in the file;
  the rollover time is the ``<unix-time>`` of the file name ``CHANGELOG.<unix-time>``, or 0
  when the name has none); ``time_ns`` = the rollover time (null when unknown); ``server``
  = ``ParseOptions.server``, default ``brick0``; ``epoch`` = ``ParseOptions.epoch`` if
  fixed, else ``epoch_of_time(time_ns)``, else 0.
- A complete file ends with a synthesized ``EPOCH`` record (next ordinal): the brick has
  written everything of that rollover. A truncated file (the data ends inside a record)
  gets no EPOCH record: its records are yielded, then a ParseError names the byte offset
  of the record that is cut.

Errors name the byte offset (``FILE:@OFFSET: reason``). With ``on_error`` set, a record
that is well formed but invalid (an unsafe name, say) is quarantined and parsing goes on
with the next one; after a malformed record parsing resumes at the next position that
looks like a record start (a NUL followed by ``E``, ``M`` or ``D``), and the bytes
skipped are what gets quarantined.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from typing import IO

from epochsync.core.errors import ParseError, RecordError
from epochsync.core.schema import Record
from epochsync.formats.common import ByteOrder, ParseOptions, RecordChecker, epoch_for, report

DEFAULT_SERVER = "brick0"
#: ordinals per rollover second: index = rollover_time * ORDINALS + ordinal
ORDINALS = 1_000_000

_HEADER = re.compile(rb"GlusterFS Changelog \| version: v(\d+)\.(\d+) \| encoding : (\d+)")
_FILE_TIME = re.compile(r"CHANGELOG\.(\d{1,12})")
_UUID_TEXT = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")

_U = rb"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"
#: the ascii records most epochs are made of, whole and well-formed, in one match each (anything
#: else, or anything these leave in doubt, goes through :meth:`_Reader.record`'s field-by-field path)
_ASCII_D = re.compile(rb"D" + _U + rb"\x00")
_ASCII_M = re.compile(rb"M" + _U + rb"\x00(\d{1,10})\x00")
_ASCII_CREATE = re.compile(
    rb"E" + _U + rb"\x00(\d{1,10})\x00(\d{1,10})\x00(\d{1,10})\x00(\d{1,10})\x00" + _U + rb"/([^\x00]*)\x00"
)

ENCODING_BINARY = 1
ENCODING_ASCII = 2

# glusterfs_fop_t (libglusterfs glusterfs-fops), the numbers that appear in changelogs
GF_FOP_NAMES = (
    "NULL STAT READLINK MKNOD MKDIR UNLINK RMDIR SYMLINK RENAME LINK TRUNCATE OPEN READ WRITE "
    "STATFS FLUSH FSYNC SETXATTR GETXATTR REMOVEXATTR OPENDIR FSYNCDIR ACCESS CREATE FTRUNCATE "
    "FSTAT LK LOOKUP READDIR INODELK FINODELK ENTRYLK FENTRYLK XATTROP FXATTROP FGETXATTR "
    "FSETXATTR RCHECKSUM SETATTR FSETATTR READDIRP FORGET RELEASE RELEASEDIR GETSPEC "
    "FREMOVEXATTR FALLOCATE DISCARD ZEROFILL IPC SEEK LEASE COMPOUND GETACTIVELK SETACTIVELK "
    "PUT ICREATE NAMELINK COPY_FILE_RANGE"
).split()
FOP_MKNOD, FOP_MKDIR, FOP_UNLINK, FOP_RMDIR, FOP_SYMLINK, FOP_RENAME, FOP_LINK = 3, 4, 5, 6, 7, 8, 9
FOP_CREATE = 23
_XATTR_FOPS = frozenset({17, 19, 33, 34, 36, 45})
_ENTRY_TYPES = {
    FOP_CREATE: "CREAT",
    FOP_MKNOD: "MKNOD",
    FOP_MKDIR: "MKDIR",
    FOP_LINK: "HLINK",
    FOP_SYMLINK: "SLINK",
    FOP_UNLINK: "UNLNK",
    FOP_RMDIR: "RMDIR",
    FOP_RENAME: "RENME",
}


class _Truncated(Exception):
    """The data ends inside a record."""


class _Malformed(Exception):
    """A record's bytes do not follow the layout; ``offset`` is where it went wrong."""

    def __init__(self, reason: str, offset: int):
        super().__init__(reason)
        self.reason = reason
        self.offset = offset


def rollover_time(file: str) -> int | None:
    """The ``<unix-time>`` of a ``CHANGELOG.<unix-time>`` file name, or None."""
    m = _FILE_TIME.fullmatch(os.path.basename(file))
    return int(m.group(1)) if m else None


def parse_gluster(stream: IO[bytes], file: str, opts: ParseOptions) -> Iterator[Record]:
    """Yields the records of one Gluster changelog file; see the module docstring for the mapping."""
    data = stream.read()
    server = opts.server or DEFAULT_SERVER
    checker = RecordChecker(opts)
    rollover = rollover_time(file)
    time_ns = None if rollover is None else rollover * 1_000_000_000
    epoch = epoch_for(opts, time_ns)
    base = (rollover or 0) * ORDINALS

    def error(offset: int, reason: str, text: bytes | None = None, index: int | None = None) -> ParseError:
        shown = None if text is None else text.decode("utf-8", "backslashreplace")
        return ParseError(file, None, reason, offset=offset, text=shown, server=server, index=index)

    newline = data.find(b"\n")
    header = data if newline < 0 else data[:newline]
    m = _HEADER.fullmatch(header)
    if m is None or newline < 0:
        what = "truncated header (no newline after it)" if m is not None else "missing header"
        expected = "'GlusterFS Changelog | version: v1.N | encoding : E' and a newline"
        report(opts, error(0, f"{what}: a Gluster changelog starts with {expected}", header[:80]))
        return
    major, minor, encoding = int(m.group(1)), int(m.group(2)), int(m.group(3))
    if (major, minor) not in ((1, 1), (1, 2)):
        report(opts, error(0, f"unsupported changelog version v{major}.{minor} (supported: v1.1, v1.2)", header))
        return
    if encoding not in (ENCODING_BINARY, ENCODING_ASCII):
        report(opts, error(0, f"unknown encoding {encoding} (1 = binary, 2 = ascii)", header))
        return
    if opts.gluster_byteorder not in ("little", "big"):
        raise ValueError(f"gluster_byteorder must be 'little' or 'big', not {opts.gluster_byteorder!r}")
    reader = _Reader(data, encoding == ENCODING_BINARY, minor == 2, opts.gluster_byteorder)

    pos = newline + 1
    ordinal = 0
    while pos < len(data):
        ordinal += 1
        index = base + ordinal
        start = pos
        if ordinal >= ORDINALS:
            report(opts, error(start, f"more than {ORDINALS - 1} records in one changelog file", index=index))
            return
        try:
            rec, pos = reader.record(start)
        except _Truncated:
            report(
                opts,
                error(
                    start,
                    f"truncated record at byte {start}: the file ends at byte {len(data)} inside it",
                    data[start:],
                    index,
                ),
            )
            return
        except _Malformed as exc:
            resume = reader.resync(start + 1)
            report(opts, error(start, f"{exc.reason} (at byte {exc.offset})", data[start:resume], index))
            pos = resume
            continue
        rec.server, rec.index, rec.epoch, rec.time_ns = server, index, epoch, time_ns
        try:
            checker.check(rec)
        except RecordError as exc:
            report(opts, error(start, str(exc), data[start:pos], index))
            continue
        yield rec
    closing = Record(server=server, index=base + ordinal + 1, epoch=epoch, type="EPOCH", time_ns=time_ns)
    try:
        checker.check(closing)
    except RecordError as exc:
        report(opts, error(len(data), f"closing EPOCH record: {exc}", index=closing.index))
        return
    yield closing


def header_end(data: bytes) -> int:
    """The offset of the first record of a changelog file (just past its header line); raises
    :class:`ParseError`-free ValueError when ``data`` does not start with a Gluster header."""
    newline = data.find(b"\n")
    if newline < 0 or _HEADER.fullmatch(data[:newline]) is None:
        raise ValueError("not a Gluster changelog: missing header line")
    return newline + 1


def scan_records(
    data: bytes, start: int | None = None, *, byteorder: ByteOrder = "little"
) -> tuple[list[tuple[int, Record]], int]:
    """The records of a changelog file's bytes from ``start`` (default: its first record), each
    with its byte offset, and the offset where the whole records end.

    Unlike :func:`parse_gluster` this keeps no index, epoch or server (the caller's cut gives
    them) and stops quietly at a record the data ends inside (a live file caught mid-write):
    the returned end is then that record's start, so reading again from there continues it.
    A malformed record raises :class:`_Malformed`'s reason as a ValueError with its offset.
    """
    first = header_end(data)
    m = _HEADER.fullmatch(data[: first - 1])
    assert m is not None
    reader = _Reader(data, int(m.group(3)) == ENCODING_BINARY, int(m.group(2)) == 2, byteorder)
    pos = first if start is None else max(start, first)
    out: list[tuple[int, Record]] = []
    while pos < len(data):
        try:
            rec, end = reader.record(pos)
        except _Truncated:
            break
        except _Malformed as exc:
            raise ValueError(f"{exc.reason} (at byte {exc.offset})") from None
        out.append((pos, rec))
        pos = end
    return out, pos


class _Reader:
    """Reads one record at a time from the bytes after the header."""

    def __init__(self, data: bytes, binary: bool, v12: bool, byteorder: ByteOrder):
        self.data = data
        self.binary = binary
        self.v12 = v12
        self.byteorder = byteorder

    # -- primitives ---------------------------------------------------------------
    def _need(self, pos: int, n: int) -> bytes:
        chunk = self.data[pos : pos + n]
        if len(chunk) < n:
            raise _Truncated()
        return chunk

    def _sep(self, pos: int, after: str) -> int:
        byte = self._need(pos, 1)
        if byte != b"\x00":
            raise _Malformed(f"expected a NUL separator after the {after}, found {byte!r}", pos)
        return pos + 1

    def _cstr(self, pos: int) -> tuple[bytes, int]:
        """Bytes up to (not including) the next NUL; the NUL is not consumed."""
        end = self.data.find(b"\x00", pos)
        if end < 0:
            raise _Truncated()
        return self.data[pos:end], end

    def _gfid(self, pos: int) -> tuple[str, int]:
        if self.binary:
            raw = self._need(pos, 16)
            return str(uuid.UUID(bytes=raw)), pos + 16
        text = self._need(pos, 36)
        if _UUID_TEXT.fullmatch(text) is None:
            raise _Malformed(f"bad GFID {text!r} (expected a lowercase UUID)", pos)
        return text.decode("ascii"), pos + 36

    def _number(self, pos: int, what: str) -> tuple[int, int]:
        if self.binary:
            return int.from_bytes(self._need(pos, 4), self.byteorder), pos + 4
        digits, end = self._cstr(pos)
        if not digits or not digits.isdigit() or len(digits) > 10:
            raise _Malformed(f"bad {what} {digits[:20]!r} (expected a decimal number)", pos)
        value = int(digits)
        if value > 0xFFFFFFFF:
            raise _Malformed(f"{what} {value} does not fit in 32 bits", pos)
        return value, end

    def _entry(self, pos: int) -> tuple[str, str, int]:
        """``PARGFID/basename`` → (parent gfid, name, end)."""
        pargfid, pos = self._gfid(pos)
        slash = self._need(pos, 1)
        if slash != b"/":
            raise _Malformed(f"expected '/' after the parent GFID, found {slash!r}", pos)
        raw, end = self._cstr(pos + 1)
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _Malformed(f"entry name {raw[:40]!r} is not valid UTF-8", pos + 1) from None
        return pargfid, name, end

    # -- records ------------------------------------------------------------------
    def record(self, pos: int) -> tuple[Record, int]:
        """The record at ``pos`` (epoch, index, server filled in by the caller) and its end."""
        if not self.binary:
            fast = self._ascii_record(pos)
            if fast is not None:
                return fast
        kind = self._need(pos, 1)
        if kind not in (b"E", b"M", b"D"):
            raise _Malformed(f"unknown record type byte {kind!r} (expected E, M or D)", pos)
        gfid, p = self._gfid(pos + 1)
        p = self._sep(p, "GFID")
        rec = Record(server="", index=0, epoch=0, type="WRITE", tfid=gfid)
        if kind == b"D":
            return rec, p
        fop_at = p
        fop, p = self._number(p, "fop number")
        fop_name = GF_FOP_NAMES[fop] if fop < len(GF_FOP_NAMES) else None
        if kind == b"M":
            if fop_name is None or fop == 0:
                raise _Malformed(f"unknown fop number {fop} in an M record", fop_at)
            rec.type = "XATTR" if fop in _XATTR_FOPS else "SATTR"
            return rec, self._sep(p, "fop number")
        rtype = _ENTRY_TYPES.get(fop)
        if rtype is None:
            shown = f"{fop} ({fop_name})" if fop_name else str(fop)
            raise _Malformed(f"E record with fop {shown}, which is not an entry operation", fop_at)
        rec.type = rtype
        if fop in (FOP_CREATE, FOP_MKNOD, FOP_MKDIR):
            p = self._sep(p, "fop number")
            rec.mode, p = self._number(p, "mode")
            p = self._sep(p, "mode")
            rec.uid, p = self._number(p, "uid")
            p = self._sep(p, "uid")
            rec.gid, p = self._number(p, "gid")
            p = self._sep(p, "gid")
        else:
            p = self._sep(p, "fop number")
        pargfid, name, p = self._entry(p)
        if fop == FOP_RENAME:
            rec.sfid, rec.tfid = gfid, None
            rec.spfid, rec.sname = pargfid, name
            p = self._sep(p, "old entry")
            rec.pfid, rec.name, p = self._entry(p)
        else:
            rec.pfid, rec.name = pargfid, name
            if self.v12 and fop in (FOP_UNLINK, FOP_RMDIR):
                p = self._sep(p, "entry")
                if self._need(p, 1) == b"\x00":
                    p += 1  # a NUL stands for "no path captured"
                else:
                    raw, p = self._cstr(p)
                    try:
                        raw.decode("utf-8")
                    except UnicodeDecodeError:
                        raise _Malformed(f"deleted path {raw[:40]!r} is not valid UTF-8", p - len(raw)) from None
        return rec, self._sep(p, "last field")

    def _ascii_record(self, pos: int) -> tuple[Record, int] | None:
        """A data, metadata or create-like record at ``pos`` read with one regular expression: the
        same record :meth:`record` reads field by field, or None for any other (or bad) record."""
        data = self.data
        kind = data[pos : pos + 1]
        if kind == b"D":
            m = _ASCII_D.match(data, pos)
            if m is not None:
                return Record(server="", index=0, epoch=0, type="WRITE", tfid=m.group(1).decode("ascii")), m.end()
        elif kind == b"M":
            m = _ASCII_M.match(data, pos)
            if m is not None:
                fop_n = int(m.group(2))
                if 0 < fop_n < len(GF_FOP_NAMES):
                    rtype = "XATTR" if fop_n in _XATTR_FOPS else "SATTR"
                    return Record(server="", index=0, epoch=0, type=rtype, tfid=m.group(1).decode("ascii")), m.end()
        elif kind == b"E":
            m = _ASCII_CREATE.match(data, pos)
            if m is not None:
                gfid, fop, mode, uid, gid, pargfid, raw = m.groups()
                fop_n, mode_n, uid_n, gid_n = int(fop), int(mode), int(uid), int(gid)
                if fop_n in (FOP_CREATE, FOP_MKNOD, FOP_MKDIR) and max(mode_n, uid_n, gid_n) <= 0xFFFFFFFF:
                    try:
                        name = raw.decode("utf-8")
                    except UnicodeDecodeError:
                        return None
                    rec = Record(
                        server="",
                        index=0,
                        epoch=0,
                        type=_ENTRY_TYPES[fop_n],
                        tfid=gfid.decode("ascii"),
                        pfid=pargfid.decode("ascii"),
                        name=name,
                        mode=mode_n,
                        uid=uid_n,
                        gid=gid_n,
                    )
                    return rec, m.end()
        return None

    def resync(self, pos: int) -> int:
        """The next position at or after ``pos`` that looks like a record start, else the end.

        A record start is a type byte (E, M, D) right after a NUL. In ascii no field holds a
        NUL and no field starts with those letters, so this finds the next record; in binary
        raw integers and GFIDs can hold the same bytes, so it is a best effort.
        """
        data = self.data
        while True:
            nul = data.find(b"\x00", max(pos - 1, 0))
            if nul < 0 or nul + 1 >= len(data):
                return len(data)
            cand = nul + 1
            if data[cand : cand + 1] in (b"E", b"M", b"D") and (not self.binary or cand + 17 <= len(data)):
                return cand
            pos = cand + 1
