"""The ``replicate`` verb: every closed epoch after the committed one through ingest, merge, translate,
apply, verify and commit (a failure after apply is rolled back); and ``relocate``."""

from __future__ import annotations

import time

from epochsync.core.argtypes import epoch_number
from epochsync.core.config import Config, TargetConfig, load_config
from epochsync.core.errors import EpochError, EpochsyncError, NotClosedError
from epochsync.core.jsonable import scalars
from epochsync.journal.lease import target_lease
from epochsync.journal.undo import (
    manifest_epoch,
    mark_closed_seen,
    write_stage_stats,
)
from epochsync.stages.apply import run_apply
from epochsync.stages.commit import run_commit
from epochsync.stages.context import _config, _target_cfg, check_preconditions, committed_epoch, unfinished_epochs
from epochsync.stages.rollback import rollback_on_interrupt, rollback_target
from epochsync.stages.translate import run_translate
from epochsync.stages.verify import run_verify
from epochsync.targets import open_target
from epochsync.warehouse.events import FAILED, record_event


def _missing_servers(cfg: Config, source: str, epoch: int) -> list[str]:
    """The servers of ``source`` whose changelogs have not closed ``epoch`` yet (sorted)."""
    from epochsync.stages.ingest.closure import missing_epoch_servers

    return sorted(missing_epoch_servers(cfg, source, epoch))


def _ingest(cfg: Config, source: str, first: int, last: int, spark, consumer: str | None = None) -> dict:
    from epochsync.stages.ingest import run_ingest

    # continuity is checked from this target's own cursor (it is the consumer)
    return run_ingest(cfg, source, first, last, spark, consumer=consumer)


class _Session:
    """The Spark session of a replicate run, opened the first time a stage asks it for work:
    an epoch whose stages all run in this process never connects (:class:`LazySession`)."""

    def __init__(self, name: str, cfg: Config, spark=None, target: str = ""):
        from epochsync.spark import LazySession

        self.name, self.cfg, self.target = name, cfg, target
        self.lazy = LazySession(self._open) if spark is None else None
        self.given = spark

    def _open(self):
        from epochsync.spark import spark_session

        # one server-side session per target, kept between runs (its package and
        # Python workers stay warm for the next epoch; the server drops it when idle)
        return spark_session(self.name, cfg=self.cfg, session_key=f"replicate/{self.cfg.file}/{self.target}")

    @property
    def existing(self):
        """The session if one was given or opened (what a rollback may use), else None."""
        return self.given if self.lazy is None else self.lazy.opened

    def get(self):
        """What the stages get: the given session, or the lazy one."""
        return self.given if self.lazy is None else self.lazy


def replicate(
    cfg,
    target,
    through_epoch: int | None = None,
    *,
    epoch: int | None = None,
    spark=None,
    inject=None,
    whole_file: bool = False,
    progress=print,
) -> list[dict]:
    """Replicate every closed epoch up to ``through_epoch`` (or only ``epoch``); returns stats rows.

    Every stage runs on one Spark session (:func:`epochsync.spark.spark_session`: the
    configured Spark Connect server, or an in-process local session), opened at the first
    epoch that has work to do.
    """
    cfg = _config(cfg)
    tcfg = _target_cfg(cfg, target)
    session = _Session(f"epochsync-replicate-{tcfg.name}", cfg, spark, tcfg.name)
    if epoch is not None:
        epochs = [epoch]  # its preconditions read the manifest, under the lease
    else:
        committed = committed_epoch(cfg, tcfg)
        epochs = list(range(committed + 1, (through_epoch or 0) + 1))
        if not epochs:
            progress(f"{tcfg.name}: at epoch {committed}, nothing to do up to epoch {through_epoch}")
    rows = []
    # one writer per target for the whole run; a signal rolls the unfinished epoch back
    with target_lease(cfg, tcfg), rollback_on_interrupt(cfg, tcfg, lambda: session.existing, progress):
        for e in epochs:
            row = _replicate_epoch(cfg, tcfg, e, session, inject, whole_file, progress)
            if row is not None:
                rows.append(row)
    return rows


