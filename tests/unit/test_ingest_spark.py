"""The ingest stage on Spark (local[2], tiny data): exact records in the warehouse, failures, quarantine, re-runs."""

import io
import json
import shutil

import pytest
from pyspark.testing import assertDataFrameEqual

from epochsync.core.config import config_from_dict
from epochsync.core.errors import EpochError, StoreError
from epochsync.core.schema import Record, record_struct_type
from epochsync.formats import ParseOptions, parse_stream
from epochsync.formats.common import ParseContext
from epochsync.stages.ingest import read_records, run_ingest
from epochsync.stages.ingest.closure import closure_of_dataframe

FIXTURES_SAMPLES = "tests/fixtures/samples"


def rec(server, index, epoch, type_, **kw) -> Record:
    return Record.from_dict({"server": server, "index": index, "epoch": epoch, "type": type_, **kw})


MDT = [
    rec(
        "MDT0000",
        1,
        1,
        "MKDIR",
        tfid="[0x200000402:0x1:0x0]",
        pfid="[0x200000007:0x1:0x0]",
        name="pics",
        mode=0o40755,
        uid=500,
        gid=500,
        time_ns=1767225601000000000,
    ),
    rec(
        "MDT0000",
        2,
        1,
        "CREAT",
        tfid="[0x200000402:0x2:0x0]",
        pfid="[0x200000402:0x1:0x0]",
        name="chloe.jpg",
        layout={"stripe_size": 1048576, "stripe_count": 1, "objects": [{"ost": "OST0000", "oid": "0x2"}]},
    ),
    rec("MDT0000", 3, 1, "EPOCH"),
    rec("MDT0000", 4, 2, "XATTR", tfid="[0x200000402:0x2:0x0]", xattr_name="user.tag", xattr_value="AP8="),
    rec(
        "MDT0000",
        5,
        2,
        "RENME",
        pfid="[0x200000402:0x1:0x0]",
        name="new name",
        sfid="[0x200000402:0x2:0x0]",
        spfid="[0x200000402:0x1:0x0]",
        sname="chloe.jpg",
    ),
    rec("MDT0000", 6, 2, "EPOCH"),
]
OST = [
    rec(
        "OST0000",
        40,
        1,
        "WRITE",
        tfid="[0x200000402:0x2:0x0]",
        object={"ost": "OST0000", "oid": "0x2", "version": "v7"},
        extents=[{"offset": 0, "length": 65536}],
    ),
    rec("OST0000", 41, 1, "EPOCH"),
    rec("OST0000", 42, 2, "EPOCH"),
]


def line(r: Record) -> str:
    return json.dumps(r.to_dict(), separators=(",", ":")) + "\n"


def write_changelogs(root, files: dict[str, list]):
    """files: 'SERVER/name' -> records or raw lines."""
    for rel, items in files.items():
        p = root / "cl" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("".join(line(i) if isinstance(i, Record) else i for i in items))


def config(root, fmt="jsonl", servers=("MDT0000", "OST0000"), on_bad="fail", uri=None, **changelogs):
    return config_from_dict(
        {
            "warehouse": f"file://{root}/wh",
            "sources": [
                {
                    "name": "src",
                    "root_fid": "[0x200000007:0x1:0x0]",
                    "servers": list(servers),
                    "changelogs": {"uri": uri or str(root / "cl"), "format": fmt, **changelogs},
                    "store": {"conn_id": "store", "bucket": "data"},
                    "epoch": {"interval": "5m", "start": "2026-01-01T00:00:00Z"},
                    "on_bad_record": on_bad,
                }
            ],
        }
    )


@pytest.fixture(autouse=True)
def on_spark(monkeypatch):
    """This module tests the Spark job: small inputs would otherwise be parsed in this process."""
    monkeypatch.setenv("EPOCHSYNC_INGEST_LOCAL_MAX_BYTES", "0")


def expected(spark, records):
    return spark.createDataFrame([r.to_row() for r in records], record_struct_type())


