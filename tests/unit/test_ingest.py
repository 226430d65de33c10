"""Ingest without Spark: epoch closure, index continuity, cursors, and the JSON Lines fast path.

The fast path must never accept a line the importer rejects, and must produce exactly
the importer's records for the lines it accepts: both are checked line by line here.
"""

import io
import json

import pytest

from epochsync.core.config import config_from_dict
from epochsync.core.errors import EpochError, ParseError
from epochsync.core.schema import Record
from epochsync.formats import ParseOptions, parse_stream
from epochsync.stages.ingest.closure import (
    check_epoch_closed,
    closure_of_records,
    epoch_closure,
    latest_closed_epoch,
    missing_epoch_servers,
)
from epochsync.stages.ingest.cursors import IndexSpan, find_index_gaps, parse_cursor, read_cursor_indexes
from epochsync.stages.ingest.executor import (
    IngestJob,
    _arrow_schemas,
    _fast_chunk,
    _finish_fast,
    _records_to_batch,
    _Sink,
)
from epochsync.stages.ingest.files import ChangelogFile

# --------------------------------------------------------------------------- closure


def R(server, index, epoch, type_="CLOSE", **kw):
    return Record(server=server, index=index, epoch=epoch, type=type_, **kw)


def test_epoch_closed_when_every_server_wrote_its_epoch_record_or_a_later_one():
    records = [R("MDT0000", 1, 3), R("MDT0000", 2, 3, "EPOCH"), R("OST0000", 7, 4, "EPOCH")]
    closure = closure_of_records(["MDT0000", "OST0000"], records, 3)
    assert closure.closed and closure.waiting == ()
    assert closure.describe() == "epoch 3 is closed"


def test_open_epoch_names_the_servers_it_waits_for():
    records = [R("MDT0000", 1, 2, "EPOCH"), R("MDT0000", 2, 3), R("OST0000", 7, 3, "EPOCH")]
    closure = closure_of_records(["MDT0000", "OST0000", "OST0001"], records, 3)
    assert not closure.closed
    assert closure.waiting == ("MDT0000", "OST0001")
    assert closure.describe() == (
        "epoch 3 is not closed: waiting for MDT0000 (closed through 2), OST0001 (no EPOCH record yet)"
    )


def test_time_window_epochs_are_closed_by_a_record_of_a_later_window():
    records = [R("brick0", 1, 5), R("brick1", 1, 6)]
    closure = closure_of_records(["brick0", "brick1"], records, 5, epochs_from="time")
    assert closure.waiting == ("brick0",)
    assert epoch_closure(["a"], {"a": 9}, 9).closed


def _jsonl(server, index, epoch, type_="CLOSE", **kw):
    return json.dumps({"server": server, "index": index, "epoch": epoch, "type": type_, **kw}) + "\n"


def _config(tmp_path, fmt="jsonl", servers=("MDT0000", "OST0000"), **changelogs):
    return config_from_dict(
        {
            "warehouse": f"file://{tmp_path}/wh",
            "sources": [
                {
                    "name": "src",
                    "root_fid": "[0x200000007:0x1:0x0]",
                    "servers": list(servers),
                    "changelogs": {"uri": str(tmp_path / "cl"), "format": fmt, **changelogs},
                    "store": {"conn_id": "store", "bucket": "data"},
                    "epoch": {"interval": "5m", "start": "2026-01-01T00:00:00Z"},
                }
            ],
        }
    )


def test_sensor_reads_raw_jsonl_changelogs(tmp_path):
    (tmp_path / "cl" / "MDT0000").mkdir(parents=True)
    (tmp_path / "cl" / "MDT0000" / "000001.jsonl").write_text(
        _jsonl("MDT0000", 1, 1) + _jsonl("MDT0000", 2, 1, "EPOCH") + _jsonl("MDT0000", 3, 2)
    )
    (tmp_path / "cl" / "MDT0000" / "000002.jsonl").write_text(_jsonl("MDT0000", 4, 2, "EPOCH") + "{not json\n")
    (tmp_path / "cl" / "OST0000").mkdir()
    (tmp_path / "cl" / "OST0000" / "a.jsonl").write_text(_jsonl("OST0000", 1, 1, "EPOCH"))
    cfg = _config(tmp_path)
    assert check_epoch_closed(cfg, "src", 1).closed
    assert missing_epoch_servers(cfg, "src", 2) == ["OST0000"]
    assert latest_closed_epoch(cfg, "src") == 1
    # file:// URIs name the same directory
    assert missing_epoch_servers(_config(tmp_path, uri=f"file://{tmp_path}/cl"), "src", 2) == ["OST0000"]
    # a server with no directory at all has closed nothing
    assert missing_epoch_servers(_config(tmp_path, servers=("MDT0000", "MDT0001")), "src", 1) == ["MDT0001"]


