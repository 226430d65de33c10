"""GlusterFS facts epochsync relies on: a volume's bricks, its well-known gfids, and the ``gluster``
command line that reports and barriers a volume.

Bricks are named ``brick1``, ``brick2``, ... in the volume's order (``gluster volume info``
numbers them the same way); those names are the source's servers (``server`` of every record,
``server=`` in the warehouse).
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


def run_gluster(args: list[str], *, timeout: float = 120.0, what: str | None = None) -> str:
    """``gluster --mode=script ARGS``; returns stdout. A failure is one GlusterError line with Gluster's words."""
    return run_tool([gluster_cli(), "--mode=script", *args], what or "gluster " + " ".join(args), timeout=timeout)


def volume_info(volume: str) -> dict:
    """``gluster volume info VOLUME --xml`` → ``{"name", "type", "status", "bricks": [Brick], "options": {}}``."""
    text = run_gluster(["volume", "info", volume, "--xml"], what=f"gluster volume info {volume}")
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise GlusterError(f"gluster volume info {volume}: unreadable XML ({exc})") from None
    if root.findtext("opRet") not in (None, "0"):
        raise GlusterError(f"gluster volume info {volume}: {root.findtext('opErrstr') or 'failed'}")
    vol = root.find("volInfo/volumes/volume")
    if vol is None:
        raise GlusterError(f"no volume named {volume!r} (gluster volume list shows the volumes)")
    bricks = []
    for i, b in enumerate(vol.findall("bricks/brick"), start=1):
        spec = b.findtext("name") or (b.text or "").strip()
        bricks.append(parse_brick_spec(spec, i))
    options = {o.findtext("name"): o.findtext("value") for o in vol.findall("options/option")}
    return {
        "name": vol.findtext("name"),
        "type": vol.findtext("typeStr"),
        "status": vol.findtext("statusStr"),
        "bricks": bricks,
        "options": options,
    }


def bricks_of(volume: str) -> list[Brick]:
    """The bricks of a distribute volume, in its order; other volume types are refused with the reason."""
    info = volume_info(volume)
    if info["type"] not in ("Distribute",):
        raise GlusterError(
            f"volume {volume} is of type {info['type']}: epochsync cuts distribute volumes (each file on one "
            "brick); replicated and dispersed volumes are not supported yet"
        )
    return info["bricks"]