def test_two_servers_several_files_and_epochs_land_exactly(spark, tmp_path):
    # MDT0000's epochs straddle its two files; blank lines and a non-compact spelling take
    # the importer's path for part of a file, the rest the fast path
    pretty = json.dumps(MDT[4].to_dict(), indent=None, separators=(", ", ": ")) + "\n"
    write_changelogs(
        tmp_path,
        {
            "MDT0000/000001.jsonl": MDT[:4],
            "MDT0000/000002.jsonl": ["\n", pretty, MDT[5]],
            "MDT0000/.000003.jsonl.tmp": ["garbage being written\n"],
            "OST0000/log": OST,
        },
    )
    cfg = config(tmp_path)
    lines = []
    stats = run_ingest(cfg, "src", 1, 2, spark, progress=lines.append)
    assertDataFrameEqual(read_records(spark, cfg.warehouse, "src", 1, 2), expected(spark, MDT + OST))
    assertDataFrameEqual(read_records(spark, cfg.warehouse, "src", 2), expected(spark, MDT[3:] + OST[2:]))
    assert stats["records"] == 9 and stats["records_per_epoch"] == {1: 5, 2: 4} and stats["quarantined"] == 0
    assert stats["servers"]["MDT0000"]["closed_through"] == 2
    ingested = read_records(spark, cfg.warehouse, "src", 1, 2)
    assert closure_of_dataframe(ingested, ["MDT0000", "OST0000"], 2).closed
    assert closure_of_dataframe(ingested, ["MDT0000", "OST0000", "OST0001"], 2).waiting == ("OST0001",)
    assert (
        lines[0]
        == "MDT0000: 2 changelog file(s), "
        + str(sum((tmp_path / "cl" / "MDT0000" / n).stat().st_size for n in ("000001.jsonl", "000002.jsonl")))
        + " bytes"
    )
    assert "OST0000: 3 records of epochs 1..2, closed through epoch 2, 0 bad" in lines


def test_bad_line_fails_the_epoch_with_file_and_line_and_writes_nothing(spark, tmp_path):
    write_changelogs(
        tmp_path, {"MDT0000/a.jsonl": [*MDT[:2], '{"server":"MDT0000","index":3,\n', MDT[2]], "OST0000/a.jsonl": OST}
    )
    cfg = config(tmp_path)
    with pytest.raises(EpochError) as err:
        run_ingest(cfg, "src", 1, 1, spark)
    path = tmp_path / "cl" / "MDT0000" / "a.jsonl"
    assert str(err.value).startswith(f"bad record of server MDT0000: {path}:3: not valid JSON: ")
    assert "on_bad_record: quarantine" in str(err.value)
    assert not (tmp_path / "wh" / "records" / "source=src" / "epoch=1").exists()
    assert list((tmp_path / "wh" / "records" / "source=src").iterdir()) == []  # no staging left


def test_quarantine_mode_sets_bad_lines_aside_and_goes_on(spark, tmp_path):
    unsafe = line(MDT[1]).replace('"chloe.jpg"', '"../etc"')
    write_changelogs(tmp_path, {"MDT0000/a.jsonl": [MDT[0], unsafe, MDT[2]], "OST0000/a.jsonl": OST})
    cfg = config(tmp_path, on_bad="quarantine")
    stats = run_ingest(cfg, "src", 1, 1, spark)
    assert stats["quarantined"] == 1
    assertDataFrameEqual(read_records(spark, cfg.warehouse, "src", 1), expected(spark, [MDT[0], MDT[2], *OST[:2]]))
    (qfile,) = (tmp_path / "wh" / "quarantine" / "source=src" / "epoch=1").iterdir()
    entry = json.loads(qfile.read_text())
    assert entry == {
        "file": str(tmp_path / "cl" / "MDT0000" / "a.jsonl"),
        "line": 2,
        "offset": len(line(MDT[0])),
        "server": "MDT0000",
        "index": 2,
        "reason": "CREAT name '../etc' contains '/' where a basename is expected",
        "text": unsafe.rstrip("\n"),
    }


