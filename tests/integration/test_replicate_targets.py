"""Target contract suite: the same plans applied to a posix and an s3 (SeaweedFS) target.

The posix target runs twice: in a plain directory, and as a btrfs subvolume (a loop image) whose
committed view is on (``posix-btrfs``; skipped where no btrfs loop can be made, see ``btrfs_dir``).

Plans are built by the real planner from hand-written snapshot entries (no Spark), the
source bytes live in a versioned SeaweedFS bucket, and every test asserts the replica's
exact bytes and namespace, after apply and after rollback.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid

import pytest
from support.plans import entry, row

from epochsync.core.config import TargetConfig
from epochsync.journal.undo import read_journal
from epochsync.stages.apply import apply_plan, write_fence
from epochsync.stages.translate import build_plan
from epochsync.stages.verify import verify_plan
from epochsync.stores.connections import resolve_s3
from epochsync.stores.s3_access import S3Access
from epochsync.targets import open_target
from epochsync.targets.base import UnsafePathError

pytestmark = pytest.mark.integration

STORE = {"key": "{ost}/{oid}", "unstriped_key": "data/{fid}", "bucket": None}
ROOT = "ROOT"


class Source:
    """A versioned source bucket holding unstriped file contents by fid."""

    def __init__(self, endpoint, bucket):
        self.client = endpoint.client()
        self.bucket = bucket
        self.client.create_bucket(Bucket=bucket)
        self.client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})

    def put(self, fid: str, data: bytes) -> str:
        return self.client.put_object(Bucket=self.bucket, Key=f"data/{fid}", Body=data)["VersionId"]


def change(ranges=None, whole=False, data=True):
    return {"data_changed": data, "whole_file": whole, "ranges": [{"offset": o, "length": n} for o, n in ranges or []]}


@pytest.fixture(scope="module")
def env(seaweed, tmp_path_factory):
    os.environ["AIRFLOW_CONN_CONTRACT_S3"] = seaweed.airflow_conn_json()
    src = Source(seaweed, "src-" + uuid.uuid4().hex[:8])
    store = dict(STORE, bucket=src.bucket)
    return {"seaweed": seaweed, "source": src, "store": store, "tmp": tmp_path_factory.mktemp("contract")}


@pytest.fixture(params=["posix", "posix-btrfs", "s3", "s3-striped"])
def target(request, env):
    name = "t" + uuid.uuid4().hex[:6]
    if request.param == "posix":
        cfg = TargetConfig(name=name, source="sim", kind="posix", path=str(env["tmp"] / name))
    elif request.param == "posix-btrfs":
        # the same contract where the replica is a btrfs subvolume with a committed view
        cfg = TargetConfig(name=name, source="sim", kind="posix", path=str(request.getfixturevalue("btrfs_dir") / name))
    else:
        stripes = {"stripe_size": 1024, "stripe_count": 3} if request.param == "s3-striped" else {}
        cfg = TargetConfig(
            name=name,
            source="sim",
            kind="s3",
            conn_id="contract_s3",
            bucket="replica-contract",
            prefix=f"{name}/",
            **stripes,
        )
    t = open_target(cfg)
    if t.kind == "s3":
        t.ensure_bucket()
    return t


def run(env, target, entries, epoch, *, inject=None):
    tdict = _tdict(target)
    plan = build_plan(entries, target=tdict, store=env["store"], epoch=epoch)
    src_io = S3Access(resolve_s3("contract_s3"))
    # as run_apply: on SeaweedFS a key written whole carries its fence (a conditional write)
    problems, state, _ = write_fence(plan, target, src_io, str(env["tmp"] / "probe.json"))
    assert problems == []
    jdir = str(env["tmp"] / f"undo-{target.name}-{epoch}")
    figures = apply_plan(plan, target, src_io, env["store"]["bucket"], jdir, state, faults=inject)
    return plan, jdir, figures, src_io


def tree(target) -> dict:
    out = {}
    for e in target.walk():
        out[e.path] = (e.type, e.sha256 if e.type == "file" else e.symlink, e.mode, dict(e.xattrs))
    return out


def rollback(target, jdir):
    for en in reversed(read_journal(jdir)):
        target.undo(en, jdir)
    # undo is idempotent: a second replay changes nothing
    for en in reversed(read_journal(jdir)):
        target.undo(en, jdir)
    target.finish_rollback(0)


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def epoch1(env):
    src = env["source"]
    data_f = os.urandom(3000)
    v_f = src.put("F", data_f)
    d = row("dir", mode=0o755)
    f = row("file", size=3000, version=v_f, fid="F", xattrs={"user.k": b"v1"})
    s = row("symlink", mode=0o777, symlink="a/f")
    entries = [
        entry("D", new=d, new_paths=["a"]),
        entry("F", new=f, new_paths=["a/f", "a/hard"]),
        entry("S", new=s, new_paths=["link"]),
    ]
    return entries, {"d": d, "f": f, "s": s, "data_f": data_f}


def test_create_modify_rename_delete_then_rollback(env, target):
    entries, st = epoch1(env)
    plan, jdir, _, src_io = run(env, target, entries, 1)
    v = verify_plan(plan, target, src_io, env["store"]["bucket"])
    assert v["ok"], v["problems"]
    t1 = tree(target)
    assert t1["a"][0] == "dir" and t1["link"][:2] == ("symlink", "a/f")
    assert t1["a/f"][:2] == ("file", sha(st["data_f"])) and t1["a/hard"][:2] == ("file", sha(st["data_f"]))
    assert t1["a/f"][3] == {"user.k": b"v1"}
    if target.kind == "posix":
        assert os.stat(os.path.join(target.root, "a/f")).st_ino == os.stat(os.path.join(target.root, "a/hard")).st_ino
    target.write_manifest({"epoch": 1})

    # epoch 2: rename a -> b, patch bytes 100..200 and grow, drop the hard link and the symlink
    new_data = bytearray(st["data_f"]) + os.urandom(500)
    new_data[100:200] = os.urandom(100)
    v2 = env["source"].put("F", bytes(new_data))
    f2 = row("file", size=len(new_data), version=v2, fid="F", xattrs={"user.k": b"v2"}, mode=0o600)
    entries2 = [
        entry("D", old=st["d"], new=st["d"], old_paths=["a"], new_paths=["b"]),
        entry(
            "F",
            old=st["f"],
            new=f2,
            old_paths=["a/f", "a/hard"],
            new_paths=["b/f"],
            change=change([(100, 100), (3000, 500)]),
        ),
        entry("S", old=st["s"], old_paths=["link"]),
    ]
    if target.kind == "posix":
        # posix places by (parent, name): the file itself did not move, its directory did
        entries2[1]["old_links"] = [
            {"pfid": "D", "name": "f", "path": "a/f"},
            {"pfid": "D", "name": "hard", "path": "a/hard"},
        ]
        entries2[1]["new_links"] = [{"pfid": "D", "name": "f", "path": "b/f"}]
        entries2[0]["old_links"] = [{"pfid": ROOT, "name": "a", "path": "a"}]
        entries2[0]["new_links"] = [{"pfid": ROOT, "name": "b", "path": "b"}]
    plan2, jdir2, fig, src_io = run(env, target, entries2, 2)
    assert verify_plan(plan2, target, src_io, env["store"]["bucket"])["ok"], verify_plan(
        plan2, target, src_io, env["store"]["bucket"]
    )
    t2 = tree(target)
    assert sorted(t2) == ["b", "b/f"]
    assert t2["b/f"] == ("file", sha(bytes(new_data)), 0o600, {"user.k": b"v2"})
    # only the changed ranges came from the source (coalesced: 100..200 and 3000..3500 are close)
    assert fig["bytes_pulled"] <= 3500 - 100
    rollback(target, jdir2)
    target.finish_commit(1)
    assert tree(target) == t1


def test_s3_walk_in_threads_gives_the_same_entries_in_the_same_order(env, monkeypatch):
    from epochsync.targets.s3 import S3Target

    name = "t" + uuid.uuid4().hex[:6]
    cfg = TargetConfig(
        name=name, source="sim", kind="s3", conn_id="contract_s3", bucket="replica-contract", prefix=f"{name}/"
    )
    target = open_target(cfg)
    target.ensure_bucket()
    entries, _ = epoch1(env)
    run(env, target, entries, 1)
    one_by_one = [(e.path, e.type, e.sha256) for e in target.walk(hashes=True)]
    assert len(one_by_one) >= 4
    monkeypatch.setattr(S3Target, "WALK_THREADS", 2)  # 4+ keys: the threaded path
    assert [(e.path, e.type, e.sha256) for e in target.walk(hashes=True)] == one_by_one


def test_dropping_one_hard_link_then_committing_keeps_the_next_epochs_fence_clean(env, target):
    """Regression (make demo, posix epoch 4): the commit's cleanup of a moved-aside name of a
    file that keeps another link changed that file's ctime after the manifest, and the next
    epoch's write fence refused the file as changed by someone else."""
    entries, st = epoch1(env)
    run(env, target, entries, 1)
    target.write_manifest({"epoch": 1})
    target.finish_commit(1)
    entries2 = [entry("F", old=st["f"], new=st["f"], old_paths=["a/f", "a/hard"], new_paths=["a/f"])]
    if target.kind == "posix":
        entries2[0]["old_links"] = [
            {"pfid": "D", "name": "f", "path": "a/f"},
            {"pfid": "D", "name": "hard", "path": "a/hard"},
        ]
        entries2[0]["new_links"] = [{"pfid": "D", "name": "f", "path": "a/f"}]
    run(env, target, entries2, 2)
    target.write_manifest({"epoch": 2})
    time.sleep(0.05)  # file times come from a coarse clock: let it tick between manifest and cleanup
    target.finish_commit(2)
    assert sorted(tree(target)) == ["a", "a/f", "link"]
    # epoch 3 changes the kept file again: run() asserts the fence finds nothing foreign
    f3 = dict(st["f"], mode=0o600)
    entries3 = [entry("F", old=st["f"], new=f3, old_paths=["a/f"], new_paths=["a/f"])]
    if target.kind == "posix":
        entries3[0]["old_links"] = entries3[0]["new_links"] = [{"pfid": "D", "name": "f", "path": "a/f"}]
    run(env, target, entries3, 3)
    assert tree(target)["a/f"][2] == 0o600


