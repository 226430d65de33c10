"""GlusterFS changelogs: the real samples, both encodings of v1.1 and v1.2, and bad input.

There is no binary sample, so the tests build binary (and ascii) files with ``encode``
below, written from the changelog translator's source (``changelog-encoders.c``:
``CHANGELOG_STORE_ASCII/BINARY`` write the type byte and the GFID, each extra field is
preceded by a NUL, a record ends with a NUL; ``fop_fn``/``number_fn`` write decimal text or
raw 4-byte integers; ``entry_fn`` writes ``PARGFID/basename``; ``del_entry_fn`` (v1.2
UNLINK/RMDIR) adds a NUL and the path, or a NUL when no path was captured).
"""

from __future__ import annotations

import io
import uuid
from pathlib import Path

import pytest

from epochsync.core.errors import ParseError
from epochsync.formats import ParseOptions, parse_file, parse_stream
from epochsync.formats.common import ParseContext

SAMPLES = Path(__file__).parents[1] / "fixtures" / "samples" / "gluster"
ROOT = "00000000-0000-0000-0000-000000000001"
DIR1 = "0b99ef11-4b79-4cd0-9730-b5a0e8c4a8c0"
HELLO = "c5250af6-720e-4bfe-b938-827614304f39"


# --------------------------------------------------------------------------- an encoder


def num(n: int):
    return ("num", n)


def entry(pargfid: str, name: str):
    return ("entry", pargfid, name)


def del_entry(pargfid: str, name: str, path: str = ""):
    return ("del", pargfid, name, path)


def _gfid(text: str, binary: bool) -> bytes:
    return uuid.UUID(text).bytes if binary else text.encode()


def encode(records, *, binary: bool = False, version: str = "1.1", byteorder: str = "little") -> bytes:
    """A changelog file: header line, then each (kind, gfid, fields) record."""
    out = bytearray(f"GlusterFS Changelog | version: v{version} | encoding : {1 if binary else 2}\n".encode())
    for kind, gfid, fields in records:
        out += kind.encode() + _gfid(gfid, binary)
        for f in fields:
            out += b"\x00"
            if f[0] == "num":
                out += f[1].to_bytes(4, byteorder) if binary else str(f[1]).encode()
            else:
                out += _gfid(f[1], binary) + b"/" + f[2].encode()
                if f[0] == "del":
                    out += b"\x00" + (f[3].encode() if f[3] else b"\x00")
        out += b"\x00"
    return bytes(out)


def parse(data: bytes, file: str = "CHANGELOG.1700000000", **opts) -> list[dict]:
    return [r.to_dict() for r in parse_stream("gluster", io.BytesIO(data), file, ParseOptions(**opts))]


# --------------------------------------------------------------------------- samples


def test_v11_ascii_sample_exact_records_without_a_time_in_the_file_name():
    got = [r.to_dict() for r in parse_file("gluster", str(SAMPLES / "v1.1_mkdir_create.changelog"))]
    b = {"server": "brick0", "epoch": 0}
    assert got == [
        {
            **b,
            "index": 1,
            "type": "MKDIR",
            "tfid": DIR1,
            "pfid": ROOT,
            "name": "dir1",
            "mode": 0o40755,
            "uid": 0,
            "gid": 0,
        },
        {
            **b,
            "index": 2,
            "type": "CREAT",
            "tfid": HELLO,
            "pfid": DIR1,
            "name": "hello.txt",
            "mode": 0o100644,
            "uid": 0,
            "gid": 0,
        },
        {**b, "index": 3, "type": "WRITE", "tfid": HELLO},  # D: whole file, no extents
        {**b, "index": 4, "type": "WRITE", "tfid": HELLO},
        {**b, "index": 5, "type": "EPOCH"},  # the file is complete
    ]


def test_v11_ascii_sample_under_its_rollover_name_takes_time_index_server_and_epoch():
    data = (SAMPLES / "v1.1_mkdir_create.changelog").read_bytes()
    t = 1_400_000_015
    got = parse(data, f"brick1/.glusterfs/changelogs/CHANGELOG.{t}", server="vol0-brick1", epoch_of_time=lambda ns: 9)
    assert [(r["index"], r["time_ns"], r["server"], r["epoch"]) for r in got] == [
        (t * 1_000_000 + i, t * 1_000_000_000, "vol0-brick1", 9) for i in range(1, 6)
    ]
    assert parse(data, epoch=3)[0]["epoch"] == 3


