"""Requests per changed file on an s3 target, counted at a proxy in front of SeaweedFS.

The write fence, the apply and verify of one epoch (what ``epochsync replicate`` sends for
it, less the per-epoch constants: lease, manifest, fence instant) are counted by the same
:class:`~epochsync_dev.s3proxy.S3Proxy` bench-e2e puts in front of the store, for a directory
rename of 300 files and for 4 KiB writes into 100 files, with verify's default (every file's
contents: ``sample`` 1.0). Before the fence was batched per directory, verify took its facts
from the apply's responses and deletes went 1,000 to a DeleteObjects, a rename cost 7
requests per file and a small write 5 (with ``sample`` 0; 7 with 1.0). Before small files
were read whole from the source and verify compared the store's checksums instead of
reading files (issue 32), a small write cost 3.2 (10 changed files per directory) and 5.0
(one per directory) with ``sample`` 0.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid

import pytest
from support import plans
from support.plans import entry, row

from epochsync.core.config import TargetConfig
from epochsync.core.errors import EpochsyncError
from epochsync.stages.apply import apply_plan, write_fence
from epochsync.stages.context import _target_dict
from epochsync.stages.translate import build_plan
from epochsync.stages.verify import verify_plan
from epochsync.stores.connections import resolve_s3
from epochsync.stores.s3_access import S3Access
from epochsync.targets import open_target
from epochsync_dev.s3proxy import S3Proxy

pytestmark = pytest.mark.integration

ROOT = "ROOT"
MTIME = plans.MTIME


@pytest.fixture(scope="module")
def env(seaweed, tmp_path_factory):
    with S3Proxy(seaweed.url) as proxy:
        os.environ["AIRFLOW_CONN_REQS_S3"] = seaweed.airflow_conn_json().replace(seaweed.url, proxy.url)
        client = seaweed.client()
        src = "src-" + uuid.uuid4().hex[:8]
        client.create_bucket(Bucket=src)
        client.put_bucket_versioning(Bucket=src, VersioningConfiguration={"Status": "Enabled"})
        store = {"key": "{ost}/{oid}", "unstriped_key": "data/{fid}", "bucket": src}
        yield {"proxy": proxy, "client": client, "store": store, "tmp": tmp_path_factory.mktemp("reqs")}
        os.environ.pop("AIRFLOW_CONN_REQS_S3", None)


def new_target(striped: bool = False):
    name = "r" + uuid.uuid4().hex[:6]
    stripes = {"stripe_size": 4096, "stripe_count": 2} if striped else {}
    cfg = TargetConfig(
        name=name, source="sim", kind="s3", conn_id="reqs_s3", bucket="replica-reqs", prefix=f"{name}/", **stripes
    )
    t = open_target(cfg)
    t.ensure_bucket()
    return t


def epoch(env, target, entries, n, *, sample=1.0):
    """Fence, apply and verify of one epoch; returns (requests at the proxy, verify result)."""
    plan = build_plan(entries, target=_target_dict(target.cfg), store=env["store"], epoch=n)
    src_io = S3Access(resolve_s3("reqs_s3"))
    probe = str(env["tmp"] / "probe.json")
    since = target.fence_time_ns()
    target.conditional_writes(probe)  # once per target and store, as run_apply does: not counted
    env["proxy"].reset_counters()
    problems, state, fence = write_fence(plan, target, src_io, probe, since=since)
    assert problems == []
    env["fence"] = fence
    jdir = str(env["tmp"] / f"undo-{target.name}-{n}")
    figures = apply_plan(plan, target, src_io, env["store"]["bucket"], jdir, state)
    env["facts"] = figures["facts"]
    result = verify_plan(plan, target, src_io, env["store"]["bucket"], sample=sample, facts=figures["facts"])
    counts = env["proxy"].snapshot()
    total = sum(c["total_requests"] for c in counts.values())
    by_method = {}
    for c in counts.values():
        for m, k in c["requests"].items():
            by_method[m] = by_method.get(m, 0) + k
    target.write_manifest({"epoch": n})
    return total, by_method, result


def put_source(env, fid: str, data: bytes) -> str:
    return env["client"].put_object(Bucket=env["store"]["bucket"], Key=f"data/{fid}", Body=data)["VersionId"]


def flip_behind_verify(env, target, key: str, data: bytes, at: int) -> None:
    """Put ``data`` with byte ``at`` flipped at ``key``, keeping its metadata: same size, a new version."""
    c, b, full = env["client"], target.bucket, target.prefix + key
    bad = bytearray(data)
    bad[at] ^= 1
    c.put_object(Bucket=b, Key=full, Body=bytes(bad), Metadata=c.head_object(Bucket=b, Key=full)["Metadata"])


def tree(target) -> dict:
    return {e.path: (e.type, e.sha256 if e.type == "file" else None, e.mode) for e in target.walk()}


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def test_directory_rename_of_300_files(env):
    n = 300
    target = new_target()
    d = row("dir", mode=0o755)
    files, contents = {}, {}
    entries = [entry("D", new=d, new_paths=["big"])]
    for i in range(n):
        data = os.urandom(100 + i)
        fid = f"F{i:04d}"
        files[fid] = row("file", size=len(data), version=put_source(env, fid, data), fid=fid)
        contents[fid] = data
        entries.append(
            entry(fid, new=files[fid], new_paths=[f"big/f{i:04d}"], change={"data_changed": True, "whole_file": True})
        )
    epoch(env, target, entries, 1)
    renamed = [entry("D", old=d, new=d, old_paths=["big"], new_paths=["big-renamed"])]
    renamed += [
        entry(fid, old=f, new=f, old_paths=[f"big/f{i:04d}"], new_paths=[f"big-renamed/f{i:04d}"])
        for i, (fid, f) in enumerate(files.items())
    ]
    total, by_method, result = epoch(env, target, renamed, 2)
    assert result["ok"], result["problems"]
    print(f"directory rename of {n} files: {total} requests ({total / n:.3f} per file) {by_method}")
    # the copies, one DeleteObjects and a few listings; it was 7 per file (two fence listings, the
    # copy, the delete, three HEADs in verify), and verify read every moved file (sample 1.0): now
    # each copy's ETag is its E-1 version's
    assert total <= 1.04 * n, by_method
    assert result["files_by_checksum"] == n and result["files_hashed"] == 0, result
    want = {"big-renamed": ("dir", None, 0o755)}
    want.update({f"big-renamed/f{i:04d}": ("file", sha(contents[fid]), 0o644) for i, fid in enumerate(files)})
    assert tree(target) == want
    assert env["proxy"].snapshot().get(env["store"]["bucket"], {}).get("bytes_out", 0) == 0


@pytest.mark.parametrize("per_dir", [10, 1])
def test_small_writes_to_100_files(env, per_dir):
    """4 KiB written into each of 100 files (64 KiB), ``per_dir`` changed files per directory."""
    n = 100
    target = new_target()
    dirs = n // per_dir
    entries, files, contents = [], {}, {}
    for j in range(dirs):
        entries.append(entry(f"D{j}", new=row("dir", mode=0o755), new_paths=[f"d{j:03d}"]))
    for i in range(n):
        fid = f"S{i:04d}"
        data = os.urandom(64 * 1024)
        files[fid] = row("file", size=len(data), version=put_source(env, fid, data), fid=fid)
        contents[fid] = data
        path = f"d{i % dirs:03d}/f{i:04d}"
        entries.append(entry(fid, new=files[fid], new_paths=[path], change={"data_changed": True, "whole_file": True}))
    epoch(env, target, entries, 1)
    writes = []
    for i, (fid, f) in enumerate(files.items()):
        data = bytearray(contents[fid])
        off = (i * 4096) % (len(data) - 4096)
        data[off : off + 4096] = os.urandom(4096)
        contents[fid] = bytes(data)
        f2 = dict(f, objects=[{"ost": "OST0000", "oid": fid, "version": put_source(env, fid, contents[fid])}])
        path = f"d{i % dirs:03d}/f{i:04d}"
        writes.append(
            entry(
                fid,
                old=f,
                new=f2,
                old_paths=[path],
                new_paths=[path],
                change={"data_changed": True, "whole_file": False, "ranges": [{"offset": off, "length": 4096}]},
            )
        )
    total, by_method, result = epoch(env, target, writes, 2)
    assert result["ok"], result["problems"]
    print(
        f"small writes to {n} files, {per_dir} per directory: {total} requests ({total / n:.3f} per file) {by_method}"
    )
    # per file: the source object's GET and the PUT, which carries the write fence itself
    # (If-Unmodified-Since the last commit; SeaweedFS refuses it with 412 if the key changed since)
    # and whose answer verify takes; the contents by the PUT's checksum, none read. It was 2.2 and
    # 4.0: a fence listing and a verify listing per directory
    fence = {k: v for k, v in env["fence"].items() if k != "waited_seconds"}  # 1 s if in the commit's second
    assert fence == {"conditional_writes": "if-unmodified-since", "keys_conditional": n, "keys": n}
    assert result["files_by_checksum"] == n and result["files_hashed"] == 0, result
    assert by_method == {"GET": n, "PUT": n}, by_method
    assert total <= 2.0 * n
    want = {f"d{j:03d}": ("dir", None, 0o755) for j in range(dirs)}
    want.update({f"d{i % dirs:03d}/f{i:04d}": ("file", sha(contents[fid]), 0o644) for i, fid in enumerate(files)})
    assert tree(target) == want


def next_second() -> None:
    """Sleep into the next whole second: listings and the fence instant have whole seconds, and a
    foreign write in the last commit's own second is one no fence sees (docs/INTERNALS.md)."""
    time.sleep(1.05 - time.time() % 1)


