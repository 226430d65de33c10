"""The agent: one per Gluster server, serving that server's brick snapshots to the pipeline.

It runs as root (it snapshots bricks and reads them whole), listens on one address, and does
only this:

- ``POST /v1/cut`` ``{"brick", "name"}``: a read-only btrfs snapshot of the brick's subvolume,
  named ``name``, in the brick's snapshot folder; ``POST /v1/purge`` deletes one. Nothing else
  writes.
- ``GET /v1/info``: the agent's version, bricks, snapshots and limits (``epochsync agent info``).
- ``GET /v1/snapshots?brick=``: the snapshots kept of a brick.
- ``GET /v1/stat``, ``/v1/fiemap``, ``/v1/read`` with ``brick``, ``snap``, ``gfid``: a file's
  attributes and xattrs, its FIEMAP extents, a byte range, by the gfid handle Gluster keeps in
  every brick (``.glusterfs/ab/cd/<gfid>``).
- ``GET /v1/changelogs`` and ``/v1/changelog?name=``: the snapshot's changelog files.
- ``POST /v1/brick`` ``{"op", "brick", "snap", "args"}``: the cut's reads of the snapshot, each a
  batch (:mod:`epochsync.sources.gluster.bricks`): gfids looked up, the ranges a file changed since
  another snapshot of the brick, the changelog after a position, the heal index, a walk; and the
  hints, the only read outside the snapshots: the brick's live changelog folder.

Every request is signed with the shared secret (:mod:`.protocol`); an agent without one does not
start. A request names a brick of the agent's config, one of its snapshots, a gfid and a
changelog file by their patterns; a dentry handle that resolves outside its snapshot is refused,
so nothing outside the agent's own snapshots is ever opened. At most ``max_requests`` requests
run at once; another is refused as busy, so a client backs off rather than piling up. One log
line per request (who, what, status, bytes, milliseconds), refusals with their reason.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from epochsync.agent.protocol import (
    AUTH_HEADER,
    CHANGELOG_NAME,
    GFID,
    MAX_READ,
    SNAPSHOT_NAME,
    AgentBadRequest,
    AgentBusy,
    AgentError,
    AgentGone,
    AgentNotFound,
    AgentPathError,
    verify,
)
from epochsync.core.errors import ConfigError

log = logging.getLogger("epochsync.agent")

#: the largest request body the agent reads (a batch of gfids is well under it)
MAX_BODY = 1 << 20
#: where a brick's changelog files are, inside it
CHANGELOG_DIR = ".glusterfs/changelogs"
#: what a directory's gfid handle points to: its parent's handle and its name there
DIR_HANDLE = re.compile(r"\.\./\.\./[0-9a-f]{2}/[0-9a-f]{2}/" + GFID.pattern + r"/[^/]+")


@dataclasses.dataclass
class AgentConfig:
    """The agent's config file (YAML; ``epochsync agent check`` reads it as the agent will)."""

    listen: str
    """host:port to listen on (a Gluster server's address on the storage network)"""
    secret_file: str
    """a file only root reads (mode 0600) holding the shared secret; the pipeline's Airflow connection has the same as its password"""
    bricks: list[str]
    """this server's brick directories, as ``gluster volume info`` names them"""
    snapshots: str = "{subvolume_parent}/.epochsync-agent/{brick_key}"
    """each brick's snapshot folder, on the brick's btrfs file system ({subvolume}, {subvolume_parent}, {brick_key})"""
    tls_cert: str | None = None
    """PEM certificate (with tls_key) to serve HTTPS; without, plain HTTP on a trusted storage network"""
    tls_key: str | None = None
    tls_ca: str | None = None
    """the operator's CA: clients must present a certificate it signed"""
    max_requests: int = 8
    """requests served at once; more are refused as busy"""
    log: str | None = None
    """log file (default: stderr, the journal under systemd)"""
    where: str = dataclasses.field(default="agent config", repr=False)

    @classmethod
    def load(cls, path: str | os.PathLike) -> AgentConfig:
        """Reads the config at ``path``; a ConfigError names the file and the key."""
        import yaml

        where = str(path)
        try:
            doc = yaml.safe_load(Path(path).read_text())
        except OSError as exc:
            raise ConfigError(where, "(file)", f"cannot read the agent's config: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(where, "(file)", f"not YAML: {exc}") from None
        if not isinstance(doc, dict):
            raise ConfigError(where, "(file)", "the agent's config is a mapping (listen, secret_file, bricks)")
        known = {f.name for f in dataclasses.fields(cls)} - {"where"}
        unknown = sorted(set(doc) - known)
        if unknown:
            raise ConfigError(where, unknown[0], f"unknown key (known: {', '.join(sorted(known))})")
        for key in ("listen", "secret_file", "bricks"):
            if not doc.get(key):
                raise ConfigError(where, key, "is required")
        if not isinstance(doc["bricks"], list) or not all(
            isinstance(b, str) and b.startswith("/") for b in doc["bricks"]
        ):
            raise ConfigError(where, "bricks", "a list of absolute brick directories")
        if bool(doc.get("tls_cert")) != bool(doc.get("tls_key")):
            raise ConfigError(where, "tls_cert", "tls_cert and tls_key go together")
        if doc.get("tls_ca") and not doc.get("tls_cert"):
            raise ConfigError(where, "tls_ca", "needs tls_cert and tls_key (the agent's own certificate)")
        try:
            cfg = cls(**doc, where=where)
        except TypeError as exc:
            raise ConfigError(where, "(file)", str(exc)) from None
        if not isinstance(cfg.max_requests, int) or cfg.max_requests < 1:
            raise ConfigError(where, "max_requests", "a whole number of at least 1")
        cfg.address()
        return cfg

    def address(self) -> tuple[str, int]:
        """``listen`` as (host, port)."""
        host, _, port = self.listen.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(self.where, "listen", f"{self.listen!r} is not host:port")
        return host.strip("[]"), int(port)

    def secret(self) -> bytes:
        """The secret, read from ``secret_file`` (a ConfigError when missing, empty or readable by others)."""
        try:
            st = os.stat(self.secret_file)
            raw = Path(self.secret_file).read_bytes().strip()
        except OSError as exc:
            raise ConfigError(self.where, "secret_file", f"{self.secret_file}: {exc.strerror}") from None
        if st.st_mode & 0o077:
            raise ConfigError(
                self.where,
                "secret_file",
                f"{self.secret_file} is readable by others (mode {st.st_mode & 0o777:o}): chmod 600 it",
            )
        if len(raw) < 16:
            raise ConfigError(
                self.where, "secret_file", f"{self.secret_file}: the secret has {len(raw)} bytes; use at least 16"
            )
        return raw


def brick_key(path: str) -> str:
    """A brick's name in its snapshot folder: its path with ``/`` as ``-``."""
    return path.strip("/").replace("/", "-") or "root"


class Bricks:
    """The agent's bricks: where each one's subvolume and snapshots are, and what it may open."""

    def __init__(self, cfg: AgentConfig):
        from epochsync.sources.gluster import btrfs

        self.btrfs = btrfs
        self.layout: dict[str, tuple[str, str, str]] = {}  # brick -> (subvolume, path inside it, snapshot folder)
        for b in cfg.bricks:
            if not os.path.isdir(b):
                raise ConfigError(cfg.where, "bricks", f"{b} is not a directory here")
            sub = btrfs.subvolume_of(b)
            if os.path.realpath(sub) == os.path.realpath(b):
                raise ConfigError(
                    cfg.where, "bricks", f"{b} is itself a btrfs subvolume; a cut snapshots the subvolume holding it"
                )
            folder = os.path.normpath(
                cfg.snapshots.format(subvolume=sub, subvolume_parent=os.path.dirname(sub), brick_key=brick_key(b))
            )
            os.makedirs(folder, mode=0o700, exist_ok=True)
            if btrfs.mount_of(folder)[0] != btrfs.mount_of(sub)[0]:
                raise ConfigError(cfg.where, "snapshots", f"{folder} is not on the btrfs file system of brick {b}")
            self.layout[b] = (sub, os.path.relpath(os.path.realpath(b), os.path.realpath(sub)), folder)

    def _brick(self, brick: str | None) -> tuple[str, str, str]:
        if brick not in self.layout:
            raise AgentNotFound(f"no brick {brick!r} on this agent (it serves {', '.join(self.layout)})")
        return self.layout[brick]

    def snapshot_dir(self, brick: str | None, snap: str | None) -> str:
        """The snapshot ``snap`` of ``brick`` (an AgentGone when it is not there)."""
        _, _, folder = self._brick(brick)
        if not snap or not SNAPSHOT_NAME.fullmatch(snap):
            raise AgentPathError(f"snapshot name {snap!r}: letters, digits, '.', '_' and '-' only")
        path = os.path.join(folder, snap)
        if not os.path.isdir(path):
            raise AgentGone(f"snapshot {snap} of brick {brick} is gone (purged, or never taken)")
        return path

    def root(self, brick: str | None, snap: str | None) -> str:
        """The brick's directory inside snapshot ``snap``."""
        _, rel, _ = self._brick(brick)
        return os.path.normpath(os.path.join(self.snapshot_dir(brick, snap), rel))

    def handle(self, brick: str | None, snap: str | None, gfid: str | None, shard: str | None = None) -> str:
        """The path of the file (or directory) of ``gfid`` in the snapshot; refuses one that would
        lead outside it (a directory's handle is a symlink, and it is resolved and checked)."""
        if not gfid or not GFID.fullmatch(gfid):
            raise AgentPathError(f"gfid {gfid!r} is not a gfid (8-4-4-4-12 lowercase hex)")
        root = self.root(brick, snap)
        if shard is not None:
            # block N of a sharded file: .shard/<gfid>.N, a regular file of the brick's
            if not shard.isdigit() or int(shard) < 1:
                raise AgentPathError(f"shard {shard!r}: a block number of at least 1")
            path = os.path.join(root, ".shard", f"{gfid}.{int(shard)}")
            if not os.path.isfile(path) or os.path.islink(path):
                raise AgentNotFound(f"no block {shard} of gfid {gfid} in snapshot {snap} of brick {brick}")
            return path
        path = os.path.join(root, ".glusterfs", gfid[:2], gfid[2:4], gfid)
        if gfid == "00000000-0000-0000-0000-000000000001":
            return root
        if not os.path.lexists(path):
            raise AgentNotFound(f"no file of gfid {gfid} in snapshot {snap} of brick {brick}")
        if os.path.islink(path) and DIR_HANDLE.fullmatch(os.readlink(path)):
            # a directory's handle: a symlink through its parent's handle to its name there
            real = os.path.realpath(path)
            if not (real == root or real.startswith(root + os.sep)):
                raise AgentPathError(f"gfid {gfid}: its handle leads outside the snapshot ({os.readlink(path)})")
            return real
        return path  # a file's handle is a hard link of it (a symlink's too: never followed)

    def changelog(self, brick: str | None, snap: str | None, name: str | None) -> str:
        """A changelog file of the snapshot, by its name under ``.glusterfs/changelogs``."""
        parts = (name or "").split("/")
        ok = name and (
            (len(parts) == 1 and CHANGELOG_NAME.fullmatch(parts[0]))
            or (len(parts) == 2 and parts[0] == "htime" and CHANGELOG_NAME.fullmatch(parts[1]))
            or (len(parts) == 4 and all(p.isdigit() for p in parts[:3]) and CHANGELOG_NAME.fullmatch(parts[3]))
        )
        if not ok:
            raise AgentPathError(f"changelog name {name!r}: CHANGELOG.<n>, YYYY/MM/DD/CHANGELOG.<n> or htime/HTIME.<n>")
        path = os.path.join(self.root(brick, snap), CHANGELOG_DIR, *parts)
        if not os.path.isfile(path) or os.path.islink(path):
            raise AgentNotFound(f"no changelog {name} in snapshot {snap} of brick {brick}")
        return path

    def changelogs(self, brick: str | None, snap: str | None) -> list[str]:
        """The changelog files of snapshot ``snap``, by name under ``.glusterfs/changelogs``."""
        base = os.path.join(self.root(brick, snap), CHANGELOG_DIR)
        out = []
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if d.isdigit() or d == "htime")
            rel = os.path.relpath(dirpath, base)
            for f in sorted(filenames):
                if CHANGELOG_NAME.fullmatch(f):
                    out.append(f if rel == "." else f"{rel}/{f}")
        return out

    def snapshots(self, brick: str | None) -> list[str]:
        """The snapshots kept of ``brick``."""
        _, _, folder = self._brick(brick)
        return sorted(n for n in os.listdir(folder) if SNAPSHOT_NAME.fullmatch(n))

    def cut(self, brick: str | None, name: str | None, replace: bool = False) -> dict:
        """A read-only snapshot ``name`` of the brick's subvolume (kept when it exists already: a retried cut)."""
        sub, rel, folder = self._brick(brick)
        if not name or not SNAPSHOT_NAME.fullmatch(name):
            raise AgentPathError(f"snapshot name {name!r}: letters, digits, '.', '_' and '-' only")
        dest = os.path.join(folder, name)
        t = time.time_ns()
        if replace and os.path.isdir(dest):
            self.btrfs.delete_snapshot(dest)
        if not os.path.isdir(dest):
            self.btrfs.snapshot(sub, dest)
        return {"brick": brick, "snapshot": name, "root": os.path.join(dest, rel), "time_ns": t}

    def purge(self, brick: str | None, name: str | None) -> dict:
        """Deletes snapshot ``name`` of ``brick``."""
        dest = self.snapshot_dir(brick, name)
        self.btrfs.delete_snapshot(dest)
        return {"brick": brick, "purged": name}


