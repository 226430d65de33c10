"""Fuzzing the Lustre and Gluster importers: no input makes them fail with anything but ParseError.

Inputs: random bytes, random text over the changelog's own alphabet, real sample lines
mutated (bytes inserted, deleted, replaced) and truncated. Strict, the only exception
allowed is ParseError; with a quarantine sink, none at all, and every input line (Lustre)
ends up either as a record or as a quarantined error. Whatever comes out obeys the
record rules: names of namespace records are safe basenames, indexes increase.
"""

from __future__ import annotations

import io
import uuid
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epochsync.core.errors import ParseError
from epochsync.core.names import check_basename
from epochsync.core.schema import NAMING_TYPES, UNNAMING_TYPES
from epochsync.formats import ParseOptions, parse_stream

SAMPLES = Path(__file__).parents[1] / "fixtures" / "samples"
LUSTRE_LINES = [
    line
    for path in sorted((SAMPLES / "lustre").glob("*.txt"))
    for line in path.read_bytes().splitlines(keepends=True)
    if line.strip()
]
FUZZ = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ALPHABET = "0123456789abcdefx:[]=.-/ @<>tpsjuefnidmrwCREATMKDIRUNLSPXOHGWQ\n\x00"


def _gfid(text: str, binary: bool) -> bytes:
    return uuid.UUID(text).bytes if binary else text.encode()


def gluster_file(binary: bool, version: str = "1.2") -> bytes:
    """A valid changelog with every kind of record (same layout as test_gluster's encoder)."""
    g = [str(uuid.UUID(int=i + 1)) for i in range(4)]

    def n(v: int) -> bytes:
        return v.to_bytes(4, "little") if binary else str(v).encode()

    def e(parent: str, name: str) -> bytes:
        return _gfid(parent, binary) + b"/" + name.encode()

    recs = [
        (b"E", g[1], [n(4), n(0o40755), n(0), n(0), e(g[0], "d")]),
        (b"E", g[2], [n(23), n(0o100644), n(1), n(1), e(g[1], "f.txt")]),
        (b"D", g[2], []),
        (b"M", g[2], [n(38)]),
        (b"E", g[2], [n(8), e(g[1], "f.txt"), e(g[0], "g.txt")]),
        (b"E", g[3], [n(7), e(g[1], "ln")]),
        (b"E", g[2], [n(5), e(g[0], "g.txt") + b"\x00" + (b"/g.txt" if version == "1.2" else b"")]),
    ]
    if version == "1.1":
        recs[-1] = (b"E", g[2], [n(5), e(g[0], "g.txt")])
    out = bytearray(f"GlusterFS Changelog | version: v{version} | encoding : {1 if binary else 2}\n".encode())
    for kind, gfid, fields in recs:
        out += kind + _gfid(gfid, binary)
        for f in fields:
            out += b"\x00" + f
        out += b"\x00"
    return bytes(out)


GLUSTER_FILES = [gluster_file(b, v) for b in (False, True) for v in ("1.1", "1.2")] + [
    (SAMPLES / "gluster" / "v1.1_mkdir_create.changelog").read_bytes(),
    (SAMPLES / "gluster" / "v1.1_truncated.changelog").read_bytes(),
]


def check_output(records) -> None:
    last: dict[str, int] = {}
    for r in records:
        if r.type in NAMING_TYPES or (r.type in UNNAMING_TYPES and r.name is not None):
            check_basename(r.name)
        if r.type == "RENME":
            check_basename(r.sname)
        if r.type != "EPOCH":
            assert r.index > last.get(r.server, -1)
        last[r.server] = r.index


def parse_strict(fmt: str, data: bytes, file: str = "CHANGELOG.1700000000", **opts) -> None:
    out = []
    try:
        for r in parse_stream(fmt, io.BytesIO(data), file, ParseOptions(**opts)):
            out.append(r)
    except ParseError as exc:
        assert str(exc).startswith(file + ":")
    check_output(out)


def parse_quarantined(fmt: str, data: bytes, file: str = "CHANGELOG.1700000000", **opts):
    errors: list[ParseError] = []
    records = list(parse_stream(fmt, io.BytesIO(data), file, ParseOptions(on_error=errors.append, **opts)))
    check_output(records)
    return records, errors


