"""The s3 target's keys (layout 2): a directory's object lives in the control area, where no
source name can collide with it; every path maps to one key and back."""

from __future__ import annotations

import pytest

from epochsync.targets.base import UnsafePathError
from epochsync.targets.s3 import LEGACY_DIR_OBJECT, dir_key, dir_path_of, key_for, path_of_key

NAMES = ["a", ".epochsync-dir", "dir", "_", "_a", "__dir", "cr\rname", "lf\nname", "sp ace", "données", "x\x01"]


def test_keys_of_every_path_are_distinct_and_map_back():
    paths = [""] + NAMES + [f"{a}/{b}" for a in NAMES for b in NAMES] + [f"{a}/{a}/{a}" for a in NAMES]
    keys = {}
    for p in paths:
        for t in ("dir", "file") if p else ("dir",):
            k = key_for(p, t)
            assert k not in keys, (p, t, keys.get(k))
            keys[k] = (p, t)
            assert dir_path_of(k) == (p if t == "dir" else None)
            assert path_of_key(k) == p

    # a filer-backed store cannot hold an object and a folder of the same name: a directory's
    # object is never the folder of a file's key, nor the other way round (whatever the names)
    def folders(k: str) -> set[str]:
        parts = k.split("/")
        return {"/".join(parts[:i]) for i in range(1, len(parts))}

    dirs = {k for k, (_, t) in keys.items() if t == "dir"}
    files = keys.keys() - dirs
    assert not any(folders(k) & files for k in dirs)
    assert not any(folders(k) & dirs for k in files)
    assert key_for("", "dir") == dir_key("") == ".epochsync/dirs/dir"
    assert key_for("a/b", "dir", "ctl") == "ctl/dirs/_a/_b/dir"


def test_a_source_name_of_the_old_directory_object_is_a_plain_file_now():
    assert key_for(f"a/{LEGACY_DIR_OBJECT}", "file") == f"a/{LEGACY_DIR_OBJECT}"
    assert dir_path_of(f"a/{LEGACY_DIR_OBJECT}") is None
    # layout 1 (a replica not moved yet) is still read
    assert key_for("a", "dir", layout=1) == f"a/{LEGACY_DIR_OBJECT}"
    assert dir_path_of(f"a/{LEGACY_DIR_OBJECT}", layout=1) == "a"
    assert dir_path_of(LEGACY_DIR_OBJECT, layout=1) == ""
    assert dir_path_of(f".epochsync/{LEGACY_DIR_OBJECT}", layout=1) is None


def test_unsafe_paths_are_refused():
    for p in ("../x", "a/../b", ".epochsync/x", "/abs"):
        with pytest.raises(UnsafePathError):
            key_for(p, "dir")
    with pytest.raises(UnsafePathError):
        key_for("", "file")
    for k in (".epochsync/dirs/a/dir", ".epochsync/dirs/_/dir", ".epochsync/dirs/_a/x", "x/dir"):
        assert dir_path_of(k) is None
