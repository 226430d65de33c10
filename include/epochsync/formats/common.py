"""What every importer shares: options, record validation, index order, quarantine."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from epochsync.errors import ParseError, RecordError
from epochsync.names import check_basename
from epochsync.schema import NAMING_TYPES, RECORD_TYPES, UNNAMING_TYPES, Record


@dataclass
class ParseOptions:
    #: server name for records whose format does not carry one (Lustre text, Gluster)
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


class RecordChecker:
    """Checks a stream of records: known type, safe names, strictly increasing index.

    ``check`` raises RecordError (no location: the importer adds FILE:LINE).
    """

    def __init__(self, opts: ParseOptions):
        self.last_index: dict[str, int] = dict(opts.after_index or {})

    def check(self, r: Record) -> Record:
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
        if r.type in NAMING_TYPES | UNNAMING_TYPES and not r.pfid:
            raise RecordError(f"{r.type} without a parent fid")
        if r.type == "SLINK" and r.symlink is not None and "\x00" in r.symlink:
            raise RecordError("SLINK target contains a NUL byte")
        last = self.last_index.get(r.server)
        if last is not None and r.index <= last:
            raise RecordError(f"index {r.index} of server {r.server} goes backwards (after {last})")
        self.last_index[r.server] = r.index
        return r


def report(opts: ParseOptions, error: ParseError) -> None:
    """Raise ``error``, or quarantine it when the caller asked to go on."""
    if opts.on_error is None:
        raise error
    opts.on_error(error)
