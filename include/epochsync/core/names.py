"""Name safety: nothing a changelog says may address anything outside a replica."""

from __future__ import annotations

from epochsync.core.errors import RecordError

#: Linux NAME_MAX; longer names cannot exist on the source and are refused.
NAME_MAX_BYTES = 255


def check_basename(name: str | None, what: str = "name") -> str:
    """Return ``name`` if it is a safe single directory entry, else raise RecordError.

    Refused: missing or empty, ``.``, ``..``, anything containing ``/`` or NUL, and
    names longer than 255 bytes in UTF-8.
    """
    if name is None or name == "":
        raise RecordError(f"{what} is empty")
    if name in (".", ".."):
        raise RecordError(f"{what} {name!r} could escape the replica")
    if "/" in name:
        raise RecordError(f"{what} {name!r} contains '/' where a basename is expected")
    if "\x00" in name:
        raise RecordError(f"{what} {name!r} contains a NUL byte")
    if len(name.encode("utf-8", "surrogateescape")) > NAME_MAX_BYTES:
        raise RecordError(f"{what} is longer than {NAME_MAX_BYTES} bytes")
    return name


def check_relative_path(path: str, what: str = "path") -> str:
    """A replica-relative path ``a/b/c``: every component must be a safe basename."""
    if path.startswith("/"):
        raise RecordError(f"{what} {path!r} is absolute")
    for part in path.split("/"):
        check_basename(part, what)
    return path
