"""The e2e benchmark's checks of issue 32's fixed-change target: the median of epochsync's repeated
epochs when the rows have them, the one measurement when they do not."""

from __future__ import annotations

from epochsync_dev.bench.e2e import FIXED, SCALE, checks


def _es(scenario: str, files: int, seconds: float, repeats: list[float] | None = None) -> dict:
    row = {"scenario": scenario, "tool": "epochsync", "files": files, "seconds": seconds, "requests": 0}
    if repeats is not None:
        runs = [seconds, *repeats]
        row["repeats"] = [{"epoch": 3 + i, "seconds": s} for i, s in enumerate(runs)]
        row["median_seconds"] = sorted(runs)[len(runs) // 2]
    return row


def _fixed_check(rows: list[dict]) -> dict:
    return next(c for c in checks(rows) if c["check"].startswith("fixed change"))


def test_the_fixed_change_check_takes_the_median_of_the_repeated_epochs():
    # one slow first epoch at 100,000 files: 2.0x alone, 1.1x by the medians
    rows = [_es(FIXED[0], 10_000, 10.0, [11.0, 9.0]), _es(FIXED[-1], 100_000, 20.0, [11.0, 10.5])]
    check = _fixed_check(rows)
    assert check["value"] == 1.1 and check["pass"], check
    assert "(the median of 3 epochs)" in check["check"]


def test_without_repeats_the_check_is_the_single_measurement():
    check = _fixed_check([_es(FIXED[0], 10_000, 10.0), _es(FIXED[-1], 100_000, 14.0)])
    assert check["value"] == 1.4 and not check["pass"]
    assert "median" not in check["check"]


def _scale(files: int, seconds: float, changed: int) -> dict:
    scenario = SCALE if files == 100_000 else f"{SCALE}-{files // 1000}k"
    row = {"scenario": scenario, "tool": "epochsync", "files": files, "seconds": seconds, "changed_files": changed}
    return {**row, "requests": 2 * changed, "bytes_read_source": 4096 * changed, "bytes_written": 8192 * changed}


def test_the_scale_check_compares_the_time_a_changed_file_takes():
    # 1 % of the files: ten times the change at ten times the files; the whole time grows 7.4x,
    # the time per changed file 0.74x (the committed bench-full of 2026-11-29)
    rows = [_scale(10_000, 1.09, 100), _scale(100_000, 8.03, 1000)]
    check = next(c for c in checks(rows) if "per changed file grows" in c["check"])
    assert check["check"].endswith("time per changed file grows < 2x from 10,000 to 100,000 files")
    assert check["value"] == 0.74 and check["pass"], check
    slow = next(
        c
        for c in checks([_scale(10_000, 1.0, 100), _scale(100_000, 25.0, 1000)])
        if "per changed file grows" in c["check"]
    )
    assert slow["value"] == 2.5 and not slow["pass"]


def test_recheck_writes_the_checks_and_the_chart_from_the_rows(tmp_path, monkeypatch, capsys):
    import json

    from epochsync_dev.bench.e2e import main

    monkeypatch.setenv("EPOCHSYNC_BENCH_RESULTS", str(tmp_path))
    assert main(["--recheck"]) == 1  # no rows: says so
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "e2e.json").write_text(json.dumps([_scale(10_000, 1.09, 100), _scale(100_000, 8.03, 1000)]))
    assert main(["--recheck"]) == 0
    written = json.loads((tmp_path / "e2e.checks.json").read_text())
    assert {c["check"].split(": ", 1)[1]: c["value"] for c in written if c["check"].startswith(SCALE + ":")} == {
        "epochsync's time per changed file grows < 2x from 10,000 to 100,000 files": 0.74,
        "<= 2.5 requests per changed file": 2.0,
    }
    assert (tmp_path / "e2e.html").read_text().startswith("<!doctype html>")
    assert "PASS" in capsys.readouterr().out
