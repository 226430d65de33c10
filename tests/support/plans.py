"""Builders of plan entries and snapshot rows for tests that drive a target with hand-made plans."""

from __future__ import annotations

#: the mtime (and atime) of every row unless a test says otherwise
MTIME = 1_700_000_000_000_000_000


def row(type_, *, size=0, mode=0o644, version=None, fid=None, symlink=None, xattrs=None, mtime=MTIME):
    """A snapshot row (the ``old``/``new`` side of a plan entry); a file with ``version`` has one object."""
    return {
        "type": type_,
        "mode": mode,
        "uid": 0,
        "gid": 0,
        "size": size,
        "atime_ns": mtime,
        "mtime_ns": mtime,
        "xattrs": [{"name": k, "value": v} for k, v in sorted((xattrs or {}).items())],
        "symlink": symlink,
        "layout": None,
        "objects": [{"ost": "OST0000", "oid": fid, "version": version}] if version else [],
    }


def entry(fid, old=None, new=None, old_paths=(), new_paths=(), change=None):
    """A plan entry of ``fid``: its rows and paths before and after, and the merge's change row."""
    return {
        "fid": fid,
        "old": old,
        "new": new,
        "old_paths": sorted(old_paths),
        "new_paths": sorted(new_paths),
        "change": change,
    }


#: a source store of versioned objects, one per file (``data/<fid>``), as translate's plans name them
STORE = {"key": "{ost}/{oid}", "unstriped_key": "data/{fid}", "bucket": "src", "versioned": True}

#: a posix target as ``build_plan`` takes it
POSIX_TARGET = {
    "name": "t",
    "kind": "posix",
    "fileset": [],
    "coalesce_gap": 1024,
    "part_size": 8 << 20,
    "small_object": 8 << 20,
    "stripe_size": None,
    "stripe_count": None,
}
