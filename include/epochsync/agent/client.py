"""The pipeline's side of the agent: signed requests, the agent's refusals as errors.

:class:`AgentClient` is what a cut and an executor's pull use to reach one server's agent. The
secret comes from an Airflow connection (its password) or a file; the URL and, with TLS, the CA
that signed the agent's certificate (and a client certificate when the agent asks for one) are
the connection's extras. One HTTP connection per thread, kept open between requests.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
from urllib.parse import urlencode, urlsplit

from epochsync.agent.protocol import AUTH_HEADER, ERRORS, MAX_READ, AgentError, AgentUnreachable, sign


class AgentClient:
    """One agent, at ``url`` (``http://host:port`` or ``https://...``), signing with ``secret``."""

    def __init__(
        self,
        url: str,
        secret: bytes | str,
        *,
        ca: str | None = None,
        cert: str | None = None,
        key: str | None = None,
        timeout: float = 60.0,
    ):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or not parts.port:
            raise AgentError(f"agent URL {url!r}: http://host:port or https://host:port")
        if not secret:
            raise AgentError(f"agent {url}: no secret (the agent refuses unsigned requests)")
        self.url = url
        self.secret = secret.encode() if isinstance(secret, str) else secret
        self.host, self.port, self.tls = parts.hostname, parts.port, parts.scheme == "https"
        self.timeout = timeout
        self._ctx = None
        if self.tls:
            self._ctx = ssl.create_default_context(cafile=ca)
            if cert:
                self._ctx.load_cert_chain(cert, key)
        self._local = threading.local()

    def _conn(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            if self.tls:
                conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout, context=self._ctx)
            else:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            self._local.conn = conn
        return conn

    def request(self, method: str, path: str, query: dict | None = None, body: dict | None = None) -> bytes:
        """Sends one signed request; returns the body, or raises the refusal's :class:`AgentError`."""
        target = path + ("?" + urlencode(query) if query else "")
        data = json.dumps(body).encode() if body is not None else b""
        headers = {AUTH_HEADER: sign(self.secret, method, target, data), "Content-Type": "application/json"}
        for attempt in (1, 2):  # a kept connection the agent closed meanwhile is opened again, once
            conn = self._conn()
            try:
                conn.request(method, target, body=data, headers=headers)
                resp = conn.getresponse()
                payload = resp.read()
                break
            except (ConnectionError, http.client.HTTPException, OSError) as exc:
                conn.close()
                self._local.conn = None
                if attempt == 2 or isinstance(exc, TimeoutError | ssl.SSLError):
                    raise AgentUnreachable(f"agent {self.url}: {type(exc).__name__}: {exc}") from None
        if resp.status == 200:
            return payload
        try:
            doc = json.loads(payload)
        except ValueError:
            doc = {"message": payload[:200].decode(errors="replace")}
        cls = ERRORS.get(doc.get("error"), AgentError)
        raise cls(f"agent {self.url}: {doc.get('message') or f'HTTP {resp.status}'}")

    def _json(self, method: str, path: str, query: dict | None = None, body: dict | None = None):
        return json.loads(self.request(method, path, query, body))

    # ------------------------------------------------------------------ requests
    def info(self) -> dict:
        """The agent's version, bricks, snapshots and limits."""
        return self._json("GET", "/v1/info")

    def cut(self, brick: str, name: str, *, replace: bool = False) -> dict:
        """A read-only snapshot ``name`` of ``brick`` (``replace``: one there already is made again);
        returns ``{"root", "time_ns", ...}``."""
        return self._json("POST", "/v1/cut", body={"brick": brick, "name": name, "replace": replace})

    def where(self, brick: str) -> dict:
        """``{"snapshots", "folder", "rel"}``: ``brick``'s snapshots, the agent's folder of them, and
        the brick's directory inside a snapshot."""
        return self._json("GET", "/v1/snapshots", {"brick": brick})

    def purge(self, brick: str, name: str) -> dict:
        """Deletes snapshot ``name`` of ``brick`` (an AgentGone when it is gone already)."""
        return self._json("POST", "/v1/purge", body={"brick": brick, "name": name})

    def snapshots(self, brick: str) -> list[str]:
        """The names of the snapshots kept of ``brick``."""
        return self._json("GET", "/v1/snapshots", {"brick": brick})["snapshots"]

    def stat(self, brick: str, snap: str, gfid: str, shard: int = 0) -> dict:
        """Attributes and xattrs (hex values) of the file of ``gfid`` (``shard`` N ≥ 1: its block N,
        ``.shard/<gfid>.N``)."""
        q = {"brick": brick, "snap": snap, "gfid": gfid} | ({"shard": shard} if shard else {})
        return self._json("GET", "/v1/stat", q)

    def fiemap(self, brick: str, snap: str, gfid: str) -> list[tuple[int, ...]]:
        """The FIEMAP extents (logical, physical, length, flags) of the file of ``gfid``."""
        doc = self._json("GET", "/v1/fiemap", {"brick": brick, "snap": snap, "gfid": gfid})
        return [tuple(e) for e in doc["extents"]]

    def read(self, brick: str, snap: str, gfid: str, offset: int, length: int, shard: int = 0) -> bytes:
        """``length`` bytes at ``offset`` of the file of ``gfid`` (or of its block ``shard``; fewer past
        its end), in requests of at most MAX_READ."""
        out = []
        while length > 0:
            n = min(length, MAX_READ)
            q = {"brick": brick, "snap": snap, "gfid": gfid, "offset": offset, "length": n}
            chunk = self.request("GET", "/v1/read", q | ({"shard": shard} if shard else {}))
            out.append(chunk)
            if len(chunk) < n:
                break
            offset, length = offset + n, length - n
        return b"".join(out)

    def changelogs(self, brick: str, snap: str) -> list[str]:
        """The changelog files of the snapshot, by name under ``.glusterfs/changelogs``."""
        return self._json("GET", "/v1/changelogs", {"brick": brick, "snap": snap})["changelogs"]

    def brick(self, op: str, brick: str, snap: str, args: dict) -> dict:
        """One of a cut's batched reads of snapshot ``snap`` of ``brick`` (``POST /v1/brick``, see
        :mod:`epochsync.sources.gluster.bricks`): ``{"result": ...}`` or ``{"raise": {...}}``."""
        return self._json("POST", "/v1/brick", body={"op": op, "brick": brick, "snap": snap, "args": args})

    def changelog(self, brick: str, snap: str, name: str) -> bytes:
        """The bytes of changelog file ``name`` of the snapshot."""
        return self.request("GET", "/v1/changelog", {"brick": brick, "snap": snap, "name": name})
