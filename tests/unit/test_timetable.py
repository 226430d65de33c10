"""EpochTimetable: one run per epoch, the window as data interval, catchup and start date honoured."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from airflow.timetables.base import DataInterval, TimeRestriction

from epochsync.airflow import timetable as tt
from epochsync.airflow.timetable import EpochTimetable

START = datetime(2026, 1, 1, tzinfo=UTC)
PLUGINS = Path(__file__).resolve().parents[2] / "plugins"


def at(minutes: float) -> datetime:
    return START + timedelta(minutes=minutes)


@pytest.fixture()
def clock(monkeypatch):
    """Pin the timetable's idea of now."""
    box = {"now": at(0)}
    monkeypatch.setattr(tt, "_utcnow", lambda: box["now"])
    return box


def nxt(table, last, *, earliest=START, latest=None, catchup=True):
    return table.next_dagrun_info(
        last_automated_data_interval=last, restriction=TimeRestriction(earliest, latest, catchup)
    )


def test_window_matches_the_config_definition():
    from epochsync.core.config import EpochConfig

    cfg = EpochConfig(interval_s=420, start=START)
    table = EpochTimetable(START, 420)
    for e in (1, 2, 9, 100):
        assert tuple(table.window(e)) == cfg.window(e)
        assert table.epoch_of(table.window(e)) == e


def test_first_run_is_epoch_one_scheduled_when_it_closes(clock):
    info = nxt(EpochTimetable(START, 300), None)
    assert info.data_interval == DataInterval(at(0), at(5))
    assert info.run_after == at(5)
    assert info.logical_date == at(0)


def test_next_run_follows_the_last_one_without_gaps(clock):
    table = EpochTimetable(START, 300)
    info = nxt(table, table.window(3))
    assert info.data_interval == table.window(4)


def test_start_date_mid_epoch_starts_at_the_next_whole_epoch(clock):
    table = EpochTimetable(START, 300)
    info = nxt(table, None, earliest=at(7))
    assert info.data_interval == table.window(3)  # [10m, 15m)
    info = nxt(table, None, earliest=at(10))
    assert info.data_interval == table.window(3)  # exactly on a boundary


def test_start_date_before_the_source_start_begins_at_epoch_one(clock):
    table = EpochTimetable(START, 300)
    assert nxt(table, None, earliest=at(-60)).data_interval == table.window(1)


def test_catchup_off_skips_to_the_latest_closed_epoch(clock):
    table = EpochTimetable(START, 300)
    clock["now"] = at(47)  # epochs 1..9 closed, 10 running
    assert nxt(table, None, catchup=False).data_interval == table.window(9)
    # with catchup on, the first epoch still comes first
    assert nxt(table, None, catchup=True).data_interval == table.window(1)


def test_catchup_off_after_a_pause_skips_missed_epochs(clock):
    table = EpochTimetable(START, 300)
    clock["now"] = at(47)
    # a run already exists for epoch 2; epochs 3..8 were missed while paused
    assert nxt(table, table.window(2), catchup=False).data_interval == table.window(9)
    assert nxt(table, table.window(2), catchup=True).data_interval == table.window(3)


def test_catchup_off_before_any_epoch_closed_waits_for_the_first(clock):
    table = EpochTimetable(START, 300)
    clock["now"] = at(2)
    info = nxt(table, None, catchup=False)
    assert info.data_interval == table.window(1)
    assert info.run_after == at(5)


def test_a_run_already_existing_for_the_latest_epoch_is_not_repeated(clock):
    table = EpochTimetable(START, 300)
    clock["now"] = at(47)
    info = nxt(table, table.window(9), catchup=False)
    assert info.data_interval == table.window(10)
    assert info.run_after == at(50)


def test_end_date_stops_scheduling(clock):
    table = EpochTimetable(START, 300)
    assert nxt(table, table.window(3), latest=at(15)).data_interval == table.window(4)
    assert nxt(table, table.window(4), latest=at(15)) is None


def test_interval_that_does_not_divide_the_hour(clock):
    table = EpochTimetable(START, 7 * 60)
    seen = []
    last = None
    for _ in range(10):
        info = nxt(table, last)
        seen.append(info.data_interval)
        last = info.data_interval
    assert [d.start for d in seen] == [at(7 * i) for i in range(10)]
    assert all(d.end - d.start == timedelta(minutes=7) for d in seen)
    assert seen[8].start == datetime(2026, 1, 1, 0, 56, tzinfo=UTC)
    assert seen[9].start == datetime(2026, 1, 1, 1, 3, tzinfo=UTC)  # crosses the hour off the grid
    assert table.epoch_of(seen[9]) == 10


def test_odd_seconds_interval_stays_on_its_own_grid(clock):
    table = EpochTimetable(START, 37.5)
    w = table.window(1000)
    assert w.start == START + timedelta(seconds=37.5 * 999)
    assert table.epoch_of(w) == 1000
    assert nxt(table, w).data_interval == table.window(1001)


def test_changed_interval_realigns_after_the_last_run(clock):
    old = EpochTimetable(START, 600).window(3)  # [20m, 30m)
    table = EpochTimetable(START, 420)  # grid 0, 7, 14, 21, 28, 35
    info = nxt(table, old)
    assert info.data_interval.start > old.start
    assert info.data_interval == table.window(5)  # [28m, 35m): the window ending after 30m


def test_schedule_from_holds_the_scheduler_back_but_not_backfills(clock):
    table = EpochTimetable(START, 300, schedule_from=at(62))
    # the scheduler (no end): the first epoch starting at or after 62m is epoch 14 [65m, 70m)
    assert nxt(table, None).data_interval == table.window(14)
    assert nxt(table, table.window(20)).data_interval == table.window(21)
    # a backfill of 00:00..00:10 (it always has an end): epochs 1..3, untouched
    assert nxt(table, None, latest=at(10)).data_interval == table.window(1)
    assert nxt(table, table.window(2), latest=at(10)).data_interval == table.window(3)
    assert nxt(table, table.window(3), latest=at(10)) is None


