"""
## epochsync: audit a target against its source

One task, `audit`, every `targets[].audit.interval` (a day by default):

- holds the target's lease, in the target's pool: it never runs beside a run that writes it;
- walks the whole target and compares each path with the source at the committed epoch
  (paths, types, sizes, modes, owners, file mtimes, symlinks, xattrs; the bytes too with the
  param `deep`), as `epochsync audit --config FILE --target T` does;
- **fails** naming the first differences: something changed the replica behind epochsync's
  back, or a run lost something; `epochsync audit --config FILE --target T` lists them all;
- a target in the middle of a run (an epoch applied but not committed) is not audited: the task
  fails and is retried.
"""

from __future__ import annotations

from epochsync.airflow.dags import dags_from_env

globals().update(dags_from_env("audit", doc_md=__doc__))
