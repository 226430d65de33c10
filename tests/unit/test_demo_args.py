"""``python -m epochsync_dev.demo``'s flags: ``make demo`` unchanged, ``REINTEGRATE=1`` and ``REINTEGRATE=only``."""

from __future__ import annotations

import pytest

from epochsync_dev.demo import parse_args


def test_plain_make_demo_runs_the_replica_demo_only():
    args = parse_args([])
    assert args.reintegrate is None
    assert (args.epochs, args.files, args.fail_epoch, args.fail_after, args.cluster) == (6, 2000, 4, 25, False)


def test_reintegrate_after_the_replicas_or_alone():
    assert parse_args(["--reintegrate"]).reintegrate == "after"
    assert parse_args(["--reintegrate", "only"]).reintegrate == "only"
    args = parse_args(["--reintegrate", "--cache-epochs", "2", "--cache-files", "24", "--epochs", "3"])
    assert (args.reintegrate, args.cache_epochs, args.cache_files, args.epochs) == ("after", 2, 24, 3)
    assert args.cache_fail_after == 3
    # the replica part's size does not matter when it does not run
    assert parse_args(["--reintegrate", "only", "--epochs", "0"]).epochs == 0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--reintegrate", "later"], "invalid choice: 'later'"),
        (["--reintegrate", "--cache-epochs", "1"], "--cache-epochs must be at least 2"),
        (["--epochs", "0"], "--epochs must be at least 1"),
    ],
)
def test_bad_flags_are_one_line_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