LUSTRE = (
    "1 02MKDIR 15:15:21.977666834 2018.01.09 0x0 t=[0x200000402:0x1:0x0] p=[0x200000007:0x1:0x0] pics\n"
    "2 00MARK  15:56:39.603643887 2018.01.09 0x0 t=[0x20001:0x0:0x0] p=[0:0x50:0xb] mdd_obd-lustre-MDT0000-0\n"
    "3 01CREAT 15:15:36.687592024 2018.01.09 0x0 t=[0x200000402:0x2:0x0] p=[0x200000402:0x1:0x0] a.jpg\n"
)


def test_sensor_counts_lustre_marks_across_files(tmp_path):
    d = tmp_path / "cl" / "MDT0000"
    d.mkdir(parents=True)
    (d / "a.log").write_text(LUSTRE)
    (d / "b.log").write_text(
        LUSTRE.replace("1 02MKDIR", "4 02MKDIR").replace("2 00MARK", "5 00MARK").replace("3 01", "6 01")
    )
    cfg = _config(tmp_path, fmt="lustre", servers=("MDT0000",))
    assert check_epoch_closed(cfg, "src", 2).closed
    assert missing_epoch_servers(cfg, "src", 3) == ["MDT0000"]


# --------------------------------------------------------------------------- continuity


def test_continuous_files_and_cursor_have_no_gap():
    spans = [IndexSpan("M", "f1", 11, 20), IndexSpan("M", "f2", 21, 30), IndexSpan("O", "g1", 5, 9)]
    assert find_index_gaps(spans, {"M": 10}) == []


def test_gap_after_the_cursor_names_server_and_missing_range():
    assert find_index_gaps([IndexSpan("M", "f1", 15, 20)], {"M": 10}) == [
        "server M: records 11..14 are missing (the consumer cursor is at index 10; f1 starts at index 15)"
    ]


def test_no_cursor_means_the_first_index_is_not_checked():
    assert find_index_gaps([IndexSpan("M", "f1", 15, 20)], None) == []
    assert find_index_gaps([IndexSpan("M", "f1", 15, 20)], {"other": 3}) == []


def test_gap_and_backwards_between_files():
    spans = [IndexSpan("M", "f1", 1, 10), IndexSpan("M", "f2", 13, 20), IndexSpan("M", "f3", 20, 25)]
    assert find_index_gaps(spans) == [
        "server M: records 11..12 are missing (f1 ends at index 10; f2 starts at index 13)",
        "server M: index goes backwards: f3 starts at index 20 after index 20 in f2",
    ]


def test_quarantined_lines_explain_a_gap_of_their_size_only():
    ok = [IndexSpan("M", "f1", 1, 10, bad_after=1), IndexSpan("M", "f2", 13, 20, bad_before=1)]
    assert find_index_gaps(ok) == []
    short = [IndexSpan("M", "f1", 1, 10, bad_after=1), IndexSpan("M", "f2", 14, 20)]
    assert find_index_gaps(short) == [
        "server M: records 11..13 are missing (f1 ends at index 10; f2 starts at index 14)"
    ]
    # a file of only bad lines between two others counts too
    mid = [IndexSpan("M", "f1", 1, 10), IndexSpan("M", "f2", None, None, bad_before=2), IndexSpan("M", "f3", 13, 14)]
    assert find_index_gaps(mid) == []


def test_epoch_record_may_repeat_the_index_of_the_mark_before_it():
    spans = [IndexSpan("M", "f1", 1, 5, last_is_mark=True), IndexSpan("M", "f2", 5, 9, first_is_epoch=True)]
    assert find_index_gaps(spans) == []


