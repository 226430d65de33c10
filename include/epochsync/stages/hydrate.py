"""The hydrate DAG's logic: seed a new or stale target from a source namespace dump at a closed epoch.

When the changelogs no longer reach back to a target's committed epoch (a new target,
or one stopped longer than the retention), the epoch DAG cannot bring it forward. The
source publishes namespace dumps (``snapshot/epoch=E/`` JSON Lines of snapshot columns;
``python -m epochsync_dev simulate`` writes them next to its changelogs); hydrate:

1. loads the dump of a closed epoch E as the target's snapshot E in the warehouse;
2. writes the change set from the target's committed snapshot (epoch 0: empty) to E,
   every changed file marked whole-file: full-object copies, no extents needed;
3. runs the data plane's translate, apply (undo journal first), verify and commit for
   that window, rolling back on failure like the epoch DAG does.

The manifest then says E, and the epoch DAG carries on from E+1.
"""

from __future__ import annotations

import time
from typing import Any

from epochsync.core.config import Config, SourceConfig
from epochsync.core.errors import EpochError, NotClosedError
from epochsync.journal.lease import holds_target_lease
from epochsync.warehouse.paths import Warehouse, epoch_partitions


def default_dump_uri(source: SourceConfig) -> str:
    """``snapshot/`` beside the changelog folder (where ``python -m epochsync_dev simulate`` and the source publish it)."""
    base = source.changelogs.uri.rstrip("/")
    if "://" not in base:
        base = "file://" + base
    return base.rsplit("/", 1)[0] + "/snapshot"


def dump_epochs(dump_uri: str) -> list[int]:
    """The epochs with a dump under ``dump_uri`` (local or ``file://`` dumps)."""
    return epoch_partitions(dump_uri)


def snapshot_diff(old, new):
    """The change set (``model.CHANGE_FIELDS``) from snapshot ``old`` to ``new``, data changes whole-file."""
    from pyspark.sql import functions as F

    from epochsync.core.model import CHANGE_FIELDS, FILE

    o, n = old.alias("o"), new.alias("n")
    j = o.join(n, F.col("o.fid") == F.col("n.fid"), "full_outer")

    def differs(col: str):
        return ~F.col(f"o.{col}").eqNullSafe(F.col(f"n.{col}"))

    created = F.col("o.fid").isNull()
    deleted = F.col("n.fid").isNull()
    both = ~created & ~deleted
    file_now = F.coalesce(F.col("n.type"), F.col("o.type")) == F.lit(FILE)
    data = file_now & ~deleted & (created | differs("size") | differs("objects") | differs("layout") | differs("type"))
    out = j.select(
        F.coalesce(F.col("n.fid"), F.col("o.fid")).alias("fid"),
        F.coalesce(F.col("n.type"), F.col("o.type")).alias("type"),
        created.alias("created"),
        deleted.alias("deleted"),
        (created | deleted | (both & differs("links"))).alias("links_changed"),
        (
            created
            | (both & (differs("mode") | differs("uid") | differs("gid") | differs("mtime_ns") | differs("atime_ns")))
        ).alias("attrs_changed"),
        ((created & (F.size(F.col("n.xattrs")) > 0)) | (both & differs("xattrs"))).alias("xattrs_changed"),
        data.alias("data_changed"),
        data.alias("whole_file"),
        F.expr("CAST(array() AS ARRAY<STRUCT<offset: BIGINT, length: BIGINT>>)").alias("ranges"),
        F.col("o.size").alias("old_size"),
        F.col("n.size").alias("new_size"),
    )
    flags = ["created", "deleted", "links_changed", "attrs_changed", "xattrs_changed", "data_changed"]
    keep = F.lit(False)
    for f in flags:
        keep = keep | F.col(f)
    return out.filter(keep).select(*CHANGE_FIELDS)


@holds_target_lease  # one writer per target: the whole hydrate, from its snapshot to its commit
def hydrate_target(
    config: Config,
    target: str,
    *,
    epoch: int | None = None,
    dump_uri: str | None = None,
    spark=None,
    log=print,
) -> dict[str, Any]:
    """Seed ``target`` from the dump at ``epoch`` (default: the latest dump); returns the commit's stats row."""
    from epochsync.core.model import change_struct_type
    from epochsync.stages import apply, commit, context, rollback, translate, verify
    from epochsync.stages.ingest.closure import missing_epoch_servers
    from epochsync.warehouse.snapshots import load_namespace_dump, read_snapshot, write_snapshot
    from epochsync.warehouse.tables import conform, write_table

    t0 = time.monotonic()
    tcfg = config.target(target)
    src = config.source_of(tcfg)
    dump_uri = (dump_uri or default_dump_uri(src)).rstrip("/")
    if epoch is None:
        have = dump_epochs(dump_uri)
        if not have:
            raise EpochError(f"no namespace dump under {dump_uri} (expected {dump_uri}/epoch=E/*.jsonl)")
        epoch = have[-1]
    missing = sorted(missing_epoch_servers(config, src.name, epoch))
    if missing:
        raise NotClosedError(
            f"epoch {epoch} of source {src.name!r} is not closed (no EPOCH record yet from {', '.join(missing)}): "
            "hydrate only from a closed epoch's dump"
        )
    committed = context.committed_epoch(config, tcfg)
    if committed >= epoch:
        raise EpochError(
            f"target {target!r} is already at epoch {committed} >= {epoch}: nothing to hydrate; the epoch DAG "
            f"carries it on from {committed + 1}"
        )
    if context.unfinished_epochs(config, tcfg, committed):
        log(f"target {target}: an unfinished epoch has an undo journal: rolling it back first")
        rollback.rollback_target(config, tcfg, spark, check=False)
    if spark is None:
        from epochsync.spark import spark_session

        spark = spark_session(f"epochsync-hydrate-{target}", cfg=config)
    wh = Warehouse(config.warehouse)
    base = committed
    first = base + 1
    log(f"target {target}: hydrating from {dump_uri}/epoch={epoch} (target at epoch {committed})")
    new = load_namespace_dump(spark, f"{dump_uri}/epoch={epoch}", src.root_fid)
    write_snapshot(spark, wh, target, epoch, new)
    new = read_snapshot(spark, wh, target, epoch, src.root_fid)
    old = read_snapshot(spark, wh, target, base, src.root_fid)
    changes = conform(snapshot_diff(old, new), change_struct_type())
    write_table(spark, changes, wh.changes(target, epoch))
    summary = translate.run_translate(config, tcfg, epoch, spark, whole_file=True, first_epoch=first)
    log(f"target {target}: plan {summary}")
    try:
        apply.run_apply(config, tcfg, epoch, spark, first_epoch=first)
        verify.run_verify(config, tcfg, epoch, spark, first_epoch=first)
        row = commit.run_commit(config, tcfg, epoch, first_epoch=first)
    except Exception:
        log(f"target {target}: hydrate failed: rolling back to epoch {committed}")
        rollback.rollback_target(config, tcfg, spark)
        raise
    log(
        f"target {target}: hydrated at epoch {epoch} in {time.monotonic() - t0:.1f}s; the epoch DAG goes on from {epoch + 1}"
    )
    return row
