"""The agent as a security boundary, and what it serves (``epochsync.agent``).

The agent runs on loopback in a thread, over a brick snapshot laid out as Gluster lays one out
(the file, its gfid handle hard-linked under ``.glusterfs``, a directory's handle a symlink
through its parent's, a changelog). Each refusal is a test: a wrong secret, an old signature,
a path escape (a bad gfid, a bad snapshot name, a directory handle leading outside, a changelog
name with ``..``), an unknown gfid, a purged snapshot, a full agent. The cut and purge of a real
btrfs brick need root and run where the btrfs fixture can (CI).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

from epochsync.agent.client import AgentClient
from epochsync.agent.protocol import (
    AgentAuthError,
    AgentBusy,
    AgentError,
    AgentGone,
    AgentNotFound,
    AgentPathError,
    sign,
    verify,
)
from epochsync.agent.server import AgentConfig, AgentServer, Bricks
from epochsync.core.btrfs import create_subvolume
from epochsync.core.errors import ConfigError
from epochsync.sources.gluster import btrfs

SECRET = b"s3cret-of-at-least-16-bytes"
FILE_GFID = "ab12cd34-0000-4000-8000-000000000001"
DIR_GFID = "ef56ab78-0000-4000-8000-000000000002"
EVIL_GFID = "aa000000-0000-4000-8000-000000000003"
ROOT_GFID = "00000000-0000-0000-0000-000000000001"


def _handle(root, gfid):
    d = os.path.join(root, ".glusterfs", gfid[:2], gfid[2:4])
    os.makedirs(d, exist_ok=True)
    return os.path.join(d, gfid)


def _fake_bricks(tmp_path) -> tuple[Bricks, str]:
    """A brick with one snapshot ``epoch-0000000001`` laid out as Gluster's (no btrfs needed)."""
    brick = str(tmp_path / "vol" / "brick")
    folder = tmp_path / "snaps"
    root = folder / "epoch-0000000001" / "brick"
    (root / "d").mkdir(parents=True)
    data = bytes(range(256)) * 40
    (root / "d" / "f").write_bytes(data)
    os.setxattr(root / "d" / "f", "user.k", b"v")
    os.link(root / "d" / "f", _handle(str(root), FILE_GFID))
    os.symlink("../../..", _handle(str(root), ROOT_GFID))
    os.symlink(f"../../00/00/{ROOT_GFID}/d", _handle(str(root), DIR_GFID))
    # a directory handle whose parent handle was made to point out of the snapshot
    outside = tmp_path / "outside"
    (outside / "x").mkdir(parents=True)
    os.symlink(str(outside), _handle(str(root), "bb000000-0000-4000-8000-000000000004"))
    os.symlink("../../bb/00/bb000000-0000-4000-8000-000000000004/x", _handle(str(root), EVIL_GFID))
    cl = root / ".glusterfs" / "changelogs" / "2026" / "12" / "03"
    cl.mkdir(parents=True)
    (cl / "CHANGELOG.1764748800").write_bytes(b"GlusterFS Changelog | version: v1.2 | encoding : 2\n")
    b = Bricks.__new__(Bricks)
    b.btrfs = btrfs
    b.layout = {brick: (str(tmp_path / "vol"), "brick", str(folder))}
    return b, brick


@pytest.fixture
def agent(tmp_path):
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(SECRET)
    secret_file.chmod(0o600)
    bricks, brick = _fake_bricks(tmp_path)
    cfg = AgentConfig(listen="127.0.0.1:0", secret_file=str(secret_file), bricks=[brick], max_requests=2)
    server = AgentServer(cfg, bricks=bricks)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    server.brick = brick
    yield server
    server.shutdown()
    server.server_close()


