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
from epochsync.core.errors import EpochsyncError
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

    def truncate(self, f: str, size: int, kept: bytes | None = None) -> History:
        """``truncate -s size``: TRUNC; when it shrinks, the object's new version (``kept``, the
        bytes left) in a WRITE without extents that states its length, as the simulator logs it."""
        self.rec("TRUNC", tfid=f, size=size)
        if kept is not None:
            version = self.client.put_object(Bucket=self.bucket, Key=f"data/{f}", Body=kept)["VersionId"]
            obj = {"ost": OST, "oid": f, "version": version, "size": len(kept)}
            self.rec("WRITE", OST, tfid=f, object=obj, extents=[])
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


def replicate_s3(world, spark, cfg, e: int, want: dict, *, fail_first: bool = True) -> None:
    """Epoch ``e`` into the s3 target: first with a failure injected late in its apply (the
    rollback must bring back epoch ``e - 1``, checked against its snapshot), then for real."""
    from epochsync.core.errors import EpochError

    target = open_target(cfg.target("s3"))
    before = replica_tree(target, root=False) if target.read_manifest() else {}
    if fail_first:
        with pytest.raises(EpochError, match="rolled back"):
            replicate(cfg, "s3", epoch=e, spark=spark, inject="at=0.9", progress=lambda _line: None)
        target = open_target(cfg.target("s3"))
        assert (target.read_manifest() or {}).get("epoch", 0) == e - 1
        assert replica_tree(target, root=False) == before
    replicate(cfg, "s3", epoch=e, spark=spark, progress=lambda _line: None)
    target = open_target(cfg.target("s3"))
    assert target.read_manifest()["epoch"] == e
    assert replica_tree(target, root=False) == want, f"s3 epoch {e}"


def test_names_the_s3_target_used_to_refuse_or_lose(world, spark):
    """Issue 32's two s3 defects, through every stage on SeaweedFS, each epoch first rolled back:

    - a file named with a carriage return: SeaweedFS sends version listings unencoded and an
      XML parser reads the CR as a LF, so verify called ``cr\\rname`` missing, then the
      rollback found it present and not in the snapshot: the target was stuck;
    - a source entry named ``.epochsync-dir`` (the old directory object's name), as a file and
      as a directory, anywhere: refused, which failed that epoch and every later one. Names
      the new layout's mirror uses (``dir``, ``_x``) are ordinary names too.
    """
    h = History(world["client"], world["bucket"])
    d, cr, dcr, mark, dmark, mdir, mx, ddir, under, lf = (fid(n) for n in range(1, 11))
    one, two, three = b"one\r\n" * 9, b"two\n" * 7, b"three\n"
    h.epoch().mkdir(d, ROOT, "d").create(cr, ROOT, "cr\rname", one).create(dcr, d, "cr\r", two)
    h.create(mark, ROOT, ".epochsync-dir", one).create(dmark, d, ".epochsync-dir", two)
    h.mkdir(mdir, d, ".epochsync-dir.d").create(mx, mdir, "x", three)
    h.mkdir(ddir, ROOT, "dir").mkdir(under, ddir, "_x").create(lf, under, "lf\nname", one)
    crd, crx = fid(11), fid(12)
    h.mkdir(crd, ROOT, "cr\rd", 0o750).create(crx, crd, "x\r", two)
    h.epoch().write(cr, one.upper()).rename(dcr, (d, "cr\r"), (ROOT, "\rcr\r"))  # new bytes; moved to the root
    h.unlink(mark, ROOT, ".epochsync-dir").rename(dmark, (d, ".epochsync-dir"), (mdir, ".epochsync-dir"))
    h.rename(mdir, (d, ".epochsync-dir.d"), (ROOT, ".epochsync-dir"))  # a directory of that name
    h.chmod(under, 0o700)
    expected = [
        {
            "d": D(),
            "cr\rname": F(one),
            "d/cr\r": F(two),
            ".epochsync-dir": F(one),
            "d/.epochsync-dir": F(two),
            "d/.epochsync-dir.d": D(),
            "d/.epochsync-dir.d/x": F(three),
            "dir": D(),
            "dir/_x": D(),
            "dir/_x/lf\nname": F(one),
            "cr\rd": D(0o750),
            "cr\rd/x\r": F(two),
        },
        {
            "d": D(),
            "cr\rname": F(one.upper()),
            "\rcr\r": F(two),
            ".epochsync-dir": D(),
            ".epochsync-dir/x": F(three),
            ".epochsync-dir/.epochsync-dir": F(two),
            "dir": D(),
            "dir/_x": D(0o700),
            "dir/_x/lf\nname": F(one),
            "cr\rd": D(0o750),
            "cr\rd/x\r": F(two),
        },
    ]
    h.write_changelogs(world["tmp"])
    cfg = make_config(world)
    for e, want in enumerate(expected, start=1):
        replicate_s3(world, spark, cfg, e, want)
    target = open_target(cfg.target("s3"))
    keys = {o["Key"][len(target.prefix) :] for o in target.list_keys()}
    assert {".epochsync-dir/x", ".epochsync-dir/.epochsync-dir", ".epochsync/dirs/_.epochsync-dir/dir"} <= keys


