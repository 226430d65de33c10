"""Canonical JSON Lines: round trips with the other importers, and bad lines."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from epochsync.core.errors import ParseError
from epochsync.core.schema import Extent, Layout, LayoutObject, ObjectRef, Record, write_jsonl
from epochsync.formats import ParseOptions, parse_file, parse_stream

SAMPLES = Path(__file__).parents[1] / "fixtures" / "samples"


def parse(data: bytes | str, **opts) -> list[Record]:
    if isinstance(data, str):
        data = data.encode()
    return list(parse_stream("jsonl", io.BytesIO(data), "in.jsonl", ParseOptions(**opts)))


def to_jsonl(records) -> str:
    buf = io.StringIO()
    write_jsonl(records, buf)
    return buf.getvalue()


def error_of(data: bytes | str, **opts) -> ParseError:
    with pytest.raises(ParseError) as exc:
        parse(data, **opts)
    return exc.value


def test_full_record_round_trips_with_extents_layout_object_and_binary_xattr():
    rec = Record(
        server="OST0001",
        index=7,
        epoch=3,
        type="WRITE",
        time_ns=1_700_000_000_123_456_789,
        flags=0,
        tfid="[0x200000402:0x2:0x0]",
        mode=0o100644,
        uid=500,
        gid=500,
        size=4096,
        xattr_name="user.k",
        xattr_value=b"\x00\xffv",
        layout=Layout(1 << 20, 2, (LayoutObject("OST0000", "0x10"),)),
        object=ObjectRef("OST0001", "0x11", "v42"),
        extents=(Extent(0, 10), Extent(100, 5)),
        cookie="c1",
        jobid="dd.500",
        nid="10.0.0.1@tcp",
    )
    assert parse(to_jsonl([rec])) == [rec]


@pytest.mark.parametrize(
    ("fmt", "path", "opts"),
    [
        ("lustre", "lustre/icicle_normalized_whitespace.txt", {}),
        ("lustre", "lustre/fsx_full_path_names.txt", {}),
        ("gluster", "gluster/v1.1_mkdir_create.changelog", {}),
    ],
)
def test_importer_output_round_trips_through_json_lines(fmt, path, opts):
    records = list(parse_file(fmt, str(SAMPLES / path), ParseOptions(**opts)))
    assert parse(to_jsonl(records)) == records


def test_mark_epochs_round_trip_the_epoch_record_shares_the_mark_index():
    text = b"".join((SAMPLES / "lustre/manual_2018.txt").read_bytes().splitlines(keepends=True)[4:10])
    records = list(parse_stream("lustre", io.BytesIO(text), "m", ParseOptions(epochs_from_marks=True)))
    assert [(r.index, r.type) for r in records][-3:] == [(5, "MARK"), (5, "EPOCH"), (9, "HLINK")]
    assert parse(to_jsonl(records)) == records


def test_only_an_epoch_after_a_mark_may_repeat_an_index():
    creat = {"server": "M", "index": 5, "epoch": 1, "type": "CREAT", "pfid": "p", "name": "a"}
    epoch = {"server": "M", "index": 5, "epoch": 1, "type": "EPOCH"}
    e = error_of(json.dumps(creat) + "\n" + json.dumps(epoch) + "\n")
    assert str(e) == "in.jsonl:2: index 5 of server M goes backwards (after 5)"
    twice = {"server": "M", "index": 5, "epoch": 1, "type": "MARK"}
    e = error_of("\n".join(json.dumps(x) for x in (twice, epoch, epoch)))
    assert e.line == 3


def test_fixed_epoch_overrides_and_server_fills_in_only_a_missing_one():
    lines = '{"index": 1, "epoch": 4, "type": "MTIME", "tfid": "f"}\n{"server": "OST0002", "index": 1, "epoch": 4, "type": "MTIME"}\n'
    got = parse(lines, epoch=9, server="OST0001")
    assert [(r.server, r.epoch) for r in got] == [("OST0001", 9), ("OST0002", 9)]


def test_blank_lines_are_skipped_and_line_numbers_still_count_them():
    e = error_of('\n\n{"server": "M", "index": 1, "epoch": 0, "type": "NOPE"}\n')
    assert str(e) == "in.jsonl:3: unknown record type 'NOPE'"
    assert e.offset == 2 and e.server == "M" and e.index == 1


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("{not json", "not valid JSON: Expecting property name enclosed in double quotes (column 2)"),
        ("[1, 2]", "expected a JSON object, got list"),
        ('{"server": "M", "index": 1, "epoch": 0}', "missing required field 'type'"),
        ('{"server": "M", "index": 1, "epoch": 0, "type": "MTIME", "colour": 1}', "unknown field(s) colour"),
        ('{"server": "M", "index": "1", "epoch": 0, "type": "MTIME"}', "field 'index' must be an integer, got '1'"),
        ('{"server": "M", "index": 1, "epoch": -1, "type": "MTIME"}', "negative epoch -1"),
        ('{"server": "M", "index": 1, "epoch": 0, "type": "XATTR", "xattr_value": "%%"}', "not valid base64"),
        ('{"server": "M", "index": 1, "epoch": 0, "type": "CREAT", "pfid": "p", "name": ".."}', "could escape"),
        ('{"server": "M", "index": 1, "epoch": 0, "type": "CREAT", "pfid": "p", "name": "a\\u0000"}', "NUL byte"),
        ('{"server": "M", "index": 1, "epoch": 0, "type": "CREAT", "name": "a"}', "CREAT without a parent fid"),
        (
            '{"server": "M", "index": 1, "epoch": 0, "type": "RENME", "pfid": "p", "name": "a", "sname": "b", '
            '"sfid": "s"}',
            "RENME without the old parent fid (sp=)",
        ),
        ("[" * 100_000, "not valid JSON"),
    ],
)
def test_bad_lines_name_file_line_and_reason(line, reason):
    e = error_of('{"server": "M", "index": 0, "epoch": 0, "type": "MTIME"}\n' + line + "\n")
    assert e.line == 2 and str(e).startswith("in.jsonl:2: ")
    assert reason in e.reason


def test_invalid_utf8_is_an_error_not_a_replacement_character():
    line = b'{"server": "M", "index": 1, "epoch": 0, "type": "CREAT", "pfid": "p", "name": "\xff"}\n'
    bad_at = line.index(b"\xff")
    e = error_of(line)
    assert e.reason == f"line is not valid UTF-8 (byte {bad_at} of the line)"


def test_quarantine_goes_on_and_records_every_bad_line():
    lines = [
        '{"server": "M", "index": 1, "epoch": 0, "type": "MTIME"}',
        "oops",
        '{"server": "M", "index": 1, "epoch": 0, "type": "MTIME"}',
        '{"server": "M", "index": 2, "epoch": 0, "type": "MTIME"}',
    ]
    bad: list[ParseError] = []
    got = parse("\n".join(lines), on_error=bad.append)
    assert [r.index for r in got] == [1, 2]
    assert [(e.line, e.text, e.index) for e in bad] == [(2, "oops", None), (3, lines[2], 1)]


def test_an_s3_object_body_is_read_by_lines():
    from botocore.response import StreamingBody

    records = list(parse_file("lustre", str(SAMPLES / "lustre/icicle_normalized_whitespace.txt")))
    data = to_jsonl(records).encode()
    assert len(data) > 1024
    got = list(parse_stream("jsonl", StreamingBody(io.BytesIO(data), len(data)), "s3://b/k", ParseOptions()))
    assert got == records


def test_the_simulators_changelogs_pass_the_importers_checks_file_after_file():
    """The simulator writes one JSON Lines file per server and epoch: they read back unchanged."""
    from collections import defaultdict

    from epochsync.formats.common import ParseContext
    from epochsync_dev.simulate.workload import fast_record_json, simulate_history

    history = simulate_history(seed=3, epochs=3, files=40, mdts=2, osts=2, data=False)
    ctx = ParseContext()
    for result in history.epochs:
        per_server = defaultdict(list)
        for r in result.records:
            per_server[r.server].append(r)
        for server, records in sorted(per_server.items()):
            data = "".join(fast_record_json(r) + "\n" for r in records).encode()
            got = list(parse_stream("jsonl", io.BytesIO(data), f"{server}/{result.epoch}", ParseOptions(context=ctx)))
            assert got == records
    assert sum(len(r.records) for r in history.epochs) > 50
