"""
## epochsync: replicate one source into one target, one epoch per run

Each run replicates one **epoch** of the source (its time window is the run's data
interval) and leaves the target at that epoch's boundary, never in between:

1. `wait_epoch_closed`: every server of the source has written its `EPOCH` record;
2. `ingest`: the epoch's changelog records → warehouse Parquet (Spark);
3. `merge`: the net change per file (Spark);
4. `translate`: the plan for the target's layout (Spark); a **dry run** stops here
   and prints the plan summary in this task's log;
5. `apply`: namespace operations and modified byte extents, undo journal first (Spark);
6. `verify`: sizes and checksums of every touched file against the source (Spark);
7. `commit`: the target manifest says this epoch.

`rollback` runs only when apply, verify or commit failed: it restores the previous
epoch from the undo journal and the run ends **failed**. Runs never overlap and each
epoch waits for the previous one (`max_active_runs=1`, `depends_on_past`).

**Trigger** with params `epoch`, `dry_run`, `whole_file`, `max_epochs_per_run`.
**Backfill** missed epochs: `airflow backfill create --dag-id <this dag> --from-date
<start of first epoch> --to-date <start of last epoch>`.
"""

from __future__ import annotations

from epochsync.airflow.dags import dags_from_env

globals().update(dags_from_env("epoch", doc_md=__doc__))