def test_rerun_overwrites_only_its_epochs(spark, tmp_path):
    write_changelogs(tmp_path, {"MDT0000/a.jsonl": MDT, "OST0000/a.jsonl": OST})
    cfg = config(tmp_path)
    run_ingest(cfg, "src", 1, 2, spark)
    changed = MDT[3].replace(xattr_value=b"new")
    write_changelogs(tmp_path, {"MDT0000/a.jsonl": [*MDT[:3], changed, *MDT[4:]]})
    stats = run_ingest(cfg, "src", 2, 2, spark)
    assert stats["unchanged_epochs"] == []  # new bytes: swapped in
    assertDataFrameEqual(
        read_records(spark, cfg.warehouse, "src", 1, 2), expected(spark, [*MDT[:3], changed, *MDT[4:], *OST])
    )


def _data_files(directory):
    return {
        p.relative_to(directory): (p.stat().st_ino, p.stat().st_mtime_ns)
        for p in directory.rglob("*")
        if p.is_file() and not p.name.startswith(("_", "."))
    }


def test_a_reingest_of_the_same_records_leaves_the_committed_files_in_place(spark, tmp_path):
    """A retry or a second target's ingest of an epoch must not replace the files another
    run may be reading: the same records give the same bytes whatever the window (and the
    path, fast or importer), and then only the marker changes."""
    pretty = json.dumps(MDT[4].to_dict(), indent=None, separators=(", ", ": ")) + "\n"
    write_changelogs(
        tmp_path, {"MDT0000/000001.jsonl": MDT[:4], "MDT0000/000002.jsonl": ["\n", pretty, MDT[5]], "OST0000/log": OST}
    )
    cfg = config(tmp_path)
    run_ingest(cfg, "src", 1, 2, spark)
    epoch2 = tmp_path / "wh" / "records" / "source=src" / "epoch=2"
    before = _data_files(epoch2)
    assert len(before) == 3  # one Parquet file per changelog file holding epoch-2 records
    stats = run_ingest(cfg, "src", 2, 2, spark)
    assert stats["unchanged_epochs"] == [2] and stats["records"] == 4
    assert _data_files(epoch2) == before  # same inodes, never rewritten
    marker = json.loads((epoch2 / "_epochsync_ingest.json").read_text())
    assert marker["window"] == [2, 2]  # the marker says what the last run read
    assertDataFrameEqual(read_records(spark, cfg.warehouse, "src", 2), expected(spark, MDT[3:] + OST[2:]))
    assert [
        p.name for p in (tmp_path / "wh" / "records" / "source=src").iterdir() if p.name.startswith("_ingest-")
    ] == []


def test_two_ingests_of_one_epoch_at_once_never_disturb_a_reader(spark, tmp_path):
    """Issue 16: two runs ingesting the same source epoch at once (two targets, a retry)
    while a third reads it: no FileNotFoundError anywhere, and the reader always sees
    exactly the epoch's records."""
    import threading

    import pyarrow.dataset as ds

    write_changelogs(tmp_path, {"MDT0000/a.jsonl": MDT, "OST0000/a.jsonl": OST})
    cfg = config(tmp_path)
    run_ingest(cfg, "src", 1, 2, spark)
    epoch2 = tmp_path / "wh" / "records" / "source=src" / "epoch=2"
    want = sorted((r.server, r.index) for r in MDT[3:] + OST[2:])
    errors: list[BaseException] = []
    reads = []
    done = threading.Event()

    def ingest(first):
        try:
            for _ in range(4):
                run_ingest(cfg, "src", first, 2, spark)
        except BaseException as exc:  # noqa: BLE001 - the test reports whatever happened
            errors.append(exc)

    def read():
        while not done.is_set():
            try:
                t = ds.dataset(str(epoch2), format="parquet", partitioning="hive").to_table(columns=["server", "index"])
                reads.append(sorted(zip(t.column("server").to_pylist(), t.column("index").to_pylist())))
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
                return

    reader = threading.Thread(target=read)
    writers = [threading.Thread(target=ingest, args=(first,)) for first in (1, 2)]
    reader.start()
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    done.set()
    reader.join()
    assert errors == []
    assert reads and all(r == want for r in reads)
    assertDataFrameEqual(read_records(spark, cfg.warehouse, "src", 1, 2), expected(spark, MDT + OST))


