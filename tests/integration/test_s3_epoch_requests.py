"""Every request of whole small epochs into an s3 target, by purpose, logged at a proxy.

``test_s3_requests.py`` counts what an epoch's fence, apply and verify send per changed file;
this counts everything ``epochsync replicate`` sends for an epoch (``stages.replicate.replicate``:
the lease, the manifest, the fence instant, the store probe, apply, verify, commit), logged by
the :class:`~epochsync_dev.s3proxy.S3Proxy` bench-e2e counts with, in front of SeaweedFS.
Those per-epoch requests were 17 (one epoch) and 28 (the first epoch with a fence, which probes
the store) before issue 32 cut them, a tenth of bench-e2e's 1 % small writes at 10,000 files
(263 requests for 100 changed files): the manifest read six times, the bucket checked twice,
the manifest's time asked again, and a lease release that listed versions.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import uuid
from collections import Counter

import pytest
import yaml

from epochsync.core.config import load_config
from epochsync.stages.replicate import replicate
from epochsync.targets import open_target
from epochsync_dev.s3proxy import S3Proxy

pytestmark = pytest.mark.integration

ROOT = "[0x200000007:0x1:0x0]"
MDT, OST = "MDT0000", "OST0000"
START_NS = 1_767_225_600 * 10**9  # 2026-01-01T00:00:00Z
EPOCH_S = 60
FILES, SIZE = 12, 16 * 1024


def fid(n: int) -> str:
    return f"[0x200000400:0x{n:x}:0x0]"


class Source:
    """Changelogs written by hand (one MDT, one OST) and the files' bytes in a versioned bucket."""

    def __init__(self, client, bucket: str, out):
        self.client, self.bucket, self.out = client, bucket, out
        self.index = {MDT: 0, OST: 0}
        self.epoch = 0
        self.records: list[dict] = []
        self.data: dict[str, bytes] = {}  # path -> bytes

    def rec(self, type_: str, server: str = MDT, **fields) -> None:
        self.index[server] += 1
        t = START_NS + (self.epoch - 1) * EPOCH_S * 10**9 + len(self.records) * 1000
        self.records.append(
            {"server": server, "index": self.index[server], "epoch": self.epoch, "type": type_, "time_ns": t, **fields}
        )

    def write(self, f: str, path: str, data: bytes, offset: int, length: int, *, sized: bool = False) -> None:
        """The file's new bytes as one object version, and a WRITE of ``length`` bytes at ``offset``
        (``sized``: the record gives the version's length)."""
        version = self.client.put_object(Bucket=self.bucket, Key=f"data/{f}", Body=data)["VersionId"]
        obj = {"ost": OST, "oid": f, "version": version, **({"size": len(data)} if sized else {})}
        self.rec("WRITE", OST, tfid=f, object=obj, extents=[{"offset": offset, "length": length}])
        self.data[path] = data

    def close(self) -> None:
        """Every server writes its EPOCH record; the epoch's changelog files are written."""
        for server in (MDT, OST):
            self.index[server] += 1
            end = START_NS + self.epoch * EPOCH_S * 10**9 - 1
            self.records.append(
                {"server": server, "index": self.index[server], "epoch": self.epoch, "type": "EPOCH", "time_ns": end}
            )
            d = self.out / "changelogs" / server
            d.mkdir(parents=True, exist_ok=True)
            mine = [r for r in self.records if r["server"] == server]
            (d / f"{self.epoch:06d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in mine))
        self.records = []


def purpose(method: str, bucket: str, key: str, query: str, copy: str, source: str) -> str:
    """A logged request in words (the key's kind, the sub-resource), as the proxy saw it."""
    if bucket == source:
        return f"source {method}"
    if not key:
        sub = next((q for q in ("versioning", "versions", "delete", "list-type") if q in query), "bucket")
        return f"replica {method} ?{sub}"
    if key.startswith("tree/.epochsync/"):
        part = key[len("tree/.epochsync/") :].split("/")[0]
        return f"replica {method} {'probe' if part == 'probe' else part}" + (" (copy)" if copy else "")
    return f"replica {method} file" + (" (copy)" if copy else "")


@pytest.fixture()
def world(seaweed, tmp_path):
    with S3Proxy(seaweed.url) as proxy:
        os.environ["AIRFLOW_CONN_EPOCH_REQS"] = seaweed.airflow_conn_json().replace(seaweed.url, proxy.url)
        client = seaweed.client()
        bucket = "src-" + uuid.uuid4().hex[:8]
        client.create_bucket(Bucket=bucket)
        client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
        doc = {
            "warehouse": str(tmp_path / "warehouse"),
            "sources": [
                {
                    "name": "src",
                    "root_fid": ROOT,
                    "servers": [MDT, OST],
                    "changelogs": {"uri": f"file://{tmp_path}/changelogs", "format": "jsonl"},
                    "store": {"conn_id": "epoch_reqs", "bucket": bucket},
                    "epoch": {"interval": f"{EPOCH_S}s", "start": "2026-01-01T00:00:00Z"},
                }
            ],
            "targets": [
                {
                    "name": "s3",
                    "source": "src",
                    "kind": "s3",
                    "conn_id": "epoch_reqs",
                    "bucket": "rep-" + uuid.uuid4().hex[:8],
                    "prefix": "tree/",
                }
            ],
        }
        (tmp_path / "epochsync.yaml").write_text(yaml.safe_dump(doc))
        yield {
            "proxy": proxy,
            "client": client,
            "source": Source(client, bucket, tmp_path),
            "cfg": load_config(tmp_path / "epochsync.yaml"),
        }
        os.environ.pop("AIRFLOW_CONN_EPOCH_REQS", None)


def run_epoch(world, e: int) -> Counter:
    """``replicate`` of epoch ``e`` (no Spark: every stage of so small an epoch runs here); returns
    its requests by purpose."""
    proxy = world["proxy"]
    proxy.keep_log(True)
    replicate(world["cfg"], "s3", epoch=e, spark=None, progress=lambda _line: None)
    log = proxy.keep_log(False)
    return Counter(purpose(m, b, k, q, c, world["source"].bucket) for m, b, k, q, _, c in log)


def small_writes(src: Source, files: list[int], *, sized: bool = False) -> None:
    """4 KiB written into each of ``files`` (16 KiB each), at an offset of its own."""
    for n in files:
        path = f"d{n % 3}/f{n:02d}"
        data = bytearray(src.data[path])
        off = (n * 1024 + src.epoch * 512) % (SIZE - 4096)
        data[off : off + 4096] = os.urandom(4096)
        src.write(fid(100 + n), path, bytes(data), off, 4096, sized=sized)


def test_a_small_write_epoch_costs_one_or_two_requests_per_file_and_six_more(world):
    """Per changed file the source's GET and the conditional PUT, or one conditional copy of the
    source's version where the WRITE record gives its length (the file's size: that version is
    the whole file); per epoch six requests: the
    lease's PUT and DELETE (the version it made), one manifest GET (kept under the lease for
    every stage after it), one GetBucketVersioning, the rollback marker's HEAD (the fence
    instant's other half; the manifest's time came with its GET) and the manifest's PUT. The
    first epoch with a fence instant also probes the store's conditional writes once: six
    requests on throw-away keys and one DeleteObjects of the versions they made."""
    src, c = world["source"], world["client"]
    src.epoch = 1
    for d in range(3):
        src.rec("MKDIR", tfid=fid(10 + d), pfid=ROOT, name=f"d{d}", mode=stat.S_IFDIR | 0o755, uid=0, gid=0)
    for n in range(FILES):
        f, path = fid(100 + n), f"d{n % 3}/f{n:02d}"
        src.rec("CREAT", tfid=f, pfid=fid(10 + n % 3), name=f"f{n:02d}", mode=stat.S_IFREG | 0o644, uid=0, gid=0)
        src.write(f, path, os.urandom(SIZE), 0, SIZE)
    src.close()
    run_epoch(world, 1)

    changed = {2: [0, 1, 2, 3, 4, 5, 6, 7], 3: [1, 4, 7, 8, 9, 10, 11, 3]}
    got = {}
    for e in (2, 3):
        src.epoch = e
        small_writes(src, changed[e], sized=e == 3)
        src.close()
        got[e] = run_epoch(world, e)
    n = len(changed[3])
    per_epoch = {
        "replica PUT lease.json": 1,
        "replica DELETE lease.json": 1,
        "replica GET manifest.json": 1,
        "replica GET ?versioning": 1,
        "replica HEAD rollback.json": 1,
        "replica PUT manifest.json": 1,
    }
    # epoch 3: the records give the versions' lengths, one copy per file
    assert dict(got[3]) == {"replica PUT file (copy)": n, **per_epoch}, got[3]
    assert sum(got[3].values()) == n + 6
    # epoch 2: no lengths, a GET and a PUT per file, and the store probe once (7 requests; it was 11)
    probe = {"replica PUT probe": 5, "replica PUT probe (copy)": 1, "replica POST ?delete": 1}
    assert dict(got[2]) == {"source GET": n, "replica PUT file": n, **per_epoch, **probe}, got[2]

    # the replica is the source's, and the control area keeps no lease or probe versions behind
    target = open_target(world["cfg"].target("s3"))
    assert target.read_manifest()["epoch"] == 3
    files = {e.path: e.sha256 for e in target.walk(hashes=True) if e.type == "file"}
    assert files == {p: hashlib.sha256(b).hexdigest() for p, b in src.data.items()}
    for leftover in ("tree/.epochsync/lease.json", "tree/.epochsync/probe/"):
        listed = c.list_object_versions(Bucket=target.bucket, Prefix=leftover)
        assert not listed.get("Versions") and not listed.get("DeleteMarkers"), (leftover, listed)