def second_epoch(env, st, target) -> list[dict]:
    """Epoch 2 after :func:`epoch1`: a directory renamed, its file rewritten whole (two names), a new
    directory, the symlink removed."""
    new_data = os.urandom(4000)
    v2 = env["source"].put("F", new_data)
    f2 = row("file", size=4000, version=v2, fid="F")
    e2 = row("dir", mode=0o700)
    entries2 = [
        entry("D", old=st["d"], new=st["d"], old_paths=["a"], new_paths=["z"]),
        entry(
            "F",
            old=st["f"],
            new=f2,
            old_paths=["a/f", "a/hard"],
            new_paths=["z/f", "z/hard"],
            change=change(whole=True),
        ),
        entry("E", new=e2, new_paths=["e"]),
        entry("S", old=st["s"], old_paths=["link"]),
    ]
    if target.kind == "posix":
        for en, links_old, links_new in (
            (entries2[0], [(ROOT, "a", "a")], [(ROOT, "z", "z")]),
            (entries2[1], [("D", "f", "a/f"), ("D", "hard", "a/hard")], [("D", "f", "z/f"), ("D", "hard", "z/hard")]),
        ):
            en["old_links"] = [{"pfid": p, "name": n, "path": x} for p, n, x in links_old]
            en["new_links"] = [{"pfid": p, "name": n, "path": x} for p, n, x in links_new]
    return entries2


