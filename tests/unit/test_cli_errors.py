"""Expected failures end in one line on stderr and an exit code, never a raw traceback."""

from __future__ import annotations

import signal

import pytest

from epochsync.cli import main
from epochsync.core.shutdown import Interrupted
from epochsync.stages import entry, replicate, rollback


def rollback_raising(monkeypatch, exc: BaseException) -> None:
    def run_rollback(args):
        raise exc

    monkeypatch.setattr(rollback, "run_rollback", run_rollback)


@pytest.mark.parametrize(
    ("exc", "code", "line"),
    [
        (
            PermissionError(13, "Permission denied", "/replica/.epochsync/lease"),
            1,
            "epochsync rollback: error: /replica/.epochsync/lease: Permission denied (set EPOCHSYNC_DEBUG=1 for the "
            "traceback)",
        ),
        (
            FileNotFoundError(2, "No such file or directory", "/wh/records/x.parquet"),
            1,
            "epochsync rollback: error: /wh/records/x.parquet: No such file or directory (set EPOCHSYNC_DEBUG=1 for "
            "the traceback)",
        ),
        (KeyboardInterrupt(), 130, "epochsync rollback: interrupted by SIGINT"),
        (
            Interrupted(signal.SIGTERM, "target t is at committed epoch 4"),
            143,
            "epochsync rollback: interrupted by SIGTERM: target t is at committed epoch 4",
        ),
    ],
)
def test_one_line_and_an_exit_code(monkeypatch, capsys, exc, code, line):
    rollback_raising(monkeypatch, exc)
    assert main(["rollback", "--config", "c.yaml", "--target", "t"]) == code
    err = capsys.readouterr().err
    assert err.strip() == line


def test_debug_shows_the_traceback_of_a_file_system_error(monkeypatch):
    rollback_raising(monkeypatch, PermissionError(13, "Permission denied", "/x"))
    monkeypatch.setenv("EPOCHSYNC_DEBUG", "1")
    with pytest.raises(PermissionError):
        main(["rollback", "--config", "c.yaml", "--target", "t"])


def test_replicate_prints_a_no_op_row_instead_of_failing_on_it(monkeypatch, capsys):
    """A commit that found its epoch already committed returns a no-op row (no 'epoch' key)."""
    monkeypatch.setattr(replicate, "load_config", lambda path: object())
    monkeypatch.setattr(
        replicate, "replicate", lambda *a, **k: [{"noop": True, "message": "target t is already at epoch 3"}]
    )
    assert main(["replicate", "--config", "c.yaml", "--target", "t", "--through", "3"]) == 0
    assert "target t is already at epoch 3" in capsys.readouterr().out


def test_a_spark_app_stopped_by_airflow_says_so_in_one_line(monkeypatch, capsys):
    """Airflow stops a stage task with SIGTERM: one line, exit 143, the lease released on the way out."""
    import epochsync.spark

    def session(*a, **k):
        raise Interrupted(signal.SIGTERM)

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    monkeypatch.setattr(entry, "load_config", lambda path: object())
    monkeypatch.setattr(epochsync.spark, "spark_session", session)
    try:
        assert entry.stage_main("apply", ["--config", "c.yaml", "--target", "t", "--epoch", "2"]) == 143
        # the app's handler turns SIGTERM into the exception the finally blocks see
        with pytest.raises(Interrupted):
            signal.raise_signal(signal.SIGTERM)
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
    err = capsys.readouterr().err.strip()
    assert err.startswith("apply: stopped by SIGTERM; the target keeps its last committed epoch") and "\n" not in err


