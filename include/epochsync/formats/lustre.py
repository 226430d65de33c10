"""Lustre ``lfs changelog`` text → canonical records.

One record per line (formats.md)::

    INDEX NNTYPE HH:MM:SS.NNNNNNNNN YYYY.MM.DD 0xFLAGS t=[FID] [j=JOBID] [ef=0xEXTRA]
          [u=UID:GID] [nid=NID] [m=MODE] [x=XATTR] [p=[PFID]] [NAME] [s=[SFID] sp=[SPFID] SNAME]

How each part lands in the canonical record:

- ``INDEX`` → ``index``. A line printed without one (the HSM example of the manual) gets
  the previous index of its server + 1 (after the consumer cursor ``after_index`` if no
  record came before it; 1 if nothing is known).
- ``NN`` and ``TYPE`` → ``type`` (the name; number and name must agree). All 25 types
  0 MARK … 24 NOPEN are accepted; the type name may be padded (``00MARK  ``) or squeezed.
- time ``HH:MM:SS.NNNNNNNNN YYYY.MM.DD`` is UTC → ``time_ns``; old releases print one
  integer ``seconds << 30 | nanoseconds`` instead, decoded the same way.
- ``0xFLAGS`` → ``flags`` as given (12 bits). ``m=`` (open mode, ``rwx`` letters or ``-``)
  adds ``FLAG_OPEN_READ/WRITE/EXEC`` (formats.common) above those bits:
  ``formats.common.opened_for_write(record)`` tells an open (or close) for write.
- ``t=`` → ``tfid``; ``p=`` → ``pfid``; the name (the rest of the line up to
  `` s=[``, spaces allowed) → ``name``; ``j=`` → ``jobid``; ``u=UID:GID`` → ``uid``/``gid``
  (who did the operation, not necessarily the new owner: attribute values are read from
  the source store); ``nid=`` → ``nid``; ``x=`` → ``xattr_name`` (``xattr_value`` stays
  null: Lustre does not log values, and for this format null means "read it from the
  source", not "removed"); ``ef=`` only says which of those follow and is not kept.
- ``RENME``: ``p=`` + first name = the new location (``pfid``/``name``), ``s=`` = the
  renamed fid (``sfid``), ``sp=`` + last name = the old location (``spfid``/``sname``),
  ``t=`` = the fid the rename overwrote (``tfid``, null if none).
- ``[0:0x0:0x0]`` is "none": the field is null. FIDs are written in Lustre's own
  ``DFID`` spelling (``[0x200000402:0x1:0x0]``; a zero sequence prints as ``0``).
- Full-path names (some managed services print ``/dir/name`` as the name of UNLNK,
  RMDIR and rename sources): the parent fid is given, so the basename is kept in
  ``name``/``sname`` and checked like any other name.
- ``server`` = ``ParseOptions.server``, default ``MDT0000``.
- ``epoch``: ``ParseOptions.epoch`` if fixed; else with ``epochs_from_marks`` the k-th
  MARK closes epoch ``first_epoch + k - 1`` (the MARK is kept, in the epoch it closes, and
  followed by a synthesized ``EPOCH`` record with the same index and time); else the time
  window ``epoch_of_time(time_ns)``; else 0.

Not supported, and reported as an error on the line: the pre-2.4 two-record rename
(``RENME`` without ``s=``/``sp=`` followed by ``RNMTO``); ``RNMTO`` records themselves
are kept as they are and ignored by replication. Lines must be UTF-8.
"""

from __future__ import annotations

import re
from calendar import timegm
from collections.abc import Iterator
from typing import IO

from epochsync.core.errors import ParseError, RecordError
from epochsync.core.names import check_basename
from epochsync.core.schema import INT64_MAX, LUSTRE_TYPES, Record
from epochsync.formats.common import (
    FLAG_OPEN_EXEC,
    FLAG_OPEN_READ,
    FLAG_OPEN_WRITE,
    LUSTRE_FLAG_MASK,
    ParseOptions,
    RecordChecker,
    epoch_for,
    iter_lines,
    report,
)

DEFAULT_SERVER = "MDT0000"