@pytest.mark.parametrize("k", [0, 1, 2, 3, 5])
def test_fault_after_k_mutations_rolls_back_exactly(env, target, k, tmp_path):
    from epochsync.journal.faults import FaultCounter, FaultSpec, InjectedFailure

    entries, st = epoch1(env)
    run(env, target, entries, 1)
    t1 = tree(target)
    entries2 = second_epoch(env, st, target)
    spec = FaultSpec(after=k)
    counter = FaultCounter(spec, str(tmp_path / "count"), str(tmp_path / "fired"))
    with pytest.raises(InjectedFailure):
        run(env, target, entries2, 2, inject=counter)
    jdir = str(env["tmp"] / f"undo-{target.name}-2")
    rollback(target, jdir)
    assert tree(target) == t1
    # a rerun (the spec fired once) reaches epoch 2 exactly
    plan, _, _, src_io = run(env, target, entries2, 2, inject=counter)
    assert verify_plan(plan, target, src_io, env["store"]["bucket"])["ok"]
    assert sorted(tree(target)) == ["e", "z", "z/f", "z/hard"]


def test_the_committed_view_is_the_manifests_epoch_whatever_apply_does(env, target, tmp_path):
    """Where the target has a committed view (posix on btrfs) it is the manifest's epoch, exactly,
    through a half-applied epoch and its rollback; elsewhere the target says why it has none."""
    from epochsync.core.config import ViewConfig
    from epochsync.journal.faults import FaultCounter, FaultSpec, InjectedFailure

    entries, st = epoch1(env)
    run(env, target, entries, 1)
    t1 = tree(target)
    target.write_manifest({"epoch": 1, "target": target.name, "committed_at": 1.5})
    published = target.publish_view()
    status = target.view_status()
    if not status["available"]:
        assert published is None and status["reason"], status
        return
    assert published["made"] and status["current"] == 1 and status["kept"] == [1]
    snap = open_target(
        TargetConfig(
            name="reader", source="sim", kind="posix", path=published["snapshot"], view=ViewConfig(snapshots="never")
        )
    )
    assert tree(snap) == t1
    counter = FaultCounter(FaultSpec(after=2), str(tmp_path / "count"), str(tmp_path / "fired"))
    with pytest.raises(InjectedFailure):
        run(env, target, second_epoch(env, st, target), 2, inject=counter)
    assert tree(target) != t1 and tree(snap) == t1 and target.view_status()["current"] == 1
    rollback(target, str(env["tmp"] / f"undo-{target.name}-2"))
    assert target.publish_view() == {"epoch": 1, "snapshot": published["snapshot"], "made": False, "deleted": []}


