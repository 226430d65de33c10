"""
## epochsync: hydrate a new or stale replica from a source namespace dump

Use it when the changelogs no longer reach back to the replica's committed epoch (a new
replica, or one stopped longer than the changelog retention). Trigger it by hand with:

- `epoch`: a **closed** epoch with a dump `snapshot/epoch=E/` (empty: the latest dump);
- `dump_uri`: where the source publishes its dumps (empty: `snapshot/` beside the
  changelog folder, where `python -m epochsync_dev simulate` writes them).

The `hydrate` task loads the dump as the replica's snapshot E, copies every file that
differs from what the replica holds as a **full object** (no extents needed), verifies,
and writes the manifest at E, with the same undo journal and rollback as an epoch run.
Then unpause or trigger the epoch DAG: it carries on from E+1.
"""

from __future__ import annotations

from epochsync.airflow.dags import dags_from_env

globals().update(dags_from_env("hydrate", doc_md=__doc__))