_FID = r"\[(?:0x)?[0-9a-fA-F]{1,16}:(?:0x)?[0-9a-fA-F]{1,8}:(?:0x)?[0-9a-fA-F]{1,8}\]"
#: a fid already spelled as Lustre's DFID prints it (non-zero sequence, lowercase hex)
_DFID = re.compile(r"\[0x[1-9a-f][0-9a-f]*:0x(?:0|[1-9a-f][0-9a-f]*):0x(?:0|[1-9a-f][0-9a-f]*)\]")
_HEAD = re.compile(
    r"(?:(?P<index>[0-9]+) +)?(?P<num>[0-9]{2})(?P<tname>[A-Z]+) +"
    r"(?:(?P<clock>[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{1,9}) +(?P<date>[0-9]{4}\.[0-9]{2}\.[0-9]{2})"
    r"|(?P<raw>[0-9]+)) +"
    r"(?P<flags>0x[0-9a-fA-F]+) +t=(?P<tfid>" + _FID + r")"
)
_FIELD = re.compile(r" (?P<key>j|ef|u|nid|m|x)=(?P<value>[^ ]*)")
_PARENT = re.compile(r" p=(?P<pfid>" + _FID + r")")
_RENAME_TAIL = re.compile(r"(?:(?P<name>.*) )?s=(?P<sfid>" + _FID + r") sp=(?P<spfid>" + _FID + r")(?: (?P<sname>.*))?")
_UIDGID = re.compile(r"([0-9]{1,10}):([0-9]{1,10})")
_OPEN_MODE = re.compile(r"[r-][w-][x-]")

#: types whose name is a path entry (checked as a basename; full paths reduced)
_ENTRY_TYPES = frozenset({"CREAT", "MKDIR", "HLINK", "SLINK", "MKNOD", "UNLNK", "RMDIR", "RENME", "RNMTO"})
#: types some servers print a full path for (formats.md)
_FULL_PATH_TYPES = frozenset({"UNLNK", "RMDIR"})
_TYPE_NUMBERS = {name: num for num, name in LUSTRE_TYPES.items()}


def parse_lustre(stream: IO[bytes], file: str, opts: ParseOptions) -> Iterator[Record]:
    """Yields the records of ``lfs changelog`` text; see the module docstring for the mapping.

    Raises :class:`ParseError` (``FILE:LINE: reason``) on the first bad line, or hands it
    to ``opts.on_error`` and goes on.
    """
    server = opts.server or DEFAULT_SERVER
    checker = RecordChecker(opts)
    marks = checker.context.mark_epoch
    offset = 0
    for lineno, raw in enumerate(iter_lines(stream), 1):
        line_offset = offset
        offset += len(raw)
        line = raw.rstrip(b"\n").rstrip(b"\r")
        if not line.strip():
            continue
        text = line.decode("utf-8", "backslashreplace")
        index = None
        try:
            rec = _parse_line(line, server, checker)
            index = rec.index
            if opts.epoch is not None:
                rec.epoch = opts.epoch
            elif opts.epochs_from_marks:
                rec.epoch = marks.get(server, opts.first_epoch)
            else:
                rec.epoch = epoch_for(opts, rec.time_ns)
            checker.check(rec)
        except RecordError as exc:
            index = getattr(exc, "index", index)
            report(
                opts,
                ParseError(file, lineno, str(exc), offset=line_offset, text=text, server=server, index=index),
            )
            continue
        yield rec
        if rec.type == "MARK" and opts.epoch is None and opts.epochs_from_marks:
            closing = epoch_record_of_mark(rec)
            checker.check(closing)
            marks[server] = rec.epoch + 1
            yield closing


def epoch_record_of_mark(mark: Record) -> Record:
    """The EPOCH record a MARK stands for: same server, index and time, the MARK's epoch."""
    return Record(server=mark.server, index=mark.index, epoch=mark.epoch, type="EPOCH", time_ns=mark.time_ns)