def test_a_foreign_write_between_epochs_fails_the_conditional_write_and_rolls_back(env):
    """The fence of keys written whole is the write's own precondition: a key changed after the last
    commit (If-Unmodified-Since) or created where the replica had nothing (If-None-Match: *) is
    refused by SeaweedFS with 412, the epoch fails naming the key, and the undo journal takes back
    every write of the epoch, the foreign version left as its writer made it; once the foreign
    changes are gone the same epoch applies."""
    from epochsync.journal.undo import read_journal, remove_journal

    target = new_target()
    c, b, pre = env["client"], target.bucket, target.prefix
    entries = [entry("D", new=row("dir", mode=0o755), new_paths=["w"])]
    files = {}
    for i in range(10):
        fid, data = f"W{i:03d}", os.urandom(5000)
        files[fid] = row("file", size=len(data), version=put_source(env, fid, data), fid=fid)
        entries.append(
            entry(fid, new=files[fid], new_paths=[f"w/f{i}"], change={"data_changed": True, "whole_file": True})
        )
    epoch(env, target, entries, 1)
    e2, want = [], {"w": ("dir", None, 0o755)}
    for i, (fid, f) in enumerate(files.items()):
        data = os.urandom(6000)
        f2 = dict(f, size=len(data), objects=[{"ost": "OST0000", "oid": fid, "version": put_source(env, fid, data)}])
        change = {"data_changed": True, "whole_file": True}
        e2.append(entry(fid, old=f, new=f2, old_paths=[f"w/f{i}"], new_paths=[f"w/f{i}"], change=change))
        want[f"w/f{i}"] = ("file", sha(data), 0o644)
    new = os.urandom(700)
    e2.append(
        entry(
            "WNEW",
            new=row("file", size=len(new), version=put_source(env, "WNEW", new), fid="WNEW"),
            new_paths=["w/new"],
            change={"data_changed": True, "whole_file": True},
        )
    )
    want["w/new"] = ("file", sha(new), 0o644)
    plan = build_plan(e2, target=_target_dict(target.cfg), store=env["store"], epoch=2)
    src_io = S3Access(resolve_s3("reqs_s3"))
    keys = [f"w/f{i}" for i in range(10)] + ["w/new"]

    def attempt(jdir: str):
        problems, state, fence = write_fence(plan, target, src_io, str(env["tmp"] / "probe.json"))
        assert problems == [] and fence["keys_conditional"] == len(keys), (problems, fence)
        return apply_plan(plan, target, src_io, env["store"]["bucket"], jdir, state)

    def roll_back(jdir: str) -> None:
        target.undo_all(list(reversed(read_journal(jdir))), jdir, lambda entry: None)
        remove_journal(jdir)
        target.mark_rollback(2)

    for n, (key, foreign_write) in enumerate(
        [
            ("w/f5", lambda: c.put_object(Bucket=b, Key=pre + "w/f5", Body=b"foreign")),
            ("w/new", lambda: c.put_object(Bucket=b, Key=pre + "w/new", Body=b"squatter")),
        ]
    ):
        next_second()
        foreign = foreign_write()["VersionId"]
        before = {k: target.key_versions(k)["known"] for k in keys}
        jdir = str(env["tmp"] / f"undo-foreign-write-{n}")
        with pytest.raises(EpochsyncError, match=f"{key} was changed by someone else.*412"):
            attempt(jdir)
        written = {e["key"] for e in read_journal(jdir) if e["op"] == "put"}
        assert len(written) >= 2, written  # keys written before the refusal: the rollback has work
        roll_back(jdir)
        # nothing of epoch 2 is left; the foreign version is, untouched
        assert {k: target.key_versions(k)["known"] for k in keys} == before, written
        assert target.key_versions(key)["current"]["version"] == foreign
        c.delete_object(Bucket=b, Key=pre + key, VersionId=foreign)
    next_second()
    attempt(str(env["tmp"] / "undo-foreign-write-done"))
    assert tree(target) == want


