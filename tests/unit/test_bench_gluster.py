"""The parts of ``make bench-gluster`` that run without a Gluster volume: tree manifests and their
comparison, the steady writer's consistency rule, CPU accounting of process trees, rsync's
figures, and the results page's layouts for its files."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time

import pytest
from support.machine import cannot_run_here

from epochsync_dev.bench.gluster import Background, RenameSampler, SteadyWatcher, _stage_row, committed_view, content
from epochsync_dev.bench.gluster_tools import Expect, cpu_of_pids, processes, rsync, tree, walk
from epochsync_dev.docs.benchmarks import LAYOUTS, line_chart
from epochsync_dev.gluster import REQUIRE_ENV


def _tree(root, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        os.utime(p, (1_700_000_000, 1_700_000_000))


def test_walk_and_expect_see_names_sizes_times_and_tail_bytes(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    files = {"w/a": b"x" * 10, "w/d/b": b"y" * 300_000, "other/c": b"z"}
    _tree(src, files)
    _tree(dst, files)
    os.symlink("a", src / "w" / "link")
    os.symlink("a", dst / "w" / "link")
    tree_ = walk(str(src), "w")
    assert set(tree_) == {"w/a", "w/d", "w/d/b", "w/link"}
    assert tree_["w/d"] == ("d",) and tree_["w/link"] == ("l", "a") and tree_["w/a"][1] == 10
    expect = Expect.of(str(src), "w", ["w/d/b"])
    assert expect.differences(str(dst)) == []
    # bytes changed inside the probed tail: found; the same size and time do not hide it
    with open(dst / "w" / "d" / "b", "r+b") as f:
        f.seek(299_000)
        f.write(b"Q")
    os.utime(dst / "w" / "d" / "b", (1_700_000_000, 1_700_000_000))
    assert expect.differences(str(dst)) == ["w/d/b: other bytes than the source's"]
    _tree(dst, {"w/d/b": files["w/d/b"]})
    # a time that differs counts, unless times are left out (the geo-replication poll)
    os.utime(dst / "w" / "a", (1_700_000_100, 1_700_000_100))
    assert expect.differences(str(dst))[0].startswith("w/a:")
    assert expect.differences(str(dst), mtimes=False) == []
    # an extra and a missing entry
    (dst / "w" / "extra").write_bytes(b"")
    os.remove(dst / "w" / "link")
    diffs = expect.differences(str(dst), mtimes=False)
    assert [d.split(":")[0] for d in diffs] == ["w/extra", "w/link"]
    assert walk(str(src), "missing") == {}
    # a number of probes: every n-th file of the same walk, in path order
    assert sorted(Expect.of(str(src), "w", 2).probes) == ["w/a"]
    assert sorted(Expect.of(str(src), "w", 1).probes) == ["w/a", "w/d/b"]


def test_steady_consistency_is_a_prefix_of_whole_files_with_its_journal(tmp_path):
    d = tmp_path / "steady"
    d.mkdir()
    w = SteadyWatcher("t", lambda: str(tmp_path), {})

    def check() -> bool:
        names = set(os.listdir(d))
        return w._consistent(str(d), names, set())

    (d / "journal").write_bytes(b"")
    assert check()  # state 0
    for k in (1, 2):
        (d / f"f{k:06d}").write_bytes(content(k))
    (d / "journal").write_bytes(b"1\n2\n")
    assert check()  # state 2
    (d / "f000003").write_bytes(content(3))
    assert not check()  # a file the journal does not list yet
    assert w.mid_step(str(d), set(os.listdir(d)))  # ... a moment inside step 3: the source was so
    (d / "f000003").write_bytes(content(3)[:4096])
    assert w.mid_step(str(d), set(os.listdir(d)))  # half written, before its journal line
    (d / "f000003").write_bytes(b"other")
    assert not w.mid_step(str(d), set(os.listdir(d)))  # bytes the writer never wrote
    (d / "f000003").write_bytes(content(3))
    (d / "journal").write_bytes(b"1\n2\n3\n")
    assert check()
    (d / "f000003").write_bytes(content(3)[:4096])
    assert not check()  # half a file
    assert not w.mid_step(str(d), set(os.listdir(d)))  # listed in the journal: it must be whole
    (d / "f000003").write_bytes(content(3))
    os.remove(d / "f000002")
    assert not check()  # a gap
    (d / "f000002").write_bytes(content(2))
    (d / ".f000004.tmp").write_bytes(b"")
    assert not check()  # a reader sees a temporary name the source never had


def test_cpu_meter_counts_a_tree_and_the_children_it_waited_for():
    procs = processes()
    me = os.getpid()
    assert procs[me][0] == os.getppid()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in tree(processes(), {me})
    finally:
        child.kill()
        child.wait()
    meter = cpu_of_pids(me)
    before = meter.read()
    subprocess.run([sys.executable, "-c", "x = 0\nfor i in range(6_000_000): x += i"], check=True)
    assert meter.read() - before >= 0.1  # the busy child's time, once waited for


def test_cpu_reading_never_loses_a_process_that_exits_unwaited_for():
    from epochsync_dev.bench.gluster_tools import CLK, CpuReading

    t = lambda s: int(s * CLK)  # noqa: E731
    # 1 (root) and its children 2 (5 s before the window) and 3 (a worker with 30 s before it)
    earlier = CpuReading({1: (0, t(10), 0), 2: (1, t(5), 0), 3: (1, t(30), 0)})
    # 2 exited and 1 waited for it (1's children's ticks grew by 2's whole life, 5 + 2 s; 1 ran 1 s)
    waited = CpuReading({1: (0, t(18), t(7)), 3: (1, t(31), 0)})
    assert waited - earlier == pytest.approx(4.0, abs=0.05)  # 1 s of 1, 2 s of 2, 1 s of 3
    # 3 exited unwaited-for (orphaned): its ticks left with it; 1 ran 1 s
    orphaned = CpuReading({1: (0, t(11), 0), 2: (1, t(5), 0)})
    assert orphaned - earlier == pytest.approx(1.0, abs=0.05)  # a plain sum of totals: -29 s
    new = CpuReading({1: (0, t(10), 0), 4: (1, t(2), 0)}) - CpuReading({1: (0, t(10), 0)})
    assert new == pytest.approx(2.0, abs=0.05)


def test_rsync_figures(tmp_path):
    if shutil.which("rsync") is None:  # CI installs it with the Gluster packages
        cannot_run_here(REQUIRE_ENV, "the rsync peer", "rsync is not installed")
    src, dst = tmp_path / "src", tmp_path / "dst"
    _tree(src, {"a": b"1" * 1000, "d/b": b"2" * 5000})
    first = rsync(str(src), str(dst))
    assert first["bytes_read"] == first["bytes_written"] == 6000
    assert (dst / "d" / "b").read_bytes() == b"2" * 5000
    os.remove(src / "a")
    time.sleep(0.01)
    second = rsync(str(src), str(dst))
    assert second["bytes_written"] == 0 and not (dst / "a").exists()


def test_stage_row_splits_a_cycle():
    cyc = {
        "epoch": 4,
        "t0": 100.0,
        "t_cut": 103.0,
        "t_end": 110.0,
        "cut": {"barrier_on_s": 2.2, "held_s": 2.3},
        "publish": {"resolve_s": 0.1, "records": {"brick1": 3, "brick2": 4}},
        "stats": [{"durations": {"merge": 2.0, "apply": 1.5}}, {"durations": {"merge": 1.0}}],
    }
    row = _stage_row("rename", cyc)
    assert row["total_s"] == 10.0 and row["cut_s"] == 3.0 and row["records"] == 7
    assert row["stages_s"] == {"merge": 3.0, "apply": 1.5}
    assert row["other_s"] == pytest.approx(2.5)


def test_results_page_layouts_of_the_gluster_files():
    rows = [
        {
            "workload": "append",
            "tool": t,
            "convergence_s": s,
            "lag_median_s": None,
            "lag_p95_s": None,
            "bytes_read": 1 << 20,
            "bytes_written": 65536,
            "cpu_s": 1.5,
            "consistent_fraction": None,
            "replica_equals_source": True,
            "loadavg_1m": [1.0, 2.0],
        }
        for t, s in (("epochsync", 4.0), ("geo-replication", None), ("rsync", 2.0))
    ]
    text = "\n".join(LAYOUTS["gluster"](rows))
    assert "`geo-replication`" in text and "did not converge" in text and "64.0 KiB" in text
    assert "not measured" not in text
    rows[0]["cpu_s"] = -35.5  # a meter that lost a process tree: said, not printed as a figure
    text = "\n".join(LAYOUTS["gluster"](rows))
    assert "| not measured* |" in text and "append epochsync -35.5" in text
    assert "append: convergence" in text
    lag = "\n".join(LAYOUTS["gluster.lag"]([{"tool": "epochsync", "points": [[0.0, 1.0], [2.0, 3.0]]}]))
    assert "<polyline" in lag and "epochsync" in lag
    assert line_chart("t", [("a", [])], "x", "y") == []
    source = "\n".join(
        LAYOUTS["gluster.source"](
            [
                {"row": "cut", "epoch": 2, "barrier": True, "end_to_end_s": 2.9, "held_s": 2.4},
                {"row": "cut", "epoch": 3, "barrier": False, "end_to_end_s": 0.9, "rename_probe_max_s": 0.02},
                {"row": "cuts-summary", "barrier": True, "cuts": 1, "end_to_end_s_max": 2.9},
                {"row": "cuts-summary", "barrier": False, "cuts": 1, "end_to_end_s_max": 0.9},
                {"row": "untar-replicated", "entries": 21116, "cut_to_commit_s": 50.0},
                {
                    "row": "live-airflow",
                    "interval_s": 10,
                    "epochs": 2,
                    "committed": 1,
                    "per_epoch": [
                        {"epoch": 1, "committed": True, "commit_after_cut_s": 18.0},
                        {"epoch": 2, "committed": False},
                    ],
                },
            ]
        )
    )
    assert "21,116 entries" in source and "18.0, not committed" in source and "| 2 | on |" in source
    assert "| 3 | off |" in source and "cuts without it (`cut.barrier: false`)" in source
    stages = "\n".join(LAYOUTS["gluster.stages"]([{"workload": "rename", "epoch": 3, "stages_s": {"merge": 2.0}}]))
    assert "merge 2.0" in stages


def test_merge_keeps_the_other_parts_rows_and_names_the_earlier_run(tmp_path, monkeypatch):
    import json

    from epochsync_dev.bench.gluster import Bench, parse_args
    from epochsync_dev.docs.benchmarks import _run_line

    monkeypatch.setenv("EPOCHSYNC_BENCH_RESULTS", str(tmp_path))

    def run(parts: str, workloads: list[str], kinds: list[str], merge: bool) -> dict:
        argv = ["--parts", parts, "--workdir", str(tmp_path / "w")] + (["--merge"] if merge else [])
        bench = Bench(parse_args(argv))
        bench.rows = [{"workload": w, "tool": "epochsync", "run": parts} for w in workloads]
        bench.source_rows = [{"row": k, "run": parts} for k in kinds]
        bench.stage_rows = [{"workload": w, "run": parts} for w in workloads]
        bench.phase_s = {p: 1.0 for p in parts.split(",")}
        bench.load_before = [3.0, 2.0, 1.0]
        bench.write(60.0, complete=True)
        return {n: json.loads((tmp_path / f"gluster{n}.json").read_text()) for n in ("", ".source", ".stages", ".meta")}

    run("issue33", ["untar", "rename"], ["untar-replicated"], merge=False)
    out = run("steady,cuts", ["steady", "rename"], ["cut", "cuts-summary"], merge=True)
    assert [(r["workload"], r["run"]) for r in out[""]] == [
        ("untar", "issue33"),
        ("steady", "steady,cuts"),
        ("rename", "steady,cuts"),
    ]
    assert [r["row"] for r in out[".source"]] == ["untar-replicated", "cut", "cuts-summary"]
    assert [r["workload"] for r in out[".stages"]] == ["untar", "steady", "rename"]
    assert out[".meta"]["merged_with"][0]["parts"] == "issue33"
    assert "earlier run (its parts kept: issue33, 1.0 min" in _run_line(out[".meta"])
    again = run("steady,cuts", ["steady"], ["cut"], merge=True)  # replaces every row of the second run
    assert len(again[".meta"]["merged_with"]) == 2
    assert _run_line(again[".meta"]).count("earlier run") == 1


def test_readme_headline_rows_of_the_gluster_results(tmp_path):
    import json

    from epochsync_dev.docs.benchmarks import headline_rows

    def summary(barrier, end_to_end, held):
        return {"row": "cuts-summary", "barrier": barrier, "end_to_end_s_median": end_to_end, "held_s_max": held}

    (tmp_path / "gluster.source.json").write_text(json.dumps([summary(True, 2.17, 2.1), summary(False, 0.017, None)]))
    assert headline_rows(tmp_path) == [
        [
            "a cut of a live GlusterFS volume (barrier on / off)",
            "2.17 s, namespace operations held up to 2.10 s / 0.017 s, nothing held",
            "",
        ]
    ]
    rows = [
        {"workload": "append", "tool": "epochsync", "bytes_written": 1310720},
        {"workload": "append", "tool": "geo-replication", "bytes_written": 2098483200},
    ]
    (tmp_path / "gluster.json").write_text(json.dumps(rows))
    what = [r[0] for r in headline_rows(tmp_path)]
    assert what == [
        "a cut of a live GlusterFS volume (barrier on / off)",
        "64 KiB appended to 20 files of 100 MiB on GlusterFS: bytes written to the replica",
    ]
    assert "geo-replication 2.0 GiB" in headline_rows(tmp_path)[1][1]
    rows += [
        {"workload": "untar", "tool": "epochsync", "convergence_s": 41.7, "entries": 21116},
        {"workload": "rename", "tool": "epochsync", "convergence_s": 7.9},  # no entries: the workload's name
        {"workload": "untar", "tool": "geo-replication", "convergence_s": 16.1},
        {"workload": "delete", "tool": "epochsync", "convergence_s": 20.2},
        {"workload": "delete", "tool": "geo-replication", "convergence_s": None},
    ]
    (tmp_path / "gluster.json").write_text(json.dumps(rows))
    converge = headline_rows(tmp_path)[1]
    assert converge[0].startswith("GlusterFS, seconds from a workload's end to an equal replica")
    assert converge[1] == "untar of 21,000 entries 42 s / 16 s, rename 8 s / timeout, 10,000 deletes 20 s / timeout"


def test_readers_of_epochsync_resolve_current_once_per_sample(tmp_path):
    """The committed view as the samplers read it: ``current`` resolved to one epoch's folder, which
    a sample walks even when the link flips under it; nothing before the first commit."""
    view = tmp_path / "replica.epochs"
    view.mkdir()
    assert not os.path.exists(committed_view(str(view)))  # no epoch committed: an empty view
    for e in (1, 2):
        _tree(view / f"epoch-{e:010d}", {f"w/d/f{e}": b"x"})
    os.symlink("epoch-0000000001", view / "current")
    seen = committed_view(str(view))
    assert seen == str(view / "epoch-0000000001")
    os.symlink("epoch-0000000002", view / ".current.tmp")
    os.replace(view / ".current.tmp", view / "current")  # the flip at commit
    assert sorted(walk(seen, "w")) == ["w/d", "w/d/f1"]  # the resolved epoch is still read whole
    assert committed_view(str(view)) == str(view / "epoch-0000000002")


def test_rename_sampler_counts_a_directory_whole_under_one_name(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    files = {"p/d/a": b"1", "p/d/s/b": b"22"}
    _tree(src, files)
    bench = type("B", (), {"mnt": str(src), "readers": lambda self: {"t": lambda: str(dst)}})()
    sampler = RenameSampler(bench, "p", "d")
    _tree(dst, files)
    assert sampler.consistent(str(dst))  # before the rename
    os.rename(dst / "p" / "d", dst / "p" / "d-renamed")
    assert sampler.consistent(str(dst))  # after it
    (dst / "p" / "d").mkdir()
    assert not sampler.consistent(str(dst))  # under both names: a state the source never had
    os.rmdir(dst / "p" / "d")
    os.remove(dst / "p" / "d-renamed" / "s" / "b")
    assert not sampler.consistent(str(dst))  # half moved


def test_background_returns_the_value_or_raises_the_error():
    assert Background("sum", lambda: 1 + 1).result() == 2

    def fails():
        raise RuntimeError("no volume")

    with pytest.raises(RuntimeError, match="no volume"):
        Background("fails", fails).result()
    with pytest.raises(TimeoutError, match="slow: still running"):
        Background("slow", lambda: time.sleep(5)).result(timeout=0.1)


def test_join_background_cancels_a_step_until_it_ends_also_one_that_starts_late(tmp_path):
    from epochsync_dev.bench.gluster import Bench, parse_args

    bench = Bench(parse_args(["--workdir", str(tmp_path / "w")]))
    running: dict[str, bool] = {}
    stopped: list[str] = []

    def step():  # its "process" starts after the teardown began, then runs until stopped
        time.sleep(0.3)
        running["p"] = True
        while running.get("p"):
            time.sleep(0.05)

    def cancel():
        if running.get("p"):
            running["p"] = False
            stopped.append("p")

    job = bench.background("a late start", step, cancel=cancel)
    bench.join_background()
    assert stopped == ["p"] and not job.alive() and bench.stop_event.is_set()


class _FakeSource:
    """A cutter and a driver over one counter of published epochs, with a lock per process as the
    real drivers have (one call at a time)."""

    def __init__(self, window_s: float):
        self.published = 0
        self.committed = 0
        self.window_s = window_s
        self.lock = threading.Lock()

    def cutter(self):
        src = self

        class Cutter:
            lock = threading.Lock()

            def call(self, op):
                with self.lock:
                    t0 = time.time()
                    time.sleep(0.01)
                    src.published += 1
                    return {"epoch": src.published, "t0": t0, "t_cut": time.time(), "cut": {}, "publish": {}}

        return Cutter()

    def driver(self):
        src = self

        class Window:
            lock = threading.Lock()

            def call(self, op):
                with self.lock:
                    t0, through = time.time(), src.published
                    if through <= src.committed:
                        return {"t0": t0, "t_end": time.time(), "through": through, "stats": []}
                    time.sleep(src.window_s)
                    first, src.committed = src.committed + 1, through
                    row = {"epoch": through, "durations": {"merge": src.window_s}}
                    return {"t0": t0, "t_end": time.time(), "first": first, "through": through, "stats": [row]}

        return Window()


def test_epoch_schedule_commits_the_on_demand_cut_and_times_the_final_pass_from_the_end():
    from epochsync_dev.bench.gluster import EpochSchedule, _live_stage_rows

    src = _FakeSource(window_s=0.15)
    schedule = EpochSchedule(src.cutter(), src.driver(), interval=0.05).start()
    time.sleep(0.5)  # the workload: scheduled cuts, windows back to back
    t_end = time.time()
    final = schedule.finish(timeout=10)
    assert len(schedule.cuts) >= 3 and len(schedule.passes) >= 2
    assert final is schedule.passes[-1] and final["through"] == schedule.final_cut["epoch"] == src.published
    assert src.committed == src.published  # nothing cut after the final cut; every epoch committed
    rows = _live_stage_rows("untar", t_end, schedule.passes, schedule.final_cut)
    assert [r["pass"] for r in rows] == list(range(1, len(rows) + 1))
    assert [r["final"] for r in rows] == [False] * (len(rows) - 1) + [True]
    last = rows[-1]
    # the final pass is timed from the workload's end: cut, the window queued behind a running one, stages
    assert last["total_s"] == pytest.approx(final["t_end"] - t_end, abs=0.002)
    assert last["cut_s"] + last["window_queued_s"] + sum(last["stages_s"].values()) + last["other_s"] == (
        pytest.approx(last["total_s"], abs=0.005)
    )
    assert rows[0]["cut_s"] == 0 and "window_queued_s" not in rows[0]
    table = "\n".join(LAYOUTS["gluster.stages"](rows))
    assert f"| {len(rows)} of {len(rows)}, final (from the workload's end; queued: cut" in table
    assert "| 1 of " in table


def test_epoch_schedule_raises_what_a_driver_raised():
    from epochsync_dev.bench.gluster import EpochSchedule

    src = _FakeSource(window_s=0.01)

    class Broken:
        def call(self, op):
            raise RuntimeError("epochsync window: no space left")

    schedule = EpochSchedule(src.cutter(), Broken(), interval=0.05).start()
    time.sleep(0.1)
    with pytest.raises(RuntimeError, match="no space left"):
        schedule.finish(timeout=5)


def test_the_peers_are_checked_before_anything_starts(monkeypatch):
    from epochsync_dev import gluster
    from epochsync_dev.bench import gluster as bench_gluster

    asked = []
    monkeypatch.setattr(gluster, "check_machine", lambda **kw: asked.append(kw))
    monkeypatch.setattr(gluster, "_which", lambda cmd: None if cmd == "sshd" else f"/usr/bin/{cmd}")
    with pytest.raises(gluster.GlusterUnavailable, match="apt-get install openssh-server"):
        bench_gluster.check_peers()
    assert asked == []  # sshd first: nothing installed for a run that cannot go on
    monkeypatch.setattr(gluster, "_which", lambda cmd: f"/usr/sbin/{cmd}")
    bench_gluster.check_peers(install=False)
    assert asked == [{"install": False, "packages": {"rsync": "rsync"}}]


def test_missing_packages_names_a_callers_commands_too(monkeypatch):
    from epochsync_dev import gluster

    monkeypatch.setattr(gluster, "_which", lambda cmd: None if cmd in ("rsync", "btrfs") else "/bin/x")
    assert gluster.missing_packages() == ["btrfs-progs"]
    assert gluster.missing_packages({**gluster.PACKAGES, "rsync": "rsync"}) == ["btrfs-progs", "rsync"]


def test_files_lost_counts_files_missing_wrong_or_left_over_not_directories(tmp_path):
    from epochsync_dev.bench.gluster_tools import files_lost

    want = {"d": ("d",), "d/a": ("f", 3, 0o644, 1), "d/b": ("f", 3, 0o644, 1), "d/l": ("l", "a"), "e": ("d",)}
    assert files_lost(want, dict(want)) == 0
    have = {k: v for k, v in want.items() if k not in ("d/b", "e")}  # a file lost; an empty folder lost
    have["d/a"] = ("f", 2, 0o644, 1)  # wrong size
    have["d/stale"] = ("f", 1, 0o644, 1)  # left over
    have["x"] = ("d",)  # a folder left over: counted through its files (none)
    assert files_lost(want, have) == 3
    assert files_lost(want, dict(want), bad_bytes={"d/a"}) == 1  # the same entry, other bytes
    # a directory where the source has a file is a wrong file
    assert files_lost({"p": ("f", 1, 0o644, 1)}, {"p": ("d",)}) == 1
    # through Expect: the tree and the probed tails
    _tree(tmp_path / "src", {"s/f1": b"one", "s/f2": b"two"})
    expect = Expect.of(str(tmp_path / "src"), "s", ["s/f1", "s/f2"])
    shutil.copytree(tmp_path / "src", tmp_path / "rep")
    assert expect.lost(str(tmp_path / "rep")) == 0
    (tmp_path / "rep/s/f2").unlink()
    (tmp_path / "rep/s/f1").write_bytes(b"ONE")  # same size, other bytes
    os.utime(tmp_path / "rep/s/f1", (os.path.getmtime(tmp_path / "src/s/f1"),) * 2)
    assert expect.lost(str(tmp_path / "rep")) == 2
    assert expect.lost(str(tmp_path / "nowhere")) == 2


def test_current_again_waits_for_every_file_written_before_the_event():
    from epochsync_dev.bench.gluster_tools import current_again

    written = {1: 10.0, 2: 11.0, 3: 12.0, 4: 20.0}
    seen = {1: 10.5, 2: 18.0, 3: 15.0, 4: 21.0}
    assert current_again(written, seen, 12.0) == pytest.approx(6.0)  # file 2, written before, seen at 18
    assert current_again(written, seen, 30.0) == 0.0  # all seen before the event
    assert current_again(written, {1: 10.5, 3: 15.0, 4: 21.0}, 12.0) is None  # file 2 never seen
    assert current_again(written, seen, 5.0) == 0.0  # nothing written yet


def test_geo_workers_read_the_status_table():
    from epochsync_dev.bench.gluster_tools import geo_workers

    status = """
