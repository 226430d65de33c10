"""Lustre ``lfs changelog`` text: the exact records of every real sample, and bad input."""

from __future__ import annotations

import io
from calendar import timegm
from pathlib import Path

import pytest

from epochsync.core.errors import ParseError
from epochsync.core.schema import LUSTRE_TYPES
from epochsync.formats import ParseOptions, parse_file, parse_stream
from epochsync.formats.common import (
    FLAG_OPEN_READ,
    FLAG_OPEN_WRITE,
    ParseContext,
    opened_for_write,
)

SAMPLES = Path(__file__).parents[1] / "fixtures" / "samples" / "lustre"


def utc_ns(y, mo, d, h, mi, s, ns) -> int:
    return timegm((y, mo, d, h, mi, s, 0, 0, 0)) * 1_000_000_000 + ns


def parse_bytes(data: bytes, file: str = "t.txt", **opts) -> list[dict]:
    return [r.to_dict() for r in parse_stream("lustre", io.BytesIO(data), file, ParseOptions(**opts))]


def parse_text(text: str, **opts) -> list[dict]:
    return parse_bytes(text.encode(), **opts)


def sample_lines(name: str, first: int, last: int) -> bytes:
    """Lines first..last (1-based, inclusive) of a sample: one documented example block."""
    lines = (SAMPLES / name).read_bytes().splitlines(keepends=True)
    return b"".join(lines[first - 1 : last])


def error_of(data: bytes | str, **opts) -> ParseError:
    if isinstance(data, str):
        data = data.encode()
    with pytest.raises(ParseError) as exc:
        parse_bytes(data, **opts)
    return exc.value


NID159 = "10.128.11.159@tcp"
M = "MDT0000"


# --------------------------------------------------------------------------- samples


def test_manual_2018_first_block_current_format_with_jobids():
    got = parse_bytes(sample_lines("manual_2018.txt", 1, 4))
    assert got == [
        {"server": M, "index": 1, "epoch": 0, "type": "MKDIR", "time_ns": utc_ns(2018, 1, 9, 15, 15, 21, 977666834),
         "flags": 0, "tfid": "[0x200000402:0x1:0x0]", "pfid": "[0x200000007:0x1:0x0]", "name": "pics",
         "uid": 500, "gid": 500, "jobid": "mkdir.500", "nid": NID159},
        {"server": M, "index": 2, "epoch": 0, "type": "CREAT", "time_ns": utc_ns(2018, 1, 9, 15, 15, 36, 687592024),
         "flags": 0, "tfid": "[0x200000402:0x2:0x0]", "pfid": "[0x200000402:0x1:0x0]", "name": "chloe.jpg",
         "uid": 500, "gid": 500, "jobid": "cp.500", "nid": NID159},
        {"server": M, "index": 3, "epoch": 0, "type": "UNLNK", "time_ns": utc_ns(2018, 1, 9, 15, 15, 41, 305116815),
         "flags": 1, "tfid": "[0x200000402:0x2:0x0]", "pfid": "[0x200000402:0x1:0x0]", "name": "chloe.jpg",
         "uid": 500, "gid": 500, "jobid": "rm.500", "nid": NID159},
        {"server": M, "index": 4, "epoch": 0, "type": "RMDIR", "time_ns": utc_ns(2018, 1, 9, 15, 15, 46, 468790091),
         "flags": 1, "tfid": "[0x200000402:0x1:0x0]", "pfid": "[0x200000007:0x1:0x0]", "name": "pics",
         "uid": 500, "gid": 500, "jobid": "rmdir.500", "nid": NID159},
    ]  # fmt: skip