def test_a_second_ingest_of_an_unchanged_window_is_reported_current(spark, tmp_path):
    """What lets the Airflow ingest task of a second target skip its spark-submit."""
    from epochsync.stages.ingest.commit import INGEST_MARKER, ingest_is_current

    write_changelogs(tmp_path, {"MDT0000/a.jsonl": MDT, "OST0000/a.jsonl": OST})
    cfg = config(tmp_path)
    assert ingest_is_current(cfg, "src", 2, 2) is None  # nothing ingested yet
    run_ingest(cfg, "src", 2, 2, spark)
    marker = json.loads((tmp_path / "wh" / "records" / "source=src" / "epoch=2" / INGEST_MARKER).read_text())
    assert marker["window"] == [2, 2] and marker["records"] == 4
    reason = ingest_is_current(cfg, "src", 2, 2, consumer="dr")
    assert reason.startswith("epoch 2 of source 'src' already ingested at ") and "(4 records;" in reason
    assert ingest_is_current(cfg, "src", 1, 2) is None  # another window: ingest it
    # a consumer whose cursor is not the one the ingest started from: it would keep other records
    cursors = tmp_path / "wh" / "cursors" / "source=src"
    cursors.mkdir(parents=True)
    (cursors / "dr.json").write_text('{"epoch": 1, "servers": {"MDT0000": 1, "OST0000": 41}}')
    assert ingest_is_current(cfg, "src", 2, 2, consumer="dr") is None
    assert ingest_is_current(cfg, "src", 2, 2, consumer="other") is not None  # no cursor, as at ingest time
    # a changelog file that changed since: ingest again
    changed = MDT[3].replace(xattr_value=b"a longer value")
    write_changelogs(tmp_path, {"MDT0000/a.jsonl": [*MDT[:3], changed, *MDT[4:]]})
    assert ingest_is_current(cfg, "src", 2, 2) is None


def test_gap_against_the_consumer_cursor_and_open_epoch_are_errors(spark, tmp_path):
    write_changelogs(tmp_path, {"MDT0000/a.jsonl": MDT[3:], "OST0000/a.jsonl": OST})
    cursors = tmp_path / "wh" / "cursors" / "source=src"
    cursors.mkdir(parents=True)
    (cursors / "dr.json").write_text('{"epoch": 1, "servers": {"MDT0000": 1, "OST0000": 41}}')
    cfg = config(tmp_path)
    with pytest.raises(
        EpochError, match=r"^server MDT0000: records 2\.\.3 are missing \(the consumer cursor is at index 1; "
    ):
        run_ingest(cfg, "src", 2, 2, spark)
    with pytest.raises(
        EpochError, match=r"^epoch 3 of source 'src' is not closed: waiting for MDT0000 \(closed through 2\)"
    ):
        run_ingest(cfg, "src", 3, 3, spark)


LUSTRE = (
    "1 02MKDIR 15:15:21.977666834 2018.01.09 0x0 t=[0x200000402:0x1:0x0] ef=0xf u=500:500 nid=10.128.11.159@tcp p=[0x200000007:0x1:0x0] pics\n"
    "2 01CREAT 15:15:36.687592024 2018.01.09 0x0 t=[0x200000402:0x2:0x0] ef=0xf u=500:500 nid=10.128.11.159@tcp p=[0x200000402:0x1:0x0] my file.jpg\n"
    "3 00MARK  15:56:39.603643887 2018.01.09 0x0 t=[0x20001:0x0:0x0] ef=0xf u=500:500 nid=0@<0:0> p=[0:0x50:0xb] mdd_obd-lustre-MDT0000-0\n"
    "4 06UNLNK 15:15:41.305116815 2018.01.09 0x1 t=[0x200000402:0x2:0x0] ef=0xf u=500:500 nid=10.128.11.159@tcp p=[0x200000402:0x1:0x0] my file.jpg\n"
)
LUSTRE2 = "5 00MARK  15:56:40.603643887 2018.01.09 0x0 t=[0x20001:0x0:0x0] p=[0:0x50:0xb] mdd_obd-lustre-MDT0000-0\n"