PRIMARY NODE    PRIMARY VOL    PRIMARY BRICK                      SECONDARY USER    SECONDARY              SECONDARY NODE    STATUS     CRAWL STATUS       LAST_SYNCED
---------------------------------------------------------------------------------------------------------------------------------------------------------------------
10.78.0.11      gmab12         /var/tmp/p/n1/fs/gmab12-0-0/brick    root              10.78.0.14::gsab12                       Active     Changelog Crawl    2026-12-03 15:20:01
10.78.0.12      gmab12         /var/tmp/p/n2/fs/gmab12-0-1/brick    root              10.78.0.14::gsab12                       Passive    N/A                N/A
10.78.0.13      gmab12         /var/tmp/p/n3/fs/gmab12-0-2/brick    root              10.78.0.14::gsab12                       Faulty     N/A                N/A
"""
    rows = geo_workers(status, "gmab12")
    assert [(r["node"], r["state"], r["crawl"]) for r in rows] == [
        ("10.78.0.11", "Active", "Changelog Crawl"),
        ("10.78.0.12", "Passive", "N/A"),
        ("10.78.0.13", "Faulty", "N/A"),
    ]
    assert rows[0]["brick"] == "/var/tmp/p/n1/fs/gmab12-0-0/brick"
    assert geo_workers(status, "other") == [] and geo_workers("No active geo-replication sessions", "gmab12") == []


def test_epoch_schedule_with_retry_records_a_failed_window_and_goes_on():
    from epochsync_dev.bench.gluster import EpochSchedule

    src = _FakeSource(window_s=0.01)
    real = src.driver()
    failed = {"n": 0}

    class Flaky:
        def call(self, op):
            if failed["n"] < 2:
                failed["n"] += 1
                raise RuntimeError("epochsync window: agent of server 1 unreachable")
            return real.call(op)

    schedule = EpochSchedule(src.cutter(), Flaky(), interval=0.05, retry=True).start()
    time.sleep(0.3)
    final = schedule.finish(timeout=10)
    assert final["through"] == src.published == src.committed
    assert [f["op"] for f in schedule.failures] == ["window", "window"]
    assert "unreachable" in schedule.failures[0]["error"]


def test_results_page_layout_of_the_pool_rows_and_the_server_kill():
    kill = {
        "killed_server": 1,
        "reader_server": 1,
        "active_server": [1],
        "same_server": True,
        "kill_at_s": 40.0,
        "down_s": 52.3,
        "healed_after_back_s": 9.5,
        "workload": "server-kill",
        "topology": "replica3-3servers",
    }
    rows = [
        {
            "workload": "append",
            "tool": "epochsync",
            "convergence_s": 6.0,
            "files_lost": 0,
            "bytes_between_hosts": 70000,
        },
        {"workload": "append", "tool": "geo-replication", "convergence_s": None, "files_lost": 2},
        kill
        | {"tool": "epochsync", "current_after_kill_s": 8.0, "current_after_kill_epochs": 1.6}
        | {"current_after_back_s": 4.0, "current_after_back_epochs": 0.8, "failed_cuts": 1, "failed_windows": 3}
        | {"files_lost": 0, "convergence_s": 5.0},
        kill
        | {"tool": "geo-replication", "current_after_kill_s": None, "current_after_back_s": 30.0}
        | {"current_after_back_epochs": 6.0, "files_lost": 1, "convergence_s": 40.0},
    ]
    text = "\n".join(LAYOUTS["gluster-pool"](rows))
    assert "`replica3-3servers`" in text and "`single-host`" in text  # the append rows carry no topology
    assert "| append | `geo-replication` | **did not converge** | **2** |" in text
    assert "server 1, which held both epochsync's reader and geo-replication's Active worker" in text
    assert "| `epochsync` | 8.0 s (1.6 epochs) | 4.0 s (0.8 epochs) |" in text
    assert "| `geo-replication` | **never** | 30.0 s (6.0 epochs) |" in text
    assert "| 1 / 3 |" in text and "server-kill: convergence" in text
    # the single-host table gains the files-lost column once its rows have the field
    single = "\n".join(LAYOUTS["gluster"]([{"workload": "append", "tool": "rsync", "files_lost": 0}]))
    assert "files lost" in single and "`single-host`" in single
    lag = "\n".join(
        LAYOUTS["gluster-pool.lag"](
            [
                {"workload": "steady", "tool": "epochsync", "points": [[0.0, 1.0], [2.0, 3.0]]},
                {"workload": "server-kill", "tool": "epochsync", "points": [[0.0, 1.0], [2.0, 9.0]]},
            ]
        )
    )
    assert "steady writer: lag" in lag and "server-kill: lag of each file, a server killed" in lag
    cuts = LAYOUTS["gluster-pool.source"]([{"row": "server-kill-cuts", "cuts": 30, "end_to_end_s_median": 0.4}])
    assert cuts[0].startswith("- server-kill: 30 scheduled cuts")
