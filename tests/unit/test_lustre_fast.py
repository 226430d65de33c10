"""The vectorized Lustre text parse against the importer, record for record.

``formats.lustre_fast.parse_lustre_chunk`` must either give exactly the importer's records
(same schema, same values, MARK epochs and synthesized EPOCH records included) or say None
and leave the chunk to the importer, which names the bad line. Checked on generated input
with the edge cases (names with spaces, quotes, unicode, ``s=`` inside; full paths; xattrs;
missing optional fields; CRLF; a last line without a newline; blank lines; zero FIDs),
on mutated sample lines (hypothesis), and through ingest (a bad line in a later chunk is
still named FILE:LINE).
"""

from __future__ import annotations

import io
import random
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epochsync.core.errors import ParseError
from epochsync.formats import ParseOptions, parse_stream
from epochsync.formats.common import ParseContext
from epochsync.formats.lustre_fast import parse_lustre_chunk
from epochsync.stages.ingest.executor import IngestJob, _arrow_schemas, _records_to_batch, _Sink
from epochsync.stages.ingest.files import ChangelogFile

SAMPLES = Path(__file__).parents[1] / "fixtures" / "samples" / "lustre"
OUT, _ = _arrow_schemas()

NAMES = [
    "a.txt",
    "file with spaces",
    "two  spaces",
    "trailing ",
    "é-ü-名前",
    'quote"d',
    "back\\slash",
    "tab\tname",
    "s=[0x1:0x2:0x0]",
    "x" * 255,
    "-",
    "name=value",
    "#hash",
    "\u200b",
]
TYPES_WITH_NAMES = ["CREAT", "MKDIR", "HLINK", "SLINK", "MKNOD", "UNLNK", "RMDIR"]
NUMBER = {
    "MARK": 0,
    "CREAT": 1,
    "MKDIR": 2,
    "HLINK": 3,
    "SLINK": 4,
    "MKNOD": 5,
    "UNLNK": 6,
    "RMDIR": 7,
    "RENME": 8,
    "OPEN": 10,
    "CLOSE": 11,
    "LYOUT": 12,
    "TRUNC": 13,
    "SATTR": 14,
    "XATTR": 15,
    "MTIME": 17,
    "CTIME": 18,
    "ATIME": 19,
    "GXATR": 23,
    "NOPEN": 24,
}


def fid(rnd: random.Random, zero_ok: bool = False) -> str:
    if zero_ok and rnd.random() < 0.3:
        return "[0:0x0:0x0]"
    if rnd.random() < 0.1:
        return f"[0:0x{rnd.randrange(1, 1 << 12):x}:0x{rnd.randrange(0, 16):x}]"
    return f"[0x{rnd.randrange(0x200000000, 0x200001000):x}:0x{rnd.randrange(1, 1 << 32):x}:0x{rnd.choice([0, 0, 1, 0xAB]):x}]"


def generate(rnd: random.Random, lines: int, *, first_index: int = 1, crlf: bool = False, marks: bool = True) -> str:
    """Valid ``lfs changelog`` text the importer accepts, every edge case the fast path takes."""
    out = []
    index = first_index
    for _ in range(lines):
        kind = rnd.choice(
            [*NUMBER, "RENME", "RENME", "CREAT", "UNLNK"] if marks else [t for t in NUMBER if t != "MARK"]
        )
        if rnd.random() < 0.2:
            index += rnd.randrange(1, 5)  # gaps are the ingest's business, not the parser's
        frac = str(rnd.randrange(10**9)).rjust(9, "0")[: rnd.choice([9, 9, 9, 1, 3, 6])]
        clock = f"{rnd.randrange(24):02d}:{rnd.randrange(60):02d}:{rnd.choice([0, 7, 59, 60]):02d}.{frac}"
        date = rnd.choice(["2026.01.01", "2024.02.29", "1970.01.01", "2099.12.31"])
        pad = " " * (max(1, 6 - len(kind)) if rnd.random() < 0.7 else 1)
        head = f"{index} {NUMBER[kind]:02d}{kind}{pad}{clock} {date} 0x{rnd.choice([0, 1, 0x242, 0xFFF, 0xFFFF]):x}"
        head += f" t={fid(rnd, zero_ok=kind in ('RENME', 'MARK'))}"
        fields = []
        if rnd.random() < 0.3:
            fields.append(f"j={rnd.choice(['', 'cp.500', 'rm.1000', 'job=x'])}")
        if rnd.random() < 0.8:
            fields.append(f"ef=0x{rnd.choice(['f', '7', 'ABCDEF0123456789'])}")
        if rnd.random() < 0.8:
            fields.append(f"u={rnd.choice(['0:0', '500:500', '4294967295:1'])}")
        if rnd.random() < 0.8:
            fields.append(f"nid={rnd.choice(['10.0.0.1@tcp', '0@<0:0>', '0@lo'])}")
        if kind in ("OPEN", "CLOSE", "NOPEN") and rnd.random() < 0.7:
            fields.append(f"m={rnd.choice(['-w-', 'r--', 'rwx', '---'])}")
        if kind in ("XATTR", "GXATR"):
            fields.append(f"x=user.{rnd.choice(['a', 'name0', 'x=y'])}")
        line = head + "".join(" " + f for f in fields)
        name = rnd.choice(NAMES)
        if kind == "RENME":
            old = "/dir/" + name if rnd.random() < 0.2 else name
            line += f" p={fid(rnd)} {name} s={fid(rnd)} sp={fid(rnd)} {old}"
        elif kind in TYPES_WITH_NAMES:
            if kind in ("UNLNK", "RMDIR") and rnd.random() < 0.3:
                name = "/some/dir/" + name
            line += f" p={fid(rnd)} {name}"
        elif kind == "MARK":
            line += " p=[0:0x50:0xb] mdd_obd-lustre-MDT0000-0"
        elif kind == "OPEN" and rnd.random() < 0.5:
            line += f" p={fid(rnd)}"
        elif rnd.random() < 0.1:
            line += " "  # an empty name: no name
        out.append(line + ("\r\n" if crlf and rnd.random() < 0.5 else "\n"))
        if rnd.random() < 0.03:
            out.append("\n")  # a blank line
        index += 1
    text = "".join(out)
    if rnd.random() < 0.5:
        text = text.rstrip("\n").rstrip("\r")  # the last line without its newline
    return text