def norm(versions: dict) -> dict:
    """Versions per key, in no order (pages may hold a key's versions and markers in any order)."""
    return {
        k: (sorted(v["known"]), v["current"], sorted(v["history"], key=lambda h: h["version"]))
        for k, v in versions.items()
    }


def test_fence_and_verify_catch_foreign_changes_on_paged_listings(env, monkeypatch):
    """The listings page every 2 keys (a page of a directory, a listing given up for one per key):
    the fence still names foreign writes to the plan's keys, and verify (with the apply's facts
    and without them) names every path changed behind the apply's back: metadata rewritten in
    place (same bytes, another version), another size, a deleted object, a removed path that
    came back as a file or as a directory; and, reading contents, other bytes of the same size."""
    from epochsync.targets.s3 import S3Target

    monkeypatch.setattr(S3Target, "LIST_MAX_KEYS", 2)
    target = new_target()
    c = env["client"]
    b, pre = target.bucket, target.prefix
    d = row("dir", mode=0o755)
    files, contents = {}, {}
    entries = [entry("D", new=d, new_paths=["d"])]
    for i in range(12):
        fid, data = f"P{i:03d}", os.urandom(2000)
        files[fid] = row("file", size=len(data), version=put_source(env, fid, data), fid=fid)
        contents[fid] = data
        entries.append(
            entry(fid, new=files[fid], new_paths=[f"d/f{i}"], change={"data_changed": True, "whole_file": True})
        )
    epoch(env, target, entries, 1)
    # epoch 2: new bytes in f0..f5, f6 and f7 deleted, n0 created
    e2 = []
    for i in range(6):
        fid = f"P{i:03d}"
        data = os.urandom(3000)
        f2 = row("file", size=len(data), version=put_source(env, fid, data), fid=fid)
        e2.append(
            entry(
                fid,
                old=files[fid],
                new=f2,
                old_paths=[f"d/f{i}"],
                new_paths=[f"d/f{i}"],
                change={"data_changed": True, "whole_file": True},
            )
        )
    for i in (6, 7):
        e2.append(entry(f"P{i:03d}", old=files[f"P{i:03d}"], old_paths=[f"d/f{i}"]))
    nv = put_source(env, "N0", b"new")
    e2.append(
        entry(
            "N0",
            new=row("file", size=3, version=nv, fid="N0"),
            new_paths=["d/n0"],
            change={"data_changed": True, "whole_file": True},
        )
    )
    plan = build_plan(e2, target=_target_dict(target.cfg), store=env["store"], epoch=2)
    since = target.fence_time_ns()

    # before the apply: a foreign write to a key the epoch rewrites, and one where it creates
    foreign = c.put_object(Bucket=b, Key=pre + "d/f1", Body=b"foreign")["VersionId"]
    squat = c.put_object(Bucket=b, Key=pre + "d/n0", Body=b"squatter")["VersionId"]
    problems, _ = target.fence_check(plan["fence"], since)
    assert any(p.startswith("d/f1: ") for p in problems), problems
    assert any(p.startswith("d/n0: exists") for p in problems), problems
    assert len(problems) == 2, problems
    c.delete_object(Bucket=b, Key=pre + "d/f1", VersionId=foreign)
    c.delete_object(Bucket=b, Key=pre + "d/n0", VersionId=squat)
    problems, state = target.fence_check(plan["fence"], since)
    assert problems == []

    src_io = S3Access(resolve_s3("reqs_s3"))
    figures = apply_plan(plan, target, src_io, env["store"]["bucket"], str(env["tmp"] / "undo-foreign"), state)
    facts = figures["facts"]
    assert {"d/f0", "d/f5", "d/n0"} <= facts.keys()
    assert verify_plan(plan, target, src_io, env["store"]["bucket"], sample=1.0, facts=facts)["ok"]

    # a directory listing answers as one listing per key does, whether it runs to its end (every
    # key of d/), gives up after as many pages as keys (two keys) or meets keys listed alone
    everything = [f"d/f{i}" for i in range(12)] + ["d/n0", "d/.epochsync-dir", "d/zz", "d/f\x01", "d/cr\rname"]
    for keys in (everything, ["d/f3", "d/f9"], ["d/f0", "d/f\x01"]):
        assert norm(target.versions_of(keys)) == norm({k: target.key_versions(k) for k in keys})

    # behind the apply's back
    head = c.head_object(Bucket=b, Key=pre + "d/f0")
    meta = dict(head["Metadata"], **{"es-mode": str(0o100600)})
    c.copy_object(
        Bucket=b,
        Key=pre + "d/f0",
        CopySource={"Bucket": b, "Key": pre + "d/f0"},
        MetadataDirective="REPLACE",
        Metadata=meta,
    )
    c.put_object(Bucket=b, Key=pre + "d/f2", Body=b"shorter")  # no metadata: no mode, the size its length
    c.delete_object(Bucket=b, Key=pre + "d/f3")
    c.put_object(Bucket=b, Key=pre + "d/f6", Body=b"back")
    c.put_object(
        Bucket=b, Key=pre + ".epochsync/dirs/_d/_f7/dir", Body=b"", Metadata={"es-type": "dir", "es-mode": "16877"}
    )
    same = os.urandom(3000)  # the same size, other bytes: only a content check sees it
    c.put_object(Bucket=b, Key=pre + "d/f4", Body=same, Metadata=c.head_object(Bucket=b, Key=pre + "d/f4")["Metadata"])
    for kw in ({"facts": facts}, {}):
        result = verify_plan(plan, target, src_io, env["store"]["bucket"], sample=0.0, **kw)
        assert not result["ok"]
        bad = sorted({p.split(":")[0] for p in result["problems"]})
        assert bad == ["d/f0", "d/f2", "d/f3", "d/f6", "d/f7"], result["problems"]
        assert any("d/f0: mode 0o600" in p for p in result["problems"]), result["problems"]
        result = verify_plan(plan, target, src_io, env["store"]["bucket"], sample=1.0, **kw)
        assert sorted({p.split(":")[0] for p in result["problems"]}) == [
            "d/f0",
            "d/f2",
            "d/f3",
            "d/f4",
            "d/f6",
            "d/f7",
        ], result["problems"]


