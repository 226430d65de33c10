"""Namespace and post operations of one-key-per-operation targets run in independent batches."""

import threading
import time

import pytest

from epochsync.stages.apply import independent_batches, run_in_order
from epochsync.targets.s3 import S3Target


def keys(op):
    return S3Target.op_keys(None, op)


def delete(k):
    return {"op": "delete", "key": k}


def copy(k, src):
    return {"op": "copy", "key": k, "src": src}


def put(k):
    return {"op": "put_empty", "key": k}


def shape(batches):
    return [[op["key"] for op in b] for b in batches]


def test_a_directory_rename_is_two_batches():
    old = [f"old/f{i}" for i in range(5)]
    ops = [delete(k) for k in old] + [delete("old/.epochsync-dir"), put("new/.epochsync-dir")]
    ops += [copy(f"new/f{i}", k) for i, k in enumerate(old)]
    # the copies read keys the deletes wrote (their pinned versions): a second batch
    first = [*old, "old/.epochsync-dir", "new/.epochsync-dir"]
    assert shape(independent_batches(ops, keys)) == [first, [f"new/f{i}" for i in range(5)]]


@pytest.mark.parametrize(
    "ops",
    [
        [delete("a"), put("a")],  # the same key twice
        [delete("a"), put("a/.epochsync-dir")],  # a file turns into a directory: the file goes first
        [delete("a/x"), put("a")],  # a directory's child, then a file of the directory's name
        [put("b"), copy("c", "b")],  # a copy reads what the batch wrote
        [copy("c", "b"), put("b")],  # a write to what the batch reads
    ],
)
def test_dependent_operations_keep_their_order(ops):
    assert shape(independent_batches(ops, keys)) == [[ops[0]["key"]], [ops[1]["key"]]]


def test_independent_operations_share_a_batch():
    ops = [put("a/x"), put("a/y"), copy("b/x", "a/z"), delete("ab"), put("a/.epochsync-dir")]
    assert shape(independent_batches(ops, keys)) == [["a/x", "a/y", "b/x", "ab", "a/.epochsync-dir"]]


class _Target:
    op_keys = staticmethod(keys)


def test_run_in_order_overlaps_a_batch_and_keeps_batches_apart():
    running, peak, seen = [0], [0], []
    lock = threading.Lock()

    def run(op):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.02)
        with lock:
            running[0] -= 1
            seen.append(op["key"])

    ops = [delete(f"old/{i}") for i in range(8)] + [copy(f"new/{i}", f"old/{i}") for i in range(8)]
    run_in_order(_Target(), ops, run)
    assert peak[0] > 1
    assert set(seen[:8]) == {f"old/{i}" for i in range(8)} and set(seen[8:]) == {f"new/{i}" for i in range(8)}


def test_after_a_failure_no_other_operation_starts_and_the_error_is_raised():
    started = []

    def run(op):
        started.append(op["key"])
        if op["key"] == "k0":
            raise RuntimeError("boom at k0")
        time.sleep(0.05)

    ops = [put(f"k{i}") for i in range(40)]
    with pytest.raises(RuntimeError, match="boom at k0"):
        run_in_order(_Target(), ops, run)
    assert len(started) < 40


def test_targets_without_op_keys_run_one_after_the_other():
    order = []
    run_in_order(object(), [put("b"), put("a")], lambda op: order.append(op["key"]))
    assert order == ["b", "a"]


def test_apply_task_threads_setting(monkeypatch):
    """Threads per executor task: default 4, clamped to 1..99 (a thread's journal writer is
    data-<task * 100 + thread>), and a value that is not a number is one clear error."""
    import pytest

    from epochsync.core.errors import EpochsyncError
    from epochsync.stages.apply import task_apply_threads

    monkeypatch.delenv("EPOCHSYNC_APPLY_TASK_THREADS", raising=False)
    assert task_apply_threads() == 4
    for text, want in (("1", 1), ("0", 1), ("16", 16), ("500", 99)):
        monkeypatch.setenv("EPOCHSYNC_APPLY_TASK_THREADS", text)
        assert task_apply_threads() == want
    monkeypatch.setenv("EPOCHSYNC_APPLY_TASK_THREADS", "four")
    with pytest.raises(EpochsyncError, match="EPOCHSYNC_APPLY_TASK_THREADS must be a whole number"):
        task_apply_threads()