def reference(text: bytes, **kw) -> pa.Table:
    records = list(parse_stream("lustre", io.BytesIO(text), "f.log", ParseOptions(**kw)))
    return pa.Table.from_batches([_records_to_batch(records, OUT)], schema=OUT)


def fast(text: bytes, time_grid=None, **kw):
    opts = ParseOptions(context=ParseContext(), **kw)
    parsed = parse_lustre_chunk(text, opts, OUT, time_grid=time_grid)
    return None if parsed is None else parsed[0].combine_chunks()


MODES = [
    ({"epochs_from_marks": True, "server": "MDT0001", "first_epoch": 3}, None),
    ({"epoch": 7}, None),
    ({}, None),
    (
        {"epoch_of_time": lambda ns: (ns - 1_700_000_000 * 10**9) // (300 * 10**9) + 1},
        (1_700_000_000 * 10**9, 300 * 10**9),
    ),
]


@pytest.mark.parametrize("seed", range(12))
def test_generated_text_gives_exactly_the_importers_records(seed):
    rnd = random.Random(seed)
    text = generate(rnd, 400, crlf=seed % 3 == 0, marks=seed % 4 != 3).encode()
    kw, grid = MODES[seed % len(MODES)]
    if grid is not None:
        text = text.replace(b" 1970.01.01 ", b" 2026.01.01 ")  # before the grid: negative epochs
    got = fast(text, grid, **kw)
    assert got is not None, "the fast path must take clean lfs changelog text"
    want = reference(text, **kw)
    assert got.schema == want.schema
    assert got.to_pylist() == want.to_pylist()


def test_chunks_carry_index_order_and_mark_epochs_like_one_stream():
    rnd = random.Random(99)
    text = generate(rnd, 600, marks=True)
    lines = text.splitlines(keepends=True)
    first, second = "".join(lines[:250]).encode(), "".join(lines[250:]).encode()
    opts = ParseOptions(epochs_from_marks=True, context=ParseContext())
    tables = []
    for chunk in (first, second):
        table, state = parse_lustre_chunk(chunk, opts, OUT)
        state.apply(opts)
        tables.append(table)
    got = pa.concat_tables(tables).combine_chunks()
    assert got.to_pylist() == reference(text.encode(), epochs_from_marks=True).to_pylist()
    # a chunk that goes backwards against the carried index is left to the importer
    assert parse_lustre_chunk(first, opts, OUT) is None


def test_the_sample_changelogs_parse_fast_or_go_to_the_importer():
    taken = 0
    for path in sorted(SAMPLES.glob("*.txt")):
        data = path.read_bytes()
        try:
            want = reference(data, on_error=None).to_pylist()
        except ParseError:
            want = None
        got = fast(data)
        if got is not None:
            taken += 1
            assert got.to_pylist() == want, path.name
    assert taken >= 4  # the real-world samples in today's spelling are taken


#: lines the importer accepts that the fast path leaves to it (it must say None, not differ)
LEFT_TO_THE_IMPORTER = [
    "16HSM   13:49:47.469433938 2013.10.01 0x280 t=[0x200000400:0x1:0x0]",  # no index
    "3 02MKDIR 4298396676 0x0 t=[0x200000405:0x15f9:0x0] p=[0x13:0x15e5a7a3:0x0] pics",  # raw time
    "3 01CREAT 10:00:00.1 2026.01.01 0x0 t=[0x200000405:0x15FA:0x0] p=[0x1:0x2:0x0] a",  # upper-case hex
    "3 01CREAT 10:00:00.1 2026.01.01 0x0 t=[0x200000405:0x15fa:0x0] u=1:1 ef=0xf p=[0x1:0x2:0x0] a",  # order
    "3 01CREAT 10:00:00.1 2026.01.01 0x0 t=[0x200000405:0x15fa:0x0] p=[0x1:0x2:0x0] u=1:1",  # a field-like name
    "3 08RENME 10:00:00.1 2026.01.01 0x0 t=[0:0x0:0x0] p=[0x1:0x2:0x0] a s=[0x1:0x3:0x0] sp=[0x1:0x2:0x0] "
    "b s=[0x1:0x4:0x0] sp=[0x1:0x2:0x0] c",  # two s=/sp= pairs: the importer splits at the last
    "   ",  # whitespace only: skipped by the importer
]

BAD = [
    "3 01CREAT 10:00:00.1 2026.01.01 0x0 t=[0x200000405:0x15fa:0x0] p=[0x1:0x2:0x0] a/b",
    "3 01CREAT 10:00:00.1 2026.01.01 0x0 t=[0x200000405:0x15fa:0x0] p=[0x1:0x2:0x0] ..",
    "3 01CREAT 10:00:00.1 2026.01.01 0x0 t=[0x200000405:0x15fa:0x0] a",  # no parent
    "3 01CREAT 10:00:00.1 2026.13.01 0x0 t=[0x200000405:0x15fa:0x0] p=[0x1:0x2:0x0] a",
    "3 01CREAT 24:00:00.1 2026.01.01 0x0 t=[0x200000405:0x15fa:0x0] p=[0x1:0x2:0x0] a",
    "3 01CREAT 10:00:00.1 2026.01.01 0x10000 t=[0x200000405:0x15fa:0x0] p=[0x1:0x2:0x0] a",
    "3 02CREAT 10:00:00.1 2026.01.01 0x0 t=[0x200000405:0x15fa:0x0] p=[0x1:0x2:0x0] a",
    "3 11CLOSE 10:00:00.1 2026.01.01 0x0 t=[0x200000405:0x15fa:0x0] ef=zz",
    "3 11CLOSE 10:00:00.1 2026.01.01 0x0 t=[0x200000405:0x15fa:0x0] u=5",
    "3 11CLOSE 10:00:00.1 2026.01.01 0x0 t=[0x200000405:0x15fa:0x0] u=1:2 u=1:2",
    "3 11CLOSE 10:00:00.1 2026.01.01 0x0 t=[0x200000405:0x15fa:0x0] m=w",
    "3 11CLOSE 10:00:00.1 2026.01.01 0x0 t=[0x200000405:0x15fa:0x0] nid=",
    "3 15XATTR 10:00:00.1 2026.01.01 0x0 t=[0x200000405:0x15fa:0x0] x=",
    "3 11CLOSE 10:00:00.1 2026.01.01 0x0 t=[0x200000405:0x15fa:0x0]junk",
    "3 11CLOSE 10:00:00.1 2026.01.01 0x0 t=[0x200000405:0x15fa:0x0] p=[0x1:0x2:0x0]junk",
    "3 08RENME 10:00:00.1 2026.01.01 0x0 t=[0:0x0:0x0] p=[0x1:0x2:0x0] a",  # old two-record rename
    "3 08RENME 10:00:00.1 2026.01.01 0x0 t=[0:0x0:0x0] p=[0x1:0x2:0x0] a s=[0:0x0:0x0] sp=[0x1:0x2:0x0] b",
    "3 08RENME 10:00:00.1 2026.01.01 0x0 t=[0:0x0:0x0] p=[0x1:0x2:0x0] s=[0x1:0x3:0x0] sp=[0x1:0x2:0x0] b",
    "3 08RENME 10:00:00.1 2026.01.01 0x0 t=[0:0x0:0x0] p=[0x1:0x2:0x0] a s=[0x1:0x3:0x0] sp=[0x1:0x2:0x0]",
    "3 11CLOSE 10:00:00.1 2026.01.01 0x0 t=[0x1:0x2:0x0] p=[0x1:0x2:0x0] a s=[0x1:0x3:0x0] sp=[0x1:0x2:0x0] b",
    "2 11CLOSE 10:00:00.1 2026.01.01 0x0 t=[0x200000405:0x15fa:0x0]",  # index goes backwards
    "3 11CLOSE 10:00:00.1 2026.01.01 0x0 t=[0x200000405:0x15fa:0x0] \x00",
    "3 11CLOSE 10:00:00.1 2026.01.01 0x0 t=[0x200000405:0x15fa:0x0] \udcff",
    "3 99FROB 10:00:00.1 2026.01.01 0x0 t=[0x200000405:0x15fa:0x0]",
    "garbage",
]

GOOD_HEAD = (
    "1 01CREAT 10:00:00.1 2026.01.01 0x0 t=[0x200000405:0x1:0x0] p=[0x1:0x2:0x0] f\n"
    "2 11CLOSE 10:00:00.2 2026.01.01 0x0 t=[0x200000405:0x1:0x0]\n"
)


@pytest.mark.parametrize("line", LEFT_TO_THE_IMPORTER + BAD)
def test_lines_the_fast_path_is_not_sure_of_go_to_the_importer(line):
    text = (GOOD_HEAD + line + "\n").encode("utf-8", "surrogateescape")
    errors: list[ParseError] = []
    list(parse_stream("lustre", io.BytesIO(text), "f.log", ParseOptions(on_error=errors.append)))
    assert bool(errors) == (line in BAD)
    assert fast(text) is None
    assert fast(GOOD_HEAD.encode()) is not None


SAMPLE_LINES = [ln for p in sorted(SAMPLES.glob("*.txt")) for ln in p.read_bytes().splitlines() if ln.strip()]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(SAMPLE_LINES),
            st.integers(0, 200),
            st.sampled_from(
                [b"", b" ", b"  ", b"x", b"=", b"[", b"]", b"s=[0x1:0x2:0x0] sp=[0x1:0x1:0x0] ", b"/", b"\r"]
            ),
            st.integers(0, 3),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_mutated_sample_lines_are_parsed_exactly_or_left_to_the_importer(edits):
    lines = []
    for i, (line, at, insert, cut) in enumerate(edits):
        line = line.split(b" ", 1)[1] if line[:1].isdigit() and b" " in line else line
        line = f"{i + 1} ".encode() + line  # increasing indexes
        at = min(at, len(line))
        lines.append(line[:at] + insert + line[at + cut :])
    text = b"\n".join(lines) + b"\n"
    errors: list[ParseError] = []
    want = list(parse_stream("lustre", io.BytesIO(text), "f.log", ParseOptions(on_error=errors.append)))
    got = fast(text)
    if got is None:
        return
    assert not errors, "the fast path took a chunk the importer rejects a line of"
    assert got.to_pylist() == pa.Table.from_batches([_records_to_batch(want, OUT)], schema=OUT).to_pylist()


def test_ingest_names_a_bad_line_in_a_later_chunk_by_file_and_line(tmp_path, monkeypatch):
    import epochsync.stages.ingest.executor as ingest
    from epochsync.formats.common import ParseContext

    monkeypatch.setattr(ingest, "CHUNK_BYTES", 4096)
    rnd = random.Random(5)
    lines = generate(rnd, 200, marks=False).rstrip("\n").split("\n")
    bad_at = 150
    lines[bad_at] = lines[bad_at].split(" ", 1)[0] + " 99FROB 10:00:00.1 2026.01.01 0x0 t=[0x1:0x2:0x0]"
    path = tmp_path / "000.log"
    path.write_text("\n".join(lines) + "\n")

    out, _ = _arrow_schemas()
    job = IngestJob(
        source="s",
        fmt="lustre",
        epochs_from="time",
        first=0,
        last=10**9,
        continuity=False,
        after_index=None,
        start_ns=0,
        interval_ns=300 * 10**9,
    )
    errors: list[ParseError] = []
    opts = ingest._parse_options(job, "MDT0000", on_error=errors.append)
    want = list(parse_stream("lustre", io.BytesIO(path.read_bytes()), str(path), opts))
    assert [e.line for e in errors] == [bad_at + 1]

    sink = _Sink(job, ChangelogFile("MDT0000", 0, str(path)), out)
    rows = [r for b in ingest._ingest_lustre_file(sink, ParseContext()) for r in b.to_pylist()]
    rep = sink.finish()
    assert rep.fast_lines > 0 and rep.slow_lines > 0
    ((_, err),) = rep.errors
    assert (err["file"], err["line"], err["reason"]) == (str(path), errors[0].line, errors[0].reason)
    assert err["offset"] == errors[0].offset
    assert rows == pa.Table.from_batches([_records_to_batch(want, out)], schema=out).to_pylist()