def test_lustre_text_with_mark_epochs_across_files(spark, tmp_path):
    write_changelogs(tmp_path, {"MDT0000/001": [LUSTRE], "MDT0000/002": [LUSTRE2]})
    cfg = config(tmp_path, fmt="lustre", servers=("MDT0000",))
    run_ingest(cfg, "src", 1, 2, spark)
    ctx = ParseContext()
    want = []
    for name in ("001", "002"):
        opts = ParseOptions(server="MDT0000", epochs_from_marks=True, context=ctx)
        want += parse_stream("lustre", (tmp_path / "cl" / "MDT0000" / name).open("rb"), name, opts)
    assert [(r.index, r.type, r.epoch) for r in want] == [
        (1, "MKDIR", 1),
        (2, "CREAT", 1),
        (3, "MARK", 1),
        (3, "EPOCH", 1),
        (4, "UNLNK", 2),
        (5, "MARK", 2),
        (5, "EPOCH", 2),
    ]
    assertDataFrameEqual(read_records(spark, cfg.warehouse, "src", 1, 2), expected(spark, want))


def test_gluster_changelog_is_one_time_window_epoch(spark, tmp_path):
    # rollover time 2026-01-01T00:07:00Z: epoch 2 of 5-minute windows from midnight
    d = tmp_path / "cl" / "brick0"
    d.mkdir(parents=True)
    shutil.copy(f"{FIXTURES_SAMPLES}/gluster/v1.1_mkdir_create.changelog", d / "CHANGELOG.1767226020")
    cfg = config(tmp_path, fmt="gluster", servers=("brick0",))
    stats = run_ingest(cfg, "src", 2, 2, spark)
    data = (d / "CHANGELOG.1767226020").read_bytes()
    opts = ParseOptions(server="brick0", epoch_of_time=cfg.source("src").epoch.epoch_of)
    want = list(parse_stream("gluster", io.BytesIO(data), str(d / "CHANGELOG.1767226020"), opts))
    assert {r.epoch for r in want} == {2} and want[-1].type == "EPOCH"
    assert stats["records"] == len(want)
    assertDataFrameEqual(read_records(spark, cfg.warehouse, "src", 2), expected(spark, want))


def _spark_app_main():
    import runpy

    return runpy.run_path("spark_apps/ingest.py")["main"]


def test_spark_app_prints_per_server_progress_and_fails_with_one_line(spark, tmp_path, capsys):
    write_changelogs(tmp_path, {"MDT0000/a.jsonl": MDT, "OST0000/a.jsonl": OST})
    cfg_file = tmp_path / "epochsync.yaml"
    cfg_file.write_text(
        json.dumps(
            {
                "warehouse": f"file://{tmp_path}/wh",
                "sources": [
                    {
                        "name": "src",
                        "root_fid": "[0x200000007:0x1:0x0]",
                        "servers": ["MDT0000", "OST0000"],
                        "changelogs": {"uri": str(tmp_path / "cl"), "format": "jsonl"},
                        "store": {"conn_id": "store", "bucket": "data"},
                        "epoch": {"interval": "5m", "start": "2026-01-01T00:00:00Z"},
                    }
                ],
            }
        )
    )
    main = _spark_app_main()
    assert main(["--config", str(cfg_file), "--source", "src", "--epoch", "1", "--through", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2:4] == [
        "MDT0000: 6 records of epochs 1..2, closed through epoch 2, 0 bad",
        "OST0000: 3 records of epochs 1..2, closed through epoch 2, 0 bad",
    ]
    assert out[4].startswith("ingested 9 records of source src epochs 1..2 in ")

    assert main(["--config", str(cfg_file), "--source", "src", "--epoch", "3"]) == 4  # NotClosedError: try later
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "ingest: error: epoch 3 of source 'src' is not closed: waiting for MDT0000 (closed through 2), "
        "OST0000 (closed through 2); ingest runs only on closed epochs (the sensor waits for them)"
    ]
    assert main(["--config", str(cfg_file), "--source", "nope", "--epoch", "1"]) == 3  # ConfigError
    assert "no source named 'nope' (have: src)" in capsys.readouterr().err


