"""What verify takes from the store's checksums instead of a read (``stages.verify.covered``), and
when translate makes a write whole (``translate.s3._whole_file_write``)."""

from __future__ import annotations

import hashlib

from support.plans import entry, row

from epochsync.stages.translate import build_plan
from epochsync.stages.verify import covered, single_object

STORE = {"key": "{ost}/{oid}", "unstriped_key": "data/{fid}", "bucket": "src", "versioned": True}
TARGET = {
    "name": "t",
    "kind": "s3",
    "fileset": [],
    "coalesce_gap": 1 << 20,
    "part_size": 8 << 20,
    "small_object": 8 << 20,
    "small_file": 256 << 10,
    "stripe_size": None,
    "stripe_count": None,
}
SRC = {"layout": None, "objects": [{"key": "data/F", "version": "v2"}]}
MD5 = hashlib.md5(b"x").hexdigest()


def item(src=SRC, size=1, **kw):
    return {"path": "a", "attrs": {"type": "file", "size": size}, "source": src, **kw}


def test_a_put_of_the_source_bytes_is_covered_only_by_its_own_checksum_and_version():
    fact = {"version": "t1", "md5": MD5, "etag": MD5, "source": SRC}
    assert covered(item(), "a", {"a": fact}, "t1")
    assert not covered(item(), "a", {"a": fact}, "t0")  # another version is current
    assert not covered(item(), "a", {"a": fact}, None)
    assert not covered(item(), "a", {"a": dict(fact, etag="0" * 32)}, "t1")  # the store's ETag is another
    assert not covered(item(), "a", {"a": dict(fact, etag=MD5 + "-1")}, "t1")  # a multipart ETag
    other = {"layout": None, "objects": [{"key": "data/F", "version": "v1"}]}
    assert not covered(item(other), "a", {"a": fact}, "t1")  # the body came from other source bytes
    assert not covered(item(), "a", {"a": {k: v for k, v in fact.items() if k != "source"}}, "t1")  # a patch
    assert not covered(item(), "a", {}, "t1")


def test_a_copy_of_the_source_version_is_covered_when_that_version_is_the_whole_file():
    fact = {"version": "t1", "etag": "e", "copied_from": {"bucket": "src", "key": "data/F", "version": "v2"}}
    assert covered(item(), "a", {"a": fact}, "t1")
    assert not covered(item(), "a", {"a": dict(fact, copied_from={**fact["copied_from"], "version": "v1"})}, "t1")
    striped = {"layout": [4096, 2], "objects": [{"key": "O0/1", "version": "v2"}, {"key": "O1/1", "version": "w"}]}
    assert single_object(striped, 4096) == striped["objects"][0]
    assert single_object(striped, 4097) is None  # a byte in the second stripe object
    copied = {"bucket": "src", "key": "O0/1", "version": "v2"}
    assert covered(item(striped, 4096), "a", {"a": dict(fact, copied_from=copied)}, "t1")
    assert not covered(item(striped, 5000), "a", {"a": dict(fact, copied_from=copied)}, "t1")


def test_a_copy_inside_the_target_is_covered_by_an_equal_etag_of_covered_bytes():
    first = {"version": "t1", "md5": MD5, "etag": MD5, "source": SRC}
    link = {"version": "t2", "etag": MD5, "copy_of": {"key": "a", "version": "t1", "etag": MD5}}
    facts = {"a": first, "b": link}
    assert covered(item(), "b", facts, "t2")  # a hard link's copy of the path just written
    assert not covered(item(), "b", {**facts, "b": dict(link, etag="0" * 32)}, "t2")
    assert not covered(item(), "b", {**facts, "a": dict(first, etag="0" * 32)}, "t2")  # the first is not covered
    moved = {"version": "t3", "etag": "e9", "copy_of": {"key": "old", "version": "p1", "etag": "e9"}}
    assert covered(item(unchanged=True), "b", {"b": moved}, "t3")  # a rename: E-1's bytes, unchanged data
    assert not covered(item(), "b", {"b": moved}, "t3")  # data changed: E-1's bytes are not the file's
    assert not covered(item(unchanged=True), "b", {"b": dict(moved, etag="ff")}, "t3")