def test_v11_ascii_sample_agrees_with_libgfchangelog_parse():
    """The sample's ``.parsed.txt`` is libgfchangelog's reading: the same fops, GFIDs and entries."""
    recs = list(parse_file("gluster", str(SAMPLES / "v1.1_mkdir_create.changelog")))
    theirs = (SAMPLES / "v1.1_mkdir_create.parsed.txt").read_text().split("\n")
    theirs = [line.split() for line in theirs if line]
    fop_type = {"MKDIR": "MKDIR", "CREATE": "CREAT"}
    assert len(recs) == len(theirs) + 1 and recs[-1].type == "EPOCH"
    for rec, fields in zip(recs, theirs):
        if fields[0] == "D":
            assert (rec.type, rec.tfid) == ("WRITE", fields[1])
        else:
            kind, gfid, fop, mode, uid, gid, path = fields
            assert kind == "E"
            assert (rec.type, rec.tfid, rec.mode, rec.uid, rec.gid) == (
                fop_type[fop],
                gfid,
                int(mode),
                int(uid),
                int(gid),
            )
            assert f"{rec.pfid}/{rec.name}" == path


def test_truncated_sample_yields_the_records_before_the_cut_then_names_the_byte_offset():
    path = str(SAMPLES / "v1.1_truncated.changelog")
    data = (SAMPLES / "v1.1_truncated.changelog").read_bytes()
    cut = data.rindex(b"E6e97")  # the record that is cut starts here
    assert cut == 203 and len(data) == 208
    got = []
    with pytest.raises(ParseError) as exc:
        for r in parse_file("gluster", path):
            got.append(r.to_dict())
    assert str(exc.value) == f"{path}:@203: truncated record at byte 203: the file ends at byte 208 inside it"
    assert exc.value.offset == 203 and exc.value.index == 3 and exc.value.text == "E6e97"
    gfid, parent = "a693c04e-af9e-4ba5-9ca7-1c4a47010d62", "f654232e-a42b-41b3-b5aa-803b3da45937"
    assert got == [
        {
            "server": "brick0",
            "index": 1,
            "epoch": 0,
            "type": "CREAT",
            "tfid": gfid,
            "pfid": parent,
            "name": "libvirt_driver_network.so",
            "mode": 0o100755,
            "uid": 0,
            "gid": 0,
        },
        {"server": "brick0", "index": 2, "epoch": 0, "type": "WRITE", "tfid": gfid},
    ]


def test_truncated_sample_with_quarantine_reports_it_and_writes_no_epoch_record():
    bad: list[ParseError] = []
    got = list(parse_file("gluster", str(SAMPLES / "v1.1_truncated.changelog"), ParseOptions(on_error=bad.append)))
    assert [r.type for r in got] == ["CREAT", "WRITE"]
    assert [(e.offset, e.index) for e in bad] == [(203, 3)]


# --------------------------------------------------------------------------- every fop, both encodings

G = [str(uuid.UUID(int=(0xA0 + i) << 100 | i)) for i in range(12)]
# a GFID whose raw bytes hold NUL, newline, '/', 'E' and 'D': a binary reader must not split on them
TRICKY = str(uuid.UUID(bytes=b"\x00\n/E\x00D\x00\x00M\x00\x01\x02\x03\x04\x05\x00"))
T = 1_700_000_000

OPS = [
    ("E", G[1], [num(4), num(0o40750), num(1000), num(100), entry(ROOT, "projects")]),
    ("E", G[2], [num(23), num(0o100600), num(1000), num(100), entry(G[1], "data file.bin")]),
    ("E", TRICKY, [num(3), num(0o10644), num(0), num(0), entry(G[1], "fifo")]),
    ("E", G[3], [num(7), entry(G[1], "latest")]),
    ("E", G[2], [num(9), entry(ROOT, "hardlink")]),
    ("D", G[2], []),
    ("M", G[2], [num(38)]),  # SETATTR
    ("M", G[2], [num(39)]),  # FSETATTR
    ("M", G[2], [num(17)]),  # SETXATTR
    ("M", G[2], [num(36)]),  # FSETXATTR
    ("M", G[2], [num(19)]),  # REMOVEXATTR
    ("M", TRICKY, [num(45)]),  # FREMOVEXATTR
    ("M", G[2], [num(33)]),  # XATTROP
    ("E", G[2], [num(8), entry(G[1], "data file.bin"), entry(ROOT, "renamed.bin")]),
]
DELETES_V11 = [
    ("E", G[3], [num(5), entry(G[1], "latest")]),
    ("E", G[1], [num(6), entry(ROOT, "projects")]),
]
DELETES_V12 = [
    ("E", G[3], [num(5), del_entry(G[1], "latest", "/projects/latest")]),
    ("E", G[1], [num(6), del_entry(ROOT, "projects")]),  # no path captured
]


