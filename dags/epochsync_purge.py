"""
## epochsync: purge a source's changelogs once every replica has applied them

One task, `purge`, every hour (or every epoch interval, if longer):

- reads every consumer's cursor (each target of this source is one);
- deletes the warehouse records of the epochs at or below the minimum cursor minus the
  retention (`retention.epochs` in the config), and each raw changelog file whose
  records all lie in those epochs;
- logs consumers lagging behind and **fails** naming any consumer idle past
  `retention.idle_limit`: it would hold the minimum cursor, and the changelogs, forever.

Param `dry_run`: list what would go, delete nothing.
"""

from __future__ import annotations

from epochsync.airflow.dags import dags_from_env

globals().update(dags_from_env("purge", doc_md=__doc__))
