"""``epochsync check``: is this setup able to run? Each piece a config names, tried as a run would.

Like ``dbt debug``: the config is loaded, then every source and target is reached the way the
stages reach them, and each check prints one line, ``ok`` or what is wrong and where:

- the warehouse: its folder exists (or can be made) and is writable;
- a changelogs source: its ``changelogs.uri`` folder (or bucket) is there and lists each
  server's files; its data store's connection resolves and its bucket answers;
- a gluster source: Gluster answers ``volume info`` through ``gluster_command``, the volume is
  started with changelogs on, and each brick is on btrfs here or served by its agent;
- a target: a posix target's folder (or its parent) is writable; an s3 or feed target's
  connection resolves and its bucket answers.

It writes nothing but a probe file it deletes again. The exit status is 0 when everything is
ok, otherwise the status of the first failure's class (3 config, 5 store, 12 source).
"""

from __future__ import annotations

import json
import os
import tempfile

from epochsync.core.errors import EpochsyncError, SourceError, StoreError


class Check:
    """The lines of one ``epochsync check`` run, and the first failure's exit status."""

    def __init__(self, out=print) -> None:
        self.out = out
        self.lines: list[dict] = []
        self.status = 0

    def run(self, what: str, fn) -> None:
        """Runs ``fn()`` (it returns a detail, or raises); prints and keeps one line."""
        try:
            detail = fn()
            ok, why = True, detail or ""
        except EpochsyncError as exc:
            ok, why = False, str(exc)
            self.status = self.status or exc.exit_code
        except OSError as exc:
            ok, why = False, f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
            self.status = self.status or SourceError.exit_code
        self.lines.append({"check": what, "ok": ok, "detail": why})
        self.out(f"{'ok    ' if ok else 'FAILED'} {what}" + (f": {why}" if why else ""))


def _writable_dir(path: str, what: str) -> str:
    folder = path
    while not os.path.isdir(folder):
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    fd, probe = tempfile.mkstemp(prefix=".epochsync-check-", dir=folder)
    os.close(fd)
    os.unlink(probe)
    return f"{path} is writable" + ("" if folder == path else f" (made on first use, under {folder})")


def _bucket(conn_id: str, bucket: str, *, made_on_first_use: bool = False) -> str:
    """``made_on_first_use`` (a target's): a bucket the store says is absent is fine, the first epoch
    creates it; the store answering is what counts."""
    from epochsync.stores.connections import resolve_s3
    from epochsync.stores.s3_access import S3Access, error_code

    settings = resolve_s3(conn_id)
    io = S3Access(settings, max_attempts=2)
    try:
        io.call(f"HEAD bucket {bucket}", lambda c: c.head_bucket(Bucket=bucket))
    except EpochsyncError:
        raise
    except Exception as exc:
        if made_on_first_use and error_code(exc) in ("404", "NoSuchBucket", "NotFound"):
            return f"bucket {bucket} does not exist yet via {settings.describe()}: the first epoch creates it"
        raise StoreError(f"bucket {bucket} via {settings.describe()}: {exc}") from None
    return f"bucket {bucket} answers via {settings.describe()}"


def _changelogs(src) -> str:
    from epochsync.stages.ingest.files import list_changelog_files, missing_changelog_folder

    if (gone := missing_changelog_folder(src)) is not None:
        raise gone
    files = list_changelog_files(src)
    counts = ", ".join(f"{s} {len(files.get(s, []))}" for s in src.servers)
    return f"{src.changelogs.uri}: changelog files per server: {counts}"


def _gluster(src) -> str:
    from epochsync.core.gluster import volume_info

    assert src.volume is not None
    info = volume_info(src.volume, command=src.gluster_commands)
    if info["status"] != "Started":
        raise SourceError(f"volume {src.volume} is {info['status']}, not Started (gluster volume start {src.volume})")
    if (info["options"] or {}).get("changelog.changelog") != "on":
        raise SourceError(
            f"volume {src.volume}: changelogs are off (gluster volume set {src.volume} changelog.changelog on)"
        )
    return f"volume {src.volume}: {info['type']}, {len(info['bricks'])} bricks, started, changelogs on"


def _bricks(src) -> str:
    from epochsync.stages.cut import mechanism

    mech = mechanism(src)
    layout = mech.layout()
    remote = sum(1 for b in mech.bricks if b.name in mech.agents)
    return f"{len(layout)} bricks ready to cut" + (f" ({remote} through their agents)" if remote else "")


def run_checks(cfg, targets: list[str] | None = None, out=print) -> Check:
    """Every check of ``cfg`` (only the targets named, when given); returns the run."""
    check = Check(out)
    wh = cfg.warehouse
    if "://" not in wh or wh.startswith("file://"):
        check.run(f"warehouse {wh}", lambda: _writable_dir(wh.removeprefix("file://"), "warehouse"))
    tcfgs = [cfg.target(t) for t in targets] if targets else list(cfg.targets)
    for src in cfg.sources:
        if targets and not any(t.source == src.name for t in tcfgs):
            continue
        if src.kind == "gluster":
            check.run(f"source {src.name}: Gluster", lambda src=src: _gluster(src))
            check.run(f"source {src.name}: bricks", lambda src=src: _bricks(src))
        else:
            check.run(f"source {src.name}: changelogs", lambda src=src: _changelogs(src))
            if src.store is not None:
                check.run(
                    f"source {src.name}: data store",
                    lambda src=src: _bucket(src.store.conn_id, src.store.bucket),
                )
    for t in tcfgs:
        if t.kind == "posix":
            check.run(f"target {t.name}: {t.path}", lambda t=t: _writable_dir(t.path, "target"))
        elif t.conn_id and t.bucket:
            check.run(f"target {t.name}: s3", lambda t=t: _bucket(t.conn_id, t.bucket, made_on_first_use=True))
        elif t.path:
            check.run(f"target {t.name}: {t.path}", lambda t=t: _writable_dir(t.path, "target"))
    return check


def configure_check(parser) -> None:
    """Add the ``check`` verb's options to ``parser``."""
    parser.add_argument("--config", help="the YAML config (default: $EPOCHSYNC_CONFIG)")
    parser.add_argument("--target", action="append", help="only this target and its source (repeatable)")
    parser.add_argument("--format", choices=("table", "json"), default="table")


def run_check(args) -> int:
    """Runs ``epochsync check``; returns 0 when every check passed, else the first failure's status."""
    from epochsync.core.config import load_config

    cfg = load_config(args.config)
    path = cfg.file
    if args.format == "json":
        check = run_checks(cfg, args.target, out=lambda _l: None)
        print(json.dumps({"config": str(path), "ok": check.status == 0, "checks": check.lines}, indent=1))
    else:
        print(f"config {path}: ok ({len(cfg.sources)} sources, {len(cfg.targets)} targets)")
        check = run_checks(cfg, args.target)
        print("everything is ready" if check.status == 0 else "not ready: see the FAILED lines")
    return check.status