def _parse_line(line: bytes, server: str, checker: RecordChecker) -> Record:
    """One line → a Record with epoch 0 (the caller sets it). Raises RecordError."""
    if b"\x00" in line:
        raise RecordError("line contains a NUL byte")
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecordError(f"line is not valid UTF-8 (byte {exc.start} of the line)") from None
    m = _HEAD.match(text)
    if m is None:
        raise RecordError(_why_head_fails(text))
    if m.group("index") is not None:
        index = _bounded_int(m.group("index"), "index", INT64_MAX)
    else:
        index = checker.next_index(server)
    try:
        rtype = _record_type(m.group("num"), m.group("tname"))
        time_ns = _clock_time(m.group("clock"), m.group("date")) if m.group("clock") else _raw_time(m.group("raw"))
        flags = int(m.group("flags"), 16) if len(m.group("flags")) <= 18 else LUSTRE_FLAG_MASK + 1
        if flags > LUSTRE_FLAG_MASK:
            raise RecordError(f"flags {m.group('flags')} out of range (Lustre flags fit in 0xffff)")
        rec = Record(server=server, index=index, epoch=0, type=rtype, time_ns=time_ns, flags=flags)
        return _parse_fields(rec, text, m)
    except RecordError as exc:
        exc.index = index  # the quarantine entry names the record's index when the line has one
        raise


def _parse_fields(rec: Record, text: str, m: re.Match) -> Record:
    """Everything after the time and flags: t=, the key=value fields, p=, names."""
    rtype = rec.type
    tfid = _fid(m.group("tfid"))

    pos = m.end()
    seen: set[str] = set()
    while True:
        f = _FIELD.match(text, pos)
        if f is None:
            break
        key, value = f.group("key"), f.group("value")
        if key in seen:
            raise RecordError(f"field {key}= appears twice")
        seen.add(key)
        _apply_field(rec, key, value)
        pos = f.end()
    pfid = None
    p = _PARENT.match(text, pos)
    if p is not None:
        pfid = _fid(p.group("pfid"))
        pos = p.end()
    rest = text[pos:]
    name = sname = sfid = spfid = None
    if rest:
        if not rest.startswith(" "):
            raise RecordError(f"unexpected text {_clip(rest)!r} after the fields")
        rest = rest[1:]
        tail = _RENAME_TAIL.fullmatch(rest) if " sp=[" in rest else None
        if tail is not None:
            name, sname = tail.group("name"), tail.group("sname")
            sfid, spfid = _fid(tail.group("sfid")), _fid(tail.group("spfid"))
        else:
            name = rest

    if rtype == "RENME":
        if sfid is None and spfid is None and sname is None:
            raise RecordError("RENME without s=/sp= (the old two-record RENME/RNMTO rename format is not supported)")
        rec.tfid = tfid  # the fid the rename overwrote, if any
        rec.sfid, rec.spfid = sfid, spfid
        rec.sname = _entry_name(sname, "RENME old name", full_path_ok=True)
        rec.pfid, rec.name = pfid, _entry_name(name, "RENME name", full_path_ok=False)
        return rec
    if sfid is not None or spfid is not None:
        raise RecordError(f"s=/sp= on a {rtype} record (only RENME carries them)")
    rec.tfid, rec.pfid = tfid, pfid
    if rtype in _ENTRY_TYPES:
        rec.name = _entry_name(name, f"{rtype} name", full_path_ok=rtype in _FULL_PATH_TYPES)
    else:
        rec.name = name or None
    return rec


def _entry_name(name: str | None, what: str, *, full_path_ok: bool) -> str:
    """A directory entry name, reduced to its basename when a full path was printed."""
    if full_path_ok and name is not None and name.startswith("/"):
        name = name.rsplit("/", 1)[1]
    return check_basename(name, what)


def _apply_field(rec: Record, key: str, value: str) -> None:
    if key == "j":
        rec.jobid = value
    elif key == "ef":
        if re.fullmatch(r"0x[0-9a-fA-F]{1,16}", value) is None:
            raise RecordError(f"bad ef= value {_clip(value)!r} (expected 0x followed by hex digits)")
    elif key == "u":
        ug = _UIDGID.fullmatch(value)
        if ug is None:
            raise RecordError(f"bad u= value {_clip(value)!r} (expected UID:GID)")
        rec.uid = _bounded_int(ug.group(1), "uid", 2**32 - 1)
        rec.gid = _bounded_int(ug.group(2), "gid", 2**32 - 1)
    elif key == "nid":
        if not value:
            raise RecordError("empty nid=")
        rec.nid = value
    elif key == "m":
        if _OPEN_MODE.fullmatch(value) is None:
            raise RecordError(f"bad m= open mode {_clip(value)!r} (expected three of r/w/x or -, like -w-)")
        bits = (FLAG_OPEN_READ, FLAG_OPEN_WRITE, FLAG_OPEN_EXEC)
        for letter, bit in zip(value, bits):
            if letter != "-":
                rec.flags = (rec.flags or 0) | bit
    elif key == "x":
        if not value:
            raise RecordError("empty x= xattr name")
        rec.xattr_name = value