# --------------------------------------------------------------------------- cursors


def test_cursor_file_parsing_and_errors():
    assert parse_cursor('{"epoch": 4, "servers": {"MDT0000": 120, "OST0000": 7}}', "c.json") == {
        "MDT0000": 120,
        "OST0000": 7,
    }
    with pytest.raises(EpochError, match=r"^c.json: consumer cursor is not valid JSON"):
        parse_cursor("{", "c.json")
    with pytest.raises(EpochError, match=r"c.json: consumer cursor: server 'M' has index -1"):
        parse_cursor('{"epoch": 1, "servers": {"M": -1}}', "c.json")


def test_cursor_of_one_consumer_or_minimum_over_all(tmp_path):
    wh = f"file://{tmp_path}/wh"
    assert read_cursor_indexes(wh, "src") is None
    d = tmp_path / "wh" / "cursors" / "source=src"
    d.mkdir(parents=True)
    (d / "dr.json").write_text('{"epoch": 5, "servers": {"M": 50, "O": 9, "X": 1}}')
    (d / "lab.json").write_text('{"epoch": 3, "servers": {"M": 30, "O": 12}}')
    assert read_cursor_indexes(wh, "src", "dr") == {"M": 50, "O": 9, "X": 1}
    assert read_cursor_indexes(wh, "src", "nobody") is None
    assert read_cursor_indexes(wh, "src") == {"M": 30, "O": 9}


# --------------------------------------------------------------------------- fast path == importer


GOOD_LINES = [
    {
        "server": "M",
        "index": 1,
        "epoch": 1,
        "type": "MKDIR",
        "tfid": "[0x1:0x2:0x0]",
        "pfid": "[0x1:0x1:0x0]",
        "name": "d é",
        "mode": 16877,
        "uid": 500,
        "gid": 4294967295,
        "time_ns": 1767225600123456789,
    },
    {
        "server": "M",
        "index": 2,
        "epoch": 1,
        "type": "CREAT",
        "tfid": "[0x1:0x3:0x0]",
        "pfid": "[0x1:0x2:0x0]",
        "name": "f",
        "layout": {
            "stripe_size": 1048576,
            "stripe_count": 2,
            "objects": [{"ost": "OST0000", "oid": "0x5"}, {"ost": "OST0001", "oid": "0x6"}],
        },
    },
    {
        "server": "M",
        "index": 3,
        "epoch": 1,
        "type": "LYOUT",
        "tfid": "[0x1:0x3:0x0]",
        "layout": {"stripe_size": 65536, "stripe_count": 0},
    },
    {
        "server": "M",
        "index": 4,
        "epoch": 1,
        "type": "XATTR",
        "tfid": "[0x1:0x3:0x0]",
        "xattr_name": "user.a",
        "xattr_value": "AAEC/w==",
    },
    {
        "server": "M",
        "index": 5,
        "epoch": 1,
        "type": "XATTR",
        "tfid": "[0x1:0x3:0x0]",
        "xattr_name": "user.a",
        "xattr_value": None,
    },
    {
        "server": "M",
        "index": 6,
        "epoch": 1,
        "type": "RENME",
        "tfid": None,
        "pfid": "[0x1:0x1:0x0]",
        "name": "g",
        "sfid": "[0x1:0x3:0x0]",
        "spfid": "[0x1:0x2:0x0]",
        "sname": "f",
        "flags": -1,
    },
    {
        "server": "M",
        "index": 7,
        "epoch": 1,
        "type": "WRITE",
        "tfid": "[0x1:0x3:0x0]",
        "object": {"ost": "OST0000", "oid": "0x5", "version": "v7", "size": 8193},
        "extents": [{"offset": 0, "length": 4096}, {"offset": 8192, "length": 1}],
    },
    {"server": "M", "index": 8, "epoch": 1, "type": "WRITE", "tfid": "[0x1:0x3:0x0]", "extents": []},
    {
        "server": "M",
        "index": 9,
        "epoch": 1,
        "type": "SLINK",
        "tfid": "[0x1:0x7:0x0]",
        "pfid": "[0x1:0x1:0x0]",
        "name": "l",
        "symlink": "../x/y",
    },
    {"index": 10, "epoch": 1, "type": "UNLNK", "tfid": "[0x1:0x7:0x0]", "pfid": "[0x1:0x1:0x0]", "flags": 1},
    {"server": "M", "index": 11, "epoch": 1, "type": "SATTR", "size": -5, "cookie": "c1", "jobid": "j", "nid": "n"},
    {"server": "M", "index": 12, "epoch": 1, "type": "EPOCH"},
]

