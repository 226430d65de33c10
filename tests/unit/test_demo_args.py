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


def test_a_failed_epoch_says_which_stage_why_the_first_differences_and_where_it_is_now(tmp_path):
    # what the demo prints under a failed epoch's line (issue 50): read from what the stages
    # write - the event log and the epoch's verify report - not from the Airflow log
    import os
    from types import SimpleNamespace

    from epochsync.journal.undo import plan_dir, write_json_atomic
    from epochsync.stages.rollback import failure_reason
    from epochsync.warehouse.events import FAILED, ROLLED_BACK, record_event
    from epochsync_dev.demo import why_failed

    cfg = SimpleNamespace(warehouse=(tmp_path / "wh").as_uri())
    assert why_failed(cfg, "s3", 1) == []
    problems = [f"f00{i}.dat: object of 10 bytes, expected 436" for i in range(7)]
    msg = "verify of target s3 epoch 1: 7 difference(s) with the source: " + "; ".join(problems)
    record_event(cfg.warehouse, "s3", FAILED, 1, stage="verify", message=msg)
    write_json_atomic(
        os.path.join(plan_dir(cfg.warehouse, "s3", 1), "verify.json"),
        {"ok": False, "problem_count": 7, "problems": problems},
    )
    reason = failure_reason(cfg.warehouse, "s3", [1])
    record_event(cfg.warehouse, "s3", ROLLED_BACK, 1, message="rolled back to epoch 0", back_at=0, reason=reason)
    lines = why_failed(cfg, "s3", 1)
    assert lines[0].startswith("epoch 1 s3: verify failed: verify of target s3 epoch 1: 7 difference(s)")
    assert lines[1] == "verify found 7 difference(s); the first:"
    assert lines[2:7] == [f"  {p}" for p in problems[:5]]
    assert lines[-1] == "rolled back to epoch 0"
    assert why_failed(cfg, "s3", 2) == []  # another epoch's events are not this one's


def test_the_transcript_the_pages_show_is_a_runs_and_two_runs_of_one_seed_have_one_shape(tmp_path):
    from epochsync_dev.docs.demo_transcript import BEGIN, END, shape, transcript_lines, with_transcript

    work = tmp_path / "demo"
    lines = [
        "epoch  1 local  records   7042  net ops  4125  changed   59.8MiB  pulled   59.3MiB  copied        0B    23.5s  ok",
        "epoch  1 s3     records   7042  net ops  4125  changed   59.8MiB  pulled   27.9MiB  copied   31.8MiB    42.2s  ok",
    ]
    a = transcript_lines(lines, f"{work}/sim/warehouse/report/index.html", "demo: PASSED in 328s: every", work)
    assert "demo: report var/demo/sim/warehouse/report/index.html" in a
    b = a.replace("   23.5s", "    3.5s").replace("328s", "401s")  # the column is right-aligned
    assert shape(a) == shape(b)
    assert shape(a) != shape(a.replace("27.9MiB", "59.3MiB"))  # a figure that moved is a difference
    page = f"intro\n{BEGIN}\nold\n{END}\nafter\n"
    out = with_transcript(page, a)
    assert out.startswith(f"intro\n{BEGIN}\n```text\nepoch  1 local") and out.endswith(f"```\n{END}\nafter\n")
    assert with_transcript(out, a) == out  # idempotent
    assert with_transcript("no markers", a) == "no markers" and with_transcript(page, None) == page
