"""Replicated volumes on a live pool of three GlusterFS servers (``epochsync_dev.pool``), one history.

The pool is three servers on this machine, each in network and mount namespaces of its own,
with a ``replica 3`` volume (a brick per server) and a ``2 x (2 + 1)`` arbiter volume. Each epoch
runs a workload on the FUSE mount, sometimes with a fault in the middle of it: ``kill -9`` of
the reader's brick, of a whole server (glusterd, bricks, self-heal daemon), a server down for a
whole epoch and back after a heal, a network partition of one server. Then a cut, the posix
target replicated through Spark, and checked equal to the cut (the reader bricks' snapshots
walked directly) and, the workload being over, to the volume as the FUSE client reads it: a
reader that missed writes would make a cut that is self-consistent but wrong, and only the
second comparison sees that. The last step proves it does, by forcing a stale reader.

The steps share the pool and run in order: a failure early makes later ones fail too.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import types

import pytest
import yaml
from support.gluster import GlusterHistory

from epochsync.core.config import load_config
from epochsync.core.errors import EpochsyncError
from epochsync.sources.gluster import replicas
from epochsync.stages.cut import cut_source
from epochsync_dev.gluster_truth import cut_truth, mount_truth

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: what the FUSE client and a cut both say of a path (mtimes differ between copies of a directory)
FIELDS = ("type", "size", "sha256", "mode", "uid", "gid", "symlink", "xattrs", "fid")


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    from support.machine import cannot_run_here

    from epochsync_dev.gluster import REQUIRE_ENV, GlusterUnavailable
    from epochsync_dev.pool import GlusterPool

    p = GlusterPool(nodes=3, image_size="1G", rollover=1)
    try:
        p.start(install=False)
    except GlusterUnavailable as exc:
        cannot_run_here(REQUIRE_ENV, "a Gluster pool", exc)
    try:
        p.r3 = p.create_volume("r3", type="replica")
        p.arb = p.create_volume("arb", type="arbiter", sets=2)
        yield p
    finally:
        p.stop()


@pytest.fixture(autouse=True)
def _whole_pool(request):
    """Each test starts with every server up and every FUSE client answering: a test that failed
    half way (a server it stopped left down) does not fail the ones after it for that reason."""
    if "pool" not in request.fixturenames:
        yield
        return
    pool = request.getfixturevalue("pool")
    for n in range(1, pool.nodes + 1):
        if n not in pool.up_nodes():
            pool.start_node(n)
    for name in list(pool.volumes):
        pool.mount_alive(name)
    yield


def _history(pool, vol, spark, folder) -> GlusterHistory:
    h = GlusterHistory(types.SimpleNamespace(volume=vol), folder, spark)
    h.pool = pool
    return h


@pytest.fixture(scope="module")
def r3(pool, spark, tmp_path_factory):
    return _history(pool, pool.r3, spark, tmp_path_factory.mktemp("pool-r3"))


def mount_alive(h: GlusterHistory) -> None:
    """The history's FUSE client is answering (its death is Gluster's client's, not epochsync's:
    it is mounted again, and the test log says so)."""
    vol = h.stack.volume
    if not h.pool.mount_alive(vol.name):
        h.lines.append(f"the FUSE client of {vol.name} had died (Transport endpoint is not connected): mounted again")


def mount_problems(h: GlusterHistory, epoch: int) -> list[str]:
    """How cut ``epoch`` differs from the volume as its FUSE client reads it now (empty: equal)."""
    mount_alive(h)
    cut = cut_truth(h.roots(epoch))
    try:
        live = mount_truth(str(h.mount))
    except OSError as exc:
        if exc.errno != errno.ENOTCONN:
            raise
        # the FUSE client died in the walk (Gluster's client, twice in CI runs): mounted again, walked again
        mount_alive(h)
        live = mount_truth(str(h.mount))
    out = [f"{p}: only in the cut" for p in sorted(set(cut) - set(live))]
    out += [f"{p}: only on the mount" for p in sorted(set(live) - set(cut))]
    for p in sorted(set(cut) & set(live)):
        for k in FIELDS:
            if k in cut[p] and k in live[p] and cut[p][k] != live[p][k]:
                out.append(f"{p}: {k} {cut[p][k]!r} in the cut, {live[p][k]!r} on the mount")
    return out[:30]


def step(h: GlusterHistory, script: str | None = None) -> tuple[int, dict]:
    """A workload, a cut, the target replicated and equal to the cut and to the mount; returns (epoch, cut record)."""
    mount_alive(h)
    epoch = h.step(script)
    problems = mount_problems(h, epoch)
    assert not problems, f"cut {epoch} differs from the volume:\n  " + "\n  ".join(problems)
    return epoch, h.read_cut(epoch)


def readers(rec: dict) -> dict[str, str]:
    return {name: s["reader"] for name, s in rec["sets"].items()}


def node_of(pool, brick_name: str, rec: dict) -> int:
    """The server whose file system holds ``brick_name``'s snapshot in cut ``rec``."""
    root = rec["bricks"][brick_name]["root"]
    return next(n for n in range(1, pool.nodes + 1) if root.startswith(f"{pool.node_dir(n)}/"))