def stat_of(path: str) -> dict:
    """A file's attributes and every xattr it has (values in hex), without following a symlink."""
    s = os.lstat(path)
    xattrs = {}
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        names = []
    for n in names:
        try:
            xattrs[n] = os.getxattr(path, n, follow_symlinks=False).hex()
        except OSError:
            continue
    out = {
        "mode": s.st_mode,
        "uid": s.st_uid,
        "gid": s.st_gid,
        "size": s.st_size,
        "nlink": s.st_nlink,
        "mtime_ns": s.st_mtime_ns,
        "ctime_ns": s.st_ctime_ns,
        "xattrs": xattrs,
    }
    if os.path.islink(path):
        out["symlink"] = os.readlink(path)
    return out


class AgentServer(ThreadingHTTPServer):
    """The HTTP(S) server: config, bricks, secret and the request limit (see the module docstring)."""

    daemon_threads = True

    def __init__(self, cfg: AgentConfig, *, bricks: Bricks | None = None):
        self.cfg = cfg
        self.secret = cfg.secret()
        self.bricks = bricks or Bricks(cfg)
        self.slots = threading.BoundedSemaphore(cfg.max_requests)
        super().__init__(cfg.address(), Handler)
        if cfg.tls_cert:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            ctx.load_cert_chain(cfg.tls_cert, cfg.tls_key)
            if cfg.tls_ca:
                ctx.verify_mode = ssl.CERT_REQUIRED
                ctx.load_verify_locations(cfg.tls_ca)
            self.socket = ctx.wrap_socket(self.socket, server_side=True)

    @property
    def url(self) -> str:
        """The URL the agent is reached at."""
        host, port = self.server_address[:2]
        assert isinstance(host, str)  # bound: the socket's own name (getsockname), never bytes
        return f"{'https' if self.cfg.tls_cert else 'http'}://{host}:{port}"

    def info(self) -> dict:
        """What ``/v1/info`` answers."""
        from epochsync.core.version import package_version

        return {
            "agent": "epochsync",
            "version": package_version(),
            "bricks": {b: {"snapshots": self.bricks.snapshots(b)} for b in self.bricks.layout},
            "max_requests": self.cfg.max_requests,
            "tls": bool(self.cfg.tls_cert),
            "client_certificates": bool(self.cfg.tls_ca),
        }