def test_manual_2018_second_block_mark_and_hardlink_with_mark_epochs():
    got = parse_bytes(sample_lines("manual_2018.txt", 5, 10), epochs_from_marks=True, first_epoch=7)
    common = {"server": M, "uid": 500, "gid": 500}
    assert got == [
        {**common, "index": 1, "epoch": 7, "type": "MKDIR", "time_ns": utc_ns(2018, 1, 9, 15, 15, 21, 977666834),
         "flags": 0, "tfid": "[0x200000402:0x1:0x0]", "pfid": "[0x200000007:0x1:0x0]", "name": "pics", "nid": NID159},
        {**common, "index": 2, "epoch": 7, "type": "CREAT", "time_ns": utc_ns(2018, 1, 9, 15, 15, 36, 687592024),
         "flags": 0, "tfid": "[0x200000402:0x2:0x0]", "pfid": "[0x200000402:0x1:0x0]", "name": "chloe.jpg",
         "nid": NID159},
        {**common, "index": 3, "epoch": 7, "type": "UNLNK", "time_ns": utc_ns(2018, 1, 9, 15, 15, 41, 305116815),
         "flags": 1, "tfid": "[0x200000402:0x2:0x0]", "pfid": "[0x200000402:0x1:0x0]", "name": "chloe.jpg",
         "nid": NID159},
        {**common, "index": 4, "epoch": 7, "type": "RMDIR", "time_ns": utc_ns(2018, 1, 9, 15, 15, 46, 468790091),
         "flags": 1, "tfid": "[0x200000402:0x1:0x0]", "pfid": "[0x200000007:0x1:0x0]", "name": "pics", "nid": NID159},
        # the MARK is kept in the epoch it closes ...
        {**common, "index": 5, "epoch": 7, "type": "MARK", "time_ns": utc_ns(2018, 1, 9, 15, 56, 39, 603643887),
         "flags": 0, "tfid": "[0x20001:0x0:0x0]", "pfid": "[0:0x50:0xb]", "name": "mdd_obd-lustre-MDT0000-0",
         "nid": "0@<0:0>"},
        # ... followed by the EPOCH record it stands for, same index and time
        {"server": M, "index": 5, "epoch": 7, "type": "EPOCH", "time_ns": utc_ns(2018, 1, 9, 15, 56, 39, 603643887)},
        {**common, "index": 9, "epoch": 8, "type": "HLINK", "time_ns": utc_ns(2018, 1, 9, 16, 6, 35, 291636498),
         "flags": 0, "tfid": "[0x200000402:0x4:0x0]", "pfid": "[0x200000007:0x3:0x0]", "name": "myhardlink",
         "nid": NID159},
    ]  # fmt: skip


def test_manual_2018_open_gxatr_xattr_nopen_examples():
    # four separate one-line examples of the manual (indexes 7, 8, 4, 4)
    opened = parse_bytes(sample_lines("manual_2018.txt", 11, 11))
    gxatr = parse_bytes(sample_lines("manual_2018.txt", 12, 12))
    xattr = parse_bytes(sample_lines("manual_2018.txt", 13, 13))
    nopen = parse_bytes(sample_lines("manual_2018.txt", 14, 14))
    assert opened == [
        {"server": M, "index": 7, "epoch": 0, "type": "OPEN", "time_ns": utc_ns(2017, 7, 25, 13, 38, 51, 510728296),
         "flags": 0x242 | FLAG_OPEN_WRITE, "tfid": "[0x200000401:0x2:0x0]", "uid": 500, "gid": 500, "nid": NID159},
    ]  # fmt: skip
    assert gxatr == [
        {"server": M, "index": 8, "epoch": 0, "type": "GXATR", "time_ns": utc_ns(2017, 7, 27, 9, 22, 55, 886793012),
         "flags": 0, "tfid": "[0x200000402:0x1:0x0]", "uid": 500, "gid": 500, "nid": NID159,
         "xattr_name": "user.name0"},
    ]  # fmt: skip
    assert xattr == [
        {"server": M, "index": 4, "epoch": 0, "type": "XATTR", "time_ns": utc_ns(2018, 1, 10, 9, 41, 36, 157333594),
         "flags": 0, "tfid": "[0x200000402:0x1:0x0]", "uid": 500, "gid": 500, "nid": NID159,
         "xattr_name": "user.name0"},
    ]  # fmt: skip
    assert nopen == [
        {"server": M, "index": 4, "epoch": 0, "type": "NOPEN", "time_ns": utc_ns(2017, 8, 31, 15, 45, 44, 947406626),
         "flags": 0x2 | FLAG_OPEN_WRITE, "tfid": "[0x200000402:0x1:0x0]", "uid": 500, "gid": 500,
         "nid": "10.128.11.158@tcp"},
    ]  # fmt: skip


