"""Hand-written histories replicated epoch by epoch into a posix and an s3 target.

Each history is a few epochs of changelog records written by hand (JSON Lines, one MDT
and one OST), with the source bytes in a versioned SeaweedFS bucket and, for every
epoch, the tree the replica must hold, also written by hand. Every epoch runs through
the real stages (``stages.replicate.replicate``: ingest, merge, translate, apply, verify,
commit) on Spark; after each one both replicas (root included) must equal that tree.

These are the cases issue 16 found stuck or silent: a directory replaced by a file or a
symlink in one epoch, attribute changes of the root directory, attributes larger than
S3's object metadata.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import uuid
from pathlib import Path

import pytest
import yaml

from epochsync.core.config import load_config
from epochsync.stages.replicate import replicate
from epochsync.targets import open_target

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = "[0x200000007:0x1:0x0]"
MDT, OST = "MDT0000", "OST0000"
EPOCH_START_NS = 1_767_225_600 * 10**9  # 2026-01-01T00:00:00Z
EPOCH_SECONDS = 60


def fid(n: int) -> str:
    return f"[0x200000400:0x{n:x}:0x0]"


class History:
    """Changelog records written by hand, epoch by epoch; file bytes go to the source bucket."""

    def __init__(self, client, bucket: str):
        self.client, self.bucket = client, bucket
        self.epochs: list[list[dict]] = []
        self.index = {MDT: 0, OST: 0}
        self.clock = EPOCH_START_NS

    def epoch(self) -> History:
        self._close()
        self.epochs.append([])
        self.clock = max(self.clock, EPOCH_START_NS + (len(self.epochs) - 1) * EPOCH_SECONDS * 10**9)
        return self

    def rec(self, type_: str, server: str = MDT, **fields) -> dict:
        self.index[server] += 1
        self.clock += 1000
        r = {
            "server": server,
            "index": self.index[server],
            "epoch": len(self.epochs),
            "type": type_,
            "time_ns": self.clock,
            **{k: v for k, v in fields.items() if v is not None},
        }
        self.epochs[-1].append(r)
        return r

    def mkdir(self, f: str, parent: str, name: str, mode: int = 0o755) -> History:
        self.rec("MKDIR", tfid=f, pfid=parent, name=name, mode=stat.S_IFDIR | mode, uid=0, gid=0)
        return self

    def create(self, f: str, parent: str, name: str, data: bytes | None = None, mode: int = 0o644) -> History:
        self.rec("CREAT", tfid=f, pfid=parent, name=name, mode=stat.S_IFREG | mode, uid=0, gid=0)
        if data:
            self.write(f, data)
        return self

    def write(self, f: str, data: bytes) -> History:
        """The whole file's new bytes: one object version, one WRITE over all of it."""
        version = self.client.put_object(Bucket=self.bucket, Key=f"data/{f}", Body=data)["VersionId"]
        self.rec(
            "WRITE",
            OST,
            tfid=f,
            object={"ost": OST, "oid": f, "version": version},
            extents=[{"offset": 0, "length": len(data)}],
        )
        return self

    def symlink(self, f: str, parent: str, name: str, target: str) -> History:
        self.rec("SLINK", tfid=f, pfid=parent, name=name, mode=stat.S_IFLNK | 0o777, uid=0, gid=0, symlink=target)
        return self

    def unlink(self, f: str, parent: str, name: str) -> History:
        self.rec("UNLNK", tfid=f, pfid=parent, name=name, flags=1)
        return self

    def rmdir(self, f: str, parent: str, name: str) -> History:
        self.rec("RMDIR", tfid=f, pfid=parent, name=name, flags=1)
        return self

    def rename(self, f: str, src: tuple[str, str], dst: tuple[str, str]) -> History:
        self.rec("RENME", sfid=f, spfid=src[0], sname=src[1], pfid=dst[0], name=dst[1], flags=0)
        return self

    def chmod(self, f: str, mode: int) -> History:
        self.rec("SATTR", tfid=f, mode=mode)
        return self

    def setxattr(self, f: str, name: str, value: bytes | None) -> History:
        import base64

        self.rec(
            "XATTR", tfid=f, xattr_name=name, xattr_value=None if value is None else base64.b64encode(value).decode()
        )
        return self

    def _close(self) -> None:
        """Every server closes the current epoch with its EPOCH record."""
        e = len(self.epochs)
        if e and not any(r["type"] == "EPOCH" for r in self.epochs[-1]):
            for server in (MDT, OST):
                self.index[server] += 1
                self.epochs[-1].append(
                    {
                        "server": server,
                        "index": self.index[server],
                        "epoch": e,
                        "type": "EPOCH",
                        "time_ns": EPOCH_START_NS + e * EPOCH_SECONDS * 10**9 - 1,
                    }
                )

    def write_changelogs(self, out: Path) -> None:
        self._close()
        for e, records in enumerate(self.epochs, start=1):
            for server in (MDT, OST):
                mine = [r for r in records if r["server"] == server]
                d = out / "changelogs" / server
                d.mkdir(parents=True, exist_ok=True)
                (d / f"{e:06d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in mine))


# The tree a replica must hold: path -> (type, sha256 of the bytes | symlink target | None, mode
# or None, xattrs). The root is the path "".
def D(mode: int = 0o755, xattrs: dict | None = None) -> tuple:  # noqa: N802
    return ("dir", None, mode, xattrs or {})


def F(data: bytes, mode: int = 0o644, xattrs: dict | None = None) -> tuple:  # noqa: N802
    return ("file", hashlib.sha256(data).hexdigest(), mode, xattrs or {})


def L(target: str) -> tuple:  # noqa: N802
    return ("symlink", target, None, {})


def replica_tree(target, *, root: bool) -> dict:
    out = {}
    if root:
        r = target.stat("", "dir")
        out[""] = None if r is None else (r.type, None, r.mode, dict(r.xattrs))
    for e in target.walk(hashes=True):
        value = e.sha256 if e.type == "file" else e.symlink
        out[e.path] = (e.type, value, e.mode if e.type != "symlink" else None, dict(e.xattrs))
    return out


@pytest.fixture()
def world(seaweed, tmp_path):
    """A source bucket, a posix and an s3 target, and Spark for merge and translate."""
    os.environ["AIRFLOW_CONN_HIST_S3"] = seaweed.airflow_conn_json()
    client = seaweed.client()
    bucket = "hist-" + uuid.uuid4().hex[:8]
    client.create_bucket(Bucket=bucket)
    client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    return {"client": client, "bucket": bucket, "tmp": tmp_path}


def make_config(world) -> object:
    out = world["tmp"]
    replica = "rep-" + uuid.uuid4().hex[:8]
    doc = {
        "warehouse": str(out / "warehouse"),
        "sources": [
            {
                "name": "hist",
                "root_fid": ROOT,
                "servers": [MDT, OST],
                "changelogs": {"uri": f"file://{out}/changelogs", "format": "jsonl"},
                "store": {"conn_id": "hist_s3", "bucket": world["bucket"]},
                "epoch": {"interval": f"{EPOCH_SECONDS}s", "start": "2026-01-01T00:00:00Z"},
            }
        ],
        "targets": [
            {"name": "posix", "source": "hist", "kind": "posix", "path": str(out / "replica")},
            {"name": "s3", "source": "hist", "kind": "s3", "conn_id": "hist_s3", "bucket": replica, "prefix": "tree/"},
        ],
    }
    (out / "epochsync.yaml").write_text(yaml.safe_dump(doc))
    return load_config(out / "epochsync.yaml")


def replicate_and_check(world, spark, history: History, expected: list[dict]) -> None:
    """Every epoch of ``history`` into a posix and an s3 target; after each, both trees must be
    ``expected[e-1]``. The posix target runs ``replicate`` (every stage); the s3 target shares its
    merge (same source, no fileset: the same snapshot and change set) and runs the rest."""
    import shutil

    from epochsync.stages.apply import run_apply
    from epochsync.stages.commit import run_commit
    from epochsync.stages.translate import run_translate
    from epochsync.stages.verify import run_verify
    from epochsync.warehouse.paths import Warehouse, local_path

    history.write_changelogs(world["tmp"])
    cfg = make_config(world)
    wh = Warehouse(cfg.warehouse)
    for e, want in enumerate(expected, start=1):
        replicate(cfg, "posix", epoch=e, spark=spark, progress=lambda _line: None)
        for uri in (wh.snapshot, wh.changes):
            shutil.copytree(local_path(uri("posix", e)), local_path(uri("s3", e)))
        run_translate(cfg, "s3", e, spark)
        run_apply(cfg, "s3", e, spark)
        run_verify(cfg, "s3", e, spark)
        run_commit(cfg, "s3", e)
        for name in ("posix", "s3"):
            target = open_target(cfg.target(name))
            assert target.read_manifest()["epoch"] == e
            got = replica_tree(target, root="" in want)
            if name == "posix":  # a posix replica keeps user.* xattrs only
                want_here = {
                    p: (*v[:3], {k: x for k, x in v[3].items() if k.startswith("user.")}) for p, v in want.items()
                }
            else:
                want_here = want
            assert got == want_here, f"{name} epoch {e}"


def test_types_replaced_under_children_and_root_attributes(world, spark):
    """Regressions (issue 16, bugs 1 and 2), one history:

    - ``mv a a.old; touch a``, ``rm -r b; touch b`` and ``rm -r c; ln -s a.old/x c`` in one
      epoch: verify's check that ``a/x`` is gone raised NotADirectoryError (UnsafePathError
      under a symlink) on posix, the epoch rolled back, and every retry failed the same way.
      The same epoch turns a file and a symlink into directories with children (the write
      fence asks whether ``s/y`` is absent while ``s`` is a symlink).
    - SATTR and XATTR on the root's fid were in the change set, but translate built no plan
      entry (the root has no parent link) and verify did not notice: the replica root
      (posix: the replica directory; s3: ``prefix/.epochsync-dir``) must follow.
    - An xattr and a symlink target too large for S3's 2 KB of object metadata replicate
      (through the fid's attribute sidecar on s3).
    """
    h = History(world["client"], world["bucket"])
    a, ax, b, bx, c, cx, f, s = (fid(n) for n in range(1, 9))
    new_a, new_b, new_c, dir_f, fy, dir_s, sy, long = (fid(n) for n in range(9, 17))
    one, two, three = b"first\n" * 10, b"a file now\n", b"a child\n"
    big = bytes(range(256)) * 7  # over S3's 2 KB of metadata once encoded: the fid's attribute sidecar
    h.epoch().mkdir(a, ROOT, "a").create(ax, a, "x", one)
    h.mkdir(b, ROOT, "b").create(bx, b, "x", one).mkdir(c, ROOT, "c").create(cx, c, "x", one)
    h.create(f, ROOT, "f", one).symlink(s, ROOT, "s", "a/x")
    h.chmod(ROOT, 0o750).setxattr(ROOT, "user.project", b"alpha").setxattr(ROOT, "trusted.t", b"1")
    h.epoch().rename(a, (ROOT, "a"), (ROOT, "a.old")).create(new_a, ROOT, "a", two)  # mv a a.old; touch a
    h.unlink(bx, b, "x").rmdir(b, ROOT, "b").create(new_b, ROOT, "b", two)  # rm -r b; touch b
    h.unlink(cx, c, "x").rmdir(c, ROOT, "c").symlink(new_c, ROOT, "c", "a.old/x")  # rm -r c; ln -s a.old/x c
    h.unlink(f, ROOT, "f").mkdir(dir_f, ROOT, "f").create(fy, dir_f, "y", three)  # rm f; mkdir f; touch f/y
    h.unlink(s, ROOT, "s").mkdir(dir_s, ROOT, "s").create(sy, dir_s, "y", three).setxattr(sy, "user.big", big)
    h.symlink(long, ROOT, "long", "t/" * 1500)
    h.chmod(ROOT, 0o711).setxattr(ROOT, "user.project", None).setxattr(ROOT, "user.owner", b"ops")
    expected = [
        {
            "": D(0o750, {"user.project": b"alpha", "trusted.t": b"1"}),
            "a": D(),
            "a/x": F(one),
            "b": D(),
            "b/x": F(one),
            "c": D(),
            "c/x": F(one),
            "f": F(one),
            "s": L("a/x"),
        },
        {
            "": D(0o711, {"user.owner": b"ops", "trusted.t": b"1"}),
            "a.old": D(),
            "a.old/x": F(one),
            "a": F(two),
            "b": F(two),
            "c": L("a.old/x"),
            "f": D(),
            "f/y": F(three),
            "s": D(),
            "s/y": F(three, xattrs={"user.big": big}),
            "long": L("t/" * 1500),
        },
    ]
    replicate_and_check(world, spark, h, expected)