def test_schedule_from_never_leaves_only_manual_runs_and_backfills(clock):
    table = EpochTimetable(START, 300, schedule_from="never")
    assert nxt(table, None) is None
    assert nxt(table, table.window(4)) is None
    assert nxt(table, None, latest=at(10)).data_interval == table.window(1)
    assert table.infer_manual_data_interval(run_after=at(12)) == table.window(2)
    assert "manual and backfill only" in table.summary


def test_manual_run_gets_the_latest_closed_epoch():
    table = EpochTimetable(START, 300)
    assert table.infer_manual_data_interval(run_after=at(12)) == table.window(2)
    assert table.infer_manual_data_interval(run_after=at(15)) == table.window(3)  # boundary: 3 just closed
    assert table.infer_manual_data_interval(run_after=at(1)) == table.window(1)  # none closed yet
    assert table.infer_manual_data_interval(run_after=at(-100)) == table.window(1)


def test_run_id_names_the_epoch():
    from airflow.utils.types import DagRunType

    table = EpochTimetable(START, 300)
    w = table.window(12)
    run_id = table.generate_run_id(run_type=DagRunType.SCHEDULED, run_after=w.end, data_interval=w)
    assert run_id == "scheduled__epoch-000012__2026-01-01T01:00:00+00:00"
    backfill = table.generate_run_id(run_type=DagRunType.BACKFILL_JOB, run_after=w.end, data_interval=w)
    assert backfill == "backfill__epoch-000012__2026-01-01T01:00:00+00:00"
    manual = table.generate_run_id(run_type=DagRunType.MANUAL, run_after=w.end, data_interval=w)
    assert manual == "manual__2026-01-01T01:00:00+00:00"


def test_serialization_round_trip_through_airflow(monkeypatch):
    """The scheduler stores the DAG as JSON and rebuilds the timetable from the plugin, which the
    installed package registers (its ``airflow.plugins`` entry point): the project's plugins
    folder is empty, and the plugin is found once (twice would be an import error)."""
    from airflow import plugins_manager, settings
    from airflow.serialization.encoders import encode_timetable

    assert not list(PLUGINS.glob("*.py"))
    monkeypatch.setattr(settings, "PLUGINS_FOLDER", str(PLUGINS))
    plugins_manager._get_plugins.cache_clear()
    plugins_manager.get_timetables_plugins.cache_clear()
    assert "epochsync.airflow.timetable.EpochTimetable" in plugins_manager.get_timetables_plugins()
    assert not plugins_manager._get_plugins()[1], plugins_manager._get_plugins()[1]

    table = EpochTimetable(datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC), 420, schedule_from="2026-05-01T00:00:00Z")
    encoded = encode_timetable(table)
    assert encoded["__type"] == "epochsync.airflow.timetable.EpochTimetable"
    from airflow.serialization.decoders import decode_timetable

    back = decode_timetable(encoded)
    assert back == table
    assert back.window(5) == table.window(5)
    assert back.schedule_from == datetime(2026, 5, 1, tzinfo=UTC)
    assert decode_timetable(encode_timetable(EpochTimetable(START, 60, "never"))).schedule_from == "never"
    plugins_manager._get_plugins.cache_clear()
    plugins_manager.get_timetables_plugins.cache_clear()


def test_rejects_a_non_positive_interval():
    with pytest.raises(ValueError, match="positive"):
        EpochTimetable(START, 0)


def test_naive_start_is_utc():
    assert EpochTimetable(datetime(2026, 1, 1), 60).window(1).start == START


def test_unregistered_timetable_is_refused_by_serialization(monkeypatch, tmp_path):
    """Without the plugin the scheduler could not rebuild the DAG: serialization says so."""
    from airflow import plugins_manager, settings
    from airflow.serialization.encoders import encode_timetable
    from airflow.serialization.helpers import TimetableNotRegistered

    monkeypatch.setattr(settings, "PLUGINS_FOLDER", str(tmp_path))
    monkeypatch.setattr(plugins_manager, "_load_entrypoint_plugins", lambda: ([], {}))  # the package not installed
    plugins_manager._get_plugins.cache_clear()
    plugins_manager.get_timetables_plugins.cache_clear()
    try:
        with pytest.raises(TimetableNotRegistered):
            encode_timetable(EpochTimetable(START, 60))
    finally:
        plugins_manager._get_plugins.cache_clear()
        plugins_manager.get_timetables_plugins.cache_clear()


def test_the_package_is_an_airflow_provider_with_its_connection_type():
    """Installed, the package is a provider: Airflow lists it and the ``epochsync_agent``
    connection type (the UI's form for the Gluster agents' secret) with its hook."""
    from airflow.providers_manager import ProvidersManager

    from epochsync.airflow.hooks.agent import EpochsyncAgentHook
    from epochsync.airflow.provider import get_provider_info

    pm = ProvidersManager()
    pm.initialize_providers_list()
    assert "epochsync" in pm.providers
    info = get_provider_info()
    assert info["connection-types"] == [
        {"hook-class-name": "epochsync.airflow.hooks.agent.EpochsyncAgentHook", "connection-type": "epochsync_agent"}
    ]
    assert EpochsyncAgentHook.get_ui_field_behaviour()["relabeling"] == {"password": "Shared secret"}
    import importlib

    for kind in ("operators", "sensors", "hooks"):
        for group in info[kind]:
            for module in group["python-modules"]:
                assert module.startswith(f"epochsync.airflow.{kind}."), module
                importlib.import_module(module)
