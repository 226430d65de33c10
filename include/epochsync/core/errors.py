"""Errors a person can act on: each names what failed and where.

Each class has its own exit status (``exit_code``; a subclass keeps its parent's unless it
says otherwise), so a cron job or an alert can tell "not closed yet" from "config wrong" or
"store refused" without reading the message: :data:`EXIT_CODES` is the table the CLI
reference shows.
"""

from __future__ import annotations


class EpochsyncError(Exception):
    """Base class: every error the CLI prints as one line and exits non-zero on."""

    #: the CLI's exit status for this class of error
    exit_code = 1


class RecordError(EpochsyncError):
    """A record is invalid. Raised without a location; parsers wrap it in ParseError."""

    exit_code = 9


class ParseError(EpochsyncError):
    """A changelog line or byte range that cannot become a canonical record.

    ``str()`` is ``FILE:LINE: reason`` (``FILE:@OFFSET: reason`` for binary input).
    """

    exit_code = 9

    def __init__(
        self,
        file: str,
        line: int | None,
        reason: str,
        *,
        offset: int | None = None,
        text: str | None = None,
        server: str | None = None,
        index: int | None = None,
    ):
        self.file = file
        self.line = line
        self.reason = reason
        self.offset = offset
        self.text = text
        self.server = server
        self.index = index
        super().__init__(self.location() + ": " + reason)

    def location(self) -> str:
        """Returns where the error is: ``FILE:LINE``, ``FILE:@OFFSET`` (a binary format) or the file alone."""
        if self.line is not None:
            return f"{self.file}:{self.line}"
        if self.offset is not None:
            return f"{self.file}:@{self.offset}"
        return self.file

    def to_dict(self) -> dict:
        """The quarantine entry: where, why, and the offending text."""
        return {
            "file": self.file,
            "line": self.line,
            "offset": self.offset,
            "server": self.server,
            "index": self.index,
            "reason": self.reason,
            "text": self.text,
        }


class ConfigError(EpochsyncError):
    """The YAML config is wrong: names the file and the key path."""

    exit_code = 3

    def __init__(self, file: str, key: str, reason: str):
        self.file = file
        self.key = key
        self.reason = reason
        super().__init__(f"{file}: {key}: {reason}")


class StoreError(EpochsyncError):
    """An object store (S3) or target could not be reached or refused a request."""

    exit_code = 5


class EpochError(EpochsyncError):
    """An epoch has a gap or cannot run in the target's current state."""

    exit_code = 8


class NotClosedError(EpochError):
    """The epoch is not closed yet: some server has not written its ``EPOCH`` record. Try later."""

    exit_code = 4


class BusyError(EpochError):
    """Another writer holds the target's lease (or took it over): nothing was changed. Try later."""

    exit_code = 6


class VerifyError(EpochError):
    """The applied epoch differs from the source: the epoch was not committed."""

    exit_code = 7


class FenceError(EpochError):
    """Someone else wrote the target since its last commit: the write fence refused the epoch."""

    exit_code = 10


class SnapshotError(EpochsyncError):
    """A snapshot or a namespace dump is missing or inconsistent."""

    exit_code = 11


class SourceError(EpochsyncError):
    """The source file system (its servers, bricks, snapshots) refused or failed an operation."""

    exit_code = 12


#: the CLI's exit statuses: (code, what it means), the CLI reference's table
EXIT_CODES: tuple[tuple[int, str], ...] = (
    (0, "success (for ``status``: every target Active or Lagging)"),
    (1, "an error of no class below; ``status``: a target is Faulty or Unreachable; ``audit``: the target differs"),
    (2, "usage: a wrong option or argument (the verb's ``--help`` lists them)"),
    (ConfigError.exit_code, "the config is wrong: the file and the key are named"),
    (NotClosedError.exit_code, "the epoch is not closed yet: run again later"),
    (StoreError.exit_code, "an object store or a target could not be reached or refused a request"),
    (BusyError.exit_code, "the target is being written by another run (its lease is held): run again later"),
    (VerifyError.exit_code, "verify found differences with the source: the epoch was rolled back, not committed"),
    (EpochError.exit_code, "the epoch cannot run in the target's state (a gap, an unfinished epoch, ...)"),
    (RecordError.exit_code, "a changelog record or line is bad: the file, line and reason are named"),
    (FenceError.exit_code, "someone else wrote the target since its last commit: the write fence refused the epoch"),
    (SnapshotError.exit_code, "a snapshot or namespace dump is missing or inconsistent"),
    (SourceError.exit_code, "the source file system (servers, bricks, snapshots) failed an operation"),
    (130, "interrupted by Ctrl-C (128 + the signal's number; 143 for SIGTERM)"),
)
