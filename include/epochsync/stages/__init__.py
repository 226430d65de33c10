"""The pipeline's stages in the order the epoch DAG runs them.

``ingest`` -> ``merge`` -> ``translate`` -> ``apply`` -> ``verify`` -> ``commit`` (or ``rollback``);
``replicate`` runs them in that order for the CLI, ``publish`` ends a feed target's run, and
``entry`` runs one stage as its own process (``spark_apps/<stage>.py``).

Stage functions (``cfg`` is a :class:`~epochsync.core.config.Config` or a config file path,
``target`` a target name; ``epoch`` is the last epoch of the run and ``first_epoch`` the
first one when a run merges a window of several closed epochs, default ``epoch``):

``context.check_preconditions(cfg, target, epoch, first_epoch=None) -> dict``
    DESIGN section 5 invariants before anything is written: ``{"action": "run" |
    "noop" | "rollback_first", "committed": M, ...}``. A gap (the manifest is below
    ``first_epoch - 1``) raises :class:`EpochError` naming the missing epochs and the
    command that backfills them; so does a manifest inside ``first_epoch..epoch - 1`` (the
    plan starts from ``first_epoch - 1``: another run committed part of the window).
``translate.run_translate(cfg, target, epoch, spark, whole_file=False, first_epoch=None) -> dict``
    Reads snapshots ``first-1`` and ``epoch`` and the change set (written by the merge),
    writes ``plans/target=T/epoch=E/plan.json``; returns the plan summary.
``apply.run_apply(cfg, target, epoch, spark=None, inject=None, first_epoch=None) -> dict``
    Checks the preconditions (an unfinished epoch is rolled back first), the write
    fence, then applies the plan (namespace on the driver, data on executors when
    ``spark`` is given, post operations on the driver), journaling before each mutation.
``verify.run_verify(cfg, target, epoch, spark=None, first_epoch=None) -> dict``
    Checks every touched path against the source at E; raises if anything differs.
``commit.run_commit(cfg, target, epoch, first_epoch=None) -> dict``
    Requires a passed verify; writes the stats row, then the manifest (the commit
    point, atomically; the last write that changes what readers of the manifest see), then
    drops the posix scratch area, publishes the committed view (posix on btrfs: a read-only
    snapshot, the ``current`` link flipped to it), advances the consumer cursor and removes
    the undo journal; returns the stats row.
``rollback.run_rollback(cfg, target, spark=None) -> dict``
    Replays the undo journal of the unfinished epoch in reverse (idempotent, resumable),
    then checks the target against the snapshot of its committed epoch. A no-op when
    nothing is unfinished. (Called with an argparse namespace it is the CLI verb.)
``replicate.replicate(cfg, target, through_epoch, *, epoch=None, spark=None, inject=None, whole_file=False, progress=print)``
    For every closed epoch after the committed one up to ``through_epoch`` (or just
    ``epoch``): ingest -> merge -> translate -> apply -> verify -> commit, one progress line
    per stage; a failure in apply, verify or commit is rolled back and re-raised.

Fault injection (tests, the demo, the DAG param): ``inject="after=K,epoch=E"`` or the
environment variable ``EPOCHSYNC_INJECT_FAILURE``; see :mod:`epochsync.journal.faults`.
"""
