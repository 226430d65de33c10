"""Compare a replica with the simulator's ground truth (``truth/epoch=E.jsonl``).

Used by ``make demo`` after every epoch and by the end-to-end benchmark: the replica's
paths, types, sizes, content hashes, modes, owners, symlink targets and xattrs must
equal the source's at the epoch, byte for byte. Times are not compared (the targets
keep mtimes where they can; ground truth for them is the snapshot, checked elsewhere).
"""

from __future__ import annotations

import base64
import json
import os
import stat


def load_truth(path: str | os.PathLike) -> dict[str, dict]:
    """Ground-truth rows keyed by path."""
    rows = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                rows[row["path"]] = row
    return rows


def truth_path(sim_dir: str | os.PathLike, epoch: int) -> str:
    return os.path.join(str(sim_dir), "truth", f"epoch={epoch}.jsonl")


def _expected(row: dict, *, owners: bool, xattrs: bool) -> tuple:
    kind = row["type"]
    mode = row.get("mode")
    return (
        row["path"],
        kind,
        (row.get("size") or 0) if kind == "file" else 0,
        stat.S_IMODE(mode) if mode is not None and kind != "symlink" else None,
        row.get("uid") if owners else None,
        row.get("gid") if owners else None,
        row.get("symlink"),
        tuple(sorted((k, base64.b64decode(v)) for k, v in (row.get("xattrs") or {}).items())) if xattrs else (),
        row.get("sha256") if kind == "file" else None,
    )


def _actual(entry, *, owners: bool, xattrs: bool) -> tuple:
    t = entry.comparable(owners=owners, xattrs=xattrs)
    # symlink permission bits are meaningless (always 0777 on Linux): compare them as None
    return t[:3] + ((None,) if entry.type == "symlink" else (t[3],)) + t[4:]


def compare_with_truth(
    target,
    truth: dict[str, dict],
    *,
    owners: bool = True,
    xattrs: bool = True,
    hashes: bool = True,
    paths=None,
    limit: int = 20,
) -> list[str]:
    """Differences between ``target`` (a :class:`epochsync.targets.base.Target`) and ``truth``.

    Empty list = identical. Each difference is one line naming the path and the field.
    ``hashes=False`` leaves the files' contents out (the walk reads no file): for a caller that
    checks them another way, as the benchmark does with an s3 listing's ETags. ``paths``: compare
    only these (each looked up with ``target.stat``, no walk): a path of ``truth`` must be there
    as it says, any other must be absent.
    """
    names = ("path", "type", "size", "mode", "uid", "gid", "symlink", "xattrs", "sha256")
    if not hashes:
        names = names[:-1]
    seen = set()
    problems: list[str] = []
    if paths is not None:
        wanted = sorted(set(paths))
        truth = {p: truth[p] for p in wanted if p in truth}
        entries = _stat_paths(target, wanted, truth, hashes)
    else:
        entries = target.walk(hashes=hashes)
    for entry in entries:
        seen.add(entry.path)
        row = truth.get(entry.path)
        if row is None:
            problems.append(f"{entry.path}: on the replica but not in the source")
            continue
        want = _expected(row, owners=owners, xattrs=xattrs)
        got = _actual(entry, owners=owners, xattrs=xattrs)
        for name, w, g in zip(names, want, got):
            if w != g:
                problems.append(f"{entry.path}: {name} is {g!r}, source has {w!r}")
                break
    for path in sorted(set(truth) - seen):
        problems.append(f"{path}: in the source but missing on the replica")
    return problems[:limit] if limit else problems


def _stat_paths(target, paths: list[str], truth: dict[str, dict], hashes: bool):
    """The entries of ``paths`` on ``target`` (those that exist), looked up in 8 threads."""
    import hashlib
    from concurrent.futures import ThreadPoolExecutor

    def one(path: str):
        entry = target.stat(path, truth[path]["type"] if path in truth else None)
        if entry is not None and hashes and entry.type == "file":
            entry.sha256 = hashlib.sha256(target.read_file(path)).hexdigest()
        return entry

    with ThreadPoolExecutor(8, thread_name_prefix="truth-stat") as pool:
        yield from (e for e in pool.map(one, paths) if e is not None)
