"""What every importer shares: options, record validation, index order, quarantine.

Importer flag bits. Lustre keeps its per-type flags in the low 12 bits of ``flags``
(``CLF_FLAGMASK`` = 0x0FFF) and importers keep them as given; the bits below sit above
them, so they never collide:

- ``FLAG_OPEN_READ`` / ``FLAG_OPEN_WRITE`` / ``FLAG_OPEN_EXEC``: the ``m=`` open mode of a
  Lustre ``OPEN``/``NOPEN``/``CLOSE`` record (``m=-w-`` sets ``FLAG_OPEN_WRITE``). Use
  :func:`opened_for_write` to ask whether a record is an open (or close) for write.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Literal

from epochsync.core.errors import ParseError, RecordError
from epochsync.core.names import check_basename
from epochsync.core.schema import NAMING_TYPES, RECORD_TYPES, UNNAMING_TYPES, Record

#: ``m=`` open-mode letters, as flag bits above Lustre's 12 flag bits.
FLAG_OPEN_READ = 0x10000
FLAG_OPEN_WRITE = 0x20000
FLAG_OPEN_EXEC = 0x40000
#: Lustre's own per-type flags (``CLF_FLAGMASK`` is 0x0FFF) must fit below the importer bits.
LUSTRE_FLAG_MASK = 0xFFFF

#: ``O_ACCMODE`` values of open(2) flags: Lustre OPEN/CLOSE flags are the open flags.
_O_ACCMODE = 0x3
_O_WRONLY = 0x1
_O_RDWR = 0x2

#: the byte order of a Gluster binary changelog's raw integers (``int.from_bytes``'s names)
ByteOrder = Literal["little", "big"]


def opened_for_write(record: Record) -> bool:
    """True if ``record`` is an OPEN/NOPEN/CLOSE of a file opened for writing.

    Uses the ``m=`` open mode when the changelog printed one (``FLAG_OPEN_*``), else the
    access mode of the open(2) flags Lustre keeps in ``flags`` (``O_WRONLY``/``O_RDWR``).
    """
    if record.type not in ("OPEN", "NOPEN", "CLOSE") or record.flags is None:
        return False
    if record.flags & (FLAG_OPEN_READ | FLAG_OPEN_WRITE | FLAG_OPEN_EXEC):
        return bool(record.flags & FLAG_OPEN_WRITE)
    return (record.flags & _O_ACCMODE) in (_O_WRONLY, _O_RDWR)


@dataclass
class ParseContext:
    """State that carries from one file to the next of the same stream of files.

    Pass the same context in the ``ParseOptions`` of consecutive files of one server
    (read in name order) so the index order is checked across files and MARK epochs keep
    counting. Importers update it as they go.
    """

    #: server -> last index accepted
    last_index: dict[str, int] = field(default_factory=dict)
    #: server -> type of the record that had that index (a synthesized EPOCH shares
    #: the index of the MARK it comes from)
    last_type: dict[str, str] = field(default_factory=dict)
    #: server -> the epoch the next record belongs to (Lustre MARK epochs)
    mark_epoch: dict[str, int] = field(default_factory=dict)


@dataclass
class ParseOptions:
    #: server name for records whose format does not carry one (Lustre text: default
    #: ``MDT0000``; Gluster: default ``brick0``); JSON Lines: only fills a missing server
    """How an importer reads a stream: defaults the format lacks (server, epoch), error handling, continuity."""

    server: str | None = None
    #: fixed epoch for every record (``--epoch N``); overrides the other sources
    epoch: int | None = None
    #: epoch from a record's time (time-window epochs): ns since 1970 → epoch
    epoch_of_time: Callable[[int], int] | None = None
    #: Lustre: MARK records delimit epochs; records after the k-th MARK are in
    #: epoch ``first_epoch + k`` and each MARK is reported as the EPOCH record of the
    #: epoch it closes
    epochs_from_marks: bool = False
    first_epoch: int = 1
    #: the consumer cursor per server: the first index must be above it
    after_index: dict[str, int] | None = None
    #: quarantine sink; ``None`` means the first bad line raises ParseError
    on_error: Callable[[ParseError], None] | None = None
    #: carried state for a sequence of files (see :class:`ParseContext`); None = this
    #: file stands alone
    context: ParseContext | None = None
    #: Gluster binary encoding: byte order of the raw integers ("little" on x86/ARM)
    gluster_byteorder: ByteOrder = "little"


class RecordChecker:
    """Checks a stream of records: known type, safe names, strictly increasing index.

    ``check`` raises RecordError (no location: the importer adds FILE:LINE). The one
    exception to "strictly increasing": an ``EPOCH`` record may repeat the index of the
    ``MARK`` record just before it (Lustre MARK epochs synthesize one EPOCH per MARK).
    """

    def __init__(self, opts: ParseOptions):
        ctx = opts.context
        if ctx is None:
            ctx = ParseContext()
        for server, index in (opts.after_index or {}).items():
            # the cursor only ever raises the bar: a context that is further along wins
            if ctx.last_index.get(server, index - 1) < index:
                ctx.last_index[server] = index
                ctx.last_type.pop(server, None)
        self.context = ctx
        self.last_index = ctx.last_index
        self.last_type = ctx.last_type

    def next_index(self, server: str) -> int:
        """The index a record printed without one gets: the previous index + 1 (or 1)."""
        return self.last_index.get(server, 0) + 1

    def check(self, r: Record) -> Record:
        """Returns ``r`` once it is a valid record that continues its server's index order; raises
        :class:`RecordError` otherwise."""
        if r.type not in RECORD_TYPES:
            raise RecordError(f"unknown record type {r.type!r}")
        if r.index < 0:
            raise RecordError(f"negative index {r.index}")
        if r.epoch < 0:
            raise RecordError(f"negative epoch {r.epoch}")
        if r.type in NAMING_TYPES:
            check_basename(r.name, f"{r.type} name")
        elif r.type in UNNAMING_TYPES and r.name is not None:
            check_basename(r.name, f"{r.type} name")
        if r.type == "RENME":
            check_basename(r.sname, "RENME old name")
            if not r.sfid:
                raise RecordError("RENME without the renamed fid (s=)")
            if not r.spfid:
                raise RecordError("RENME without the old parent fid (sp=)")
        if r.type in NAMING_TYPES | UNNAMING_TYPES and not r.pfid:
            raise RecordError(f"{r.type} without a parent fid")
        if r.type == "SLINK" and r.symlink is not None and "\x00" in r.symlink:
            raise RecordError("SLINK target contains a NUL byte")
        last = self.last_index.get(r.server)
        if last is not None and r.index <= last:
            epoch_of_mark = r.type == "EPOCH" and r.index == last and self.last_type.get(r.server) == "MARK"
            if not epoch_of_mark:
                raise RecordError(f"index {r.index} of server {r.server} goes backwards (after {last})")
        self.last_index[r.server] = r.index
        self.last_type[r.server] = r.type
        return r


def iter_lines(stream: IO[bytes], block: int = 1 << 20) -> Iterator[bytes]:
    """The lines of a binary stream, each with its ``\\n`` (the last one may lack it).

    Reads with ``read(block)`` only, because iterating some streams does not yield lines:
    a botocore ``StreamingBody`` (an S3 object's body) yields 1 KiB chunks.
    """
    pending = b""
    while True:
        chunk = stream.read(block)
        if not chunk:
            break
        lines = (pending + chunk if pending else chunk).split(b"\n")
        pending = lines.pop()
        for line in lines:
            yield line + b"\n"
    if pending:
        yield pending


def report(opts: ParseOptions, error: ParseError) -> None:
    """Raise ``error``, or quarantine it when the caller asked to go on."""
    if opts.on_error is None:
        raise error
    opts.on_error(error)


def epoch_for(opts: ParseOptions, time_ns: int | None) -> int:
    """The epoch of a record when the format carries none and MARKs do not apply.

    A fixed ``opts.epoch`` wins; else the time window of ``time_ns``; else epoch 0.
    """
    if opts.epoch is not None:
        return opts.epoch
    if opts.epoch_of_time is not None and time_ns is not None:
        return opts.epoch_of_time(time_ns)
    return 0
