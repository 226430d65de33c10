"""GlusterFS facts epochsync relies on: a volume's bricks, its well-known gfids, and the ``gluster``
command line that reports and barriers a volume.

Bricks are named ``brick1``, ``brick2``, ... in the volume's order (``gluster volume info``
numbers them the same way). In a distribute volume those names are the source's servers
(``server`` of every record, ``server=`` in the warehouse); in a replicated one the servers are
its replica sets, ``set1``, ``set2``, ... (each ``replica`` consecutive bricks of the volume's
order, as Gluster groups them; with an arbiter, the last brick of each set is the arbiter).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import dataclass

from epochsync.core.errors import EpochsyncError, SourceError

#: a volume's well-known gfids (Gluster's ``glusterfs-fops``/``syncop`` constants)
ROOT_GFID = "00000000-0000-0000-0000-000000000001"
#: the internal directories of a volume: never part of a replica
SHARD_ROOT_GFID = "be318638-e8a0-4c6d-977d-7a937aa84806"
SHARD_REMOVE_ME_GFID = "77dd5a45-dbf5-4592-b31b-b440382302e9"
TRASH_GFID = "00000000-0000-0000-0000-000000000005"
TRASH_INTERNAL_GFID = "00000000-0000-0000-0000-000000000006"
INTERNAL_GFIDS = frozenset({SHARD_ROOT_GFID, SHARD_REMOVE_ME_GFID, TRASH_GFID, TRASH_INTERNAL_GFID})
#: root entries Gluster keeps for itself (on every brick)
INTERNAL_ROOT_NAMES = frozenset({".glusterfs", ".shard", ".trashcan"})
#: AFR's directory of a replicated volume's bricks where a heal parks the inodes of names it
#: removes (``.glusterfs-anonymous-inode-<volume id>``): hidden from clients, never replicated
ANON_INODE_PREFIX = ".glusterfs-anonymous-inode-"


def is_internal_root_name(name: str) -> bool:
    """Is ``name``, an entry of a brick's root, Gluster's own (never part of a replica)?"""
    return name in INTERNAL_ROOT_NAMES or name.startswith(ANON_INODE_PREFIX)


class GlusterError(SourceError):
    """The gluster command line failed or the volume is not what the config says."""


@dataclass(frozen=True)
class Brick:
    """One brick: its server name in epochsync (``brick1`` ...), host and directory."""

    name: str
    host: str
    path: str

    @property
    def spec(self) -> str:
        """``host:/path``, as Gluster spells a brick."""
        return f"{self.host}:{self.path}"

    def is_local(self) -> bool:
        """Is the brick's host this machine (its name, or an address of it)?"""
        return host_is_local(self.host)


def parse_brick_spec(spec: str, index: int) -> Brick:
    """``host:/path`` → the ``index``-th brick (1-based); a ValueError says what is wrong."""
    host, sep, path = spec.partition(":")
    if not sep or not host or not path.startswith("/"):
        raise ValueError(f"expected a brick as host:/absolute/path, got {spec!r}")
    return Brick(name=f"brick{index}", host=host, path=os.path.normpath(path))


