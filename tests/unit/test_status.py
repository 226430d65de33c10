"""status and report read a target's manifest, stats rows, events, cursors and pending records."""

import json
import textwrap

import pytest

from epochsync.cli import main
from epochsync.core.config import load_config
from epochsync.core.errors import ConfigError
from epochsync.journal.undo import write_json_atomic
from epochsync.report.status import failure_line, pending_operations, target_status
from epochsync.stages.rollback import failure_reason
from epochsync.warehouse.events import FAILED, ROLLED_BACK, record_event
from epochsync.warehouse.paths import Warehouse, local_path


@pytest.fixture()
def cfg(tmp_path):
    p = tmp_path / "epochsync.yaml"
    p.write_text(
        textwrap.dedent(f"""
        warehouse: file://{tmp_path}/wh
        sources:
          - name: sim
            root_fid: "[0x200000007:0x1:0x0]"
            servers: [MDT0000, OST0000]
            changelogs: {{uri: {tmp_path}/changelogs, format: jsonl}}
            store: {{conn_id: source_s3, bucket: data}}
            epoch: {{interval: 5m, start: 2026-01-01T00:00:00Z}}
        targets:
          - name: local
            source: sim
            kind: posix
            path: {tmp_path}/replica
    """)
    )
    return load_config(p)


def commit(cfg, epoch, **row):
    wh = Warehouse(cfg.warehouse)
    doc = {
        "target": "local",
        "source": "sim",
        "epoch": epoch,
        "records_in": 40,
        "bytes_changed": 4096,
        "bytes_pulled": 4096,
        "bytes_written": 4096,
        "bytes_copied": 0,
        "net_operations": {"created": 3, "data": 2},
        "durations": {"apply": 1.5, "merge": 2.0},
        "committed_at": 1767225900.0 + 300 * epoch,
        **row,
    }
    write_json_atomic(local_path(wh.stats("local", epoch)), doc)
    t = cfg.target("local")
    write_json_atomic(f"{t.path}/.epochsync/manifest.json", {"target": "local", "source": "sim", "epoch": epoch})


def write_records(cfg, epoch, types):
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = local_path(Warehouse(cfg.warehouse).records("sim", epoch)) + "/server=MDT0000"
    import os

    os.makedirs(d, exist_ok=True)
    pq.write_table(pa.table({"type": types, "index": list(range(len(types)))}), d + "/part-0.parquet")


def test_empty_target_is_at_epoch_zero(cfg):
    s = target_status(cfg, cfg.target("local"))
    assert s["committed_epoch"] == 0
    assert s["last_synced"] is None and s["last_run"] is None
    assert s["failures"] == 0 and s["rollbacks"] == 0


def test_status_reports_figures_failures_and_pending(cfg, capsys):
    commit(cfg, 1)
    commit(cfg, 2, records_in=77)
    write_json_atomic(
        local_path(Warehouse(cfg.warehouse).cursor("sim", "local")),
        {"epoch": 2, "servers": {"MDT0000": 120, "OST0000": 88}},
    )
    record_event(
        cfg.warehouse, "local", FAILED, 3, stage="verify", message="f001390.dat: object of 10 bytes, expected 436"
    )
    # the rollback's event, as rollback_target writes it: the reason is the epoch's failure
    reason = failure_reason(cfg.warehouse, "local", [3])
    assert reason == "verify failed: f001390.dat: object of 10 bytes, expected 436"
    record_event(cfg.warehouse, "local", ROLLED_BACK, 3, message="rolled back to epoch 2", back_at=2, reason=reason)
    write_records(cfg, 2, ["CREAT"])  # committed: not pending
    write_records(cfg, 3, ["CREAT", "RENME", "WRITE", "WRITE", "SATTR", "EPOCH"])
    s = target_status(cfg, cfg.target("local"))
    assert s["committed_epoch"] == 2
    assert s["last_synced"] == "2026-01-01T00:10:00Z"
    assert s["last_run"]["records_in"] == 77
    assert (s["failures"], s["rollbacks"]) == (1, 1)
    assert s["pending"] == {"entry": 2, "data": 2, "meta": 1}
    assert s["cursors"] == {"MDT0000": 120, "OST0000": 88}
    assert s["status"] == "Faulty"  # the last event is a rollback

    rc = main(["status", "--config", cfg.file, "--format", "json"])
    rows = json.loads(capsys.readouterr().out)
    assert rc == 1 and rows[0]["committed_epoch"] == 2
    main(["status", "--config", cfg.file])
    table = capsys.readouterr().out
    assert "local" in table and "Faulty" in table and "2026-01-01T00:10:00Z" in table
    # why, and where the rollback left it, not "rolled_back ... back at epoch 2"
    assert (
        "last failure: epoch 3 verify failed: f001390.dat: object of 10 bytes, expected 436; rolled back to epoch 2"
        in table
    ), table
    assert "MDT0000=120" in table
    # an event written before the reason was kept still reads
    assert failure_line({"event": ROLLED_BACK, "epoch": 3, "message": "back at epoch 2"}).endswith("back at epoch 2")
    assert failure_line({"event": FAILED, "epoch": 4, "stage": "apply", "message": "boom"}).startswith(
        "epoch 4 failed in apply at"
    )