BAD_LINES = [
    '{"server":"M","index":"13","epoch":1,"type":"CLOSE"}',  # string index
    '{"server":"M","index":13.0,"epoch":1,"type":"CLOSE"}',  # float index
    '{"server":"M","index":true,"epoch":1,"type":"CLOSE"}',
    '{"server":"M","index":13,"epoch":1,"type":"CLOSE","name":5}',  # number where a string belongs
    '{"server":"M","index":13,"epoch":1,"type":"CLOSE","colour":"blue"}',  # unknown key
    '{"server":"M","index":13,"epoch":1,"type":"CLOSE","index":14}',  # duplicate key
    '{"server":"M","index":13,"epoch":1,"type":"CLOSE"} {"server":"M","index":14,"epoch":1,"type":"CLOSE"}',
    '{"server":"M","index":13,"epoch":1,"type":"FROB"}',
    '{"server":"M","index":-1,"epoch":1,"type":"CLOSE"}',
    '{"server":"M","index":13,"epoch":-1,"type":"CLOSE"}',
    '{"server":"M","index":13,"epoch":1,"type":"CLOSE","uid":-1}',
    '{"server":"M","index":13,"epoch":1,"type":"CLOSE","mode":4294967296}',
    '{"server":"M","index":13,"epoch":1,"type":"CREAT","pfid":"[0x1:0x1:0x0]","name":".."}',
    '{"server":"M","index":13,"epoch":1,"type":"CREAT","pfid":"[0x1:0x1:0x0]","name":"a/b"}',
    '{"server":"M","index":13,"epoch":1,"type":"CREAT","pfid":"[0x1:0x1:0x0]","name":"a\\u0000b"}',
    '{"server":"M","index":13,"epoch":1,"type":"CREAT","pfid":"[0x1:0x1:0x0]","name":""}',
    '{"server":"M","index":13,"epoch":1,"type":"CREAT","pfid":"[0x1:0x1:0x0]"}',  # no name
    '{"server":"M","index":13,"epoch":1,"type":"CREAT","name":"x"}',  # no parent
    '{"server":"M","index":13,"epoch":1,"type":"UNLNK","pfid":"[0x1:0x1:0x0]","name":"."}',
    '{"server":"M","index":13,"epoch":1,"type":"RENME","pfid":"[0x1:0x1:0x0]","name":"a","spfid":"[0x1:0x1:0x0]","sname":"b"}',
    '{"server":"M","index":13,"epoch":1,"type":"RENME","pfid":"[0x1:0x1:0x0]","name":"a","sfid":"[0x1:0x2:0x0]","sname":"b"}',
    '{"server":"M","index":13,"epoch":1,"type":"SLINK","pfid":"[0x1:0x1:0x0]","name":"a","symlink":"x\\u0000"}',
    '{"server":"M","index":13,"epoch":1,"type":"XATTR","xattr_value":"aGk"}',  # bad base64 padding
    '{"server":"M","index":13,"epoch":1,"type":"XATTR","xattr_value":"a*=="}',
    '{"server":"M","index":13,"epoch":1,"type":"CREAT","pfid":"p","name":"n","layout":{"stripe_size":0,"stripe_count":1}}',
    '{"server":"M","index":13,"epoch":1,"type":"CREAT","pfid":"p","name":"n","layout":{"stripe_count":1}}',
    '{"server":"M","index":13,"epoch":1,"type":"CREAT","pfid":"p","name":"n","layout":{"stripe_size":1,"stripe_count":70000}}',
    '{"server":"M","index":13,"epoch":1,"type":"CREAT","pfid":"p","name":"n","layout":{"stripe_size":1,"stripe_count":1,"objects":[null]}}',
    '{"server":"M","index":13,"epoch":1,"type":"CREAT","pfid":"p","name":"n","layout":{"stripe_size":1,"stripe_count":1,"objects":[{"ost":"O"}]}}',
    '{"server":"M","index":13,"epoch":1,"type":"WRITE","object":{"oid":"0x1"}}',
    '{"server":"M","index":13,"epoch":1,"type":"WRITE","object":{"ost":"O","oid":"0x1","size":-1}}',
    '{"server":"M","index":13,"epoch":1,"type":"WRITE","object":{"ost":"O","oid":"0x1","size":"8"}}',
    '{"server":"M","index":13,"epoch":1,"type":"WRITE","extents":[{"offset":-1,"length":1}]}',
    '{"server":"M","index":13,"epoch":1,"type":"WRITE","extents":[{"offset":1}]}',
    '{"server":"M","index":13,"epoch":1,"type":"WRITE","extents":[null]}',
    '{"server":"M","index":12,"epoch":1,"type":"CLOSE"}',  # index goes backwards
    '{"server":"M","index":13,"epoch":1,"type":"CLOSE","flags":2147483648}',  # beyond int32: importer decides
    '{"server":"OTHER","index":13,"epoch":1,"type":"CLOSE"}',  # another server's record
    "[1, 2]",
    '{"server":"M","index":13,"epoch":1,"type":"CLOSE"',
    "   ",  # a blank line: the importer skips it, the fast path leaves that to it
]


