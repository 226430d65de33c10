"""The epochsync Airflow plugin: the epoch timetable, so that the scheduler can rebuild epoch DAGs.

Airflow only rebuilds custom timetables it finds in a plugin. This one is registered by the
package's entry point ``airflow.plugins``: installing the package is enough, no file goes into
``$AIRFLOW_HOME/plugins`` (a copy there would be found twice: an import error).
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from epochsync.airflow.timetable import EpochTimetable


class EpochsyncPlugin(AirflowPlugin):
    """The epochsync Airflow plugin: the epoch timetable."""

    name = "epochsync"
    timetables = [EpochTimetable]
