"""
## epochsync: replicate one source into one target, one epoch per run

Each run replicates one **epoch** of the source (its time window is the run's data
interval) and leaves the target at that epoch's boundary, never in between:

1. `wait_epoch_closed`: every server of the source has written its `EPOCH` record;
2. `ingest`: the epoch's changelog records → warehouse Parquet (Spark);
3. `merge`: the net change per file (Spark);
4. `translate`: the plan for the target's layout (Spark); a **dry run** stops here
   and prints the plan summary in this task's log;
5. `wait_previous_epoch`: the target is committed at the epoch before this run's (it waits
   while a run of an earlier epoch is in flight, and fails at once, naming the missing
   epochs, when none is);
6. `apply`: namespace operations and modified byte extents, undo journal first (Spark);
7. `verify`: sizes and checksums of every touched file against the source (Spark);
8. `commit`: the target manifest says this epoch.

`rollback` runs only when apply, verify or commit failed: it restores the previous
epoch from the undo journal and the run ends **failed** (a run that wrote nothing has
nothing to undo). Scheduled and manual runs never overlap (`max_active_runs=1`); a
backfill's do, and each epoch still commits after the previous one.

**Trigger** with params `epoch`, `dry_run`, `whole_file`, `max_epochs_per_run`.
**Backfill** missed epochs: `airflow backfill create --dag-id <this dag> --from-date
<start of first epoch> --to-date <start of last epoch> --reprocess-behavior failed`.
"""

from __future__ import annotations

from epochsync.airflow.dags import dags_from_env

globals().update(dags_from_env("epoch", doc_md=__doc__))