def _replicate_epoch(cfg: Config, tcfg: TargetConfig, e: int, session: _Session, inject, whole_file: bool, progress):
    """One epoch through every stage; a failure after apply started is rolled back."""
    from epochsync.stages.merge import run_merge

    src = cfg.source_of(tcfg)
    pre = check_preconditions(cfg, tcfg, e)
    if pre["action"] == "noop":
        progress(f"{tcfg.name} epoch {e}: {pre['message']}")
        return None
    if pre["action"] == "rollback_first":
        progress(f"{tcfg.name} epoch {e}: {pre['message']}")
        r = rollback_target(cfg, tcfg, session.existing, progress=progress)
        progress(f"{tcfg.name}: {r['message']}")
    missing = _missing_servers(cfg, src.name, e)
    if missing:
        from epochsync.stages.ingest.files import missing_changelog_folder

        if (gone := missing_changelog_folder(src)) is not None:
            raise gone
        raise NotClosedError(
            f"epoch {e} of source {src.name} is not closed: no EPOCH record yet from {', '.join(missing)}"
        )
    mark_closed_seen(cfg.warehouse, tcfg.name, e)

    running = {"stage": None}  # the stage an exception came from, for the event log

    def step(name, fn, detail):
        running["stage"] = name
        t = time.monotonic()
        progress(f"{tcfg.name} epoch {e}: {name} ...")
        tag = f"epochsync-{name}-{tcfg.name}-e{e}"  # the stage's jobs in the Spark UI and event log
        spark.addTag(tag)
        try:
            out = fn()
        finally:
            spark.removeTag(tag)
        took = time.monotonic() - t
        progress(f"{tcfg.name} epoch {e}: {name} done in {took:.1f}s{detail(out)}")
        if name in ("ingest", "merge"):
            write_stage_stats(cfg.warehouse, tcfg.name, e, name, {**scalars(out), "seconds": round(took, 3)})
        return out

    spark = session.get()
    step("ingest", lambda: _ingest(cfg, src.name, e, e, spark, tcfg.name), lambda o: _fmt(o, "records"))
    step("merge", lambda: run_merge(cfg, tcfg.name, e, e, spark), lambda o: _fmt(o, "changes"))
    if tcfg.kind == "feed":
        # a feed publishes the net change in place of translate, apply, verify and commit
        from epochsync.stages.publish import publish_epoch

        try:
            return step(
                "publish",
                lambda: publish_epoch(cfg, tcfg, e, e, spark, inject=inject),
                lambda o: f": {o['records_published']} records in {o['file']}",
            )
        except EpochsyncError as exc:  # nothing to roll back: _feed.json still names the previous epoch
            record_event(cfg.warehouse, tcfg.name, FAILED, e, message=str(exc)[:500])
            raise EpochError(f"epoch {e} of feed {tcfg.name} was not published: {exc}") from exc
    step(
        "translate",
        lambda: run_translate(cfg, tcfg, e, spark, whole_file=whole_file),
        lambda o: f": {o['namespace_ops']} namespace, {o['data_ops']} data, {o['post_ops']} post operations",
    )
    try:
        step(
            "apply",
            lambda: run_apply(cfg, tcfg, e, spark, inject=inject),
            lambda o: (
                f": {o.get('bytes_pulled', 0)} bytes pulled, {o.get('bytes_written', 0)} written, "
                f"{o.get('bytes_copied', 0)} copied server-side"
            ),
        )
        step(
            "verify",
            lambda: run_verify(cfg, tcfg, e, spark),
            lambda o: f": {o['paths_checked']} paths, {o['files_hashed']} files hashed",
        )
        return step("commit", lambda: run_commit(cfg, tcfg, e), lambda o: f": manifest at epoch {e}")
    except Exception as exc:
        progress(f"{tcfg.name} epoch {e}: FAILED: {exc}")
        record_event(cfg.warehouse, tcfg.name, FAILED, e, stage=running["stage"], message=str(exc)[:500])
        try:
            r = rollback_target(cfg, tcfg, session.existing, progress=progress)
            progress(f"{tcfg.name} epoch {e}: rolled back: {r['message']}")
        except Exception as rexc:
            raise EpochsyncError(
                f"epoch {e} failed ({exc}) and its rollback failed too ({rexc}); run "
                f"'epochsync rollback --config {cfg.file} --target {tcfg.name}' again"
            ) from rexc
        if isinstance(exc, EpochsyncError):
            # the original error's class (its exit status: a verify difference stays a verify failure)
            err = EpochError(f"epoch {e} of target {tcfg.name} failed and was rolled back: {exc}")
            err.exit_code = exc.exit_code
            raise err from exc
        raise