def test_serves_a_file_by_gfid_from_its_snapshot(agent):
    c = AgentClient(agent.url, SECRET)
    snap = "epoch-0000000001"
    st = c.stat(agent.brick, snap, FILE_GFID)
    assert st["size"] == 10240 and st["xattrs"]["user.k"] == b"v".hex()
    assert c.read(agent.brick, snap, FILE_GFID, 100, 10) == (bytes(range(256)) * 40)[100:110]
    assert c.read(agent.brick, snap, FILE_GFID, 10000, 1000) == (bytes(range(256)) * 40)[10000:]
    assert c.stat(agent.brick, snap, DIR_GFID)["mode"] & 0o040000
    assert c.stat(agent.brick, snap, ROOT_GFID)["mode"] & 0o040000
    assert isinstance(c.fiemap(agent.brick, snap, FILE_GFID), list)
    assert c.changelogs(agent.brick, snap) == ["2026/12/03/CHANGELOG.1764748800"]
    assert c.changelog(agent.brick, snap, "2026/12/03/CHANGELOG.1764748800").startswith(b"GlusterFS Changelog")
    assert c.snapshots(agent.brick) == [snap]
    info = c.info()
    assert info["bricks"][agent.brick]["snapshots"] == [snap] and info["max_requests"] == 2


def test_a_wrong_secret_is_refused(agent):
    with pytest.raises(AgentAuthError, match="wrong signature"):
        AgentClient(agent.url, b"not-the-secret-at-all").info()


def test_an_old_or_missing_signature_is_refused():
    header = sign(SECRET, "GET", "/v1/info", b"", now=time.time() - 3600)
    with pytest.raises(AgentAuthError, match="signed"):
        verify(SECRET, header, "GET", "/v1/info", b"")
    with pytest.raises(AgentAuthError, match="no X-Epochsync-Auth"):
        verify(SECRET, None, "GET", "/v1/info", b"")
    # a signature is for one request: another path or body is refused
    header = sign(SECRET, "GET", "/v1/info", b"")
    with pytest.raises(AgentAuthError):
        verify(SECRET, header, "GET", "/v1/snapshots?brick=/x", b"")


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda c, b: c.stat(b, "epoch-0000000001", "../../../../etc/passwd"), "is not a gfid"),
        (lambda c, b: c.stat(b, "../../etc", FILE_GFID), "snapshot name"),
        (lambda c, b: c.stat(b, "epoch-0000000001", EVIL_GFID), "leads outside the snapshot"),
        (lambda c, b: c.changelog(b, "epoch-0000000001", "../../../d/f"), "changelog name"),
        (lambda c, b: c.changelog(b, "epoch-0000000001", "2026/../../CHANGELOG.1"), "changelog name"),
        (lambda c, b: c.request("POST", "/v1/write", body={}), "only reads"),
        (lambda c, b: c.request("GET", "/etc/passwd"), "no such request"),
    ],
)
def test_a_path_escape_is_refused(agent, call, match):
    with pytest.raises(AgentPathError, match=match):
        call(AgentClient(agent.url, SECRET), agent.brick)


def test_an_unknown_gfid_or_brick_is_not_found(agent):
    c = AgentClient(agent.url, SECRET)
    with pytest.raises(AgentNotFound, match="no file of gfid"):
        c.stat(agent.brick, "epoch-0000000001", "12345678-1234-4234-8234-123456789abc")
    with pytest.raises(AgentNotFound, match="no brick"):
        c.stat("/somewhere/else", "epoch-0000000001", FILE_GFID)


def test_a_purged_snapshot_is_gone(agent, tmp_path):
    c = AgentClient(agent.url, SECRET)
    shutil.rmtree(tmp_path / "snaps" / "epoch-0000000001")
    with pytest.raises(AgentGone, match="is gone"):
        c.read(agent.brick, "epoch-0000000001", FILE_GFID, 0, 10)


def test_a_full_agent_says_busy(agent):
    for _ in range(agent.cfg.max_requests):
        agent.slots.acquire()
    try:
        with pytest.raises(AgentBusy, match="2 requests at once"):
            AgentClient(agent.url, SECRET).info()
    finally:
        for _ in range(agent.cfg.max_requests):
            agent.slots.release()
    AgentClient(agent.url, SECRET).info()