def _importer(text: str) -> tuple[list[Record], list[ParseError]]:
    errors: list[ParseError] = []
    opts = ParseOptions(server="M", on_error=errors.append)
    return list(parse_stream("jsonl", io.BytesIO(text.encode()), "f.jsonl", opts)), errors


def _fast_table(text: str):
    _, read = _arrow_schemas()
    return _fast_chunk(text.encode(), "M", read)


def test_fast_path_accepts_good_lines_with_exactly_the_importers_records():
    import pyarrow as pa

    text = "".join(json.dumps(d) + "\n" for d in GOOD_LINES)
    records, errors = _importer(text)
    assert errors == [] and len(records) == len(GOOD_LINES)
    table = _fast_table(text)
    assert table is not None
    out, _ = _arrow_schemas()
    job = IngestJob(source="s", fmt="jsonl", epochs_from="records", first=1, last=1, continuity=True, after_index=None)
    sink = _Sink(job, ChangelogFile("M", 0, "f.jsonl"), out)
    fast = pa.Table.from_batches(_finish_fast(table, sink), schema=out)
    reference = pa.Table.from_batches([_records_to_batch(records, out)])
    assert fast.to_pylist() == reference.to_pylist()
    assert sink.report.closed_through == 1 and (sink.report.span_first, sink.report.span_last) == (1, 12)


#: lines the importer itself accepts but the fast path leaves to it: a duplicate key (the
#: last wins), flags beyond int32 (kept as their 32 bits), another server's record (ingest
#: refuses it), a blank line (skipped)
IMPORTER_ACCEPTS = {
    '{"server":"M","index":13,"epoch":1,"type":"CLOSE","index":14}',
    '{"server":"M","index":13,"epoch":1,"type":"CLOSE","flags":2147483648}',
    '{"server":"OTHER","index":13,"epoch":1,"type":"CLOSE"}',
    "   ",
}


@pytest.mark.parametrize("bad", BAD_LINES)
def test_fast_path_leaves_every_line_the_importer_rejects_to_the_importer(bad):
    good = "".join(json.dumps(d) + "\n" for d in GOOD_LINES)
    text = good + bad + "\n"
    records, errors = _importer(text)
    if bad not in IMPORTER_ACCEPTS:
        assert len(errors) == 1 and len(records) == len(GOOD_LINES)
    assert _fast_table(text) is None


# --------------------------------------------------------------------------- one file on an executor


def _run_file(path, server="M", first=1, last=1, after=None):
    from epochsync.stages.ingest.executor import _ingest_jsonl_file

    out, read = _arrow_schemas()
    job = IngestJob(
        source="s", fmt="jsonl", epochs_from="records", first=first, last=last, continuity=True, after_index=after
    )
    sink = _Sink(job, ChangelogFile(server, 0, str(path)), out)
    batches = list(_ingest_jsonl_file(sink, read))
    return [row for b in batches for row in b.to_pylist()], sink.finish()