def test_manual_2018_whole_file_reports_the_backwards_index_at_line_5():
    path = str(SAMPLES / "manual_2018.txt")
    with pytest.raises(ParseError) as exc:
        list(parse_file("lustre", path))
    assert str(exc.value) == f"{path}:5: index 1 of server MDT0000 goes backwards (after 4)"
    assert exc.value.index == 1 and exc.value.server == "MDT0000"


def test_manual_2018_whole_file_with_quarantine_keeps_every_good_line_and_names_every_bad_one():
    path = str(SAMPLES / "manual_2018.txt")
    bad: list[ParseError] = []
    got = list(parse_file("lustre", path, ParseOptions(on_error=bad.append)))
    assert [(r.index, r.type) for r in got] == [
        (1, "MKDIR"), (2, "CREAT"), (3, "UNLNK"), (4, "RMDIR"), (5, "MARK"), (9, "HLINK"),
    ]  # fmt: skip
    assert [(e.line, e.index) for e in bad] == [(5, 1), (6, 2), (7, 3), (8, 4), (11, 7), (12, 8), (13, 4), (14, 4)]
    assert bad[4].reason == "index 7 of server MDT0000 goes backwards (after 9)"
    assert bad[4].text.startswith("7 10OPEN  13:38:51.510728296 2017.07.25 0x242")
    lines = (SAMPLES / "manual_2018.txt").read_bytes().splitlines(keepends=True)
    assert bad[4].offset == sum(len(x) for x in lines[:10])


def test_manual_2011_old_format_raw_integer_time_block():
    got = parse_bytes(sample_lines("manual_2011_oldformat.txt", 1, 4))
    # 4298396676 = 4 << 30 | 3429380: 4 s and 3429380 ns after 1970 (the manual's example)
    assert 4298396676 == 4 << 30 | 3429380
    assert got == [
        {"server": M, "index": 2, "epoch": 0, "type": "MKDIR", "time_ns": 4_003_429_380, "flags": 0,
         "tfid": "[0x200000405:0x15f9:0x0]", "pfid": "[0x13:0x15e5a7a3:0x0]", "name": "pics"},
        {"server": M, "index": 3, "epoch": 0, "type": "CREAT", "time_ns": 4_003_434_968, "flags": 0,
         "tfid": "[0x200000405:0x15fa:0x0]", "pfid": "[0x200000405:0x15f9:0x0]", "name": "chloe.jpg"},
        {"server": M, "index": 4, "epoch": 0, "type": "UNLNK", "time_ns": 4_003_437_170, "flags": 0,
         "tfid": "[0x200000405:0x15fa:0x0]", "pfid": "[0x200000405:0x15f9:0x0]", "name": "chloe.jpg"},
        {"server": M, "index": 5, "epoch": 0, "type": "RMDIR", "time_ns": 4_003_438_098, "flags": 0,
         "tfid": "[0x200000405:0x15f9:0x0]", "pfid": "[0x13:0x15e5a7a3:0x0]", "name": "pics"},
    ]  # fmt: skip