def test_paths_outside_the_replica_are_refused(env, target):
    f = row("file", size=0)
    for bad in ["../escape", "/abs", "a/../../x", "nul\x00byte", "x" * 300, ".epochsync/manifest.json"]:
        with pytest.raises(UnsafePathError):
            run(env, target, [entry("X", new=f, new_paths=[bad])], 1)


def test_manifest_round_trip_and_walk_hides_control_area(env, target):
    assert target.read_manifest() is None
    target.write_manifest({"epoch": 3, "target": target.name})
    assert target.read_manifest()["epoch"] == 3
    assert target.fence_time_ns() is not None
    assert list(target.walk()) == []


@pytest.mark.parametrize("fail_at", [None, 3])
def test_s3_partial_update_of_a_large_object_copies_unchanged_parts_server_side(env, fail_at, tmp_path):
    from epochsync.journal.faults import FaultCounter, FaultSpec, InjectedFailure

    name = "big" + uuid.uuid4().hex[:6]
    cfg = TargetConfig(
        name=name, source="sim", kind="s3", conn_id="contract_s3", bucket="replica-contract", prefix=f"{name}/"
    )
    target = open_target(cfg)
    target.ensure_bucket()
    mib = 1024 * 1024
    data = os.urandom(11 * mib)
    v1 = env["source"].put("B" + name, data)
    fid = "B" + name
    f1 = row("file", size=len(data), version=v1, fid=fid)
    run(env, target, [entry(fid, new=f1, new_paths=["big"])], 1)
    before = target.read_file("big")
    assert before == data

    new = bytearray(data)
    new[6 * mib : 6 * mib + 100] = os.urandom(100)
    v2 = env["source"].put(fid, bytes(new))
    f2 = row("file", size=len(new), version=v2, fid=fid)
    entries = [entry(fid, old=f1, new=f2, old_paths=["big"], new_paths=["big"], change=change([(6 * mib, 100)]))]
    if fail_at is None:
        plan, _, fig, _ = run(env, target, entries, 2)
        (op,) = plan["data"]
        assert op["write"] == {"mode": "multipart", "parts": [{"copy": [0, 6 * mib]}, {"upload": [6 * mib, 11 * mib]}]}
        assert target.read_file("big") == bytes(new)
        assert fig["bytes_copied"] == 6 * mib  # no byte of the unchanged 6 MiB travelled
        assert fig["bytes_pulled"] == 100  # only the changed range came from the source
        return
    # fail between the parts of the multipart upload: rollback aborts it, the old version stays
    counter = FaultCounter(FaultSpec(after=fail_at), str(tmp_path / "c"), str(tmp_path / "f"))
    with pytest.raises(InjectedFailure):
        run(env, target, entries, 2, inject=counter)
    c = env["seaweed"].client()
    assert c.list_multipart_uploads(Bucket="replica-contract", Prefix=f"{name}/").get("Uploads")
    rollback(target, str(env["tmp"] / f"undo-{target.name}-2"))
    assert not c.list_multipart_uploads(Bucket="replica-contract", Prefix=f"{name}/").get("Uploads")
    assert target.read_file("big") == data


def _links(en: dict, old: list[tuple[str, str, str]], new: list[tuple[str, str, str]]) -> dict:
    en["old_links"] = [{"pfid": p, "name": n, "path": x} for p, n, x in old]
    en["new_links"] = [{"pfid": p, "name": n, "path": x} for p, n, x in new]
    return en