def _record_type(num: str, tname: str) -> str:
    n = int(num)
    expected = LUSTRE_TYPES.get(n)
    if expected is None:
        raise RecordError(f"unknown changelog type {num}{tname} (known types are 00 MARK to 24 NOPEN)")
    if tname != expected:
        if tname in _TYPE_NUMBERS:
            raise RecordError(f"type number {num} is {expected} but the name says {tname}")
        raise RecordError(f"unknown changelog type name {tname!r} for type {num} (expected {expected})")
    return expected


def _clock_time(clock: str, date: str) -> int:
    h, mi, s = int(clock[0:2]), int(clock[3:5]), int(clock[6:8])
    if h > 23 or mi > 59 or s > 60:
        raise RecordError(f"bad time {clock}")
    day_start = _DAY_STARTS.get(date)
    if day_start is None:
        day_start = _day_start(date)
    return (day_start + h * 3600 + mi * 60 + s) * 1_000_000_000 + int(clock[9:].ljust(9, "0"))


#: date text -> seconds of its midnight UTC (a changelog holds few distinct dates)
_DAY_STARTS: dict[str, int] = {}


def _day_start(date: str) -> int:
    year, month, day = (int(x) for x in date.split("."))
    if not (1970 <= year and 1 <= month <= 12 and 1 <= day <= _days_in(year, month)):
        raise RecordError(f"bad date {date}")
    if len(_DAY_STARTS) > 10_000:
        _DAY_STARTS.clear()
    _DAY_STARTS[date] = seconds = timegm((year, month, day, 0, 0, 0, 0, 0, 0))
    return seconds


def _days_in(year: int, month: int) -> int:
    if month == 2:
        return 29 if (year % 4 == 0 and year % 100 != 0) or year % 400 == 0 else 28
    return 30 if month in (4, 6, 9, 11) else 31


def _raw_time(raw: str) -> int:
    """Old releases: one integer ``seconds << 30 | nanoseconds``."""
    value = _bounded_int(raw, "raw time", 2**64 - 1)
    seconds, nanos = value >> 30, value & ((1 << 30) - 1)
    if nanos >= 1_000_000_000:
        raise RecordError(f"raw time {raw} has {nanos} nanoseconds (not seconds << 30 | nanoseconds)")
    ns = seconds * 1_000_000_000 + nanos
    if ns > INT64_MAX:
        raise RecordError(f"raw time {raw} is out of range")
    return ns


def _fid(text: str) -> str | None:
    """Lustre's DFID spelling, or None for the zero fid ``[0:0x0:0x0]``."""
    if _DFID.fullmatch(text) is not None:
        return text  # already in DFID spelling (the usual case): nothing to rewrite
    seq, oid, ver = (int(part, 16) for part in text[1:-1].split(":"))
    if seq == 0 and oid == 0 and ver == 0:
        return None
    return f"[{seq:#x}:{oid:#x}:{ver:#x}]" if seq else f"[0:{oid:#x}:{ver:#x}]"


def _bounded_int(digits: str, what: str, hi: int) -> int:
    if len(digits) > 20:
        raise RecordError(f"{what} {_clip(digits)} is out of range")
    value = int(digits)
    if value > hi:
        raise RecordError(f"{what} {digits} is out of range (at most {hi})")
    return value


def _why_head_fails(text: str) -> str:
    """Name the first part of a line that does not look like ``lfs changelog`` output."""
    m = re.match(r"(?:([0-9]+) +)?([0-9]{2})([A-Z]+)", text)
    if m is None:
        return f"not an lfs changelog line (expected 'INDEX NNTYPE TIME DATE 0xFLAGS t=[FID] ...'): {_clip(text)!r}"
    try:
        _record_type(m.group(2), m.group(3))
    except RecordError as exc:
        return str(exc)
    return f"bad time, flags or t=[FID] in {_clip(text)!r}"


def _clip(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[:n] + "..."
