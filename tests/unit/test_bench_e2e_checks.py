"""The e2e benchmark's checks of issue 32's fixed-change target: the median of epochsync's repeated
epochs when the rows have them, the one measurement when they do not."""

from __future__ import annotations

from epochsync_dev.bench.e2e import FIXED, checks


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