def test_manual_2011_old_format_dated_block_two_marks_close_two_epochs():
    got = parse_bytes(sample_lines("manual_2011_oldformat.txt", 5, 10), epochs_from_marks=True)
    t = lambda h, mi, s, ns: utc_ns(2010, 3, 24, h, mi, s, ns)  # noqa: E731
    assert got == [
        {"server": M, "index": 1, "epoch": 1, "type": "MARK", "time_ns": t(19, 8, 20, 890432813), "flags": 0,
         "tfid": "[0x10001:0x0:0x0]", "name": "mdd_obd-lustre-MDT0000-0"},  # p=[0:0x0:0x0] is none
        {"server": M, "index": 1, "epoch": 1, "type": "EPOCH", "time_ns": t(19, 8, 20, 890432813)},
        {"server": M, "index": 2, "epoch": 2, "type": "MKDIR", "time_ns": t(19, 10, 21, 509659173), "flags": 0,
         "tfid": "[0x200000420:0x3:0x0]", "pfid": "[0x61b4:0xca2c7dde:0x0]", "name": "mydir"},
        {"server": M, "index": 3, "epoch": 2, "type": "SATTR", "time_ns": t(19, 10, 27, 329356533), "flags": 0,
         "tfid": "[0x200000420:0x3:0x0]"},
        {"server": M, "index": 4, "epoch": 2, "type": "CREAT", "time_ns": t(19, 10, 37, 113847713), "flags": 0,
         "tfid": "[0x200000420:0x4:0x0]", "pfid": "[0x200000420:0x3:0x0]", "name": "hosts"},
        {"server": M, "index": 5, "epoch": 2, "type": "MARK", "time_ns": t(19, 13, 40, 858292517), "flags": 0,
         "tfid": "[0x40001:0x0:0x0]", "name": "mdd_obd-lustre-MDT0000-0"},
        {"server": M, "index": 5, "epoch": 2, "type": "EPOCH", "time_ns": t(19, 13, 40, 858292517)},
        {"server": M, "index": 9, "epoch": 3, "type": "HLINK", "time_ns": t(19, 19, 35, 171867477), "flags": 0,
         "tfid": "[0x200000420:0x6:0x0]", "pfid": "[0x200000420:0x3:0x0]", "name": "myhardlink"},
    ]  # fmt: skip


def test_manual_2011_whole_file_reports_the_second_block_at_line_5():
    path = str(SAMPLES / "manual_2011_oldformat.txt")
    with pytest.raises(ParseError, match=r":5: index 1 of server MDT0000 goes backwards \(after 5\)$"):
        list(parse_file("lustre", path))


def test_hsm_record_without_index_takes_the_next_index():
    path = SAMPLES / "manual_hsm_no_index.txt"
    expected = {"server": M, "epoch": 0, "type": "HSM", "time_ns": utc_ns(2013, 10, 1, 13, 49, 47, 469433938),
                "flags": 0x280, "tfid": "[0x200000400:0x1:0x0]"}  # fmt: skip
    # alone: index 1; after the consumer cursor: cursor + 1; after other records: previous + 1
    assert parse_bytes(path.read_bytes()) == [{**expected, "index": 1}]
    assert parse_bytes(path.read_bytes(), after_index={M: 41}) == [{**expected, "index": 42}]
    ctx = ParseContext()
    list(parse_stream("lustre", io.BytesIO(sample_lines("test_framework.txt", 1, 1)), "a", ParseOptions(context=ctx)))
    got = [r.to_dict() for r in parse_stream("lustre", io.BytesIO(path.read_bytes()), "b", ParseOptions(context=ctx))]
    assert got == [{**expected, "index": 17}]