def test_first_cut_reads_each_set_through_one_data_brick(pool, r3):
    r3.sh("mkdir -p d; for i in $(seq 1 30); do printf 'one %s\\n' $i > d/f$i; done; ln -s f1 d/s1")
    epoch, rec = step(r3)
    assert epoch == 1
    assert len(rec["sets"]) == 1 and all(rec["status"].values()), rec["status"]
    # three copies of every operation, published once
    raw = [{k: v for k, v in r.items() if k != "index"} for r in r3.records(epoch)]
    assert raw and len({repr(sorted(r.items())) for r in raw}) == len(raw), "a record published twice"


def test_the_readers_brick_killed_in_a_workload(pool, r3):
    before = readers(r3.read_cut(1))["set1"]
    node = node_of(pool, before, r3.read_cut(1))
    r3.sh("for i in $(seq 1 10); do echo more >> d/f$i; done")
    assert pool.kill_brick("r3", node)
    epoch, rec = step(r3, "for i in $(seq 11 20); do echo after >> d/f$i; done; mv d/f21 d/f21r; rm d/f22; mkdir e")
    after = readers(rec)["set1"]
    assert after != before, f"the killed brick {before} stayed the reader"
    assert "down at the cut" in rec["sets"]["set1"]["not_reader"][before]
    # the same reader while it qualifies; the killed brick back and healed
    pool.start_volume_force("r3")
    pool.wait_healed("r3")
    epoch, rec = step(r3, "echo healed > e/h1")
    assert readers(rec)["set1"] == after


def test_the_readers_server_killed_and_down_a_whole_epoch(pool, r3):
    rec = r3.read_cut(max(_epochs(r3)))
    reader = readers(rec)["set1"]
    node = node_of(pool, reader, rec)
    r3.sh("for i in $(seq 1 5); do dd if=/dev/urandom of=e/big$i bs=64k count=4 status=none; done")
    pool.stop_node(node)
    epoch, rec = step(
        r3, "for i in $(seq 1 5); do echo tail >> e/big$i; done; mv e/big5 e/big5r; ln e/big1 e/big1-link"
    )
    assert readers(rec)["set1"] != reader
    # a whole epoch with the server still down
    epoch, rec = step(r3, "rm e/big2; truncate -s 1000 e/big3; chmod 600 e/big4; setfattr -n user.k -v v e/big1")
    assert readers(rec)["set1"] != reader
    pool.start_node(node)
    pool.wait_healed("r3")
    epoch, rec = step(r3, "echo back > e/back")
    assert all(rec["status"].values())


def test_a_partitioned_server(pool, r3):
    rec = r3.read_cut(max(_epochs(r3)))
    reader_node = node_of(pool, readers(rec)["set1"], rec)
    # not server 1: the pool's gluster_command asks server 1 first, and a partitioned server's
    # glusterd would answer that the others are gone (see the notes: a minority's view)
    other = 3 if reader_node != 3 else 2
    pool.isolate(other)
    try:
        step(r3, "for i in $(seq 1 8); do echo cut-off > p$i; done; mv p1 p1r; rm p2")
        # asked through the cut-off server, Gluster says the others' bricks are down and its own is
        # owed heals: no brick to read, and the error says why
        doc = yaml.safe_load(r3.config_path.read_text())
        doc["sources"][0]["gluster_command"] = [*pool.nsenter(other), "gluster"]
        minority = r3.folder / "minority.yaml"
        minority.write_text(yaml.safe_dump(doc, sort_keys=False))
        with pytest.raises(EpochsyncError, match="sees 1 of the 3 servers of its pool"):
            cut_source(load_config(minority), "vol")
        # with a server of the majority as a fallback, the cut passes the cut-off one over
        doc["sources"][0]["gluster_fallbacks"] = [[*pool.nsenter(reader_node), "gluster"]]
        fallback = r3.folder / "fallback.yaml"
        fallback.write_text(yaml.safe_dump(doc, sort_keys=False))
        cut = cut_source(load_config(fallback), "vol")["cuts"][-1]
        got = r3.read_cut(cut["epoch"])
        assert node_of(pool, readers(got)["set1"], got) != other, got["sets"]
    finally:
        pool.rejoin(other)
    pool.wait_healed("r3", timeout=240)
    epoch, rec = step(r3, "echo rejoined > p3")
    assert all(rec["status"].values())


