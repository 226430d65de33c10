"""Epoch window arithmetic, once: epoch E covers ``[start + (E-1)*interval, start + E*interval)``.

The config's :class:`~epochsync.core.config.EpochConfig`, the Airflow timetable and the
importers (which assign epochs by record time) all compute with these functions, so an
instant falls in the same epoch everywhere. Instants are compared in integer nanoseconds
(timezone-aware datetimes are read as UTC; naive ones are taken as UTC).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

_EPOCH0 = datetime(1970, 1, 1, tzinfo=UTC)


def _utc(dt: datetime) -> datetime:
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)


def ns_of(dt: datetime) -> int:
    """``dt`` in nanoseconds since 1970 (exact to the microsecond a datetime holds)."""
    return ((_utc(dt) - _EPOCH0) // timedelta(microseconds=1)) * 1_000


def grid(start: datetime, interval_s: float) -> tuple[int, int]:
    """``(start_ns, interval_ns)``: the epoch grid in integer nanoseconds."""
    return ns_of(start), round(interval_s * 1_000_000_000)


def epoch_of_ns(start_ns: int, interval_ns: int, when_ns: int) -> int:
    """The epoch whose window holds ``when_ns`` (an instant before ``start`` gives 0 or less)."""
    return (when_ns - start_ns) // interval_ns + 1


def window(start: datetime, interval_s: float, epoch: int) -> tuple[datetime, datetime]:
    """The ``[begin, end)`` window of ``epoch``, in UTC."""
    step = timedelta(seconds=interval_s)
    start = _utc(start)
    return start + (epoch - 1) * step, start + epoch * step


def last_closed_epoch(start: datetime, interval_s: float, when: datetime) -> int:
    """The highest epoch whose window has ended at ``when`` (0 if none has)."""
    elapsed = (_utc(when) - _utc(start)).total_seconds()
    # a tiny tolerance: float seconds of a boundary that is exact in microseconds
    return max(0, math.floor(elapsed / interval_s + 1e-9))


def first_epoch_at_or_after(start: datetime, interval_s: float, when: datetime) -> int:
    """The first epoch whose window begins at or after ``when`` (1 at the latest for ``when <= start``)."""
    elapsed = (_utc(when) - _utc(start)).total_seconds()
    if elapsed <= 0:
        return 1
    return math.ceil(elapsed / interval_s - 1e-9) + 1