def test_new_files_are_server_side_copies_of_their_source_versions(env):
    """A file this epoch wrote whole, one source object, on the target's own endpoint: one
    CopyObject of the pinned source version, no byte through the client; verify covers it with
    the object's length (the copy's source is that version). A copy whose source object is not
    the file's length (a source that broke the rule) is caught by that length."""
    n = 40
    target = new_target()
    entries = [entry("D", new=row("dir", mode=0o755), new_paths=["c"])]
    contents = {}
    for i in range(n):
        fid, data = f"C{i:03d}", os.urandom(1000 + i)
        contents[f"c/f{i:03d}"] = data
        f = row("file", size=len(data), version=put_source(env, fid, data), fid=fid)
        f["objects"][0]["size"] = len(data)  # the WRITE record states the version's length (the copy rule)
        change = {"data_changed": True, "whole_file": False, "ranges": [{"offset": 0, "length": len(data)}]}
        entries.append(entry(fid, new=f, new_paths=[f"c/f{i:03d}"], change=change))
    total, by_method, result = epoch(env, target, entries, 1)
    assert result["ok"], result["problems"]
    print(f"{n} new files copied from the source: {total} requests {by_method}")
    assert result["files_by_checksum"] == n and result["files_hashed"] == 0, result
    counts = env["proxy"].snapshot()
    assert counts.get(env["store"]["bucket"], {}).get("bytes_out", 0) == 0  # nothing read out of the source
    assert by_method["PUT"] == n + 1  # the copies and the directory's object
    want = {"c": ("dir", None, 0o755)}
    want.update({p: ("file", sha(b), 0o644) for p, b in contents.items()})
    assert tree(target) == want

    # the source object of a new file holds 5 bytes fewer than the file (a truncate up: no stated
    # length): never copied, read and put with the hole as zeros
    data = os.urandom(600)
    short = row("file", size=len(data) + 5, version=put_source(env, "SHORT", data), fid="SHORT")
    change = {"data_changed": True, "whole_file": False, "ranges": [{"offset": 0, "length": len(data) + 5}]}
    _, _, result = epoch(env, target, [entry("SHORT", new=short, new_paths=["c/short"], change=change)], 2)
    assert result["ok"], result["problems"]
    assert tree(target)["c/short"] == ("file", sha(data + bytes(5)), 0o644)