def test_reads_of_what_is_not_a_file_are_refused(agent):
    c = AgentClient(agent.url, SECRET)
    with pytest.raises(AgentError, match="not a regular file"):
        c.read(agent.brick, "epoch-0000000001", DIR_GFID, 0, 10)


def test_the_config_refuses_an_agent_without_a_safe_secret(tmp_path):
    cfg_file = tmp_path / "agent.yaml"
    cfg_file.write_text("listen: 127.0.0.1:7411\nbricks: [/b]\n")
    with pytest.raises(ConfigError, match="secret_file: is required"):
        AgentConfig.load(cfg_file)
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o644)
    cfg_file.write_text(f"listen: 127.0.0.1:7411\nsecret_file: {secret}\nbricks: [/b]\n")
    with pytest.raises(ConfigError, match="readable by others"):
        AgentConfig.load(cfg_file).secret()
    cfg_file.write_text(f"listen: 127.0.0.1:7411\nsecret_file: {secret}\nbricks: [/b]\nanonymous: true\n")
    with pytest.raises(ConfigError, match="anonymous: unknown key"):
        AgentConfig.load(cfg_file)
    with pytest.raises(AgentError, match="no secret"):
        AgentClient("http://127.0.0.1:1", b"")


def test_agent_verbs(agent, tmp_path):
    """``epochsync agent info`` asks a running agent; a wrong secret is one line and status 12."""
    secret = tmp_path / "client-secret"
    secret.write_bytes(SECRET)
    run = [sys.executable, "-m", "epochsync.cli", "agent", "info", "--url", agent.url, "--secret-file", str(secret)]
    done = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"brick {agent.brick}: 1 snapshots" in done.stdout
    secret.write_bytes(b"a-wrong-secret-of-enough-bytes")
    done = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert done.returncode == 12 and "wrong signature" in done.stderr and "Traceback" not in done.stderr


def test_cut_and_purge_a_btrfs_brick(btrfs_dir, tmp_path):
    """On btrfs (root): the agent's cut is a read-only snapshot of the brick's subvolume; purge deletes it."""
    sub = os.path.join(btrfs_dir, "agent-vol")
    create_subvolume(sub)
    brick = os.path.join(sub, "brick")
    os.makedirs(brick)
    with open(os.path.join(brick, "f"), "w") as f:
        f.write("hello")
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    cfg = AgentConfig(listen="127.0.0.1:0", secret_file=str(secret), bricks=[brick])
    server = AgentServer(cfg)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        c = AgentClient(server.url, SECRET)
        out = c.cut(brick, "epoch-0000000007")
        assert open(os.path.join(out["root"], "f")).read() == "hello"
        with pytest.raises(OSError):
            open(os.path.join(out["root"], "g"), "w")
        assert c.snapshots(brick) == ["epoch-0000000007"]
        c.purge(brick, "epoch-0000000007")
        assert c.snapshots(brick) == []
        with pytest.raises(AgentGone):
            c.purge(brick, "epoch-0000000007")
    finally:
        server.shutdown()
        server.server_close()
        subprocess.run(["btrfs", "subvolume", "delete", sub], capture_output=True)


# --------------------------------------------------------------------------- a cut's reads through the agent


def _second_snapshot(tmp_path) -> str:
    """Snapshot ``epoch-0000000002`` of the fake brick: the file with its second KiB changed."""
    old = tmp_path / "snaps" / "epoch-0000000001"
    new = tmp_path / "snaps" / "epoch-0000000002"
    shutil.copytree(old, new, symlinks=True)
    root = new / "brick"
    f = root / "d" / "f"
    data = bytearray(f.read_bytes())
    data[1024:2048] = b"\xff" * 1024
    os.unlink(_handle(str(root), FILE_GFID))
    f.write_bytes(bytes(data))
    os.link(f, _handle(str(root), FILE_GFID))
    return str(root)