def test_gap_inside_a_file_names_server_and_range(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text(_jsonl("M", 1, 1) + _jsonl("M", 2, 1) + _jsonl("M", 6, 1) + _jsonl("M", 7, 1, "EPOCH"))
    rows, rep = _run_file(p)
    assert [r["index"] for r in rows] == [1, 2, 6, 7]
    assert rep.gaps == [f"server M: records 3..5 are missing ({p} has index 6 after index 2)"]
    assert rep.fast_lines == 0 and rep.slow_lines == 4  # the importer judged the file


def test_importer_takes_over_mid_file_with_absolute_line_numbers(tmp_path, monkeypatch):
    import epochsync.stages.ingest.executor as ingest

    monkeypatch.setattr(ingest, "CHUNK_BYTES", 200)  # several chunks: the bad line is in a later one
    lines = [_jsonl("M", i, 1 if i < 8 else 2) for i in range(1, 12)]
    lines[9] = '{"server":"M","index":10,"epoch":2,"type":"CREAT","pfid":"[0x1:0x1:0x0]","name":".."}\n'
    lines[6] = _jsonl("M", 7, 1, "EPOCH")
    p = tmp_path / "a.jsonl"
    p.write_text("".join(lines))
    rows, rep = _run_file(p, first=2, last=2)
    assert [r["index"] for r in rows] == [8, 9, 11]
    assert rep.fast_lines > 0 and rep.slow_lines > 0
    assert rep.records == {2: 3} and rep.closed_through == 1
    ((epoch, err),) = rep.errors
    assert epoch == 2 and (err["line"], err["offset"]) == (10, sum(len(x) for x in lines[:9]))
    assert err["reason"] == "CREAT name '..' could escape the replica"
    # the bad record may stand for index 10: no gap
    assert rep.gaps == [] and (rep.span_first, rep.span_last) == (1, 11)


def test_bad_lines_of_other_epochs_are_left_to_their_own_run(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text(_jsonl("M", 1, 1) + "garbage\n" + _jsonl("M", 3, 1, "EPOCH") + _jsonl("M", 4, 2, "EPOCH"))
    _, rep = _run_file(p, first=2, last=2)
    assert rep.errors == [] and rep.records == {2: 1}
    _, rep = _run_file(p, first=1, last=1)
    assert [(e, d["line"]) for e, d in rep.errors] == [(1, 2)]


def test_lustre_source_without_an_epoch_source_is_refused(tmp_path):
    cfg = _config(tmp_path, fmt="lustre", servers=("MDT0000",), epochs_from="records")
    with pytest.raises(EpochError, match=r"lustre changelogs carry no epochs; set changelogs.epochs_from to mark"):
        missing_epoch_servers(cfg, "src", 1)


def test_lustre_time_window_epochs_close_when_a_later_window_has_records(tmp_path):
    d = tmp_path / "cl" / "MDT0000"
    d.mkdir(parents=True)
    (d / "a.log").write_text(LUSTRE)  # 15:15:21, 15:56:39, 15:15:36 on 2018-01-09
    cfg = config_from_dict(
        {
            "warehouse": f"file://{tmp_path}/wh",
            "sources": [
                {
                    "name": "src",
                    "root_fid": "[0x200000007:0x1:0x0]",
                    "servers": ["MDT0000"],
                    "changelogs": {"uri": str(tmp_path / "cl"), "format": "lustre", "epochs_from": "time"},
                    "store": {"conn_id": "store", "bucket": "data"},
                    "epoch": {"interval": "5m", "start": "2018-01-09T15:00:00Z"},
                }
            ],
        }
    )
    # 15:56:39 is in window 12 (15:55-16:00): windows up to 11 are closed
    assert check_epoch_closed(cfg, "src", 11).closed
    assert check_epoch_closed(cfg, "src", 12).describe() == (
        "epoch 12 of source 'src' is not closed: waiting for MDT0000 (closed through 11)"
    )


def test_a_record_after_its_epoch_was_closed_is_a_bad_record(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text(_jsonl("M", 1, 1) + _jsonl("M", 2, 1, "EPOCH") + _jsonl("M", 3, 1) + _jsonl("M", 4, 2, "EPOCH"))
    rows, rep = _run_file(p, first=1, last=2)
    assert [r["index"] for r in rows] == [1, 2, 4]
    assert [(e, d["reason"]) for e, d in rep.errors] == [
        (2, "record index 3 of epoch 1 comes after the server closed epoch 1")
    ]
    assert rep.gaps == []  # the bad record stands for index 3


def test_many_small_files_are_packed_into_a_few_balanced_tasks():
    from epochsync.stages.ingest import pack_files

    files = [ChangelogFile("M", i, f"f{i:03d}", size) for i, size in enumerate([100, 10, 60, 50, 40, 30, 5, 5])]
    tasks = pack_files(files, 3)
    assert sorted(f.uri for t in tasks for f in t) == sorted(f.uri for f in files)  # each file once
    assert [sum(f.size for f in t) for t in tasks] == [100, 100, 100]
    assert pack_files(files[:2], 8) == [[files[0]], [files[1]]]


def test_files_before_the_run_and_below_the_cursor_are_not_read_again(tmp_path):
    from epochsync.stages.ingest.files import file_tail, settled_files

    d = tmp_path / "M"
    d.mkdir()
    texts = {
        "1.jsonl": _jsonl("M", 1, 1) + _jsonl("M", 2, 1, "EPOCH"),
        "2.jsonl": _jsonl("M", 3, 2) + _jsonl("M", 4, 2, "EPOCH"),
        "3.jsonl": _jsonl("M", 5, 3) + _jsonl("M", 6, 3, "EPOCH") + "\n",
        "4.jsonl": "{broken\n",
    }
    files = []
    for i, (name, text) in enumerate(texts.items()):
        (d / name).write_text(text)
        files.append(ChangelogFile("M", i, str(d / name), len(text)))
    tails = {f.uri: file_tail(f) for f in files}
    assert [tails[f.uri] for f in files] == [(2, 1, "EPOCH"), (4, 2, "EPOCH"), (6, 3, "EPOCH"), None]
    names = lambda got: [f.uri.rsplit("/", 1)[-1] for f in got["M"]]  # noqa: E731
    assert names(settled_files({"M": files}, tails, 3, {"M": 4})) == ["3.jsonl", "4.jsonl"]
    # records above the cursor must still be read (continuity from the cursor)
    assert names(settled_files({"M": files}, tails, 3, {"M": 3})) == ["2.jsonl", "3.jsonl", "4.jsonl"]
    assert names(settled_files({"M": files}, tails, 3, None)) == ["3.jsonl", "4.jsonl"]
    # only a leading run: an unreadable tail stops the skipping
    assert names(settled_files({"M": [files[3], *files[:3]]}, tails, 3, None)) == [
        "4.jsonl",
        "1.jsonl",
        "2.jsonl",
        "3.jsonl",
    ]


# --------------------------------------------------------------------------- Spark Connect-ready driver side


class _Conf:
    def __init__(self, values):
        self.values = values

    def get(self, key, default=None):
        return self.values.get(key, default)


class _Session:
    def __init__(self, **values):
        self.conf = _Conf({k.replace("_", "."): v for k, v in values.items()})


def test_task_slots_come_from_the_session_conf_not_its_spark_context():
    from epochsync.stages.ingest import DEFAULT_CORES, TASKS_PER_CORE, task_slots

    assert task_slots(_Session(**{"spark_default_parallelism": "3", "spark_master": "local[8]"})) == 3 * TASKS_PER_CORE
    assert task_slots(_Session(spark_master="local[5]")) == 5 * TASKS_PER_CORE
    assert task_slots(_Session(spark_master="local")) == TASKS_PER_CORE
    assert task_slots(_Session(spark_master="spark://h:7077", spark_cores_max="6")) == 6 * TASKS_PER_CORE
    assert task_slots(_Session(spark_master="spark://h:7077")) == DEFAULT_CORES * TASKS_PER_CORE
    assert task_slots(_Session()) == DEFAULT_CORES * TASKS_PER_CORE


def test_an_ingest_into_a_warehouse_that_is_not_a_file_system_is_refused_before_any_work(tmp_path):
    from epochsync.stages.ingest import run_ingest

    cfg = config_from_dict(
        {
            "warehouse": "s3://bucket/wh",
            "sources": [
                {
                    "name": "src",
                    "root_fid": "[0x200000007:0x1:0x0]",
                    "servers": ["M"],
                    "changelogs": {"uri": str(tmp_path / "cl"), "format": "jsonl"},
                    "store": {"conn_id": "store", "bucket": "data"},
                    "epoch": {"interval": "5m", "start": "2026-01-01T00:00:00Z"},
                }
            ],
        }
    )
    with pytest.raises(EpochError, match=r"^ingest needs a file:// warehouse .*, not s3://bucket/wh$"):
        run_ingest(cfg, "src", 1, 1, spark=object())


def test_the_same_records_give_the_same_parquet_bytes_however_they_are_batched(tmp_path, monkeypatch):
    """What lets a re-ingest leave the committed files in place: fixed row groups, one chunk each."""
    import pyarrow.parquet as pq

    import epochsync.stages.ingest.executor as ingest

    monkeypatch.setattr(ingest, "ROW_GROUP_ROWS", 5)
    out, _ = _arrow_schemas()
    records = [
        R("M", i, 1 if i <= 7 else 2, "CREAT", tfid=f"[0x1:{i:#x}:0x0]", pfid="[0x1:0x1:0x0]", name=f"n{i}")
        for i in range(1, 13)
    ]
    f = ChangelogFile("M", 0, str(tmp_path / "changelog.jsonl"))
    whole = [_records_to_batch(records, out)]
    pieces = [_records_to_batch(records[i : i + 3], out) for i in range(0, 12, 3)]
    ingest._write_parquet(iter(whole), str(tmp_path / "a"), f, out)
    ingest._write_parquet(iter(pieces), str(tmp_path / "b"), f, out)
    name = ingest.part_file_name(f)
    for epoch, rows in ((1, 7), (2, 5)):
        a = tmp_path / "a" / f"epoch={epoch}" / "server=M" / name
        b = tmp_path / "b" / f"epoch={epoch}" / "server=M" / name
        assert a.read_bytes() == b.read_bytes()
        meta = pq.ParquetFile(a).metadata
        assert meta.num_rows == rows and [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == (
            [5, 2] if rows == 7 else [5]
        )
    assert sorted(p.name for p in (tmp_path / "a" / "epoch=1" / "server=M").iterdir()) == [name]  # no temp left


def test_fast_path_reads_keys_that_first_appear_after_the_sample_like_the_importer():
    """The JSON reader's schema comes from the keys of the chunk's first 64 KiB; keys that
    appear later are inferred and must still give exactly the importer's records."""
    import pyarrow as pa

    from epochsync.stages.ingest.executor import JSON_SAMPLE_BYTES

    head = []
    i = 0
    while sum(len(x) for x in head) <= JSON_SAMPLE_BYTES:
        i += 1
        head.append(
            json.dumps({"server": "M", "index": i, "epoch": 1, "type": "CLOSE", "tfid": "[0x1:0x2:0x0]"}) + "\n"
        )
    later = [dict(d, index=i + k + 1) for k, d in enumerate(GOOD_LINES) if d.get("server", "M") == "M"]
    later[-1]["type"] = "EPOCH"
    text = "".join(head) + "".join(json.dumps(d) + "\n" for d in later)
    records, errors = _importer(text)
    assert errors == []
    table = _fast_table(text)
    assert table is not None
    out, _ = _arrow_schemas()
    job = IngestJob(source="s", fmt="jsonl", epochs_from="records", first=1, last=1, continuity=False, after_index=None)
    sink = _Sink(job, ChangelogFile("M", 0, "f.jsonl"), out)
    fast = pa.Table.from_batches(_finish_fast(table, sink), schema=out)
    assert fast.to_pylist() == pa.Table.from_batches([_records_to_batch(records, out)]).to_pylist()
    # a later key with a value of the wrong type is still left to the importer
    bad = "".join(head) + json.dumps({"server": "M", "index": i + 1, "epoch": 1, "type": "CLOSE", "size": "5"}) + "\n"
    assert _fast_table(bad) is None
    assert len(_importer(bad)[1]) == 1
