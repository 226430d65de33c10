"""The embedded SeaweedFS the demo, the benchmarks and the tests run on."""

import pytest

pytestmark = pytest.mark.integration


def test_the_embedded_store_takes_a_bucket_per_test_for_a_whole_run(tmp_path):
    """Each bucket is a SeaweedFS collection with volumes of its own; with the volume count
    left to free disk / 128 MB, a test run on a fuller disk ran out after some 30-70 buckets."""
    from epochsync_dev.embedded import SeaweedFS

    with SeaweedFS(tmp_path / "weed") as ep:
        c = ep.client()
        for i in range(90):
            c.create_bucket(Bucket=f"many-{i:03d}")
            c.put_object(Bucket=f"many-{i:03d}", Key="k", Body=b"x")
        assert c.get_object(Bucket="many-089", Key="k")["Body"].read() == b"x"
