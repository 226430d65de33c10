"""Errors a person can act on: each names what failed and where."""

from __future__ import annotations


class EpochsyncError(Exception):
    """Base class: every error the CLI prints as one line and exits non-zero on."""


class RecordError(EpochsyncError):
    """A record is invalid. Raised without a location; parsers wrap it in ParseError."""


class ParseError(EpochsyncError):
    """A changelog line or byte range that cannot become a canonical record.

    ``str()`` is ``FILE:LINE: reason`` (``FILE:@OFFSET: reason`` for binary input).
    """

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

    def __init__(self, file: str, key: str, reason: str):
        self.file = file
        self.key = key
        self.reason = reason
        super().__init__(f"{file}: {key}: {reason}")


class StoreError(EpochsyncError):
    """An object store (S3) or target could not be reached or refused a request."""


class EpochError(EpochsyncError):
    """An epoch is not closed, has a gap, or cannot run in the target's current state."""


class SnapshotError(EpochsyncError):
    """A snapshot or a namespace dump is missing or inconsistent."""