def test_a_server_killed_during_a_cut_and_a_brick_during_the_pull(pool, r3):
    """kill -9 of the reader's server while the cut runs: the cut either holds (and is right) or
    fails with one line, and the next attempt cuts; then the new reader's brick killed while the
    epoch is pulled: the pull reads the snapshots, so the epoch commits equal to its cut."""
    import threading

    rec = r3.read_cut(max(_epochs(r3)))
    node = node_of(pool, readers(rec)["set1"], rec)
    r3.sh("mkdir -p k; for i in $(seq 1 30); do echo during-cut > k/f$i; done")
    killer = threading.Timer(0.05, pool.stop_node, args=(node,))
    killer.start()
    try:
        epoch = r3.cut()["epoch"]
    except EpochsyncError as exc:
        assert "\n" not in str(exc)
        epoch = r3.cut()["epoch"]
    killer.join()
    rec = r3.read_cut(epoch)
    reader = readers(rec)["set1"]
    pull_killer = threading.Timer(0.5, pool.kill_brick, args=("r3", node_of(pool, reader, rec)))
    pull_killer.start()
    r3.replicate("local", epoch)
    pull_killer.join()
    problems = r3.problems("local", epoch)
    assert not problems, problems
    assert not mount_problems(r3, epoch)
    pool.start_node(node)
    pool.start_volume_force("r3")
    pool.wait_healed("r3")
    step(r3, "echo after > k/after")


@pytest.fixture(scope="module")
def agents(pool):
    from epochsync_dev.pool import PoolAgents

    a = PoolAgents(pool, pool.work_dir / "agents")
    os.environ["AIRFLOW_CONN_POOL_AGENTS"] = a.conn_json()
    yield a
    a.stop()
    os.environ.pop("AIRFLOW_CONN_POOL_AGENTS", None)


def test_arbiter_volume_never_reads_the_arbiter_and_agents_serve_it(pool, agents, spark, tmp_path_factory, monkeypatch):
    """A 2 x (2 + 1) volume cut and pulled through the servers' agents: each set read through a
    data brick, never the arbiter; the snapshots are the agents' and everything the cut and the
    pull read of them came through the agents (the pipeline opens no brick path: a local read
    would fail the test). The agent of the reader's server killed alone: the epoch's pull fails,
    the target stays at the epoch before, and once the agent is back the epoch commits. An agent
    killed before a cut: the cut leaves its bricks out and reads each set through a brick whose
    agent answers. A whole server down (glusterd, bricks, agent) for an epoch, then back and
    healed."""
    import epochsync.stages.cut as cut_stage

    def no_local_brick(name, root, live=None):
        raise AssertionError(f"the cut read brick {name} at {root} here, not through its agent")

    monkeypatch.setattr(cut_stage, "LocalBrick", no_local_brick)
    h = _history(pool, pool.arb, spark, tmp_path_factory.mktemp("pool-arb"))
    doc = yaml.safe_load(h.config_path.read_text())
    doc["sources"][0].update(agents=agents.urls, agent_conn_id="pool_agents")
    h.config_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    h.cfg = load_config(h.config_path)
    h.sh(
        "mkdir a b; for i in $(seq 1 40); do printf 'x%s\\n' $i > a/f$i; done; dd if=/dev/urandom of=a/big bs=64k count=20 status=none"
    )
    epoch, rec = step(h)
    assert len(rec["sets"]) == 2
    for s in rec["sets"].values():
        assert s["arbiter"] and s["reader"] != s["arbiter"]
    assert all(b.get("agent") and "/.epochsync-agent/" in b["root"] for b in rec["bricks"].values()), rec["bricks"]
    served = "".join(agents.log(n).read_text() for n in agents.procs if agents.log(n).exists())
    assert "GET /v1/read?" in served and "POST /v1/cut" in served and "POST /v1/brick" in served
    # kill one data brick of every set (server 1 holds the first data brick of each)
    killed = pool.kill_brick("arb", 1)
    assert killed
    epoch, rec = step(h, "for i in $(seq 1 20); do echo two >> a/f$i; done; mv a/f30 b/f30; rm a/f31")
    for s in rec["sets"].values():
        assert s["reader"] != s["arbiter"], "the arbiter became a reader"
        assert node_of(pool, s["reader"], rec) != 1, "a killed brick stayed the reader"
    pool.start_volume_force("arb")
    pool.wait_healed("arb")
    epoch, rec = step(h, "echo after-heal > b/z")
    # the agent of a reader's server killed alone, before the epoch is pulled
    h.sh("echo more >> a/big; echo new > b/new")
    epoch = h.cut()["epoch"]
    rec = h.read_cut(epoch)
    node = node_of(pool, next(iter(rec["sets"].values()))["reader"], rec)
    agents.kill(node)
    with pytest.raises(EpochsyncError) as failed:
        h.replicate("local", epoch)
    assert "agent" in str(failed.value) and "\n" not in str(failed.value)
    assert not h.problems("local", epoch - 1), "the failed pull left the target off its last epoch"
    agents.start(node)
    h.replicate("local", epoch)
    assert not h.problems("local", epoch)
    assert not mount_problems(h, epoch)
    # an agent killed alone before a cut, its bricks up: they are not cut, and no set is read through them
    h.sh("for i in $(seq 1 10); do echo agentless >> a/f$i; done")
    agents.kill(node)
    try:
        epoch, rec = step(h, "mv a/f11 b/f11; echo x > b/nx")
    finally:
        agents.start(node)
    missing = {b for b, w in rec["bricks"].items() if w.get("missing")}
    assert missing and all("agent" in rec["bricks"][b]["missing"] for b in missing), rec["bricks"]
    assert not missing & {s["reader"] for s in rec["sets"].values()}, rec["sets"]
    epoch, rec = step(h, "echo agent-back >> b/nx")
    assert not any(w.get("missing") for w in rec["bricks"].values())
    # a whole server down for an epoch: glusterd, its bricks and its agent
    down = 2
    pool.stop_node(down)
    agents.kill(down)
    try:
        epoch, rec = step(h, "for i in $(seq 12 20); do echo down >> a/f$i; done; rm a/f12; mkdir b/c")
        assert any(w.get("missing") for w in rec["bricks"].values())
    finally:
        pool.start_node(down)
        agents.start(down)
    pool.start_volume_force("arb")
    pool.wait_healed("arb")
    epoch, rec = step(h, "echo healed > b/c/h")
    # the purge drops every committed cut but the newest, through the agents
    from epochsync.stages.cut import mechanism
    from epochsync.stages.purge import purge_source

    mech = mechanism(h.cfg.source(h.source))
    assert len(mech.epochs()) > 1
    purge_source(h.cfg, h.source, log=lambda _l: None)
    assert mech.epochs() == [epoch]
    assert all(
        names == [f"vol.epoch-{epoch:010d}"] for names in (mech.agents[b.name].snapshots(b.path) for b in mech.bricks)
    )