def test_an_error_on_an_executor_comes_back_as_one_line_naming_the_file(spark, tmp_path):
    write_changelogs(tmp_path, {"MDT0000/a.jsonl": MDT, "OST0000/a.jsonl": OST})
    cfg = config(tmp_path)
    gone = tmp_path / "cl" / "OST0000" / "a.jsonl"

    def progress(line):  # called after the listing, before the Spark job: the file vanishes in between
        if gone.exists():
            gone.unlink()

    with pytest.raises(StoreError) as err:
        run_ingest(cfg, "src", 1, 2, spark, progress=progress)
    assert str(err.value) == f"ingest of source 'src': cannot read {gone}: No such file or directory"
    assert not (tmp_path / "wh" / "records" / "source=src" / "epoch=1").exists()


def test_a_small_ingest_runs_here_and_commits_the_bytes_the_spark_job_writes(spark, tmp_path, monkeypatch):
    """Below ``EPOCHSYNC_INGEST_LOCAL_MAX_BYTES`` the same task code runs in this process, with
    no session at all; a Spark ingest of the same files then finds the committed bytes equal."""
    monkeypatch.delenv("EPOCHSYNC_INGEST_LOCAL_MAX_BYTES")
    pretty = json.dumps(MDT[4].to_dict(), indent=None, separators=(", ", ": ")) + "\n"
    write_changelogs(
        tmp_path, {"MDT0000/000001.jsonl": MDT[:4], "MDT0000/000002.jsonl": ["\n", pretty, MDT[5]], "OST0000/log": OST}
    )
    cfg = config(tmp_path)
    here = run_ingest(cfg, "src", 1, 2, None)
    assert here["in_process"] and "spark_job" not in here["phase_seconds"]
    assert here["records_per_epoch"] == {1: 5, 2: 4}
    assertDataFrameEqual(read_records(spark, cfg.warehouse, "src", 1, 2), expected(spark, MDT + OST))
    monkeypatch.setenv("EPOCHSYNC_INGEST_LOCAL_MAX_BYTES", "0")
    again = run_ingest(cfg, "src", 1, 2, spark)
    assert not again["in_process"] and again["unchanged_epochs"] == [1, 2]


def test_a_small_ingest_here_fails_as_the_executors_do(tmp_path, monkeypatch):
    monkeypatch.delenv("EPOCHSYNC_INGEST_LOCAL_MAX_BYTES")
    write_changelogs(
        tmp_path, {"MDT0000/a.jsonl": [*MDT[:2], '{"server":"MDT0000","index":3,\n', MDT[2]], "OST0000/a.jsonl": OST}
    )
    cfg = config(tmp_path)
    with pytest.raises(EpochError) as err:
        run_ingest(cfg, "src", 1, 1, None)
    path = tmp_path / "cl" / "MDT0000" / "a.jsonl"
    assert str(err.value).startswith(f"bad record of server MDT0000: {path}:3: not valid JSON: ")
    assert list((tmp_path / "wh" / "records" / "source=src").iterdir()) == []  # no staging left
    (tmp_path / "cl" / "MDT0000" / "a.jsonl").unlink()
    write_changelogs(tmp_path, {"MDT0000/a.jsonl": MDT, "OST0000/a.jsonl": OST})
    gone = tmp_path / "cl" / "OST0000" / "a.jsonl"

    def progress(line):  # after the listing, before the parse: the file vanishes in between
        if gone.exists():
            gone.unlink()

    with pytest.raises(StoreError) as err2:
        run_ingest(cfg, "src", 1, 2, None, progress=progress)
    assert str(err2.value) == f"ingest of source 'src': cannot read {gone}: No such file or directory"
    monkeypatch.setenv("EPOCHSYNC_INGEST_LOCAL_MAX_BYTES", "x")
    with pytest.raises(EpochError, match="EPOCHSYNC_INGEST_LOCAL_MAX_BYTES must be a number of bytes"):
        run_ingest(cfg, "src", 1, 2, None)