def expected_records(server: str = "brick0") -> list[dict]:
    b = {"server": server, "epoch": 0, "time_ns": T * 1_000_000_000}
    recs = [
        {"type": "MKDIR", "tfid": G[1], "pfid": ROOT, "name": "projects", "mode": 0o40750, "uid": 1000, "gid": 100},
        {
            "type": "CREAT",
            "tfid": G[2],
            "pfid": G[1],
            "name": "data file.bin",
            "mode": 0o100600,
            "uid": 1000,
            "gid": 100,
        },
        {"type": "MKNOD", "tfid": TRICKY, "pfid": G[1], "name": "fifo", "mode": 0o10644, "uid": 0, "gid": 0},
        {"type": "SLINK", "tfid": G[3], "pfid": G[1], "name": "latest"},
        {"type": "HLINK", "tfid": G[2], "pfid": ROOT, "name": "hardlink"},
        {"type": "WRITE", "tfid": G[2]},
        {"type": "SATTR", "tfid": G[2]},
        {"type": "SATTR", "tfid": G[2]},
        {"type": "XATTR", "tfid": G[2]},
        {"type": "XATTR", "tfid": G[2]},
        {"type": "XATTR", "tfid": G[2]},
        {"type": "XATTR", "tfid": TRICKY},
        {"type": "XATTR", "tfid": G[2]},
        {"type": "RENME", "sfid": G[2], "spfid": G[1], "sname": "data file.bin", "pfid": ROOT, "name": "renamed.bin"},
        {"type": "UNLNK", "tfid": G[3], "pfid": G[1], "name": "latest"},
        {"type": "RMDIR", "tfid": G[1], "pfid": ROOT, "name": "projects"},
        {"type": "EPOCH"},
    ]
    return [{**b, "index": T * 1_000_000 + i, **r} for i, r in enumerate(recs, 1)]


@pytest.mark.parametrize("binary", [False, True], ids=["ascii", "binary"])
@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_every_fop_in_both_encodings_and_both_versions(binary, version):
    deletes = DELETES_V12 if version == "1.2" else DELETES_V11
    data = encode(OPS + deletes, binary=binary, version=version)
    assert parse(data, f"CHANGELOG.{T}") == expected_records()


def test_binary_big_endian_numbers_with_the_byte_order_option():
    data = encode(OPS + DELETES_V11, binary=True, byteorder="big")
    assert parse(data, f"CHANGELOG.{T}", gluster_byteorder="big") == expected_records()
    # read with the wrong byte order, fop 4 (MKDIR) becomes 0x04000000: a clear error, not garbage
    header_len = data.index(b"\n") + 1
    with pytest.raises(ParseError, match=rf"CHANGELOG.1700000000:@{header_len}: E record with fop 67108864"):
        parse(data, f"CHANGELOG.{T}")


def test_v12_file_with_the_v11_unlink_layout_is_an_error_not_a_shifted_parse():
    data = encode(OPS + DELETES_V11, version="1.2")
    first_unlink = len(encode(OPS, version="1.2"))
    with pytest.raises(ParseError) as exc:
        parse(data)
    # the v1.2 path field swallows the next record, so the error shows at or after the UNLINK
    assert exc.value.offset >= first_unlink


def test_header_only_file_is_an_empty_complete_rollover():
    assert parse(encode([]), "CHANGELOG.5") == [
        {"server": "brick0", "index": 5_000_001, "epoch": 0, "type": "EPOCH", "time_ns": 5_000_000_000}
    ]


def test_consecutive_rollovers_of_one_brick_keep_the_index_increasing():
    ctx = ParseContext()
    a = parse(encode(OPS[:2]), "CHANGELOG.100", context=ctx)
    b = parse(encode(OPS[:1]), "CHANGELOG.115", context=ctx)
    assert [r["index"] for r in a + b] == [100_000_001, 100_000_002, 100_000_003, 115_000_001, 115_000_002]
    with pytest.raises(ParseError, match="goes backwards"):
        parse(encode(OPS[:1]), "CHANGELOG.110", context=ctx)


# --------------------------------------------------------------------------- malformed input


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("..", "CREAT name '..' could escape the replica"),
        (".", "CREAT name '.' could escape the replica"),
        ("", "CREAT name is empty"),
        ("a/b", "CREAT name 'a/b' contains '/' where a basename is expected"),
    ],
)
@pytest.mark.parametrize("binary", [False, True], ids=["ascii", "binary"])
def test_unsafe_names_are_errors_with_the_byte_offset(name, reason, binary):
    data = encode([OPS[0], ("E", G[2], [num(23), num(0o100600), num(0), num(0), entry(G[1], name)])], binary=binary)
    second = len(encode([OPS[0]], binary=binary))
    with pytest.raises(ParseError) as exc:
        parse(data, "x/CHANGELOG.9")
    assert str(exc.value) == f"x/CHANGELOG.9:@{second}: {reason}"
    assert exc.value.index == 9_000_002


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        (b"", "missing header"),
        (b"hello\n", "missing header"),
        (b"GlusterFS Changelog | version: v1.1 | encoding : 2", "truncated header (no newline after it)"),
        (b"GlusterFS Changelog | version: v1.0 | encoding : 2\n", "unsupported changelog version v1.0"),
        (b"GlusterFS Changelog | version: v1.2 | encoding : 3\n", "unknown encoding 3 (1 = binary, 2 = ascii)"),
    ],
)
def test_bad_headers(header, reason):
    with pytest.raises(ParseError) as exc:
        parse(header)
    assert exc.value.offset == 0 and exc.value.reason.startswith(reason)
    assert str(exc.value).startswith("CHANGELOG.1700000000:@0: ")