def test_a_stale_reader_is_caught(pool, r3, monkeypatch):
    """The net can fail: a reader that missed writes (forced, against the rules) makes a cut the
    target equals, but the comparison with the mount says what it lacks."""
    rec = r3.read_cut(max(_epochs(r3)))
    reader_node = node_of(pool, readers(rec)["set1"], rec)
    stale_node = next(n for n in (3, 2, 1) if n != reader_node)
    pool.kill_brick("r3", stale_node)
    r3.sh("echo missed > stale-1; echo missed >> p3")
    stale = next(b for b in rec["sets"]["set1"]["bricks"] if node_of(pool, b, rec) == stale_node)
    real = replicas.choose_reader

    def forced(rset, **kw):
        return replicas.Verdict(reader=stale, refused=real(rset, **kw).refused)

    monkeypatch.setattr("epochsync.stages.cut.choose_reader", forced)
    epoch = r3.cut()["epoch"]
    assert readers(r3.read_cut(epoch))["set1"] == stale
    problems = mount_problems(r3, epoch)
    assert any("stale-1" in p for p in problems), problems
    monkeypatch.undo()
    pool.start_volume_force("r3")
    pool.wait_healed("r3")


def _epochs(h: GlusterHistory) -> list[int]:
    from epochsync.stages.cut import published_epoch

    return list(range(1, published_epoch(h.cfg, h.source) + 1))


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_make_gluster_nodes_leaves_nothing_behind(pool, tmp_path, how):
    """``make gluster NODES=2``'s pool, stopped by SIGTERM (it removes itself) or killed -9 (the next
    stack or pool that starts removes it): no namespace, mount or loop device of it is left."""
    import signal

    from epochsync_dev.gluster import cleanup_stale

    proc = subprocess.Popen(
        [sys.executable, "-m", "epochsync_dev.pool", "--dir", str(tmp_path), "--nodes", "2", "--type", "replica"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "stop:" in line:
            break
    out = "".join(lines)
    assert "stop:" in out, out
    ns = out.split("namespaces ", 1)[1].split("..", 1)[0][:-1]  # es<id>n
    proc.send_signal(getattr(signal, how))
    rest = proc.communicate(timeout=120)[0]
    if how == "SIGKILL":
        cleanup_stale()
    else:
        assert proc.returncode == 0 and "nothing left running" in rest, rest
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert ns not in left, left
    mounts = open("/proc/self/mounts").read()
    assert f"epochsync-pool-{ns[2:-1]}" not in mounts
    assert pool.r3.name in subprocess.run(["ls", pool.work_dir / "mnt"], capture_output=True, text=True).stdout
