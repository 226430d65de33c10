"""``epochsync parse``: JSON Lines on stdout, one clear error line, quarantine and exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from epochsync.cli import main
from epochsync.core.errors import ParseError
from epochsync.formats import ParseOptions, parse_file
from epochsync.formats.cli import EXIT_QUARANTINED

SAMPLES = Path(__file__).parents[1] / "fixtures" / "samples"
ICICLE = str(SAMPLES / "lustre" / "icicle_normalized_whitespace.txt")
MANUAL = str(SAMPLES / "lustre" / "manual_2018.txt")
TRUNCATED = str(SAMPLES / "gluster" / "v1.1_truncated.changelog")
GLUSTER = str(SAMPLES / "gluster" / "v1.1_mkdir_create.changelog")


def run(capsys, *argv: str) -> tuple[int, list[dict], str]:
    rc = main(["parse", *argv])
    out, err = capsys.readouterr()
    return rc, [json.loads(line) for line in out.splitlines()], err


def test_lustre_sample_prints_canonical_records_without_nulls(capsys):
    rc, recs, err = run(capsys, "--format", "lustre", ICICLE)
    assert rc == 0 and err == ""
    assert recs == [r.to_dict() for r in parse_file("lustre", ICICLE, ParseOptions(epochs_from_marks=True))]
    assert recs[6] == {
        "server": "MDT0000",
        "index": 16,
        "epoch": 1,
        "type": "RENME",
        "time_ns": 1773629539805772855,
        "flags": 0,
        "pfid": "[0x200000401:0x2:0x0]",
        "name": "file1_renamed.txt",
        "sfid": "[0x200000401:0x3:0x0]",
        "spfid": "[0x200000401:0x2:0x0]",
        "sname": "file1.txt",
        "uid": 1000,
        "gid": 1000,
        "nid": "172.31.39.56@tcp",
    }


def test_server_and_fixed_epoch_options(capsys):
    rc, recs, _ = run(capsys, "--format", "lustre", "--server", "MDT0003", "--epoch", "12", ICICLE)
    assert rc == 0
    assert {(r["server"], r["epoch"]) for r in recs} == {("MDT0003", 12)}


def test_bad_line_exits_1_with_file_line_reason_on_stderr(capsys):
    rc, recs, err = run(capsys, "--format", "lustre", MANUAL)
    assert rc == ParseError.exit_code == 9  # a bad input line: its own status
    assert err == f"epochsync parse: error: {MANUAL}:5: index 1 of server MDT0000 goes backwards (after 4)\n"
    assert [r["index"] for r in recs] == [1, 2, 3, 4]  # the lines before it were written


def test_quarantine_writes_bad_lines_goes_on_and_exits_with_its_own_code(capsys, tmp_path):
    qfile = tmp_path / "bad.jsonl"
    rc, recs, err = run(capsys, "--format", "lustre", "--quarantine", str(qfile), MANUAL)
    assert rc == EXIT_QUARANTINED == 3
    assert err == f"epochsync parse: 7 records written; 8 bad lines quarantined in {qfile}\n"
    assert [(r["index"], r["type"], r["epoch"]) for r in recs] == [
        (1, "MKDIR", 1),
        (2, "CREAT", 1),
        (3, "UNLNK", 1),
        (4, "RMDIR", 1),
        (5, "MARK", 1),
        (5, "EPOCH", 1),
        (9, "HLINK", 2),
    ]
    bad = [json.loads(line) for line in qfile.read_text().splitlines()]
    assert [b["line"] for b in bad] == [5, 6, 7, 8, 11, 12, 13, 14]
    assert bad[0] == {
        "file": MANUAL,
        "line": 5,
        "offset": 596,
        "server": "MDT0000",
        "index": 1,
        "reason": "index 1 of server MDT0000 goes backwards (after 4)",
        "text": "1 02MKDIR 15:15:21.977666834 2018.01.09 0x0 t=[0x200000402:0x1:0x0] ef=0xf u=500:500 "
        "nid=10.128.11.159@tcp p=[0x200000007:0x1:0x0] pics",
    }


def test_quarantine_with_nothing_bad_exits_0_and_leaves_an_empty_file(capsys, tmp_path):
    qfile = tmp_path / "bad.jsonl"
    rc, recs, err = run(capsys, "--format", "lustre", "--quarantine", str(qfile), ICICLE)
    assert (rc, len(recs), err, qfile.read_text()) == (0, 9, "", "")


def test_truncated_gluster_file_reports_the_records_then_the_byte_offset(capsys):
    rc, recs, err = run(capsys, "--format", "gluster", "--server", "vol-b1", TRUNCATED)
    assert rc == ParseError.exit_code
    assert [(r["server"], r["type"]) for r in recs] == [("vol-b1", "CREAT"), ("vol-b1", "WRITE")]
    assert err == (
        f"epochsync parse: error: {TRUNCATED}:@203: truncated record at byte 203: the file ends at byte 208 inside it\n"
    )


def test_jsonl_output_parses_back_to_the_same_output(capsys, tmp_path):
    rc, recs, _ = run(capsys, "--format", "gluster", GLUSTER)
    assert rc == 0 and recs[-1]["type"] == "EPOCH"
    canon = tmp_path / "canon.jsonl"
    canon.write_text("".join(json.dumps(r) + "\n" for r in recs))
    rc, again, _ = run(capsys, "--format", "jsonl", str(canon))
    assert rc == 0 and again == recs


def test_files_are_one_stream_index_order_is_checked_across_them(capsys, tmp_path):
    first = tmp_path / "0001.txt"
    second = tmp_path / "0002.txt"
    lines = Path(ICICLE).read_text().splitlines(keepends=True)
    first.write_text("".join(lines[:5]))
    second.write_text("".join(lines[5:]))
    rc, recs, _ = run(capsys, "--format", "lustre", str(first), str(second))
    assert rc == 0 and [r["index"] for r in recs] == [1, 4, 5, 6, 9, 10, 16, 17, 23]
    rc, _, err = run(capsys, "--format", "lustre", str(second), str(first))
    assert (
        rc == ParseError.exit_code
        and err == f"epochsync parse: error: {first}:1: index 1 of server MDT0000 goes backwards (after 23)\n"
    )


def test_missing_file_is_one_clear_line(capsys, tmp_path):
    missing = tmp_path / "nope.txt"
    rc, recs, err = run(capsys, "--format", "lustre", str(missing))
    assert (rc, recs) == (ParseError.exit_code, [])
    assert err == f"epochsync parse: error: {missing}: cannot read: No such file or directory\n"


def test_usage_errors_exit_2_and_help_documents_the_exit_codes(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["parse", "--format", "lustre", "--epoch", "-1", ICICLE])
    assert exc.value.code == 2
    assert "must be 0 or more, got -1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["parse", "--format", "xml", ICICLE])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        main(["parse", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--quarantine FILE" in out
    assert f"  {EXIT_QUARANTINED}  every good record written, but bad lines went to the --quarantine file" in out


def test_the_installed_console_script(tmp_path):
    script = Path(sys.executable).parent / "epochsync"
    assert script.exists(), "the console script is installed with the package (pip install -e .)"
    done = subprocess.run(
        [str(script), "parse", "--format", "lustre", ICICLE], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert [json.loads(x)["type"] for x in done.stdout.splitlines()] == [
        "SATTR",
        "CREAT",
        "OPEN",
        "CLOSE",
        "MKDIR",
        "CREAT",
        "RENME",
        "UNLNK",
        "RMDIR",
    ]
    bad = subprocess.run(
        [str(script), "parse", "--format", "lustre", MANUAL], capture_output=True, text=True, timeout=120
    )
    assert bad.returncode == ParseError.exit_code
    assert bad.stderr == f"epochsync parse: error: {MANUAL}:5: index 1 of server MDT0000 goes backwards (after 4)\n"