def test_malformed_records_are_quarantined_and_parsing_resumes_at_the_next_record():
    good = encode(OPS[:2])
    header_len = good.index(b"\n") + 1
    junk = b"X" + G[5].encode() + b"\x00"  # unknown type byte
    wrong_fop = b"E" + G[6].encode() + b"\x0013\x00"  # WRITE is not an entry fop
    bad_gfid = b"D" + b"not-a-uuid-not-a-uuid-not-a-uuid-xyz" + b"\x00"
    data = good[:header_len] + junk + good[header_len:] + wrong_fop + bad_gfid + encode([OPS[5]])[header_len:]
    errors: list[ParseError] = []
    got = parse(data, "CHANGELOG.1", on_error=errors.append)
    assert [r["type"] for r in got] == ["MKDIR", "CREAT", "WRITE", "EPOCH"]
    assert [r["index"] for r in got] == [1_000_002, 1_000_003, 1_000_006, 1_000_007]
    assert [(e.offset, e.index) for e in errors] == [
        (header_len, 1_000_001),
        (header_len + len(good) - header_len + len(junk), 1_000_004),
        (header_len + len(good) - header_len + len(junk) + len(wrong_fop), 1_000_005),
    ]
    assert [e.reason for e in errors] == [
        f"unknown record type byte b'X' (expected E, M or D) (at byte {header_len})",
        f"E record with fop 13 (WRITE), which is not an entry operation (at byte {errors[1].offset + 38})",
        f"bad GFID b'not-a-uuid-not-a-uuid-not-a-uuid-xyz' (expected a lowercase UUID) (at byte {errors[2].offset + 1})",
    ]
    assert errors[0].text == junk.decode()
    # strict: the first one stops the parse
    with pytest.raises(ParseError, match=rf"CHANGELOG.1:@{header_len}: unknown record type byte"):
        parse(data, "CHANGELOG.1")


@pytest.mark.parametrize("binary", [False, True], ids=["ascii", "binary"])
def test_every_truncation_point_is_a_parse_error_naming_the_cut_record(binary):
    data = encode(OPS + DELETES_V12, binary=binary, version="1.2")
    header_len = data.index(b"\n") + 1
    starts = []
    pos = header_len
    for op in OPS + DELETES_V12:
        starts.append(pos)
        pos += len(encode([op], binary=binary, version="1.2")) - header_len
    for cut in range(header_len + 1, len(data)):
        if cut in starts:
            continue  # a cut between records looks like a complete file (with fewer records)
        record_start = max(s for s in starts if s < cut)
        got: list[dict] = []
        with pytest.raises(ParseError) as exc:
            for r in parse_stream("gluster", io.BytesIO(data[:cut]), "CHANGELOG.2", ParseOptions()):
                got.append(r.to_dict())
        assert exc.value.offset == record_start, cut
        assert exc.value.reason == f"truncated record at byte {record_start}: the file ends at byte {cut} inside it"
        assert len(got) == starts.index(record_start)


def test_an_epoch_before_the_first_window_is_an_error_for_every_record_and_the_epoch_record():
    errors: list[ParseError] = []
    got = parse(encode(OPS[:1]), "CHANGELOG.7", epoch_of_time=lambda ns: -1, on_error=errors.append)
    assert got == []
    assert [(e.index, e.reason) for e in errors] == [
        (7_000_001, "negative epoch -1"),
        (7_000_002, "closing EPOCH record: negative epoch -1"),
    ]


def test_the_dev_stack_stops_only_the_glusterd_it_started_by_its_pid():
    # never by name (pkill -x glusterd would end a host's glusterd, or a pool's in its namespace)
    import subprocess
    import sys

    from epochsync_dev.gluster import stop_glusterd

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert stop_glusterd(other.pid) is False  # a PID now held by something that is not glusterd
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()
    assert stop_glusterd(True) is False  # an older registry entry: no PID, nothing is ended
    assert stop_glusterd(None) is False
    assert stop_glusterd(2**22 + 12345) is False  # no such process