def test_a_large_file_patched_in_place_is_read_back(env):
    """A file above ``small_file`` keeps the patch (its ranges pulled, the rest of the replica's
    object kept); no checksum covers a patch, so verify reads it, and a wrong byte shows."""
    target = new_target()
    big = os.urandom(600 * 1024)
    f1 = row("file", size=len(big), version=put_source(env, "BIG", big), fid="BIG")
    epoch(env, target, [entry("BIG", new=f1, new_paths=["big"], change={"data_changed": True, "whole_file": True})], 1)
    data = bytearray(big)
    data[300_000:304_096] = os.urandom(4096)
    f2 = dict(f1, objects=[{"ost": "OST0000", "oid": "BIG", "version": put_source(env, "BIG", bytes(data))}])
    change = {"data_changed": True, "whole_file": False, "ranges": [{"offset": 300_000, "length": 4096}]}
    writes = [entry("BIG", old=f1, new=f2, old_paths=["big"], new_paths=["big"], change=change)]
    plan = build_plan(writes, target=_target_dict(target.cfg), store=env["store"], epoch=2)
    assert plan["data"][0]["write"] == {"mode": "patch"} and "source" not in plan["data"][0]
    total, by_method, result = epoch(env, target, writes, 2)
    assert result["ok"], result["problems"]
    assert result["files_by_checksum"] == 0 and result["files_hashed"] == 1, result
    assert tree(target) == {"big": ("file", sha(bytes(data)), 0o644)}
    # the replica's byte changed behind verify's back (same size, same metadata): read, so seen
    flip_behind_verify(env, target, "big", bytes(data), 1)
    src_io = S3Access(resolve_s3("reqs_s3"))
    result = verify_plan(plan, target, src_io, env["store"]["bucket"], sample=1.0, facts={})
    assert result["problems"] == ["big: content differs from the source at epoch 2 (first difference at byte 1)"]