def test_a_multipart_upload_is_covered_when_its_parts_make_the_file():
    """As a posix file's written ranges: the parts run from 0 to the size, each uploaded part is
    the MD5 apply computed, each copied part names its pinned E-1 version, the version's ETag is
    the one the parts make, and the uploaded bytes came from the file's source versions at E."""
    a, b = hashlib.md5(b"old").hexdigest(), hashlib.md5(b"new").hexdigest()
    parts = [
        {"copy": [0, 10], "from": {"key": "a", "version": "t0"}, "etag": a},
        {"upload": [10, 15], "md5": b, "etag": b},
    ]
    whole = hashlib.md5(bytes.fromhex(a) + bytes.fromhex(b)).hexdigest() + "-2"
    fact = {"version": "t1", "etag": whole, "parts": parts, "pulled_from": [["data/F", "v2"]]}
    big = item(size=15)
    assert covered(big, "a", {"a": fact}, "t1")
    assert not covered(big, "a", {"a": fact}, "t0")  # another version is current
    assert not covered(item(size=16), "a", {"a": fact}, "t1")  # the parts end before the file does
    assert not covered(big, "a", {"a": dict(fact, etag=hashlib.md5(b"x").hexdigest() + "-2")}, "t1")
    assert not covered(big, "a", {"a": dict(fact, etag=whole.replace("-2", "-3"))}, "t1")
    assert not covered(big, "a", {"a": dict(fact, pulled_from=[["data/F", "v1"]])}, "t1")  # E-1's source bytes
    assert not covered(big, "a", {"a": {k: v for k, v in fact.items() if k != "pulled_from"}}, "t1")
    wrong_md5 = [parts[0], dict(parts[1], md5=a)]  # the store took other bytes than apply composed
    assert not covered(big, "a", {"a": dict(fact, parts=wrong_md5)}, "t1")
    unpinned = [dict(parts[0], **{"from": {"key": "a", "version": None}}), parts[1]]
    assert not covered(big, "a", {"a": dict(fact, parts=unpinned)}, "t1")
    gap = [parts[0], dict(parts[1], upload=[11, 16])]
    assert not covered(item(size=16), "a", {"a": dict(fact, parts=gap)}, "t1")
    bad = [dict(parts[0], etag="not hex"), parts[1]]
    assert not covered(big, "a", {"a": dict(fact, parts=bad)}, "t1")
    # SeaweedFS answers an UploadPartCopy with its chunks' "<md5>-<n>", and makes the version's
    # ETag of that digest: the proof takes the part as the store named it
    chunks = [dict(parts[0], etag=a + "-2"), parts[1]]
    assert covered(big, "a", {"a": dict(fact, parts=chunks)}, "t1")
    assert not covered(big, "a", {"a": dict(fact, parts=[parts[0], dict(parts[1], etag=b + "-1")])}, "t1")
    # copied parts only (an unchanged file rewritten with new parts) need no source version
    only = {"version": "t1", "etag": hashlib.md5(bytes.fromhex(a)).hexdigest() + "-1", "parts": parts[:1]}
    assert covered(item(size=10), "a", {"a": dict(only, pulled_from=[])}, "t1")
    # a hard link's copy of a multipart version is covered through it
    link = {"version": "t2", "etag": whole, "copy_of": {"key": "a", "version": "t1", "etag": whole}}
    assert covered(big, "b", {"a": fact, "b": link}, "t2")


def write_entry(fid, old_size, new_size, ranges, version="v2", layout=None, objects=None):
    old = row("file", size=old_size, version="v1", fid=fid)
    new = row("file", size=new_size, version=version, fid=fid)
    if layout:
        old["layout"] = new["layout"] = layout
        old["objects"] = new["objects"] = objects
    change = {"data_changed": True, "whole_file": False, "ranges": [{"offset": o, "length": n} for o, n in ranges]}
    return entry(fid, old=old, new=new, old_paths=[fid.lower()], new_paths=[fid.lower()], change=change)


def test_small_files_are_written_whole_and_larger_ones_patched():
    small = write_entry("S", 8000, 8000, [(100, 4096)])
    big = write_entry("B", 300 << 10, 300 << 10, [(100, 4096)])
    new = entry(
        "N",
        new=row("file", size=5000, version="v9", fid="N"),
        new_paths=["n"],
        change={"data_changed": True, "whole_file": False, "ranges": [{"offset": 0, "length": 5000}]},
    )
    partly = entry(
        "P",
        new=row("file", size=5000, version="v9", fid="P"),
        new_paths=["p"],
        change={"data_changed": True, "whole_file": False, "ranges": [{"offset": 0, "length": 4000}]},
    )
    plan = build_plan([small, big, new, partly], target=TARGET, store=STORE, epoch=2)
    ops = {o["fid"]: o for o in plan["data"]}
    s = ops["S"]
    assert s["write"] == {"mode": "put"} and s["base"] is None and s["source"]["objects"][0]["version"] == "v2"
    assert [p["ranges"] for p in s["pulls"]] == [[[0, 8000]]]
    # every byte of a new file is in the change's ranges, but the source did not say how long its
    # version is: the ranges may hold only because of a truncate (issue 50), so it is read and put
    assert "copy_from" not in ops["N"] and ops["N"]["write"] == {"mode": "put"}
    assert ops["N"]["source"]["objects"][0]["version"] == "v9"
    # a small file rewritten in place is read, not copied: its source object may be shorter than it
    assert "copy_from" not in s
    # a new file with a hole at its end (a truncate up): read and put, never copied
    assert "copy_from" not in ops["P"] and ops["P"]["source"]["objects"][0]["version"] == "v9"
    b = ops["B"]
    assert b["write"] == {"mode": "patch"} and b["base"] == "b" and "source" not in b
    assert plan["summary"]["planned_pull_bytes"] == 8000 + 4096 + 5000 + 5000


