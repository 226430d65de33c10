import io
import json

import pytest

from epochsync.core.errors import RecordError
from epochsync.core.schema import FIELD_NAMES, Extent, Layout, LayoutObject, ObjectRef, Record, write_jsonl


def full_record() -> Record:
    return Record(
        server="OST0001",
        index=7,
        epoch=3,
        type="WRITE",
        time_ns=1_700_000_000_123_456_789,
        flags=0,
        tfid="[0x200000402:0x2:0x0]",
        pfid="[0x200000402:0x1:0x0]",
        name="a b.txt",
        sfid=None,
        mode=0o100644,
        uid=500,
        gid=500,
        size=4096,
        xattr_name="user.k",
        xattr_value=b"\x00\xffv",
        layout=Layout(1 << 20, 2, (LayoutObject("OST0000", "0x10"), LayoutObject("OST0001", "0x11"))),
        object=ObjectRef("OST0001", "0x11", "v42", 5 << 20),
        extents=(Extent(0, 10), Extent(100, 5)),
        cookie="c1",
        jobid="dd.500",
        nid="10.0.0.1@tcp",
    )


def test_json_round_trip_keeps_every_field():
    r = full_record()
    buf = io.StringIO()
    write_jsonl([r], buf)
    d = json.loads(buf.getvalue())
    assert "sfid" not in d  # nulls are left out
    assert d["xattr_value"] == "AP92"
    assert Record.from_dict(d) == r


@pytest.mark.parametrize(
    "patch,msg",
    [
        ({"colour": 1}, "unknown field"),
        ({"index": "7"}, "must be an integer"),
        ({"index": True}, "must be an integer"),
        ({"xattr_value": "not base64!"}, "base64"),
        ({"extents": [{"offset": -1, "length": 3}]}, "out of range"),
        ({"object": {"ost": "O", "oid": "1", "size": -1}}, "'object.size' out of range"),
        ({"object": {"ost": "O", "oid": "1", "size": "8"}}, "'object.size' must be an integer"),
    ],
)
def test_from_dict_rejects_bad_values(patch, msg):
    d = full_record().to_dict()
    d.update(patch)
    with pytest.raises(RecordError, match=msg):
        Record.from_dict(d)


def test_missing_required_field():
    with pytest.raises(RecordError, match="'epoch'"):
        Record.from_dict({"server": "MDT0000", "index": 1, "type": "MARK"})


def test_struct_type_matches_python_view(spark):
    from epochsync.core.schema import record_struct_type

    st = record_struct_type()
    assert tuple(st.fieldNames()) == FIELD_NAMES
    df = spark.createDataFrame([full_record().to_row()], st)
    row = df.collect()[0]
    assert row.layout.objects[1].oid == "0x11"
    assert row.extents[1].offset == 100
    assert bytes(row.xattr_value) == b"\x00\xffv"


def test_arrow_schema_is_what_pyspark_makes_of_the_struct_type():
    """An ingest run in this process writes with :func:`record_arrow_schema` (no pyspark import);
    Spark's executors wrote with pyspark's conversion: the Parquet must be the same."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from epochsync.core.schema import record_arrow_schema, record_struct_type

    assert record_arrow_schema().equals(to_arrow_schema(record_struct_type()), check_metadata=True)


def test_change_and_snapshot_arrow_schemas_are_pysparks():
    """The merge, translate and snapshot files use Arrow schemas built without pyspark (an epoch
    that needs no Spark never imports it): the same as pyspark's conversion of the Spark types."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from epochsync.core.model import (
        change_arrow_schema,
        change_struct_type,
        snapshot_arrow_schema,
        snapshot_struct_type,
    )
    from epochsync.warehouse.tables import nullable_type

    for mine, spark_type in ((change_arrow_schema, change_struct_type), (snapshot_arrow_schema, snapshot_struct_type)):
        assert mine().equals(to_arrow_schema(nullable_type(spark_type())), check_metadata=True), mine.__name__