def test_icicle_squeezed_whitespace_rename_open_close():
    got = parse_bytes((SAMPLES / "icicle_normalized_whitespace.txt").read_bytes(), server="MDT0001")
    nid = "172.31.39.56@tcp"
    root, d, f1 = "[0x200000007:0x1:0x0]", "[0x200000401:0x2:0x0]", "[0x200000401:0x3:0x0]"
    t = lambda h, mi, s, ns: utc_ns(2026, 3, 16, h, mi, s, ns)  # noqa: E731
    u0 = {"server": "MDT0001", "epoch": 0, "uid": 0, "gid": 0, "nid": nid}
    u1000 = {"server": "MDT0001", "epoch": 0, "uid": 1000, "gid": 1000, "nid": nid}
    assert got == [
        {**u0, "index": 1, "type": "SATTR", "time_ns": t(2, 10, 1, 138251424), "flags": 0x44, "tfid": root},
        {**u0, "index": 4, "type": "CREAT", "time_ns": t(2, 10, 1, 749034600), "flags": 0,
         "tfid": "[0x200000401:0x1:0x0]", "pfid": root, "name": "test.txt"},
        # OPEN with m=-w- and p= but no name
        {**u0, "index": 5, "type": "OPEN", "time_ns": t(2, 10, 1, 749071801), "flags": 0x24A | FLAG_OPEN_WRITE,
         "tfid": "[0x200000401:0x1:0x0]", "pfid": root},
        {**u0, "index": 6, "type": "CLOSE", "time_ns": t(2, 10, 1, 750006074), "flags": 0x242,
         "tfid": "[0x200000401:0x1:0x0]"},
        {**u1000, "index": 9, "type": "MKDIR", "time_ns": t(2, 52, 19, 794688065), "flags": 0, "tfid": d,
         "pfid": root, "name": "test_plan_explore"},
        {**u1000, "index": 10, "type": "CREAT", "time_ns": t(2, 52, 19, 797308841), "flags": 0, "tfid": f1,
         "pfid": d, "name": "file1.txt"},
        # rename: new location in pfid/name, renamed fid in sfid, old in spfid/sname, t=[0:0x0:0x0] → no tfid
        {**u1000, "index": 16, "type": "RENME", "time_ns": t(2, 52, 19, 805772855), "flags": 0, "pfid": d,
         "name": "file1_renamed.txt", "sfid": f1, "spfid": d, "sname": "file1.txt"},
        {**u1000, "index": 17, "type": "UNLNK", "time_ns": t(2, 52, 19, 807645282), "flags": 1,
         "tfid": "[0x200000401:0x4:0x0]", "pfid": d, "name": "file2.txt"},
        {**u1000, "index": 23, "type": "RMDIR", "time_ns": t(2, 52, 19, 813302595), "flags": 1, "tfid": d,
         "pfid": root, "name": "test_plan_explore"},
    ]  # fmt: skip


def test_test_framework_creat_with_jobid_and_loopback_nid():
    assert parse_bytes((SAMPLES / "test_framework.txt").read_bytes()) == [
        {"server": M, "index": 16, "epoch": 0, "type": "CREAT", "time_ns": utc_ns(2018, 3, 9, 10, 28, 46, 968438800),
         "flags": 0, "tfid": "[0x200000401:0x10:0x0]", "pfid": "[0x200000007:0x1:0x0]", "name": "blob",
         "uid": 501, "gid": 501, "jobid": "touch.501", "nid": "0@lo"},
    ]  # fmt: skip


def test_hpc_provenance_unlink_with_odd_nid():
    assert parse_bytes((SAMPLES / "hpc_provenance.txt").read_bytes()) == [
        {"server": M, "index": 96, "epoch": 0, "type": "UNLNK", "time_ns": utc_ns(2019, 3, 7, 21, 6, 0, 508754493),
         "flags": 1, "tfid": "[0x200000403:0x60:0x0]", "pfid": "[0x200000405:0x2:0x0]", "name": "test2.txt",
         "uid": 0, "gid": 0, "jobid": "rm.1000", "nid": "0@<0:0>"},
    ]  # fmt: skip


def test_fsx_full_path_name_keeps_the_basename():
    nid = "172.31.39.207@tcp"
    t = lambda h, mi, s, ns: utc_ns(2026, 10, 9, h, mi, s, ns)  # noqa: E731
    assert parse_bytes((SAMPLES / "fsx_full_path_names.txt").read_bytes()) == [
        {"server": M, "index": 12955, "epoch": 0, "type": "MKDIR", "time_ns": t(5, 55, 15, 24429670), "flags": 0,
         "tfid": "[0x200000403:0x1928:0x0]", "pfid": "[0x200000007:0x1:0x0]", "name": "cl8", "uid": 0, "gid": 0,
         "nid": nid},
        {"server": M, "index": 12957, "epoch": 0, "type": "CREAT", "time_ns": t(5, 55, 18, 28357979), "flags": 0,
         "tfid": "[0x200000403:0x1929:0x0]", "pfid": "[0x200000403:0x1928:0x0]", "name": "a.txt", "uid": 0,
         "gid": 0, "nid": nid},
        {"server": M, "index": 12967, "epoch": 0, "type": "UNLNK", "time_ns": t(5, 55, 21, 970213014), "flags": 1,
         "tfid": "[0x200000403:0x1929:0x0]", "pfid": "[0x200000403:0x1928:0x0]", "name": "b.txt", "uid": 0,
         "gid": 0, "nid": nid},
    ]  # fmt: skip