def test_a_layout_1_replica_moves_its_directory_objects_on_the_next_epoch(world, spark, monkeypatch):
    """A replica written before layout 2 keeps each directory's attributes in ``path/.epochsync-dir``.
    The next epoch's apply moves them to the control area (copies, deletes, then the manifest
    says layout 2) before its write fence: first an unfinished epoch of the old layout is rolled
    back (its journal names layout-1 keys, and the rollback's check reads that layout), then the
    move, then the epoch; a rollback after the move restores the moved layout."""
    from epochsync.core.errors import EpochError
    from epochsync.stages import replicate as replicate_module
    from epochsync.targets.s3 import naming

    h = History(world["client"], world["bucket"])
    a, ab, ax, bx, r = (fid(n) for n in range(1, 6))
    h.epoch().mkdir(a, ROOT, "a", 0o750).mkdir(ab, a, "b", 0o700).create(ax, a, "x", b"x1\n").create(bx, ab, "x", b"bx")
    h.chmod(ROOT, 0o711)
    h.epoch().write(ax, b"x2 longer\n").mkdir(r, ROOT, "r").rename(ab, (a, "b"), (r, "b"))
    h.write_changelogs(world["tmp"])
    cfg = make_config(world)
    one = {"a": D(0o750), "a/b": D(0o700), "a/x": F(b"x1\n"), "a/b/x": F(b"bx")}
    two = {"a": D(0o750), "r": D(), "r/b": D(0o700), "a/x": F(b"x2 longer\n"), "r/b/x": F(b"bx")}

    with monkeypatch.context() as old:  # the code before layout 2
        old.setattr(naming, "LAYOUT", 1)
        replicate(cfg, "s3", epoch=1, spark=spark, progress=lambda _line: None)
        target = open_target(cfg.target("s3"))
        doc = target.read_manifest()
        doc.pop("layout")  # an old manifest says nothing of its layout
        target.io.client.put_object(
            Bucket=target.bucket, Key=target.prefix + ".epochsync/manifest.json", Body=json.dumps(doc).encode()
        )
        target = open_target(cfg.target("s3"))
        keys = {o["Key"][len(target.prefix) :] for o in target.list_keys()}
        assert {".epochsync-dir", "a/.epochsync-dir", "a/b/.epochsync-dir"} <= keys
        assert target.layout == 1 and replica_tree(target, root=True) == {"": D(0o711), **one}

        def no_rollback(*args, **kwargs):
            raise EpochError("rollback skipped by the test")

        old.setattr(replicate_module, "rollback_target", no_rollback)
        with pytest.raises(EpochsyncError, match="rollback failed too"):
            replicate(cfg, "s3", epoch=2, spark=spark, inject="at=0.7", progress=lambda _line: None)
    # the new code: the unfinished layout-1 epoch is rolled back, the layout moves, epoch 2 fails
    # once late in its apply (rolled back onto the moved layout), then runs
    target = open_target(cfg.target("s3"))
    assert target.read_manifest()["epoch"] == 1 and target.layout == 1
    with pytest.raises(EpochError, match="rolled back"):
        replicate(cfg, "s3", epoch=2, spark=spark, inject="at=0.9,repeat=1", progress=lambda _line: None)
    target = open_target(cfg.target("s3"))
    assert target.read_manifest()["layout"] == 2 and target.read_manifest()["epoch"] == 1
    keys = {o["Key"][len(target.prefix) :] for o in target.list_keys()}
    assert not any(k.endswith(".epochsync-dir") for k in keys), keys
    assert {".epochsync/dirs/dir", ".epochsync/dirs/_a/dir", ".epochsync/dirs/_a/_b/dir"} <= keys
    assert replica_tree(target, root=True) == {"": D(0o711), **one}
    replicate(cfg, "s3", epoch=2, spark=spark, progress=lambda _line: None)
    target = open_target(cfg.target("s3"))
    assert target.read_manifest()["epoch"] == 2 and target.read_manifest()["layout"] == 2
    assert replica_tree(target, root=True) == {"": D(0o711), **two}


def test_truncated_down_then_up_within_an_epoch(world, spark):
    """Issue 50's hand-written history (``make demo`` failed on it): a file truncated to 0 and
    then to 100 within one epoch, another to 10 and then to 436, a third down and up across
    two epochs. The version the source holds at E is shorter than the file: the tail is a
    hole, zeros on both targets (the s3 target copied the short version whole, an object of
    0 and 10 bytes). Every epoch is first rolled back on s3 (``replicate_s3``)."""
    h = History(world["client"], world["bucket"])
    a, b, c = fid(1), fid(2), fid(3)
    data = bytes(range(256)) * 2
    h.epoch().create(a, ROOT, "a", data).truncate(a, 0, b"").truncate(a, 100)
    h.create(b, ROOT, "b", data[:300]).truncate(b, 10, data[:10]).truncate(b, 436)
    h.create(c, ROOT, "c", data)
    h.epoch().truncate(c, 7, data[:7])
    h.epoch().truncate(c, 300)
    expected = [
        {"a": F(bytes(100)), "b": F(data[:10] + bytes(426)), "c": F(data)},
        {"a": F(bytes(100)), "b": F(data[:10] + bytes(426)), "c": F(data[:7])},
        {"a": F(bytes(100)), "b": F(data[:10] + bytes(426)), "c": F(data[:7] + bytes(293))},
    ]
    h.write_changelogs(world["tmp"])
    cfg = make_config(world)
    for e, want in enumerate(expected, start=1):
        replicate_s3(world, spark, cfg, e, want)
        replicate(cfg, "posix", epoch=e, spark=spark, progress=lambda _line: None)
        got = replica_tree(open_target(cfg.target("posix")), root=False)
        assert got == want, f"posix epoch {e}"