def mutate(data: bytes, pos: int, delete: int, insert: bytes) -> bytes:
    pos %= len(data) + 1
    return data[:pos] + insert + data[pos + delete :]


# --------------------------------------------------------------------------- Lustre


@FUZZ
@given(st.binary(max_size=400))
def test_lustre_random_bytes(data):
    parse_strict("lustre", data, "f.txt", epochs_from_marks=True)
    records, errors = parse_quarantined("lustre", data, "f.txt")
    assert len(records) + len(errors) == sum(1 for line in data.split(b"\n") if line.strip())


@FUZZ
@given(st.text(alphabet=ALPHABET, max_size=300))
def test_lustre_random_text_over_the_format_alphabet(text):
    data = text.encode()
    parse_strict("lustre", data, "f.txt")
    parse_quarantined("lustre", data, "f.txt", epochs_from_marks=True)


@FUZZ
@given(
    st.lists(st.sampled_from(LUSTRE_LINES), min_size=1, max_size=6),
    st.integers(min_value=0),
    st.integers(min_value=0, max_value=12),
    st.binary(max_size=8) | st.sampled_from([b" ", b"  ", b"/", b"..", b"\x00", b"s=[", b" sp=[0:0x0:0x0] ", b"0x"]),
)
def test_lustre_mutated_sample_lines(lines, pos, delete, insert):
    data = mutate(b"".join(lines), pos, delete, insert)
    parse_strict("lustre", data, "f.txt", epochs_from_marks=True)
    records, errors = parse_quarantined("lustre", data, "f.txt")
    assert len(records) + len(errors) == sum(1 for line in data.split(b"\n") if line.strip())


@FUZZ
@given(st.sampled_from(LUSTRE_LINES), st.integers(min_value=0))
def test_lustre_truncated_lines(line, cut):
    data = line[: cut % (len(line) + 1)]
    parse_strict("lustre", data, "f.txt")
    parse_quarantined("lustre", data, "f.txt")


# --------------------------------------------------------------------------- Gluster


@FUZZ
@given(st.sampled_from(["1.1", "1.2"]), st.sampled_from([1, 2]), st.binary(max_size=400))
def test_gluster_random_bytes_after_a_valid_header(version, encoding, body):
    data = f"GlusterFS Changelog | version: v{version} | encoding : {encoding}\n".encode() + body
    parse_strict("gluster", data)
    parse_quarantined("gluster", data)


@FUZZ
@given(st.binary(max_size=200))
def test_gluster_random_bytes(data):
    parse_strict("gluster", data)
    parse_quarantined("gluster", data)


@FUZZ
@given(
    st.sampled_from(GLUSTER_FILES),
    st.integers(min_value=0),
    st.integers(min_value=0, max_value=20),
    st.binary(max_size=10) | st.sampled_from([b"\x00", b"E", b"M", b"D", b"/..", b"\x00\x00", b"/"]),
)
def test_gluster_mutated_files(data, pos, delete, insert):
    mutated = mutate(data, pos, delete, insert)
    parse_strict("gluster", mutated)
    parse_quarantined("gluster", mutated)


@FUZZ
@given(st.sampled_from(GLUSTER_FILES), st.integers(min_value=0))
def test_gluster_truncated_files(data, cut):
    truncated = data[: cut % (len(data) + 1)]
    parse_strict("gluster", truncated)
    records, errors = parse_quarantined("gluster", truncated)
    # a cut file never claims to be complete unless the cut fell between records
    if errors:
        assert not records or records[-1].type != "EPOCH"


# --------------------------------------------------------------------------- JSON Lines

JSON_ALPHABET = '{}[]":,0123456789-. \\nabcdefghijklmnopqrstuvwxyzEPOCHMARK'


@FUZZ
@given(st.text(alphabet=JSON_ALPHABET, max_size=300) | st.binary(max_size=200).map(lambda b: b.decode("latin-1")))
def test_jsonl_random_text(text):
    data = text.encode("utf-8", "surrogateescape")
    parse_strict("jsonl", data, "f.jsonl")
    records, errors = parse_quarantined("jsonl", data, "f.jsonl")
    assert len(records) + len(errors) == sum(1 for line in data.split(b"\n") if line.strip())
