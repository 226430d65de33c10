"""An Airflow Asset per target, updated at every commit: what a downstream DAG schedules on.

A target's asset is named ``epochsync_target_<name>`` (group ``epochsync``; its URI is the name:
a URI with a scheme makes Airflow load every provider to find that scheme's handler, at every
DAG parse). The task that commits the target (an epoch DAG's ``commit``, a feed's
``publish``, a hydrate) names it among its outlets and, once the commit point is written, sets
the event's extra: ``{"target", "epoch"}`` and, for a catch-up run, ``first`` (its first epoch).
A run that fails, is rolled back or is a dry run commits nothing and emits no event. A DAG that
needs "replica dr at a new epoch" schedules on :func:`target_asset` (see the Airflow docs page,
*Assets*)::

    from airflow.sdk import DAG, task
    from epochsync.airflow.assets import target_asset

    with DAG("after_dr_commits", schedule=[target_asset("dr")]):
        @task
        def report(triggering_asset_events=None):
            for event in triggering_asset_events[target_asset("dr")]:
                print("dr is at epoch", event.extra["epoch"])
        report()
"""

from __future__ import annotations

from airflow.sdk import Asset

#: the group every target's asset is in (the UI's asset list filters by it)
ASSET_GROUP = "epochsync"


def target_asset(target: str) -> Asset:
    """The Asset of ``target``: updated at every commit of it, the epoch in the event's extra."""
    return Asset(name=f"epochsync_target_{target}", group=ASSET_GROUP)


def mark_committed(outlet_events, target: str, epoch: int, first: int | None = None) -> None:
    """Set the extra of ``target``'s asset event for this task (``outlet_events``: the task's context
    entry; nothing when it has none, as when a stage runs outside Airflow)."""
    if outlet_events is None:
        return
    extra: dict = {"target": target, "epoch": int(epoch)}
    if first is not None and int(first) != int(epoch):
        extra["first"] = int(first)
    outlet_events[target_asset(target)].extra = extra
