"""Registers epochsync's ``EpochTimetable`` so the scheduler can deserialize epoch DAGs.

Airflow only rebuilds custom timetables it finds in a plugin; the class itself
lives in the ``epochsync`` package (``include/epochsync/airflow/timetable.py``).
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from epochsync.airflow.timetable import EpochTimetable


class EpochsyncPlugin(AirflowPlugin):
    """The epochsync Airflow plugin: the epoch timetable."""

    name = "epochsync"
    timetables = [EpochTimetable]