@pytest.mark.parametrize("verb", [None, *__import__("epochsync.cli", fromlist=["VERBS"]).VERBS])
def test_every_verb_has_help(verb, capsys):
    """``epochsync [VERB] --help`` prints usage and exits 0 for every verb (``bench`` once raised)."""
    with pytest.raises(SystemExit) as done:
        main([verb, "--help"] if verb else ["--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("usage: epochsync")


def test_every_stage_takes_the_same_arguments(capsys):
    """One parser for every stage process (spark_apps/<stage>.py): ingest by source, the rest by target."""
    from epochsync.stages.entry import STAGES, build_parser

    common = ["--config", "c.yaml", "--epoch", "2", "--through", "3", "--dry-run", "--whole-file"]
    for stage in STAGES:
        args = build_parser(stage).parse_args([*common, "--target", "t", "--inject-failure", "after=1"])
        assert (args.config, args.epoch, args.through, args.target, args.inject_failure) == (
            "c.yaml",
            2,
            3,
            "t",
            "after=1",
        )
    assert build_parser("ingest").parse_args(["--config", "c", "--epoch", "1", "--source", "s"]).source == "s"
    with pytest.raises(SystemExit):
        build_parser("merge").parse_args(["--config", "c", "--epoch", "1"])  # no target
    assert entry.stage_main("nope", []) == 2
    assert "unknown stage 'nope'" in capsys.readouterr().err


def test_version_prints_the_installed_version_and_exits_0(capsys):
    from importlib.metadata import version

    from epochsync.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"epochsync {version('epochsync')}"


def test_each_class_of_error_has_its_own_exit_status_and_the_table_names_each_once(monkeypatch, capsys):
    from epochsync.core import errors
    from epochsync.core.btrfs import BtrfsError
    from epochsync.core.gluster import GlusterError
    from epochsync.journal.lease import LeaseLostError, TargetBusyError
    from epochsync.stages.ingest.commit import IngestNotClosedError

    codes = [c for c, _ in errors.EXIT_CODES]
    assert len(codes) == len(set(codes)), codes  # one meaning a status
    cases = [
        (errors.ConfigError("c.yaml", "targets[0].kind", "unknown kind"), 3),
        (errors.NotClosedError("epoch 5 of source sim is not closed"), 4),
        (IngestNotClosedError(["epoch 5 is not closed: waiting for OST0001"]), 4),
        (errors.StoreError("s3://replica/: connection refused"), 5),
        (TargetBusyError("t", {"run": "x"}), 6),
        (LeaseLostError("lease of t taken over"), 6),
        (errors.VerifyError("verify of target t epoch 4: 1 difference(s)"), 7),
        (errors.EpochError("target t is at epoch 0, so epoch 2 would leave a gap"), 8),
        (errors.ParseError("f.txt", 3, "bad type"), 9),
        (errors.FenceError("write fence: target t was changed by someone else"), 10),
        (errors.SnapshotError("no snapshot of epoch 3"), 11),
        (GlusterError("gluster volume info failed"), 12),
        (BtrfsError("btrfs subvolume snapshot failed"), 12),
        (errors.EpochsyncError("something else"), 1),
    ]
    for exc, code in cases:
        assert exc.exit_code == code and code in codes, (exc, code)
        rollback_raising(monkeypatch, exc)
        assert main(["rollback", "--config", "c.yaml", "--target", "t"]) == code
        assert capsys.readouterr().err == f"epochsync rollback: error: {exc}\n"


def test_a_rolled_back_epoch_keeps_its_failures_status(monkeypatch, tmp_path):
    # replicate wraps the stage's error ("... failed and was rolled back: ...") and keeps its
    # class's status: a verify difference exits 7 after the rollback, not EpochError's 8
    from types import SimpleNamespace

    from epochsync.core.errors import EpochError, VerifyError
    from epochsync.stages import merge
    from epochsync.warehouse.events import read_events

    def verify(*a, **k):
        raise VerifyError("verify of target t epoch 4: 1 difference(s) with the source: f: size 10, expected 436")

    rolled = []
    spark = SimpleNamespace(addTag=lambda t: None, removeTag=lambda t: None)
    stubs = {
        "check_preconditions": lambda cfg, tcfg, e: {"action": "run"},
        "_missing_servers": lambda cfg, src, e: [],
        "mark_closed_seen": lambda *a: None,
        "_ingest": lambda *a, **k: {"records": 1},
        "run_translate": lambda *a, **k: {"namespace_ops": 0, "data_ops": 1, "post_ops": 0},
        "run_apply": lambda *a, **k: {},
        "run_verify": verify,
        "rollback_target": lambda *a, **k: rolled.append(1) or {"message": "target t is back at epoch 3"},
    }
    for name, fn in stubs.items():
        monkeypatch.setattr(replicate, name, fn)
    monkeypatch.setattr(merge, "run_merge", lambda *a, **k: {"changes": 1})
    wh = (tmp_path / "wh").as_uri()
    cfg = SimpleNamespace(warehouse=wh, source_of=lambda t: SimpleNamespace(name="sim"))
    tcfg = SimpleNamespace(name="t", kind="s3")
    session = SimpleNamespace(get=lambda: spark, existing=spark)
    with pytest.raises(EpochError) as exc:
        replicate._replicate_epoch(cfg, tcfg, 4, session, None, False, lambda line: None)
    assert rolled == [1]
    assert str(exc.value).startswith("epoch 4 of target t failed and was rolled back: verify of target t epoch 4")
    assert exc.value.exit_code == VerifyError.exit_code == 7 != EpochError.exit_code
    # the event log names the stage that failed (status and the report say it)
    failed = [e for e in read_events(wh, "t") if e["event"] == "failed"]
    assert [(e["epoch"], e["stage"]) for e in failed] == [(4, "verify")]