def host_is_local(host: str) -> bool:
    """Is ``host`` this machine?"""
    if host in ("localhost", socket.gethostname(), socket.getfqdn()):
        return True
    try:
        addrs = {str(a[4][0]) for a in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return any(a.startswith("127.") or a == "::1" for a in addrs)


def gluster_cli() -> str:
    """The path of the ``gluster`` command; a GlusterError says how to get it."""
    found = shutil.which("gluster") or (os.path.exists("/usr/sbin/gluster") and "/usr/sbin/gluster")
    if not found:
        raise GlusterError(
            "the gluster command line is not installed here (Debian: apt-get install glusterfs-server); "
            "a gluster source is cut where its bricks are"
        )
    return str(found)


def run_tool(
    cmd: list[str],
    what: str,
    *,
    timeout: float = 120.0,
    missing: str | None = None,
    error: type[EpochsyncError] = GlusterError,
) -> str:
    """Runs ``cmd``; returns its stdout. Not installed (``missing`` says how to get it), no answer within
    ``timeout`` or a failure is one ``error`` line (a GlusterError unless told) naming ``what``, with the
    tool's last words."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise error(missing or f"{cmd[0]} is not installed here") from None
    except subprocess.TimeoutExpired:
        raise error(f"{what}: no answer in {timeout:g} s") from None
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip() or f"exit status {done.returncode}").splitlines()[-1]
        raise error(f"{what} failed: {said}")
    return done.stdout


#: how Gluster's command line is run: one command (``("ssh", "node1", "gluster")``; empty: this
#: machine's ``gluster``), or several tried in order (a source's ``gluster_command`` and its
#: ``gluster_fallbacks``)
GlusterCommand = tuple[str, ...] | tuple[tuple[str, ...], ...]


def gluster_commands(command: GlusterCommand | None) -> list[list[str]]:
    """The commands of ``command`` in the order they are tried (an empty one: this machine's ``gluster``)."""
    if not command:
        return [[gluster_cli()]]
    if isinstance(command[0], str):
        return [list(command)]
    return [list(c) if c else [gluster_cli()] for c in command]


def run_gluster(
    args: list[str], *, timeout: float = 120.0, what: str | None = None, command: GlusterCommand | None = None
) -> str:
    """``gluster --mode=script ARGS``; returns stdout. ``command``: how Gluster's command line is run
    against the pool (a source's ``gluster_command``, e.g. ``ssh node1 gluster``; default: this
    machine's ``gluster``), or several such commands: each is tried in turn until one answers (a
    server down, or its ssh refused, and the next server is asked). A failure is one GlusterError
    line with Gluster's words (the first command's, and how many others failed too)."""
    what = what or "gluster " + " ".join(args)
    commands = gluster_commands(command)
    first: GlusterError | None = None
    for cli in commands:
        try:
            return run_tool([*cli, "--mode=script", *args], what, timeout=timeout)
        except GlusterError as exc:
            first = first or exc
    assert first is not None
    if len(commands) == 1:
        raise first
    raise GlusterError(
        f"{first} (and {len(commands) - 1} more gluster commands failed too: {', '.join(' '.join(c) for c in commands[1:])})"
    )


def _xml(text: str, what: str) -> ET.Element:
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise GlusterError(f"{what}: unreadable XML ({exc})") from None
    if root.findtext("opRet") not in (None, "0"):
        raise GlusterError(f"{what}: {root.findtext('opErrstr') or 'failed'}")
    return root


def volume_info(volume: str, *, command: GlusterCommand | None = None) -> dict:
    """``gluster volume info VOLUME --xml`` → ``{"name", "id", "type", "status", "bricks": [Brick],
    "replica", "arbiter", "disperse", "arbiters": [brick name], "options": {}}``."""
    what = f"gluster volume info {volume}"
    root = _xml(run_gluster(["volume", "info", volume, "--xml"], what=what, command=command), what)
    vol = root.find("volInfo/volumes/volume")
    if vol is None:
        raise GlusterError(f"no volume named {volume!r} (gluster volume list shows the volumes)")
    bricks = []
    arbiters = []
    for i, b in enumerate(vol.findall("bricks/brick"), start=1):
        spec = b.findtext("name") or (b.text or "").strip()
        brick = parse_brick_spec(spec, i)
        bricks.append(brick)
        if b.findtext("isArbiter") == "1":
            arbiters.append(brick.name)
    options = {o.findtext("name"): o.findtext("value") for o in vol.findall("options/option")}

    def count(tag: str) -> int:
        try:
            return int(vol.findtext(tag) or 0)
        except ValueError:
            return 0

    return {
        "name": vol.findtext("name"),
        "id": vol.findtext("id"),
        "type": vol.findtext("typeStr"),
        "status": vol.findtext("statusStr"),
        "bricks": bricks,
        "replica": max(1, count("replicaCount")),
        "arbiter": count("arbiterCount"),
        "disperse": count("disperseCount"),
        "arbiters": arbiters,
        "options": options,
    }


#: the volume types epochsync cuts
SUPPORTED_TYPES = ("Distribute", "Replicate", "Distributed-Replicate")


def check_supported(info: dict) -> None:
    """Refuses a volume epochsync cannot read from a cut, with the reason."""
    kind = info["type"] or "?"
    if info["disperse"] or "Disperse" in kind:
        raise GlusterError(
            f"volume {info['name']} is of type {kind}: a dispersed volume stores each file as erasure-coded "
            "fragments, no brick holds a file's bytes, so a cut of its bricks cannot be read without decoding "
            "every fragment; epochsync replicates distribute, replicated, arbiter and distributed-replicate volumes"
        )
    if kind not in SUPPORTED_TYPES:
        raise GlusterError(
            f"volume {info['name']} is of type {kind}: epochsync cuts {', '.join(SUPPORTED_TYPES)} volumes"
        )
    if len(info["bricks"]) % info["replica"]:
        raise GlusterError(
            f"volume {info['name']}: {len(info['bricks'])} bricks are not whole replica sets of {info['replica']}"
        )


def bricks_of(volume: str, *, command: GlusterCommand | None = None) -> list[Brick]:
    """The bricks of a volume epochsync cuts, in its order; other volume types are refused with the reason."""
    info = volume_info(volume, command=command)
    check_supported(info)
    return info["bricks"]


def volume_status(
    volume: str, *, command: GlusterCommand | None = None, timeout: float = 20.0
) -> dict[str, bool] | None:
    """``{brick spec: online}`` from ``gluster volume status VOLUME --xml``, or None when glusterd does
    not answer (then nothing is known of the bricks' processes; the cut goes by the snapshots)."""
    what = f"gluster volume status {volume}"
    try:
        root = _xml(
            run_gluster(["volume", "status", volume, "--xml"], what=what, command=command, timeout=timeout),
            what,
        )
    except GlusterError:
        return None
    out = {}
    for node in root.iter("node"):
        host, path = node.findtext("hostname"), node.findtext("path")
        if host and path and path.startswith("/"):
            out[f"{host}:{os.path.normpath(path)}"] = node.findtext("status") == "1"
    return out