def test_a_large_file_appended_is_a_multipart_upload_its_parts_cover(env):
    """A file above ``small_object`` (8 MiB) appended to: one multipart upload, its unchanged part
    copied server-side from the replica's version at E-1 and the appended bytes uploaded. Verify
    reads none of it: the version's ETag is the one its parts make (SeaweedFS makes it as S3
    does), each uploaded part is the MD5 apply computed, the copied part names its pinned E-1
    version (``stages.verify.parts_cover``). A byte changed behind verify's back is a new
    version, which the facts do not cover: read, so seen."""
    target = new_target()
    big = os.urandom(12 * 1024 * 1024)
    f1 = row("file", size=len(big), version=put_source(env, "APP", big), fid="APP")
    writes = [entry("APP", new=f1, new_paths=["log"], change={"data_changed": True, "whole_file": True})]
    _, by_method, result = epoch(env, target, writes, 1)
    assert result["ok"], result["problems"]
    # a new file of 12 MiB: uploaded in parts (its bytes pulled from the source version)
    assert result["files_by_checksum"] == 1 and result["files_hashed"] == 0, result
    data = big + os.urandom(64 * 1024)
    f2 = dict(f1, size=len(data), objects=[{"ost": "OST0000", "oid": "APP", "version": put_source(env, "APP", data)}])
    change = {"data_changed": True, "whole_file": False, "ranges": [{"offset": len(big), "length": 64 * 1024}]}
    writes = [entry("APP", old=f1, new=f2, old_paths=["log"], new_paths=["log"], change=change)]
    plan = build_plan(writes, target=_target_dict(target.cfg), store=env["store"], epoch=2)
    assert plan["data"][0]["write"]["mode"] == "multipart", plan["data"][0]["write"]
    assert any("copy" in p for p in plan["data"][0]["write"]["parts"]), plan["data"][0]["write"]
    _, by_method, result = epoch(env, target, writes, 2)
    assert result["ok"], result["problems"]
    assert result["files_by_checksum"] == 1 and result["files_hashed"] == 0, result
    # the fence's and verify's listings, the appended range and the tail of E-1's last part
    assert by_method.get("GET", 0) <= 4, by_method
    assert tree(target) == {"log": ("file", sha(data), 0o644)}
    flip_behind_verify(env, target, "log", data, 5)
    src_io = S3Access(resolve_s3("reqs_s3"))
    assert env["facts"]["log"]["parts"]  # the apply's facts of the version it wrote, now not current
    result = verify_plan(plan, target, src_io, env["store"]["bucket"], sample=1.0, facts=env["facts"])
    assert result["problems"] == ["log: content differs from the source at epoch 2 (first difference at byte 5)"]
    assert result["files_by_checksum"] == 0 and result["files_hashed"] == 1, result