@pytest.mark.parametrize("k", [None, 1, 3, 6])
def test_types_swapped_under_children_apply_verify_and_roll_back(env, target, k, tmp_path):
    """Regression (issue 16, bug 1): one epoch turns a directory with a child into a symlink,
    a symlink and a file into directories with children. Verify's absence check of ``c/x``
    (under what is a symlink now), the write fence's of ``s/y`` (under what is a symlink at
    E-1) and a rollback replayed twice (undo of ``create s/y`` while ``s`` is a symlink again)
    used to raise instead of counting those paths as absent."""
    from epochsync.journal.faults import FaultCounter, FaultSpec, InjectedFailure

    src = env["source"]
    data = os.urandom(500)
    v = src.put("CX", data)
    d, fx = row("dir", mode=0o755), row("file", size=500, version=v, fid="CX")
    s = row("symlink", mode=0o777, symlink="c/x")
    entries1 = [
        entry("C", new=d, new_paths=["c"]),
        entry("CX", new=fx, new_paths=["c/x", "f"]),
        entry("S", new=s, new_paths=["s"]),
    ]
    run(env, target, entries1, 1)
    target.write_manifest({"epoch": 1})
    t1 = tree(target)
    d2, ln = row("dir", mode=0o700), row("symlink", mode=0o777, symlink="elsewhere")
    y = os.urandom(300)
    fy = row("file", size=300, version=src.put("SY", y), fid="SY")
    entries2 = [
        _links(entry("C", old=d, old_paths=["c"]), [(ROOT, "c", "c")], []),
        _links(
            entry("CX", old=fx, new=fx, old_paths=["c/x", "f"], new_paths=["g"]),
            [("C", "x", "c/x"), (ROOT, "f", "f")],
            [(ROOT, "g", "g")],
        ),
        _links(entry("S", old=s, old_paths=["s"]), [(ROOT, "s", "s")], []),
        _links(entry("C2", new=ln, new_paths=["c"]), [], [(ROOT, "c", "c")]),
        _links(entry("S2", new=d2, new_paths=["s"]), [], [(ROOT, "s", "s")]),
        _links(entry("SY", new=fy, new_paths=["s/y"]), [], [("S2", "y", "s/y")]),
        _links(entry("F2", new=d2, new_paths=["f"]), [], [(ROOT, "f", "f")]),
    ]
    if k is not None:
        counter = FaultCounter(FaultSpec(after=k), str(tmp_path / "count"), str(tmp_path / "fired"))
        with pytest.raises(InjectedFailure):
            run(env, target, entries2, 2, inject=counter)
        rollback(target, str(env["tmp"] / f"undo-{target.name}-2"))  # replays the journal twice
        assert tree(target) == t1
        target.mark_rollback(2)  # the undo's renames changed ctimes: the fence instant moves past them
    plan, _, _, src_io = run(env, target, entries2, 2)
    result = verify_plan(plan, target, src_io, env["store"]["bucket"])
    assert result["ok"], result["problems"]
    t2 = tree(target)
    assert {p: v[:2] for p, v in t2.items()} == {
        "c": ("symlink", "elsewhere"),
        "f": ("dir", None),
        "g": ("file", sha(data)),
        "s": ("dir", None),
        "s/y": ("file", sha(y)),
    }


@pytest.mark.parametrize("fail", [False, True])
def test_root_attributes_apply_verify_and_roll_back(env, target, fail, tmp_path):
    """Regression (issue 16, bug 2): the root's entry (path "") sets the replica root's mode and
    xattrs (posix: the replica directory; s3: the root marker), verify checks them, and a
    rollback (replayed twice) puts the root back as it was, whether the change was made or not."""
    import shutil

    from epochsync.journal.faults import FaultCounter, FaultSpec, InjectedFailure

    def root_state():
        r = target.stat("", "dir")
        return None if r is None else (r.type, r.mode, r.xattrs)

    entries, _ = epoch1(env)
    run(env, target, entries, 1)
    target.write_manifest({"epoch": 1})
    before = root_state()
    old = row("dir", mode=0o40755)
    new = row("dir", mode=0o40700, xattrs={"user.tag": b"root", "trusted.x": b"1"})
    entries2 = [entry(ROOT, old=old, new=new, old_paths=[""], new_paths=[""], change=change(data=False))]
    entries2[0]["change"]["attrs_changed"] = entries2[0]["change"]["xattrs_changed"] = True
    jdir = str(env["tmp"] / f"undo-{target.name}-2")
    want = ("dir", 0o700, {"user.tag": b"root"} if target.kind == "posix" else {"user.tag": b"root", "trusted.x": b"1"})
    if fail:  # the root's change is the only mutation: fail before it is made
        counter = FaultCounter(FaultSpec(after=0), str(tmp_path / "count"), str(tmp_path / "fired"))
        with pytest.raises(InjectedFailure):
            run(env, target, entries2, 2, inject=counter)
    else:
        run(env, target, entries2, 2)
        assert root_state() == want
    rollback(target, jdir)
    assert root_state() == before
    target.mark_rollback(2)
    shutil.rmtree(jdir)
    plan, _, _, src_io = run(env, target, entries2, 2)
    assert plan["summary"]["attrs"] == 1
    result = verify_plan(plan, target, src_io, env["store"]["bucket"])
    assert result["ok"], result["problems"]
    assert root_state() == want
    assert "" not in tree(target) and ".epochsync" not in tree(target)  # the root is no entry of a walk
    # verify notices a root that does not match
    if target.kind == "posix":
        os.chmod(target.root, 0o755)
    else:
        target.io.client.put_object(Bucket=target.bucket, Key=target.prefix + ".epochsync/dirs/dir", Body=b"")
    assert not verify_plan(plan, target, src_io, env["store"]["bucket"])["ok"]


