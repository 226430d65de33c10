"""A brick's changelog between two cuts: which records of its changelog files an epoch owns.

A brick writes ``.glusterfs/changelogs/CHANGELOG`` (the live file) and renames it to
``YYYY/MM/DD/CHANGELOG.<unix time>`` at each rollover (every ``changelog.rollover-time``
seconds, and at once when Gluster's barrier is enabled: a cut's explicit rollover). A
snapshot of the brick holds both. A cut remembers where it read each brick up to
(:class:`Position`: the newest rolled-over file, and the live file's length and digest), so
epoch E owns exactly the records of snapshot E after snapshot E-1's position: the rolled
files newer than that position (the first of them was the live file then: its first bytes
are skipped, once checked to be the same bytes), then the live file of snapshot E.

A rolled file is named by its whole second. At a short ``changelog.rollover-time`` (1 s) two
rollovers can fall in one second (a periodic one and a cut's explicit one): the later rename
replaces the earlier file, whose records are then in no file at all, and the brick's HTIME index
lists that name twice. :func:`read_slice` refuses such a slice with :class:`ChangelogGap`
(a name listed twice in HTIME since the last cut, the rolled file the last cut ended on no
longer the same bytes, or a first file that does not start with the live bytes read then); the
cut stage then walks the whole cut against the published state instead of trusting the records
(:mod:`epochsync.stages.cut`).
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import asdict, dataclass

from epochsync.core.gluster import GlusterError
from epochsync.core.schema import Record
from epochsync.formats.common import ByteOrder
from epochsync.formats.gluster import header_end, scan_records

CHANGELOG_DIR = os.path.join(".glusterfs", "changelogs")
LIVE = "CHANGELOG"
_ROLLED = re.compile(r"CHANGELOG\.(\d+)")
HTIME_DIR = "htime"
_HTIME = re.compile(r"HTIME\.(\d+)")


class ChangelogGap(GlusterError):
    """A brick's changelog lost records since the last cut (see the module docstring)."""


@dataclass(frozen=True)
class Position:
    """Where a brick's changelog was read up to at a cut."""

    rolled: int | None  # the <unix time> of the newest rolled-over file then (None: none yet)
    live_len: int  # bytes of the live CHANGELOG read (whole records)
    live_sha: str  # sha256 of those bytes
    rolled_sha: str | None = None  # sha256 of the newest rolled-over file then (None: not known)

    def to_dict(self) -> dict:
        """Returns the position as JSON values."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Position:
        """Returns the position stored by :meth:`to_dict`."""
        return cls(
            rolled=d.get("rolled"),
            live_len=int(d["live_len"]),
            live_sha=str(d["live_sha"]),
            rolled_sha=d.get("rolled_sha"),
        )


@dataclass
class Slice:
    """A brick's records between two positions, and the position after them."""

    records: list[Record]  # every record the epoch owns, in file order
    live: list[Record]  # the records of the live file (all of it, not only the epoch's part)
    position: Position
    files: list[str]  # the files read, in order


def rolled_files(changelog_dir: str) -> list[tuple[int, str]]:
    """The rolled-over files under ``changelog_dir`` as ``(unix time, path)``, oldest first."""
    out = []
    for year in _digits(changelog_dir):
        for month in _digits(os.path.join(changelog_dir, year)):
            for day in _digits(os.path.join(changelog_dir, year, month)):
                d = os.path.join(changelog_dir, year, month, day)
                for name in os.listdir(d):
                    m = _ROLLED.fullmatch(name)
                    if m:
                        out.append((int(m.group(1)), os.path.join(d, name)))
    out.sort()
    return out


def _digits(path: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(path) if n.isdigit())
    except FileNotFoundError:
        return []


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _sha_of(path: str | None) -> str | None:
    return hashlib.sha256(_read(path)).hexdigest() if path else None


def htime_names(changelog_dir: str) -> list[str]:
    """The file names the brick's HTIME index lists (``CHANGELOG.<t>``, and ``changelog.<t>`` for a
    rollover without records), oldest index first."""
    d = os.path.join(changelog_dir, HTIME_DIR)
    try:
        files = sorted((int(m.group(1)), n) for n in os.listdir(d) if (m := _HTIME.fullmatch(n)))
    except FileNotFoundError:
        return []
    out: list[str] = []
    for _ts, name in files:
        out.extend(
            os.path.basename(p.decode("utf-8", "replace")) for p in _read(os.path.join(d, name)).split(b"\0") if p
        )
    return out


def check_htime(changelog_dir: str, after: int | None) -> None:
    """Raises :class:`ChangelogGap` when HTIME lists a rolled file newer than ``after`` twice: two
    rollovers in one second, the later file replaced the earlier."""
    seen: set[int] = set()
    for name in htime_names(changelog_dir):
        m = _ROLLED.fullmatch(name)
        if not m:
            continue  # changelog.<t>: a rollover without records, no file
        ts = int(m.group(1))
        if after is not None and ts <= after:
            continue
        if ts in seen:
            raise ChangelogGap(
                f"changelog of the brick at {changelog_dir} lost records: HTIME lists {name} twice (two rollovers "
                "in one second, the later replaced the earlier; changelog.rollover-time is too short)"
            )
        seen.add(ts)