def test_a_partly_written_file_is_copied_when_the_source_says_its_version_is_the_whole_file():
    def sized(fid, old_size, new_size, length, layout=None, objects=None):
        e = write_entry(fid, old_size, new_size, [(100, 4096)], layout=layout, objects=objects)
        if layout is None:
            e["new"]["objects"][0]["size"] = length
        return e

    exact = sized("S", 8000, 8000, 8000)  # the WRITE record said the version is 8,000 bytes
    short = sized("H", 8000, 9000, 8000)  # a truncate extended the file past its object's end
    longer = sized("L", 8000, 8000, 9000)  # nothing says which 8,000 of its bytes are the file
    unknown = write_entry("U", 8000, 8000, [(100, 4096)])  # a source that gives no length
    big = sized("B", 300 << 10, 300 << 10, 300 << 10)  # patched in the replica: not a whole write
    layout = {"stripe_size": 4096, "stripe_count": 2, "objects": [{"ost": f"O{i}", "oid": "x"} for i in range(2)]}
    one = [{"ost": "O0", "oid": "x", "version": "w0", "size": 4000}, {"ost": "O1", "oid": "x", "version": None}]
    striped = sized("T", 4000, 4000, None, layout, one)  # its bytes all in its first object
    two = [{"ost": "O0", "oid": "x", "version": "w0", "size": 4096}, {"ost": "O1", "oid": "x", "version": "w1"}]
    spread = sized("W", 6000, 6000, None, layout, two)  # bytes in two objects: no single version
    plan = build_plan([exact, short, longer, unknown, big, striped, spread], target=TARGET, store=STORE, epoch=2)
    ops = {o["fid"]: o for o in plan["data"]}
    assert ops["S"]["copy_from"] == {"key": "data/S", "version": "v2", "size": 8000}
    assert ops["S"]["write"] == {"mode": "put"}
    assert ops["T"]["copy_from"] == {"key": "O0/x", "version": "w0", "size": 4000}
    for fid in "HLUW":
        assert "copy_from" not in ops[fid], fid
        assert ops[fid]["write"] == {"mode": "put"} and ops[fid]["source"] is not None  # read whole and put
    assert "copy_from" not in ops["B"] and ops["B"]["write"] == {"mode": "patch"}


def test_a_file_truncated_down_then_up_within_the_epoch_is_never_copied_from_its_shorter_version():
    # make demo's f001390.dat (issue 50): written, truncated to 10 bytes (the store's version is
    # then 10 bytes long, and the WRITE record says so), truncated up to 436. The change's
    # ranges run from the smallest size to the final one, [0, 436): every byte "changed", but
    # the version holds 10 of them; the rest is a hole, zeros
    for old_size in (0, 2000):
        e = write_entry("F", old_size, 436, [(0, 436)])
        e["new"]["objects"][0]["size"] = 10
        op = build_plan([e], target=TARGET, store=STORE, epoch=2)["data"][0]
        assert "copy_from" not in op, op
        assert op["write"] == {"mode": "put"} and op["source"]["objects"][0]["version"] == "v2"


def test_a_small_file_over_many_small_source_objects_keeps_the_patch():
    layout = {"stripe_size": 4096, "stripe_count": 4, "objects": [{"ost": f"O{i}", "oid": "x"} for i in range(4)]}
    objects = [{"ost": f"O{i}", "oid": "x", "version": f"v{i}"} for i in range(4)]
    e = write_entry("M", 16384, 16384, [(100, 100)], layout=layout, objects=objects)
    plan = build_plan([e], target=TARGET, store=STORE, epoch=2)
    op = plan["data"][0]
    # four GETs to read it whole against one ranged GET and the replica's object: the patch
    assert op["write"] == {"mode": "patch"} and "source" not in op
    e = write_entry("M", 8192, 8192, [(100, 100)], layout=layout, objects=objects)
    op = build_plan([e], target=TARGET, store=STORE, epoch=2)["data"][0]
    assert op["write"] == {"mode": "put"} and len(op["pulls"]) == 2  # two objects hold its bytes: read whole


def test_server_side_copies_do_not_send_an_apply_to_the_executors():
    from types import SimpleNamespace

    from epochsync.stages.apply import _client_ops

    def io(endpoint):
        return SimpleNamespace(kind="s3", settings=SimpleNamespace(endpoint_url=endpoint, access_key="k", region="r"))

    target = SimpleNamespace(kind="s3", io=io("http://store"))
    copy = {"copy_from": {"key": "data/F", "version": "v"}, "write": {"mode": "put"}, "source": SRC}
    put = {"write": {"mode": "put"}, "source": SRC}
    patch = {"write": {"mode": "patch"}}
    striped = {"stripes": [{"key": "s"}], "source": SRC}  # a striped target's operation has no "write"
    ops = [copy] * 100 + [put] * 3 + [patch] * 2 + [dict(copy, extra_keys=["b"]), striped]
    assert _client_ops(ops, target, io("http://store")) == 7  # the copies move no bytes through here
    assert _client_ops(ops, target, io("http://elsewhere")) == len(ops)  # no copy across stores: all read
    assert _client_ops(ops, SimpleNamespace(kind="posix"), io("http://store")) == len(ops)