def _fmt(o, key) -> str:
    return f": {o[key]} {key}" if isinstance(o, dict) and key in o else ""


def configure_replicate(parser) -> None:
    """Add the ``replicate`` verb's options to ``parser``."""
    parser.add_argument("--config", required=True, metavar="FILE", help="epochsync YAML config")
    parser.add_argument("--target", required=True, metavar="NAME", help="target to replicate into")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--epoch", type=epoch_number, metavar="E", help="replicate exactly this epoch (the next one)")
    which.add_argument("--through", type=epoch_number, metavar="E", help="replicate every closed epoch up to E")
    parser.add_argument("--whole-file", action="store_true", help="pull changed files whole, not only their extents")
    parser.add_argument(
        "--inject-failure", metavar="SPEC", help="fault injection, e.g. after=3,epoch=2 (see epochsync.journal.faults)"
    )


def run_replicate(args) -> int:
    """The ``replicate`` verb: one line per epoch replicated; returns 0."""
    cfg = load_config(args.config)

    def progress(line: str) -> None:
        print(line, flush=True)

    rows = replicate(
        cfg,
        args.target,
        args.through,
        epoch=args.epoch,
        inject=args.inject_failure,
        whole_file=args.whole_file,
        progress=progress,
    )
    for r in rows:
        if "epoch" not in r:  # a no-op (the epoch was committed in between)
            print(r.get("message", "nothing to do"))
            continue
        if r.get("kind") == "feed":
            print(
                f"epoch {r['epoch']}: published; {r['records_in']} records, {r['records_published']} changes "
                f"{r['events']} in {r['file']} ({r['bytes_written']} bytes)"
            )
            continue
        print(
            f"epoch {r['epoch']}: committed; {r['records_in']} records, ops {r['net_operations']}, "
            f"{r['bytes_changed']} bytes changed, {r['bytes_pulled']} pulled, {r['bytes_written']} written, "
            f"{r['bytes_copied']} copied server-side"
        )
    return 0


def configure_relocate(parser) -> None:
    """Add the ``relocate`` verb's options to ``parser``."""
    parser.add_argument("--config", required=True, metavar="FILE", help="epochsync YAML config")
    parser.add_argument("--target", required=True, metavar="NAME", help="target whose control directory moves")
    parser.add_argument(
        "--from",
        dest="old",
        default=".epochsync",
        metavar="NAME",
        help="where the control directory is now (default .epochsync); it moves to the target's control_dir",
    )


def run_relocate(args) -> int:
    """``epochsync relocate``: move a target's control directory to its (new) ``control_dir``.

    The way forward when the source holds an entry named like the control directory at its
    root: translate refuses that epoch, naming it; change ``control_dir``, relocate, rerun.
    """
    import dataclasses

    cfg = load_config(args.config)
    tcfg = cfg.target(args.target)
    old = open_target(dataclasses.replace(tcfg, control_dir=args.old))
    committed = manifest_epoch(old.read_manifest())
    unfinished = unfinished_epochs(cfg, tcfg, committed)
    if unfinished:
        raise EpochError(
            f"target {tcfg.name}: epoch(s) {unfinished} did not commit; roll them back first "
            f"(epochsync rollback --config {cfg.file} --target {tcfg.name}), then relocate"
        )
    print(open_target(tcfg).move_control_dir(args.old))
    return 0