def test_the_empty_path_is_only_the_root_directory():
    f = row("file", size=0)
    tdict = {
        "name": "t",
        "kind": "posix",
        "fileset": [],
        "coalesce_gap": 0,
        "part_size": 5 << 20,
        "small_object": 1 << 20,
        "stripe_size": None,
        "stripe_count": None,
    }
    for bad in [
        entry("X", new=f, new_paths=[""]),
        entry("X", old=row("dir"), new=row("dir"), old_paths=[""], new_paths=["", "a"]),
    ]:
        with pytest.raises(UnsafePathError, match="only the root"):
            build_plan([bad], target=tdict, store=STORE, epoch=1)


def test_keys_with_control_characters_replicate_and_roll_back(env):
    """Regression (issue 16, bug 4): a file named with ``\\x01`` broke the version listing (the
    XML answer cannot carry it: a parser error, or SeaweedFS's U+FFFD in its place), so the
    write fence called the object missing and a rollback found no version to remove. Every
    listing asks for ``encoding-type=url`` now."""
    name = "ctl" + uuid.uuid4().hex[:6]
    cfg = TargetConfig(
        name=name, source="sim", kind="s3", conn_id="contract_s3", bucket="replica-contract", prefix=f"{name}/"
    )
    target = open_target(cfg)
    target.ensure_bucket()
    src = env["source"]
    one = os.urandom(2000)
    f1 = row("file", size=2000, version=src.put("CTL" + name, one), fid="CTL" + name)
    d = row("dir", mode=0o755)
    x = row("file", size=2000, version=src.put("X" + name, one), fid="X" + name)
    f, dx = "ctl\x01name", "d\x1fir"
    run(
        env,
        target,
        [
            entry("CTL" + name, new=f1, new_paths=[f]),
            entry("D", new=d, new_paths=[dx]),
            entry("X" + name, new=x, new_paths=[f"{dx}/x\x7fy"]),
        ],
        1,
    )
    target.write_manifest({"epoch": 1})
    assert {p: v[:2] for p, v in tree(target).items()} == {
        f: ("file", sha(one)),
        dx: ("dir", None),
        f"{dx}/x\x7fy": ("file", sha(one)),
    }
    # epoch 2: patch the file in place (the fence needs its size), move the directory
    two = bytearray(one)
    two[10:20] = b"0123456789"
    f2 = row("file", size=2000, version=src.put("CTL" + name, bytes(two)), fid="CTL" + name)
    entries2 = [
        entry("CTL" + name, old=f1, new=f2, old_paths=[f], new_paths=[f], change=change([(10, 10)])),
        entry("D", old=d, new=d, old_paths=[dx], new_paths=["dir2"]),
        entry("X" + name, old=x, new=x, old_paths=[f"{dx}/x\x7fy"], new_paths=["dir2/x\x7fy"]),
    ]
    plan, jdir, _, src_io = run(env, target, entries2, 2)
    assert verify_plan(plan, target, src_io, env["store"]["bucket"])["ok"]
    t2 = tree(target)
    assert {p: v[:2] for p, v in t2.items()} == {
        f: ("file", sha(bytes(two))),
        "dir2": ("dir", None),
        "dir2/x\x7fy": ("file", sha(one)),
    }
    target.write_manifest({"epoch": 2})
    # epoch 3 deletes it; the rollback finds the delete marker it must remove
    plan, jdir, _, _ = run(env, target, [entry("CTL" + name, old=f2, old_paths=[f])], 3)
    assert f not in tree(target)
    rollback(target, jdir)
    assert tree(target) == t2


def _tdict(target) -> dict:
    return {
        "name": target.name,
        "kind": target.kind,
        "fileset": [],
        "coalesce_gap": 1 << 20,
        "part_size": 5 << 20,
        "small_object": 1 << 20,
        "stripe_size": target.cfg.stripe_size,
        "stripe_count": target.cfg.stripe_count,
        "prefix": target.cfg.prefix,
        "path": target.cfg.path,
        "control_dir": target.control_dir,
    }


