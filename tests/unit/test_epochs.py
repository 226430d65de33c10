"""Epoch window arithmetic is one module: config, importers and the timetable agree at every boundary."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from epochsync.core import epochs
from epochsync.core.config import EpochConfig


@pytest.mark.parametrize(
    "start", [datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, 0, 0, 0, 250_000, tzinfo=UTC)]
)
@pytest.mark.parametrize("interval_s", [300.0, 0.5, 7.25])
def test_every_view_of_an_epoch_agrees(start, interval_s):
    from epochsync.airflow.timetable import epoch_window
    from epochsync.stages.ingest.executor import _epoch_grid, _epoch_of_time

    cfg = EpochConfig(interval_s=interval_s, start=start)
    by_record_time = _epoch_of_time(*_epoch_grid(type("Src", (), {"epoch": cfg})()))
    for e in (1, 2, 17, 1000):
        begin, end = cfg.window(e)
        assert (begin, end) == epochs.window(start, interval_s, e) == tuple(epoch_window(start, interval_s, e))
        for instant, expected in ((begin, e), (end - timedelta(microseconds=1), e), (end, e + 1)):
            ns = epochs.ns_of(instant)
            assert cfg.epoch_of(ns) == by_record_time(ns) == expected, (e, instant)
        assert epochs.last_closed_epoch(start, interval_s, end) == e
        assert epochs.last_closed_epoch(start, interval_s, end - timedelta(microseconds=1)) == e - 1
        assert epochs.first_epoch_at_or_after(start, interval_s, begin) == e


def test_naive_datetimes_are_utc():
    naive = datetime(2026, 1, 1)
    assert epochs.ns_of(naive) == epochs.ns_of(naive.replace(tzinfo=UTC)) == 1_767_225_600 * 10**9
