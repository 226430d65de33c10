"""epochsync as an Airflow provider: what ``get_provider_info`` tells Airflow (entry point
``apache_airflow_provider``, as Airflow's own providers register).

Airflow then shows the ``epochsync_agent`` connection type in the UI, and lists the package's
hooks, operators and sensors, from the installed package alone. The plugin (the epoch timetable)
has an entry point of its own (``airflow.plugins``): Airflow loads the plugins a provider lists
only with ``[core] lazy_load_providers`` off.
"""

from __future__ import annotations


def get_provider_info() -> dict:
    """The provider's description (Airflow's ``provider_info.schema.json``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        release = version("epochsync")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree
        release = "0+unknown"
    return {
        "package-name": "epochsync",
        "name": "epochsync",
        "description": "Epoch-consistent replication of parallel file systems from their changelogs.",
        "versions": [release],
        "connection-types": [
            {
                "hook-class-name": "epochsync.airflow.hooks.agent.EpochsyncAgentHook",
                "connection-type": "epochsync_agent",
            }
        ],
        "operators": [{"integration-name": "epochsync", "python-modules": ["epochsync.airflow.operators.stage"]}],
        "sensors": [
            {
                "integration-name": "epochsync",
                "python-modules": [
                    "epochsync.airflow.sensors.epoch_closed",
                    "epochsync.airflow.sensors.previous_epoch",
                ],
            }
        ],
        "hooks": [{"integration-name": "epochsync", "python-modules": ["epochsync.airflow.hooks.agent"]}],
    }