class Handler(BaseHTTPRequestHandler):
    """One request: the slot, the signature, the route, one log line."""

    server: AgentServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # noqa: A002 (BaseHTTPRequestHandler's name)
        """Silenced: :meth:`_serve` writes one line per request."""

    def do_GET(self):
        """Serves a GET."""
        self._serve("GET")

    def do_POST(self):
        """Serves a POST (cut, purge)."""
        self._serve("POST")

    def _serve(self, method: str) -> None:
        t0 = time.monotonic()
        body = b""
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self.close_connection = True  # the body stays unread: the connection cannot carry on
        elif length:
            body = self.rfile.read(length)
        status, payload, kind = 200, b"", "application/json"
        acquired = self.server.slots.acquire(blocking=False)
        try:
            if not acquired:
                raise AgentBusy(f"the agent serves {self.server.cfg.max_requests} requests at once; try again")
            if length > MAX_BODY:
                raise AgentBadRequest(f"a request's body is at most {MAX_BODY} bytes ({length} sent)")
            verify(self.server.secret, self.headers.get(AUTH_HEADER), method, self.path, body)
            payload, kind = self._route(method, body)
        except AgentError as exc:
            status, payload = exc.status, json.dumps({"error": exc.kind, "message": str(exc)}).encode()
            kind = "application/json"
        except Exception as exc:  # an agent never dies of one request: the client gets one line
            log.exception("request %s %s failed", method, self.path)
            status = 500
            payload = json.dumps({"error": "failed", "message": f"{type(exc).__name__}: {exc}"}).encode()
        finally:
            if acquired:
                self.server.slots.release()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
        level = logging.INFO if status == 200 else logging.WARNING
        why = "" if status == 200 else " " + json.loads(payload).get("message", "")
        log.log(
            level,
            "%s %s %s -> %d %dB %.1fms%s",
            self.client_address[0],
            method,
            self.path[:200],
            status,
            len(payload),
            (time.monotonic() - t0) * 1000,
            why,
        )

    def _route(self, method: str, body: bytes) -> tuple[bytes, str]:
        url = urlsplit(self.path)
        q = {k: v[-1] for k, v in parse_qs(url.query).items()}
        b = self.server.bricks
        brick, snap, gfid = q.get("brick"), q.get("snap"), q.get("gfid")
        route = (method, url.path)
        if route == ("POST", "/v1/brick"):
            return _json(self._brick_request(body)), "application/json"
        if route == ("POST", "/v1/cut") or route == ("POST", "/v1/purge"):
            try:
                args = json.loads(body or b"{}")
            except ValueError:
                raise AgentError("the request's body is not JSON") from None
            if url.path == "/v1/cut":
                done = b.cut(args.get("brick"), args.get("name"), replace=bool(args.get("replace")))
            else:
                done = b.purge(args.get("brick"), args.get("name"))
            return _json(done), "application/json"
        if method != "GET":
            raise AgentPathError(
                f"{method} {url.path}: the agent only reads, apart from cut and purge (POST /v1/brick reads)"
            )
        if url.path == "/v1/info":
            return _json(self.server.info()), "application/json"
        if url.path == "/v1/snapshots":
            _sub, rel, folder = b._brick(brick)
            return _json({"snapshots": b.snapshots(brick), "folder": folder, "rel": rel}), "application/json"
        if url.path == "/v1/stat":
            return _json(stat_of(b.handle(brick, snap, gfid, q.get("shard")))), "application/json"
        if url.path == "/v1/fiemap":
            path = b.handle(brick, snap, gfid)
            if not os.path.isfile(path) or os.path.islink(path):
                raise AgentError(f"gfid {gfid} is not a regular file: only files have extents")
            return _json({"extents": [list(e) for e in b.btrfs.fiemap(path)]}), "application/json"
        if url.path == "/v1/read":
            path = b.handle(brick, snap, gfid, q.get("shard"))
            try:
                offset, length = int(q.get("offset", 0)), int(q.get("length", 0))
            except ValueError:
                raise AgentError("offset and length are whole numbers") from None
            if offset < 0 or length < 0 or length > MAX_READ:
                raise AgentError(f"a read is 0 to {MAX_READ} bytes at a non-negative offset")
            if not os.path.isfile(path) or os.path.islink(path):
                raise AgentError(f"gfid {gfid} is not a regular file: /v1/stat says what it is")
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                return os.pread(fd, length, offset), "application/octet-stream"
            finally:
                os.close(fd)
        if url.path == "/v1/changelogs":
            return _json({"changelogs": b.changelogs(brick, snap)}), "application/json"
        if url.path == "/v1/changelog":
            return Path(b.changelog(brick, snap, q.get("name"))).read_bytes(), "application/octet-stream"
        raise AgentPathError(f"no such request: {method} {url.path}")

    def _brick_request(self, body: bytes) -> dict:
        """``POST /v1/brick``: one of the cut's batched reads, run on the snapshot here."""
        from epochsync.sources.gluster.bricks import LocalBrick, serve_request

        try:
            doc = json.loads(body or b"{}")
        except ValueError:
            raise AgentBadRequest("the request's body is not JSON") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("args", {}), dict):
            raise AgentBadRequest('a brick request is {"op", "brick", "snap", "args": {...}}')
        b = self.server.bricks
        brick, snap = doc.get("brick"), doc.get("snap")
        side = LocalBrick(str(brick), b.root(brick, snap), live=brick)

        def old(name: str) -> LocalBrick:
            return LocalBrick(str(brick), b.root(brick, name))

        def check_gfid(g) -> None:
            if not isinstance(g, str) or not GFID.fullmatch(g):
                raise AgentPathError(f"gfid {g!r} is not a gfid (8-4-4-4-12 lowercase hex)")

        try:
            return serve_request(str(doc.get("op")), side, doc.get("args") or {}, old, check_gfid)
        except (ValueError, KeyError, TypeError) as exc:
            raise AgentBadRequest(f"brick request {doc.get('op')!r}: {exc}") from None


def _json(doc) -> bytes:
    return json.dumps(doc).encode()


def serve(cfg: AgentConfig, *, ready=None) -> None:
    """Runs the agent until SIGTERM or Ctrl-C (``epochsync agent serve``)."""
    handlers: list[logging.Handler] = [logging.FileHandler(cfg.log) if cfg.log else logging.StreamHandler()]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", handlers=handlers)
    server = AgentServer(cfg)
    log.info(
        "agent serving %s on %s (%d requests at once)", ", ".join(server.bricks.layout), server.url, cfg.max_requests
    )
    if ready:
        ready(server)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        log.info("agent stopped")