@pytest.mark.parametrize("name", sorted(p.name for p in SAMPLES.glob("*.txt")))
def test_every_sample_parses_with_quarantine_and_every_line_is_accounted_for(name):
    bad: list[ParseError] = []
    recs = list(parse_file("lustre", str(SAMPLES / name), ParseOptions(on_error=bad.append)))
    lines = [x for x in (SAMPLES / name).read_bytes().splitlines() if x.strip()]
    assert len(recs) + len(bad) == len(lines)
    assert all("goes backwards" in e.reason for e in bad)


# --------------------------------------------------------------------------- format variants


LINE = (
    "{index} {num:02d}{name:<5} 15:15:21.977666834 2018.01.09 0x0 t=[0x200000402:0x1:0x0] "
    "ef=0xf u=500:500 nid=10.0.0.1@tcp p=[0x200000007:0x1:0x0] entry"
)


@pytest.mark.parametrize("num", sorted(LUSTRE_TYPES))
def test_every_type_by_number_and_name_padded_and_squeezed(num):
    name = LUSTRE_TYPES[num]
    padded = LINE.format(index=10, num=num, name=name)
    if name == "RENME":
        padded += " s=[0x200000402:0x5:0x0] sp=[0x200000402:0x6:0x0] old"
    squeezed = " ".join(padded.split())
    assert parse_text(padded)[0]["type"] == name
    assert parse_text(padded) == parse_text(squeezed)
    assert parse_text(padded)[0]["name"] == "entry"


def test_type_number_and_name_must_agree_and_unknown_types_are_errors():
    e = error_of(LINE.format(index=1, num=2, name="CREAT"))
    assert str(e) == "t.txt:1: type number 02 is MKDIR but the name says CREAT"
    e = error_of(LINE.format(index=1, num=25, name="FOO"))
    assert str(e) == "t.txt:1: unknown changelog type 25FOO (known types are 00 MARK to 24 NOPEN)"
    e = error_of(LINE.format(index=1, num=1, name="CRAET"))
    assert e.reason == "unknown changelog type name 'CRAET' for type 01 (expected CREAT)"


def test_name_with_spaces_runs_to_the_rename_fields():
    line = (
        "16 08RENME 02:52:19.805772855 2026.03.16 0x1 t=[0x200000401:0x9:0x0] ef=0xf u=1:2 nid=0@lo "
        "p=[0x200000401:0x2:0x0] my new  name.txt s=[0x200000401:0x3:0x0] sp=[0x200000401:0x7:0x0] old name .txt"
    )
    (rec,) = parse_text(line)
    assert rec["name"] == "my new  name.txt"
    assert rec["sname"] == "old name .txt"
    assert rec["tfid"] == "[0x200000401:0x9:0x0]"  # the overwritten fid
    assert rec["flags"] == 1
    assert (rec["sfid"], rec["spfid"], rec["pfid"]) == (
        "[0x200000401:0x3:0x0]",
        "[0x200000401:0x7:0x0]",
        "[0x200000401:0x2:0x0]",
    )
    creat = "3 01CREAT 02:52:19.805772855 2026.03.16 0x0 t=[0x200000401:0x9:0x0] p=[0x200000401:0x2:0x0]  two  spaces "
    assert parse_text(creat)[0]["name"] == " two  spaces "


def test_rename_source_printed_as_a_full_path_keeps_the_basename():
    line = (
        "7 08RENME 05:55:21.970213014 2026.10.09 0x0 t=[0:0x0:0x0] p=[0x200000403:0x1928:0x0] b.txt "
        "s=[0x200000403:0x1929:0x0] sp=[0x200000403:0x1928:0x0] /cl8/a.txt"
    )
    (rec,) = parse_text(line)
    assert (rec["name"], rec["sname"]) == ("b.txt", "a.txt")
    assert "tfid" not in rec


def test_rename_without_source_fields_is_the_unsupported_old_two_record_form():
    line = "8 08RENME 05:55:21.970213014 2026.10.09 0x0 t=[0x200000403:0x1:0x0] p=[0x200000403:0x2:0x0] a"
    assert "old two-record RENME/RNMTO rename format is not supported" in error_of(line).reason


