"""Ingest from an S3 prefix on a real S3 server (SeaweedFS): listing and reading with boto3 on executors."""

from __future__ import annotations

import json

import pytest
from pyspark.testing import assertDataFrameEqual

from epochsync.core.config import config_from_dict
from epochsync.core.errors import EpochError, StoreError
from epochsync.core.schema import Record, record_struct_type
from epochsync.stages.ingest import read_records, run_ingest
from epochsync.stages.ingest.closure import missing_epoch_servers

pytestmark = pytest.mark.integration


def rec(server, index, epoch, type_, **kw) -> Record:
    return Record.from_dict({"server": server, "index": index, "epoch": epoch, "type": type_, **kw})


MDT = [
    rec("MDT0000", 1, 1, "MKDIR", tfid="[0x200000402:0x1:0x0]", pfid="[0x200000007:0x1:0x0]", name="d", mode=0o40755),
    rec("MDT0000", 2, 1, "EPOCH"),
    rec("MDT0000", 3, 2, "CREAT", tfid="[0x200000402:0x2:0x0]", pfid="[0x200000402:0x1:0x0]", name="a b"),
    rec("MDT0000", 4, 2, "EPOCH"),
]
OST = [
    rec(
        "OST0000",
        7,
        2,
        "WRITE",
        tfid="[0x200000402:0x2:0x0]",
        object={"ost": "OST0000", "oid": "0x9"},
        extents=[{"offset": 4096, "length": 100}],
    ),
    rec("OST0000", 8, 2, "EPOCH"),
]


def body(records) -> bytes:
    return "".join(json.dumps(r.to_dict()) + "\n" for r in records).encode()


@pytest.fixture(autouse=True)
def on_spark(monkeypatch):
    """The executors read the changelogs from S3 here: small inputs would be parsed in this process."""
    monkeypatch.setenv("EPOCHSYNC_INGEST_LOCAL_MAX_BYTES", "0")


def test_ingest_reads_changelogs_from_an_s3_prefix(spark, seaweed, bucket_name, tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_CHANGELOGS_S3", seaweed.airflow_conn_json())
    s3 = seaweed.client()
    s3.create_bucket(Bucket=bucket_name)
    # two files for MDT0000 (epoch 2 in the second), a hidden one and a nested "directory" to skip
    s3.put_object(Bucket=bucket_name, Key="fs1/MDT0000/000001.jsonl", Body=body(MDT[:2]))
    s3.put_object(Bucket=bucket_name, Key="fs1/MDT0000/000002.jsonl", Body=body(MDT[2:]))
    s3.put_object(Bucket=bucket_name, Key="fs1/MDT0000/.000003.jsonl", Body=b"not yet\n")
    s3.put_object(Bucket=bucket_name, Key="fs1/MDT0000/old/000000.jsonl", Body=b"archived\n")
    s3.put_object(Bucket=bucket_name, Key="fs1/OST0000/log", Body=body(OST))
    cfg = config_from_dict(
        {
            "warehouse": f"file://{tmp_path}/wh",
            "sources": [
                {
                    "name": "fs1",
                    "root_fid": "[0x200000007:0x1:0x0]",
                    "servers": ["MDT0000", "OST0000"],
                    "changelogs": {"uri": f"s3://{bucket_name}/fs1/", "format": "jsonl", "conn_id": "changelogs_s3"},
                    "store": {"conn_id": "source_s3", "bucket": "data"},
                    "epoch": {"interval": "5m", "start": "2026-01-01T00:00:00Z"},
                }
            ],
        }
    )
    # the sensor's view, read on the driver
    assert missing_epoch_servers(cfg, "fs1", 2) == []
    assert missing_epoch_servers(cfg, "fs1", 3) == ["MDT0000", "OST0000"]
    with pytest.raises(EpochError, match=r"waiting for MDT0000 \(closed through 2\), OST0000 \(closed through 2\)"):
        run_ingest(cfg, "fs1", 3, 3, spark)

    stats = run_ingest(cfg, "fs1", 1, 2, spark)
    assert stats["records"] == 6 and stats["servers"]["MDT0000"]["files"] == 2
    want = spark.createDataFrame([r.to_row() for r in MDT + OST], record_struct_type())
    assertDataFrameEqual(read_records(spark, cfg.warehouse, "fs1", 1, 2), want)

    # epoch 2 alone: MDT0000's first file ends in epoch 1 (read from its tail) and is skipped
    stats = run_ingest(cfg, "fs1", 2, 2, spark)
    assert stats["servers"]["MDT0000"]["files_skipped"] == 1 and stats["records"] == 4
    want = spark.createDataFrame([r.to_row() for r in MDT[2:] + OST], record_struct_type())
    assertDataFrameEqual(read_records(spark, cfg.warehouse, "fs1", 2), want)

    # a bad line in an S3 object is named by its s3:// URI and line
    s3.put_object(Bucket=bucket_name, Key="fs1/OST0000/log", Body=body(OST[:1]) + b"{oops\n" + body(OST[1:]))
    with pytest.raises(EpochError, match=rf"^bad record of server OST0000: s3://{bucket_name}/fs1/OST0000/log:2: "):
        run_ingest(cfg, "fs1", 2, 2, spark)


def test_s3_errors_on_executors_are_one_clear_line(spark, seaweed, bucket_name, tmp_path, monkeypatch):
    s3 = seaweed.client()
    s3.create_bucket(Bucket=bucket_name)
    wrong = json.loads(seaweed.airflow_conn_json())
    wrong["password"] = "not-the-secret"
    monkeypatch.setenv("AIRFLOW_CONN_CHANGELOGS_S3", json.dumps(wrong))
    cfg = config_from_dict(
        {
            "warehouse": f"file://{tmp_path}/wh",
            "sources": [
                {
                    "name": "fs1",
                    "root_fid": "[0x200000007:0x1:0x0]",
                    "servers": ["MDT0000"],
                    "changelogs": {"uri": f"s3://{bucket_name}/fs1/", "format": "jsonl", "conn_id": "changelogs_s3"},
                    "store": {"conn_id": "source_s3", "bucket": "data"},
                    "epoch": {"interval": "5m", "start": "2026-01-01T00:00:00Z"},
                }
            ],
        }
    )
    with pytest.raises(StoreError) as err:
        run_ingest(cfg, "fs1", 1, 1, spark)
    message = str(err.value)
    assert message.startswith(
        f"ingest of source 'fs1': cannot list s3://{bucket_name}/fs1/MDT0000/ via changelogs_s3 ("
    )
    assert "\n" not in message