def test_healthy_after_a_later_commit(cfg):
    record_event(cfg.warehouse, "local", FAILED, 1, message="x")
    commit(cfg, 1)
    from epochsync.warehouse.events import COMMITTED

    record_event(cfg.warehouse, "local", COMMITTED, 1)
    assert target_status(cfg, cfg.target("local"))["status"] in ("Active", "Lagging")


def test_pending_is_none_without_ingested_records(cfg):
    assert pending_operations(cfg, "sim", 0, None) is None


def test_report_writes_html_with_charts(cfg, tmp_path, capsys):
    commit(cfg, 1, closed_seen_at=1767225900.0 + 300 - 12.5)  # committed 12.5 s after the pipeline saw it closed
    commit(cfg, 2)  # a row from before closed_seen_at was recorded
    out = tmp_path / "r.html"
    assert main(["report", "--config", cfg.file, "--out", str(out)]) == 0
    page = out.read_text()
    assert page.count("<svg") == 4 and "bytes per epoch" in page and "<td>2</td>" in page
    assert "time per stage" in page and "lag at each commit" in page
    # the delay is counted from when the pipeline saw the epoch closed, never from the window's end
    assert "<td>12.5 s</td>" in page and "<td>unknown</td>" in page and "unknown for epoch 2" in page
    assert "epoch 1 delay: 12.5 s" in page
    # every chart has its axes' titles, and the stacked stages are named
    assert page.count(">seconds</text>") == 2 and ">bytes</text>" in page and ">epoch</text>" in page
    assert ">merge</text>" in page and ">apply</text>" in page
    assert capsys.readouterr().out.strip() == str(out)


def test_report_escapes_what_it_did_not_write(cfg, tmp_path):
    from epochsync.report.status import build_report

    commit(cfg, 1)
    record_event(cfg.warehouse, "local", FAILED, 2, message="<script>alert(1)</script> & more")
    page = build_report(cfg, [cfg.target("local")])
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt; &amp; more" in page


def test_delay_and_lag_from_the_stats_rows():
    from epochsync.report.status import epochs_behind, replication_delays

    rows = [
        {"epoch": 1, "closed_seen_at": 100.0, "committed_at": 130.0},
        {"epoch": 2, "closed_seen_at": 120.0, "committed_at": 150.0},
        {"epoch": 3, "closed_seen_at": 125.0, "committed_at": 160.0},
        {"epoch": 4, "committed_at": 170.0},
    ]
    assert replication_delays(rows) == [30.0, 30.0, 35.0, None]
    # when epoch 1 committed (t=130), epochs 2 and 3 had been seen closed already
    assert epochs_behind(rows) == [2, 1, 0, 0]


def test_chart_ticks_are_round_and_cover_the_data():
    from epochsync.report.charts import bar_chart, nice_ticks

    assert nice_ticks(0) == [0.0, 1.0]
    ticks = nice_ticks(37)
    assert ticks[0] == 0 and ticks[-1] >= 37 and len(ticks) <= 6
    c = bar_chart("t", "s", [1, 2], {"a": [3.0, None], "b": [1.0, 2.0]}, stacked=True)
    assert len(c.bars) == 3 and c.note == "unknown for epoch 2"
    assert all(c.left <= b.x and b.x + b.w <= c.plot_right and c.top <= b.y <= c.plot_bottom for b in c.bars)
    assert all(0 <= x and y <= c.height for x, y, _, _ in c.legend)


def test_each_stage_keeps_its_colour_on_every_targets_chart():
    from epochsync.report.charts import bar_chart
    from epochsync.report.status import STAGE_COLORS

    # a target whose rows have no ingest (another target ingested the epoch) keeps merge orange
    with_ingest = bar_chart("t", "s", [1], {"ingest": [1.0], "merge": [2.0]}, stacked=True, colors=STAGE_COLORS)
    without = bar_chart("t", "s", [1], {"merge": [2.0], "apply": [1.0]}, stacked=True, colors=STAGE_COLORS)
    legend = {name: colour for c in (with_ingest, without) for _, _, colour, name in c.legend}
    assert legend == {s: STAGE_COLORS[s] for s in ("ingest", "merge", "apply")}
    assert {b.color for b in without.bars} == {STAGE_COLORS["merge"], STAGE_COLORS["apply"]}
    assert len(set(STAGE_COLORS.values())) == len(STAGE_COLORS)


def test_unknown_target_is_a_clear_error(cfg, capsys):
    assert main(["status", "--config", cfg.file, "--target", "nope"]) == ConfigError.exit_code == 3
    assert "no target named 'nope'" in capsys.readouterr().err
