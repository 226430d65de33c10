"""The net's histories with operations skipped (the shrinker's candidates), without S3: the same
mask gives the same history, the others are drawn as in the whole one, and the records still
replay to the oracle's namespace."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from epochsync.core.schema import record_to_json
from epochsync_dev.net import NetConfig, NetWorkload, applied_ops, history_ops
from epochsync_dev.oracle import replay


def generate(net: NetConfig) -> tuple[list[list[str]], NetWorkload, list[list], list[list]]:
    """Each epoch's records (JSON), the workload, and each epoch's records and snapshot after it."""
    records: list = []
    w = NetWorkload(net, records.append)
    texts, per_epoch, snapshots = [], [], [w.model.snapshot_rows()]
    for e in range(1, net.epochs + 1):
        records.clear()
        w.run_epoch(e)
        w.finish_epoch()
        texts.append([record_to_json(r) for r in records])
        per_epoch.append(list(records))
        snapshots.append(w.model.snapshot_rows())
    return texts, w, per_epoch, snapshots


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_a_mask_gives_one_history_of_the_other_operations(seed):
    net = NetConfig.of_seed(seed)
    whole = history_ops(net)
    labels = [label for label, _ in whole]
    assert len(set(labels)) == len(labels)
    skip = frozenset(random.Random(seed).sample(labels, len(labels) // 2))
    masked = replace(net, skip=skip)
    a, w, per_epoch, snapshots = generate(masked)
    assert generate(masked)[0] == a
    assert w.op_log == whole  # the same operations drawn, in the same order
    assert [label for label, _ in applied_ops(masked)] == [x for x in labels if x not in skip]
    assert sum(map(len, a)) < sum(map(len, generate(net)[0]))
    for e, records in enumerate(per_epoch, start=1):
        assert replay(w.cfg.root_fid, snapshots[e - 1], records) == snapshots[e], f"epoch {e}"


def test_skipping_nothing_is_the_whole_history():
    net = NetConfig.of_seed(5)
    assert generate(net)[0] == generate(replace(net, skip=frozenset({"no.such.op"})))[0]


def test_every_operation_skipped_leaves_the_epoch_records():
    net = NetConfig.of_seed(6)
    texts = generate(replace(net, skip=frozenset(label for label, _ in history_ops(net))))[0]
    assert all(all('"type":"EPOCH"' in t for t in epoch) for epoch in texts)