def test_paths_over_the_targets_limits_are_refused_at_translate(env, target):
    """S3 keys hold 1,024 bytes of UTF-8 (prefix included), Linux system calls 4,095 bytes of
    path. SeaweedFS and moto take longer keys; AWS would refuse them half way through an apply.
    Translate refuses such a path by name, before anything is applied."""
    from epochsync.targets.base import TargetLimitError

    entries, _ = epoch1(env)
    run(env, target, entries, 1)
    t1 = tree(target)
    f, d = row("file", size=0), row("dir")
    if target.kind == "s3":
        room = 1024 - len(target.prefix.encode())
        fits = "/".join(["é" * 100] * 4 + ["x" * (room - 4 * 201)])  # 1,024 bytes with the prefix
        assert len((target.prefix + fits).encode()) == 1024
        too_long = fits + "y"
        from epochsync.targets.s3 import key_for

        extra = len(key_for(fits, "dir", target.control_dir)) - len(fits)  # a directory's object in the control area
        dir_too_long = fits[: len(fits) - extra + 1]  # its directory object's key is one byte too long
    else:
        room = 4095 - len(target.root.encode()) - 1
        n = (room - 1) // 251
        fits = "/".join(["d" * 250] * n + ["x" * (room - 251 * n)])
        assert len((target.root + "/" + fits).encode()) == 4095
        too_long = fits + "y"
        dir_too_long = None
    for bad, row_ in ((too_long, f), (dir_too_long, d)):
        if bad is None:
            continue
        parents = [entry(f"P{i}", new=d, new_paths=[bad[:i]]) for i, c in enumerate(bad) if c == "/"]
        with pytest.raises(TargetLimitError, match=r"needs an S3 key of 102[5-9] bytes|would be an absolute path"):
            build_plan(
                [*parents, entry("X", new=row_, new_paths=[bad])], target=_tdict(target), store=env["store"], epoch=2
            )
        assert tree(target) == t1
    parents = [entry(f"P{i}", new=d, new_paths=[fits[:i]]) for i, c in enumerate(fits) if c == "/"]
    plan = build_plan(
        [*parents, entry("X", new=f, new_paths=[fits])], target=_tdict(target), store=env["store"], epoch=2
    )
    problems, state = target.fence_check(plan["fence"], target.fence_time_ns())
    assert problems == []
    apply_plan(
        plan,
        target,
        S3Access(resolve_s3("contract_s3")),
        env["store"]["bucket"],
        str(env["tmp"] / f"undo-{target.name}-limits"),
        state,
    )
    assert tree(target)[fits][0] == "file"


def test_attributes_over_the_metadata_limit_live_in_a_sidecar(env, target):
    """S3 refuses more than 2 KB of user metadata (SeaweedFS and moto do not). xattrs and a
    symlink target that do not fit go to the fid's attribute sidecar in the control area:
    they replicate, verify, roll back, and the sidecar goes when it is no longer needed."""
    src = env["source"]
    data = os.urandom(700)
    big, other = os.urandom(1700), os.urandom(1600)  # base64 in metadata: over 2 KB (ext4: 4 KB an inode)
    v = src.put("BIG", data)
    f1 = row("file", size=700, version=v, fid="BIG", xattrs={"user.big": big, "user.small": b"s"})
    s1 = row("symlink", mode=0o777, symlink="t" * 3000)
    d1 = row("dir", xattrs={"user.dir": other})
    entries1 = [
        entry("BIG", new=f1, new_paths=["f", "hard"]),
        entry("S", new=s1, new_paths=["s"]),
        entry("D", new=d1, new_paths=["d"]),
    ]
    plan1, _, _, src_io = run(env, target, entries1, 1)
    assert verify_plan(plan1, target, src_io, env["store"]["bucket"])["ok"]
    target.write_manifest({"epoch": 1})
    t1 = tree(target)
    want_f = {"user.big": big, "user.small": b"s"}
    assert t1["f"][3] == t1["hard"][3] == want_f and t1["d"][3] == {"user.dir": other}
    assert t1["s"][:2] == ("symlink", "t" * 3000)

    def sidecars() -> list[str]:
        if target.kind != "s3":
            return []
        return sorted(o["Key"] for o in target.list_keys(f"{target.control_dir}/attrs/"))

    if target.kind == "s3":
        assert len(sidecars()) == 3  # one per fid (the hard link shares it)
        for key in target.list_keys():
            meta = target.io.client.head_object(Bucket=target.bucket, Key=key["Key"])["Metadata"]
            assert sum(len(f"x-amz-meta-{k}".encode()) + len(v.encode()) for k, v in meta.items()) <= 2048
    # epoch 2: the file's xattrs shrink (inline again), the symlink goes, the directory's grow
    f2 = dict(f1, xattrs=[{"name": "user.small", "value": b"s"}])
    d2 = dict(d1, xattrs=[{"name": "user.dir", "value": other + other}])
    entries2 = [
        entry("BIG", old=f1, new=f2, old_paths=["f", "hard"], new_paths=["f", "hard"], change=change(data=False)),
        entry("S", old=s1, old_paths=["s"]),
        entry("D", old=d1, new=d2, old_paths=["d"], new_paths=["d"], change=change(data=False)),
    ]
    for e in (entries2[0], entries2[2]):
        e["change"]["xattrs_changed"] = True
    plan2, jdir2, _, _ = run(env, target, entries2, 2)
    result = verify_plan(plan2, target, src_io, env["store"]["bucket"])
    assert result["ok"], result["problems"]
    t2 = tree(target)
    assert sorted(t2) == ["d", "f", "hard"] and t2["f"][3] == {"user.small": b"s"}
    assert t2["d"][3] == {"user.dir": other + other}
    if target.kind == "s3":
        assert len(sidecars()) == 1  # the directory's
    rollback(target, jdir2)
    assert tree(target) == t1
    if target.kind == "s3":
        assert len(sidecars()) == 3


