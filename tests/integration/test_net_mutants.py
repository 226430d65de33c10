"""Proof that the net can fail (issue 50): each fast path and verify shortcut broken on purpose
(``epochsync.core.probes.MUTANTS``, switched by ``EPOCHSYNC_MUTANT``), one at a time, must be
caught by verify or by the net's comparison with the oracle.

A plan mutant replicates wrong bytes; nothing else is needed. A verify mutant accepts what it
should not, so each run also changes one byte of one replica file behind verify's back, in a
file that shortcut covers (the fact apply left of it says so): the real verify reads it and
refuses the epoch; the mutant lets it through, and the oracle sees the byte. Each mutant runs
one small history (its seed, no rollback round) on the target its path belongs to.
"""

from __future__ import annotations

import os

import pytest

from epochsync.core.probes import MUTANTS
from epochsync_dev.net import NetConfig, NetFailure, applied_ops, run_seed, shrink

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# mutant -> (seed, target, which apply facts mark a file its shortcut covers; None: a plan mutant).
# A mark gets the fact and whether the file was there at E-1 (a posix data operation that did
# not create it): a carried entry was, and a file written whole has no byte outside its ranges.
CASES = {
    "copy-when-ranges-cover": (2, "s3", None),
    "copy-ignores-length": (2, "s3", None),
    "part-copy-past-base": (1, "s3", None),
    "patch-keeps-stale-tail": (3, "s3", None),
    "small-whole-drops-hole": (2, "s3", None),
    "verify-checksum-stale": (1, "s3", lambda f, _old: f.get("md5") and f.get("etag") == f["md5"] and f.get("source")),
    "verify-parts-stale": (1, "s3", lambda f, _old: f.get("parts") is not None),
    "verify-copy-stale": (1, "s3", lambda f, _old: f.get("copied_from")),
    "verify-ranges-stale": (1, "posix", lambda f, old: f.get("ranges") is not None and old),
    # the mutant leaves such a file out of verify, so apply keeps no fact of it: any file that was there
    "verify-carried-any": (1, "posix", "there"),
}


def flip_one(cfg, name: str, epoch: int, marks) -> bool:
    """Change one byte of the first file whose apply fact ``marks`` picks, keeping its size (s3:
    and its metadata; posix: outside the ranges apply wrote)."""
    from epochsync.journal.undo import plan_dir, read_json
    from epochsync.stages.context import APPLIED_FACTS, load_plan
    from epochsync.targets import open_target

    facts = (read_json(os.path.join(plan_dir(cfg.warehouse, name, epoch), APPLIED_FACTS)) or {}).get("facts") or {}
    plan = load_plan(cfg, name, epoch)
    there = {op["path"] for op in plan["data"] if "path" in op and not op.get("create")}
    target = open_target(cfg.target(name))
    if marks == "there":
        facts = {p: {"ranges": []} for p in there}
    for key, fact in sorted(facts.items()):
        if marks != "there" and not marks(fact, key in there):
            continue
        if name == "s3":
            c, full = target.io.client, target._full(key)
            head = c.head_object(Bucket=target.bucket, Key=full)
            if not head["ContentLength"]:
                continue
            data = bytearray(c.get_object(Bucket=target.bucket, Key=full)["Body"].read())
            data[0] ^= 1
            c.put_object(Bucket=target.bucket, Key=full, Body=bytes(data), Metadata=head["Metadata"])
            return True
        path = os.path.join(target.root, key)
        size = os.path.getsize(path)
        written = {o + i for o, n, _ in fact["ranges"] for i in range(n)}
        at = next((i for i in range(size) if i not in written), None)
        if at is None:
            continue
        with open(path, "r+b") as f:
            f.seek(at)
            b = f.read(1)
            f.seek(at)
            f.write(bytes([b[0] ^ 1]))
        return True
    return False


def test_every_mutant_is_caught(seaweed, spark, tmp_path, monkeypatch):
    assert set(CASES) == set(MUTANTS)
    rows, missed = [], []
    # the controls first: without a mutant, verify itself refuses a byte changed behind its back
    for name in ("verify-checksum-stale", "verify-ranges-stale") if not os.environ.get("EPOCHSYNC_NET_MUTANTS") else ():
        seed, target, marks = CASES[name]
        with pytest.raises(NetFailure) as caught:
            run_seed(seed, seaweed, tmp_path, spark=spark, tamper=lambda cfg, t, e, m=marks: flip_one(cfg, t, e, m),
                     rollback=False, targets=(target,))  # fmt: skip
        assert caught.value.check == "verify", caught.value
        rows.append((f"(none: {name}'s tamper)", seed, target, f"verify: {str(caught.value)[:90]}"))
    only = os.environ.get("EPOCHSYNC_NET_MUTANTS")  # a comma-separated subset, to look into one
    for name, (seed, target, marks) in CASES.items():
        if only and name not in only.split(","):
            continue
        monkeypatch.setenv("EPOCHSYNC_MUTANT", name)
        flipped: list[int] = []

        def tamper(cfg, t, e, marks=marks, flipped=flipped):
            if marks is not None and not flipped and flip_one(cfg, t, e, marks):
                flipped.append(e)

        try:
            run_seed(seed, seaweed, tmp_path, spark=spark, net=NetConfig.of_seed(seed), tamper=tamper,
                     rollback=False, targets=(target,))  # fmt: skip
            caught = None
        except NetFailure as exc:
            caught = f"{exc.check}: {str(exc)[:90]}"
        monkeypatch.delenv("EPOCHSYNC_MUTANT")
        rows.append((name, seed, target, caught or "NOT CAUGHT"))
        if caught is None:
            missed.append(name)
    width = max(len(r[0]) for r in rows)
    print("\n" + "\n".join(f"{n:<{width}}  seed {s:<3} {t:<6} {c}" for n, s, t, c in rows))
    assert not missed, f"mutants the net did not catch: {missed}"


def test_shrink_keeps_a_smaller_history_that_fails_the_same(seaweed, spark, tmp_path, monkeypatch):
    """The shrinker on a real failure: a plan mutant's seed (it fails at epoch 2 of 3), a few tries."""
    name = "patch-keeps-stale-tail"
    seed, target, _ = CASES[name]
    monkeypatch.setenv("EPOCHSYNC_MUTANT", name)
    lines: list[str] = []
    shrunk = shrink(seed, seaweed, tmp_path, spark=spark, targets=(target,), rollback=False, max_tries=12,
                    progress=lines.append)  # fmt: skip
    print("\n".join(lines))
    assert shrunk.tries <= 12
    assert len(shrunk.kept) < shrunk.original_ops == len(applied_ops(NetConfig.of_seed(seed)))
    with pytest.raises(NetFailure) as caught:  # the history kept, run again
        run_seed(seed, seaweed, tmp_path, spark=spark, net=shrunk.net, targets=(target,), rollback=False)
    assert (caught.value.check, caught.value.target) == (shrunk.original.check, shrunk.original.target)