def test_open_modes_go_to_flag_bits_and_say_open_for_write():
    base = "5 10OPEN  02:10:01.749071801 2026.03.16 0x{flags:x} t=[0x200000401:0x1:0x0] ef=0x7 u=0:0 nid=0@lo m={m}"
    read = parse_stream("lustre", io.BytesIO(base.format(flags=0, m="r--").encode()), "t", ParseOptions())
    (r,) = list(read)
    assert r.flags == FLAG_OPEN_READ and not opened_for_write(r)
    (w,) = list(parse_stream("lustre", io.BytesIO(base.format(flags=0, m="rw-").encode()), "t", ParseOptions()))
    assert w.flags == FLAG_OPEN_READ | FLAG_OPEN_WRITE and opened_for_write(w)
    # no m=: the open(2) access mode in the flags decides (0x242 = O_WRONLY|O_CREAT|O_TRUNC)
    close = "6 11CLOSE 02:10:01.750006074 2026.03.16 0x242 t=[0x200000401:0x1:0x0]"
    (c,) = list(parse_stream("lustre", io.BytesIO(close.encode()), "t", ParseOptions()))
    assert opened_for_write(c)
    e = error_of(base.format(flags=0, m="w"))
    assert e.reason == "bad m= open mode 'w' (expected three of r/w/x or -, like -w-)"


def test_fixed_epoch_and_time_window_epochs():
    text = (SAMPLES / "icicle_normalized_whitespace.txt").read_bytes()
    assert {r["epoch"] for r in parse_bytes(text, epoch=42)} == {42}
    split = utc_ns(2026, 3, 16, 2, 30, 0, 0)
    got = parse_bytes(text, epoch_of_time=lambda ns: 1 if ns < split else 2)
    assert [r["epoch"] for r in got] == [1, 1, 1, 1, 2, 2, 2, 2, 2]


def test_mark_epochs_continue_across_files_with_a_context():
    ctx = ParseContext()
    first = parse_bytes(sample_lines("manual_2011_oldformat.txt", 5, 9), epochs_from_marks=True, context=ctx)
    later = "10 01CREAT 19:20:00.000000000 2010.03.24 0x0 t=[0x200000420:0x7:0x0] p=[0x200000420:0x3:0x0] z"
    second = parse_text(later, epochs_from_marks=True, context=ctx)
    assert [(r["index"], r["type"], r["epoch"]) for r in first][-2:] == [(5, "MARK", 2), (5, "EPOCH", 2)]
    assert [(r["index"], r["epoch"]) for r in second] == [(10, 3)]
    # and the index order is checked across the files
    with pytest.raises(ParseError, match="index 4 of server MDT0000 goes backwards"):
        parse_text(later.replace("10 01CREAT", "4 01CREAT"), epochs_from_marks=True, context=ctx)


def test_blank_lines_and_crlf_line_ends_are_accepted():
    text = (SAMPLES / "test_framework.txt").read_bytes()
    assert parse_bytes(b"\n" + text.replace(b"\n", b"\r\n") + b"\n  \n") == parse_bytes(text)


# --------------------------------------------------------------------------- malformed input


GOOD = "16 01CREAT 10:28:46.968438800 2018.03.09 0x0 t=[0x200000401:0x10:0x0] p=[0x200000007:0x1:0x0] {}"


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("", "CREAT name is empty"),
        (".", "CREAT name '.' could escape the replica"),
        ("..", "CREAT name '..' could escape the replica"),
        ("a/b", "CREAT name 'a/b' contains '/' where a basename is expected"),
        ("/etc/passwd", "CREAT name '/etc/passwd' contains '/' where a basename is expected"),
    ],
)
def test_names_that_could_escape_the_replica_are_errors(name, reason):
    e = error_of(GOOD.format(name))
    assert str(e) == f"t.txt:1: {reason}"


def test_full_path_names_are_reduced_only_where_servers_print_them_and_still_checked():
    unlink = "17 06UNLNK 02:52:19.807645282 2026.03.16 0x1 t=[0x200000401:0x4:0x0] p=[0x200000401:0x2:0x0] {}"
    assert parse_text(unlink.format("/a/b/c.txt"))[0]["name"] == "c.txt"
    assert error_of(unlink.format("/a/..")).reason == "UNLNK name '..' could escape the replica"
    assert error_of(unlink.format("/a/")).reason == "UNLNK name is empty"