def test_a_cuts_reads_through_the_agent_answer_as_the_snapshot_read_here(agent, tmp_path):
    """Every batched read of ``sources.gluster.bricks`` gives through the agent what it gives on the
    snapshot here: the gfids looked up (a file, a directory, the root, one absent), the ranges a file
    changed between two snapshots, the changelog's end and a slice of it, the heal index, a walk."""
    from epochsync.sources.gluster.bricks import AgentBrick, LocalBrick
    from epochsync.sources.gluster.changelog import Position

    c = AgentClient(agent.url, SECRET)
    old_root = str(tmp_path / "snaps" / "epoch-0000000001" / "brick")
    new_root = _second_snapshot(tmp_path)
    here, there = LocalBrick("b", new_root), AgentBrick("b", c, agent.brick, "epoch-0000000002")
    old_here, old_there = LocalBrick("b", old_root), AgentBrick("b", c, agent.brick, "epoch-0000000001")
    gfids = [FILE_GFID, DIR_GFID, ROOT_GFID, "12345678-1234-4234-8234-123456789abc"]
    for full in (True, False):
        assert there.lookup_many(gfids, full=full) == here.lookup_many(gfids, full=full)
    assert there.lookup_many(gfids)[0].size == 10240 and there.lookup_many(gfids)[3] is None
    items = [(FILE_GFID, 10240), (DIR_GFID, 0)]
    assert there.changed_files(old_there, items) == here.changed_files(old_here, items)
    assert there.changed_files(old_there, items)[1] is None  # a directory: not compared, read whole
    assert there.changelog_end() == here.changelog_end()
    assert there.gfids() == here.gfids()
    assert there.owed("vol", {"b": 0}) == here.owed("vol", {"b": 0}) == {}
    assert there.started() == here.started()
    assert there.exists() and not AgentBrick("b", c, agent.brick, "epoch-0000000009").exists()
    at = Position(rolled=None, live_len=0, live_sha=here.changelog_end()[0].live_sha)
    assert there.changelog_readable(at.to_dict()) == here.changelog_readable(at.to_dict())


def test_a_cuts_reads_through_the_agent_refuse_as_they_would_here(agent):
    """A changelog that does not continue the last cut's position refuses through the agent as the
    ChangelogGap it is (a cut walks that brick), and a malformed or escaping request is refused."""
    from epochsync.agent.protocol import AgentBadRequest
    from epochsync.sources.gluster.bricks import AgentBrick
    from epochsync.sources.gluster.changelog import ChangelogGap, Position

    c = AgentClient(agent.url, SECRET)
    there = AgentBrick("b", c, agent.brick, "epoch-0000000001")
    with pytest.raises(ChangelogGap, match=r"lost records: CHANGELOG\.1700000000.*is gone.*on agent"):
        there.changelog_slice(Position(rolled=1700000000, live_len=0, live_sha="0" * 64, rolled_sha="0" * 64))
    with pytest.raises(AgentPathError, match="is not a gfid"):
        there.lookup_many(["../../../etc/passwd"])
    with pytest.raises(AgentGone, match="is gone"):
        AgentBrick("b", c, agent.brick, "epoch-0000000009").lookup_many([FILE_GFID])
    with pytest.raises(AgentPathError, match="snapshot name"):
        there.changed_files(AgentBrick("b", c, agent.brick, "../../x"), [(FILE_GFID, 10)])
    with pytest.raises(AgentBadRequest, match="no such brick request"):
        c.brick("write", agent.brick, "epoch-0000000001", {})
    with pytest.raises(AgentBadRequest, match="at most 4000"):
        c.brick("lookup", agent.brick, "epoch-0000000001", {"gfids": [FILE_GFID] * 4001})
    with pytest.raises(AgentBadRequest, match="body is at most"):
        c.brick("lookup", agent.brick, "epoch-0000000001", {"gfids": ["x" * 2_000_000]})
    # the connection refused mid-body is opened again for the next request
    assert there.lookup_many([FILE_GFID])[0] is not None
