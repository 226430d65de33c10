"""The ground-truth comparator names every difference between a replica and the source."""

import base64
import hashlib
import json
import os

import pytest

from epochsync.core.config import TargetConfig
from epochsync.targets.posix import PosixTarget
from epochsync_dev.truth import compare_with_truth, load_truth


def row(path, type_, data=None, mode=0o100644, **kw):
    r = {
        "path": path,
        "type": type_,
        "mode": mode,
        "uid": os.getuid(),
        "gid": os.getgid(),
        "symlink": None,
        "xattrs": {},
        "size": None,
        "sha256": None,
    }
    if data is not None:
        r.update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    r.update(kw)
    return r


@pytest.fixture()
def replica(tmp_path):
    root = tmp_path / "replica"
    (root / "d").mkdir(parents=True)
    os.chmod(root / "d", 0o755)
    (root / "d" / "f").write_bytes(b"hello")
    os.chmod(root / "d" / "f", 0o644)
    os.symlink("d/f", root / "l")
    return PosixTarget(TargetConfig(name="t", source="s", kind="posix", path=str(root)))


def truth_rows():
    return {
        "d": row("d", "dir", mode=0o40755),
        "d/f": row("d/f", "file", b"hello"),
        "l": row("l", "symlink", mode=0o120777, symlink="d/f"),
    }


def test_identical_replica_has_no_differences(replica):
    assert compare_with_truth(replica, truth_rows(), xattrs=False) == []


def test_each_kind_of_difference_is_named(replica):
    t = truth_rows()
    t["d/f"] = row("d/f", "file", b"hellO")
    assert compare_with_truth(replica, t, xattrs=False) == [
        f"d/f: sha256 is {hashlib.sha256(b'hello').hexdigest()!r}, source has {hashlib.sha256(b'hellO').hexdigest()!r}"
    ]
    t = truth_rows()
    t["d/f"]["mode"] = 0o100600
    assert compare_with_truth(replica, t, xattrs=False) == ["d/f: mode is 420, source has 384"]
    t = truth_rows()
    t["l"]["symlink"] = "elsewhere"
    assert compare_with_truth(replica, t, xattrs=False) == ["l: symlink is 'd/f', source has 'elsewhere'"]
    t = truth_rows()
    t["new"] = row("new", "file", b"")
    del t["l"]
    assert compare_with_truth(replica, t, xattrs=False) == [
        "l: on the replica but not in the source",
        "new: in the source but missing on the replica",
    ]


def test_xattrs_are_compared(replica, tmp_path):
    try:
        os.setxattr(tmp_path / "replica" / "d" / "f", "user.k", b"v1")
    except OSError:
        pytest.fail("this file system must support user xattrs for the posix target tests")
    t = truth_rows()
    t["d/f"]["xattrs"] = {"user.k": base64.b64encode(b"v2").decode()}
    assert compare_with_truth(replica, t) == ["d/f: xattrs is (('user.k', b'v1'),), source has (('user.k', b'v2'),)"]


def test_load_truth(tmp_path):
    p = tmp_path / "epoch=1.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in truth_rows().values()) + "\n")
    assert set(load_truth(p)) == {"d", "d/f", "l"}


def test_only_the_paths_given_are_compared(replica):
    t = truth_rows()
    t["d/f"]["mode"] = 0o100600
    t["gone"] = row("gone", "file", b"x")
    # d/f differs and is not asked for; gone is asked for and missing; l is asked for and equal
    assert compare_with_truth(replica, t, xattrs=False, paths=["l", "gone"]) == [
        "gone: in the source but missing on the replica"
    ]
    # a path asked for that the source does not have must be absent from the replica
    del t["l"]
    assert compare_with_truth(replica, t, xattrs=False, paths=["l"]) == ["l: on the replica but not in the source"]
    assert compare_with_truth(replica, truth_rows(), xattrs=False, paths=["d", "d/f", "l"]) == []


def test_contents_are_left_out_without_hashes(replica):
    t = truth_rows()
    t["d/f"] = row("d/f", "file", b"hellO")  # same size, other bytes
    assert compare_with_truth(replica, t, xattrs=False, hashes=False) == []
    assert compare_with_truth(replica, t, xattrs=False, hashes=False, paths=["d/f"]) == []
    assert compare_with_truth(replica, t, xattrs=False, paths=["d/f"]) == [
        f"d/f: sha256 is {hashlib.sha256(b'hello').hexdigest()!r}, source has {hashlib.sha256(b'hellO').hexdigest()!r}"
    ]