def test_nul_byte_and_bad_utf8_are_errors():
    assert error_of(GOOD.format("a\x00b")).reason == "line contains a NUL byte"
    e = error_of(GOOD.format("x").encode()[:-1] + b"\xff\xfe")
    assert e.reason.startswith("line is not valid UTF-8")


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("hello world", "not an lfs changelog line"),
        ("16 01CREAT 10:28:46.968438800 2018.13.09 0x0 t=[0x200000401:0x10:0x0]", "bad date 2018.13.09"),
        ("16 01CREAT 25:28:46.968438800 2018.03.09 0x0 t=[0x200000401:0x10:0x0]", "bad time 25:28:46.968438800"),
        ("16 01CREAT 10:28:46.968438800 2018.03.09 0x0 t=[zz]", "bad time, flags or t=[FID]"),
        ("16 01CREAT 10:28:46.968438800 2018.03.09 0x10000 t=[0x1:0x2:0x0]", "flags 0x10000 out of range"),
        ("16 13TRUNC 4298396676 0x0 t=[0x1:0x2:0x0] u=abc", "bad u= value 'abc' (expected UID:GID)"),
        ("16 13TRUNC 1073741823 0x0 t=[0x1:0x2:0x0]", "raw time 1073741823 has 1073741823 nanoseconds"),
        ("16 13TRUNC 4298396676 0x0 t=[0x1:0x2:0x0] u=1:2 u=1:2", "field u= appears twice"),
        ("16 13TRUNC 4298396676 0x0 t=[0x1:0x2:0x0]junk", "unexpected text 'junk' after the fields"),
        ("16 13TRUNC 4298396676 0x0 t=[0x1:0x2:0x0] s=[0x1:0x3:0x0] sp=[0x1:0x4:0x0] x", "s=/sp= on a TRUNC record"),
        ("99999999999999999999 13TRUNC 4298396676 0x0 t=[0x1:0x2:0x0]", "index 99999999999999999999 is out of range"),
        ("16 13TRUNC 4298396676 0x0 t=[0x1:0x2:0x0] u=1:4294967296", "gid 4294967296 is out of range"),
        ("16 01CREAT 4298396676 0x0 t=[0x1:0x2:0x0] x.txt", "CREAT without a parent fid"),
    ],
)
def test_malformed_lines_name_file_line_and_reason(line, reason):
    e = error_of("\n\n" + line + "\n")
    assert e.line == 3 and e.file == "t.txt" and e.offset == 2
    assert reason in e.reason
    assert str(e).startswith("t.txt:3: ")
    assert e.text == line


def test_quarantine_goes_on_after_each_bad_line_and_drops_nothing_silently():
    lines = [
        GOOD.format("ok1"),
        GOOD.format("..").replace("16 ", "17 ", 1),
        "garbage",
        GOOD.format("ok2").replace("16 ", "18 ", 1),
        GOOD.format("ok0").replace("16 ", "15 ", 1),  # backwards
    ]
    bad: list[ParseError] = []
    got = parse_text("\n".join(lines) + "\n", on_error=bad.append)
    assert [r["name"] for r in got] == ["ok1", "ok2"]
    assert [(e.line, e.index) for e in bad] == [(2, 17), (3, None), (5, 15)]
    assert [e.to_dict()["text"] for e in bad] == [lines[1], lines[2], lines[4]]


def test_an_s3_object_body_is_read_by_lines_not_by_its_1k_iteration_chunks():
    from botocore.response import StreamingBody

    data = (SAMPLES / "icicle_normalized_whitespace.txt").read_bytes()
    assert len(data) > 1024  # iterating the body would cut lines at 1 KiB
    body = StreamingBody(io.BytesIO(data), len(data))
    got = [r.to_dict() for r in parse_stream("lustre", body, "s3://b/MDT0000/1.txt", ParseOptions())]
    assert got == parse_bytes(data)