def test_the_s3_target_refuses_metadata_over_2kb(env):
    from epochsync.core.errors import StoreError

    name = "meta" + uuid.uuid4().hex[:6]
    cfg = TargetConfig(
        name=name, source="sim", kind="s3", conn_id="contract_s3", bucket="replica-contract", prefix=f"{name}/"
    )
    target = open_target(cfg)
    target.ensure_bucket()
    jdir = str(env["tmp"] / f"undo-{name}")
    from epochsync.journal.undo import UndoJournal

    with UndoJournal(jdir, "ns", 1) as journal, pytest.raises(StoreError, match="S3 allows 2048"):
        target.put(journal, {}, "k", b"x", {"es-xattrs": "v" * 2030})
    assert target.head("k") is None and read_journal(jdir) == []


def test_a_source_entry_named_like_the_control_directory_has_a_way_forward(env, target):
    """A source may hold ``.epochsync`` at its root. Translate refuses that epoch by name, with
    nothing applied; the way forward is another ``control_dir`` for the target and
    ``epochsync relocate`` (Target.move_control_dir), after which the epoch replicates."""
    import dataclasses

    from epochsync.core.errors import EpochError
    from epochsync.stages.translate import ReservedNameError

    entries, st = epoch1(env)
    run(env, target, entries, 1)
    target.write_manifest({"epoch": 1, "target": target.name})
    t1 = tree(target)
    data = os.urandom(3000)
    notes = row("file", size=3000, version=env["source"].put("NOTES", data), fid="NOTES")
    entries2 = [
        entry("CD", new=row("dir"), new_paths=[".epochsync"]),
        entry("NOTES", new=notes, new_paths=[".epochsync/notes"]),
    ]
    with pytest.raises(ReservedNameError, match=r"holds '\.epochsync(/notes)?' at its root.*epochsync relocate"):
        run(env, target, entries2, 2)
    assert tree(target) == t1 and target.read_manifest()["epoch"] == 1

    moved = open_target(dataclasses.replace(target.cfg, control_dir=".epochsync-" + target.name))
    with pytest.raises(EpochError, match="move that directory first"):
        moved.read_manifest()  # never "epoch 0" for a target whose control directory was not moved
    assert "moved" in moved.move_control_dir(".epochsync")
    assert "nothing to move" in moved.move_control_dir(".epochsync")  # a rerun finds it done
    assert moved.read_manifest()["epoch"] == 1
    assert tree(moved) == t1  # striped targets: the stripe objects moved with it
    plan, _, _, src_io = run(env, moved, entries2, 2)
    assert verify_plan(plan, moved, src_io, env["store"]["bucket"])["ok"]
    t2 = tree(moved)
    assert t2[".epochsync"][0] == "dir" and t2[".epochsync/notes"][:2] == ("file", sha(data))
    assert {p: v for p, v in t2.items() if not p.startswith(".epochsync")} == t1


def test_relocate_verb_moves_a_posix_control_directory(tmp_path, capsys):
    from epochsync.cli import main

    replica = tmp_path / "replica"
    (replica / ".epochsync").mkdir(parents=True)
    (replica / ".epochsync" / "manifest.json").write_text('{"epoch": 4, "target": "t"}')
    conf = tmp_path / "c.yaml"
    conf.write_text(
        "sources: [{name: s, root_fid: R, servers: [M], changelogs: {uri: /x}, store: {conn_id: c, bucket: b},"
        " epoch: {interval: 60s, start: '2026-01-01T00:00:00Z'}}]\n"
        f"targets: [{{name: t, source: s, kind: posix, path: {replica}, control_dir: .ctl}}]\n"
    )
    assert main(["relocate", "--config", str(conf), "--target", "t"]) == 0
    assert "moved" in capsys.readouterr().out
    assert (replica / ".ctl" / "manifest.json").exists() and not (replica / ".epochsync").exists()
    # an epoch in flight (an undo journal above the manifest's epoch) must be rolled back first
    (replica / ".ctl").rename(replica / ".epochsync")
    jdir = tmp_path / "warehouse" / "undo" / "target=t" / "epoch=5"
    jdir.mkdir(parents=True)
    (jdir / "ns.jsonl").write_text("")
    assert main(["relocate", "--config", str(conf), "--target", "t"]) == 8  # EpochError
    assert "roll them back first" in capsys.readouterr().err
    assert (replica / ".epochsync" / "manifest.json").exists()