def end_position(changelog_dir: str) -> Position:
    """The position at the end of what ``changelog_dir`` holds (a source's first cut starts there)."""
    rolled = rolled_files(changelog_dir)
    live_path = os.path.join(changelog_dir, LIVE)
    data = _read(live_path) if os.path.exists(live_path) else b""
    end = _whole_records_end(data, live_path) if data else 0
    return Position(
        rolled=rolled[-1][0] if rolled else None,
        live_len=end,
        live_sha=hashlib.sha256(data[:end]).hexdigest(),
        rolled_sha=_sha_of(rolled[-1][1]) if rolled else None,
    )


def live_records(changelog_dir: str, *, byteorder: ByteOrder = "little") -> list[Record]:
    """The whole records of the live CHANGELOG in ``changelog_dir`` (empty when there is none)."""
    path = os.path.join(changelog_dir, LIVE)
    data = _read(path) if os.path.exists(path) else b""
    if not data:
        return []
    try:
        return [r for _, r in scan_records(data, byteorder=byteorder)[0]]
    except ValueError as exc:
        raise GlusterError(f"changelog {path}: {exc}") from None


def _whole_records_end(data: bytes, path: str) -> int:
    try:
        return scan_records(data)[1]
    except ValueError as exc:
        raise GlusterError(f"changelog {path}: {exc}") from None


def read_slice(changelog_dir: str, after: Position, *, byteorder: ByteOrder = "little") -> Slice:
    """The records of ``changelog_dir`` after position ``after``, and the position at their end.

    Refuses with :class:`ChangelogGap` when the files no longer continue ``after`` (see the module
    docstring: records lost to a rollover in the same second, or a changelog reset under us), and
    with GlusterError when a file cannot be read as a changelog.
    """
    records: list[Record] = []
    files: list[str] = []
    every = rolled_files(changelog_dir)
    newer = [(ts, p) for ts, p in every if after.rolled is None or ts > after.rolled]
    if after.rolled is not None and after.rolled_sha is not None:
        then = next((p for ts, p in every if ts == after.rolled), None)
        if then is None or _sha_of(then) != after.rolled_sha:
            raise ChangelogGap(
                f"changelog of the brick at {changelog_dir} lost records: CHANGELOG.{after.rolled}, the last cut's "
                "newest rolled file, "
                + ("is gone" if then is None else "was replaced since (a rollover in the same second)")
            )
    check_htime(changelog_dir, after.rolled)
    live_path = os.path.join(changelog_dir, LIVE)
    live_data = _read(live_path) if os.path.exists(live_path) else b""
    chain = [*[(p, _read(p)) for _, p in newer], (live_path, live_data)]
    first_path, first_data = chain[0]
    skip = 0
    if first_data and after.live_len > 0:
        try:
            head = header_end(first_data)
        except ValueError as exc:
            raise GlusterError(f"changelog {first_path}: {exc}") from None
        if after.live_len > head:
            # the live file read at the last cut had records: it must be the first file now
            # (rolled over since, or still live), starting with exactly those bytes
            if hashlib.sha256(first_data[: after.live_len]).hexdigest() != after.live_sha:
                raise ChangelogGap(
                    f"changelog of the brick at {changelog_dir} does not continue the last cut: {first_path} does "
                    f"not start with the {after.live_len} bytes read then (was the changelog reset or the brick "
                    "replaced?)"
                )
            skip = after.live_len
    for i, (path, data) in enumerate(chain):
        if not data:
            continue
        start = skip if i == 0 and skip else None
        try:
            found, end = scan_records(data, start, byteorder=byteorder)
        except ValueError as exc:
            raise GlusterError(f"changelog {path}: {exc}") from None
        if path != live_path and end != len(data):
            raise GlusterError(f"changelog {path}: a rolled-over file ends inside a record at byte {end}")
        records.extend(r for _, r in found)
        files.append(path)
    live_records: list[Record] = []
    live_end = 0
    if live_data:
        try:
            live_found, live_end = scan_records(live_data, byteorder=byteorder)
        except ValueError as exc:
            raise GlusterError(f"changelog {live_path}: {exc}") from None
        live_records = [r for _, r in live_found]
    position = Position(
        rolled=newer[-1][0] if newer else after.rolled,
        live_len=live_end,
        live_sha=hashlib.sha256(live_data[:live_end]).hexdigest(),
        rolled_sha=hashlib.sha256(chain[-2][1]).hexdigest() if newer else after.rolled_sha,
    )
    return Slice(records=records, live=live_records, position=position, files=files)
