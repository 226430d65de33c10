"""``EpochTimetable``: one DAG run per epoch of a source.

Epoch E covers ``[start + (E-1)*interval, start + E*interval)`` (``EpochConfig.window``).
A run's data interval is exactly that window and it is scheduled when the window
ends (the ``wait_epoch_closed`` sensor then waits for every server's ``EPOCH``
record). The epoch number is a pure function of the data interval
(:func:`epoch_of_interval`), so tasks get it from the run's data interval, or from
the ``epoch`` param on a manual run.

Registered through the plugin in ``plugins/epochsync_plugin.py`` so the scheduler
can deserialize it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, Literal

from airflow.timetables.base import DagRunInfo, DataInterval, Timetable

from epochsync.core import epochs

if TYPE_CHECKING:
    from pendulum import DateTime

#: ``schedule_from`` value: the scheduler creates no run (manual runs and backfills only)
NEVER: Final = "never"


def _as_utc(dt: datetime) -> DateTime:
    import pendulum

    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return pendulum.instance(dt).in_timezone("UTC")


def epoch_window(start: datetime, interval_s: float, epoch: int) -> tuple[DateTime, DateTime]:
    """The ``[begin, end)`` window of ``epoch`` as pendulum datetimes (Airflow's data interval)."""
    begin, end = epochs.window(start, interval_s, epoch)
    return _as_utc(begin), _as_utc(end)


last_closed_epoch = epochs.last_closed_epoch
first_epoch_at_or_after = epochs.first_epoch_at_or_after


def epoch_of_interval(start: datetime, interval_s: float, data_interval_end: datetime) -> int:
    """The epoch a run with this data interval end replicates: the last one closed at that end."""
    return last_closed_epoch(start, interval_s, data_interval_end)


class EpochTimetable(Timetable):
    """One run per epoch: data interval = the epoch's window, run after the window ends.

    ``restriction.earliest`` (the DAG's start date) and ``restriction.latest`` (end
    date) bound the epochs; with ``catchup=False`` the first run (or the next after a
    pause) is the latest epoch already closed, skipping older ones.

    ``schedule_from`` (a time, or :data:`NEVER`) holds the *scheduler* back: it creates
    runs only for epochs starting at or after it (none for NEVER), while backfills and
    manual runs still reach every epoch. The DAG's start date cannot do this: a manual
    run dated before it would get no task instances at all. The scheduler asks without
    an end (``restriction.latest`` is None unless the DAG has an end date); a backfill
    always gives its ``--to-date``.
    """

    description = "one run per epoch of the source"

    def __init__(self, start: datetime, interval_s: float, schedule_from: datetime | str | None = None):
        if interval_s <= 0:
            raise ValueError(f"epoch interval must be positive, got {interval_s!r}")
        self.start = _as_utc(start)
        self.interval_s = float(interval_s)
        self.schedule_from: datetime | Literal["never"] | None
        if schedule_from == NEVER:
            self.schedule_from = NEVER
        elif isinstance(schedule_from, str):
            self.schedule_from = _as_utc(datetime.fromisoformat(schedule_from.replace("Z", "+00:00")))
        else:
            self.schedule_from = None if schedule_from is None else _as_utc(schedule_from)

    # -- identity and serialization (the scheduler stores DAGs as JSON)
    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, EpochTimetable)
            and self.start == other.start
            and self.interval_s == other.interval_s
            and self.schedule_from == other.schedule_from
        )

    def __hash__(self) -> int:
        return hash((self.start, self.interval_s, str(self.schedule_from)))

    def serialize(self) -> dict[str, Any]:
        """Returns the timetable as the JSON Airflow stores."""
        sf = self.schedule_from
        return {
            "start": self.start.isoformat(),
            "interval_s": self.interval_s,
            "schedule_from": sf.isoformat() if isinstance(sf, datetime) else sf,
        }

    @classmethod
    def deserialize(cls, data: dict[str, Any]) -> EpochTimetable:
        """Returns the timetable :meth:`serialize` wrote."""
        return cls(datetime.fromisoformat(data["start"]), float(data["interval_s"]), data.get("schedule_from"))

    @property
    def summary(self) -> str:
        """Returns one line for the UI: the epoch length, the start and when scheduling begins."""
        base = f"epochs of {_human(self.interval_s)} from {self.start.isoformat()}"
        if self.schedule_from == NEVER:
            return base + " (manual and backfill only)"
        if self.schedule_from is not None:
            return base + f" (scheduled from {self.schedule_from.isoformat()})"
        return base

    def validate(self) -> None:
        """Raise ``AirflowTimetableInvalid`` unless the epoch interval is positive."""
        if not self.interval_s > 0:
            from airflow.exceptions import AirflowTimetableInvalid

            raise AirflowTimetableInvalid(f"epoch interval must be positive, got {self.interval_s}")

    # -- the epoch arithmetic
    def window(self, epoch: int) -> DataInterval:
        """Returns the data interval of ``epoch``: ``[start + (E-1)*interval, start + E*interval)``."""
        begin, end = epoch_window(self.start, self.interval_s, epoch)
        return DataInterval(begin, end)

    def epoch_of(self, data_interval: DataInterval) -> int:
        """Returns the epoch whose window ends at ``data_interval``'s end."""
        return epoch_of_interval(self.start, self.interval_s, data_interval.end)

    # -- the Timetable protocol
    def infer_manual_data_interval(self, *, run_after: datetime) -> DataInterval:
        """A manual run replicates the latest epoch closed at ``run_after`` (epoch 1 before any closed).

        The ``epoch`` param of the run, when given, overrides this: the timetable
        cannot see params.
        """
        epoch = max(1, last_closed_epoch(self.start, self.interval_s, run_after))
        return self.window(epoch)

    def next_dagrun_info(
        self,
        *,
        last_automated_data_interval: DataInterval | None,
        restriction,
    ) -> DagRunInfo | None:
        """Returns the next epoch to schedule (its window and run date), or None to hold the scheduler back."""
        if last_automated_data_interval is not None:
            # the epoch after the last scheduled one; realigned in case the interval changed
            epoch = last_closed_epoch(self.start, self.interval_s, last_automated_data_interval.end) + 1
            last_epoch_start = last_automated_data_interval.start
        else:
            epoch = 1
            last_epoch_start = None
        if restriction.earliest is not None:
            # never before the DAG's start date: the first epoch starting at or after it
            epoch = max(epoch, first_epoch_at_or_after(self.start, self.interval_s, restriction.earliest))
        if self.schedule_from is not None and restriction.latest is None:
            # the scheduler asking (a backfill always has an end): hold it back
            if self.schedule_from == NEVER:
                return None
            epoch = max(epoch, first_epoch_at_or_after(self.start, self.interval_s, self.schedule_from))
        if not restriction.catchup:
            # skip missed epochs: the latest already closed one, or the next to close
            epoch = max(epoch, last_closed_epoch(self.start, self.interval_s, _utcnow()))
        window = self.window(epoch)
        if last_epoch_start is not None and window.start <= last_epoch_start:
            # a shortened interval can realign onto the last run: move past it
            epoch = first_epoch_at_or_after(self.start, self.interval_s, last_epoch_start + timedelta(microseconds=1))
            window = self.window(epoch)
        if restriction.latest is not None and window.start > restriction.latest:
            return None
        return DagRunInfo.interval(start=window.start, end=window.end)

    def generate_run_id(self, *, run_type, run_after, data_interval, **extra) -> str:
        """``scheduled__epoch-000042__2026-01-01T03:30:00+00:00``: the epoch readable in the UI's run list.

        Manual runs keep Airflow's plain id: their epoch may come from params, which a
        timetable cannot see.
        """
        if data_interval is None or str(getattr(run_type, "value", run_type)) == "manual":
            return run_type.generate_run_id(suffix=run_after.isoformat())
        epoch = self.epoch_of(data_interval)
        return run_type.generate_run_id(suffix=f"epoch-{epoch:06d}__{run_after.isoformat()}")


def _utcnow() -> datetime:
    """The scheduler's clock (one place, so tests can pin it)."""
    from airflow._shared.timezones.timezone import utcnow

    return utcnow()


def _human(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
