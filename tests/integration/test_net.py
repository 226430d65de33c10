"""The net (issue 50): seeded file-system histories through a posix and an s3 target on SeaweedFS.

``epochsync_dev.net`` generates each history and checks every epoch against the oracle, once
after a rollback and once for real. ``test_net`` runs the fixed seeds (which between them must
reach every plan path and verify rule: the coverage table) and fresh ones
(``EPOCHSYNC_NET_FRESH``, 1 by default); a failure prints the one command that replays it.
``test_net_case`` replays each regression case the shrinker wrote (``tests/fixtures/net/``):
each must pass; one found with a mutant must still fail with it (else it no longer holds the
history that found it).
"""

from __future__ import annotations

import os
import random

import pytest

from epochsync.core.probes import PATHS
from epochsync_dev.net import (
    CASES_DIR,
    WANTED_PATHS,
    NetFailure,
    case_command,
    coverage_table,
    load_case,
    repro_command,
    run_case,
    run_seed,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: fixed seeds: between them every path of WANTED_PATHS (every fourth seed has a big file)
FIXED_SEEDS = [1, 2, 4]


def run_or_fail(seed, seaweed, tmp_path, spark, **kw):
    try:
        return run_seed(seed, seaweed, tmp_path, spark=spark, **kw)
    except Exception as exc:
        pytest.fail(f"net: seed {seed} failed: {exc}\n  reproduce: {repro_command(seed)}", pytrace=False)


def test_net(seaweed, spark, tmp_path):
    PATHS.clear()
    for seed in FIXED_SEEDS:
        print(f"net: seed {seed} (reproduce: {repro_command(seed)})")
        run_or_fail(seed, seaweed, tmp_path, spark)
    fixed = dict(PATHS)
    fresh = [random.SystemRandom().randrange(10**9) for _ in range(int(os.environ.get("EPOCHSYNC_NET_FRESH", "1")))]
    for seed in fresh:
        print(f"net: fresh seed {seed} (reproduce: {repro_command(seed)})")
        run_or_fail(seed, seaweed, tmp_path, spark)
    print("net coverage of the fixed seeds:\n" + coverage_table(fixed, WANTED_PATHS))
    never = [p for p in WANTED_PATHS if not fixed.get(p)]
    assert not never, f"the net's fixed seeds never reached {never}"


@pytest.mark.parametrize("path", sorted(CASES_DIR.glob("*.json")), ids=lambda p: p.stem)
def test_net_case(path, seaweed, spark, tmp_path, monkeypatch):
    try:
        run_case(path, seaweed, tmp_path, spark=spark)
    except NetFailure as exc:
        pytest.fail(f"net: case {path.name} failed: {exc}\n  reproduce: {case_command(path)}", pytrace=False)
    _net, _kw, doc = load_case(path)
    if doc.get("mutant"):
        monkeypatch.setenv("EPOCHSYNC_MUTANT", doc["mutant"])
        with pytest.raises(NetFailure) as caught:
            run_case(path, seaweed, tmp_path, spark=spark)
        assert (caught.value.check, caught.value.target) == (doc["failure"]["check"], doc["failure"]["target"])
