"""A loopback HTTP proxy in front of an S3 server that counts traffic and injects faults.

Every tool under measurement (epochsync, ``aws s3 sync``, a whole-file copier) talks to
the same proxy, so bytes and requests are counted the same way, on the server side of
the client, per bucket: requests by method, body bytes sent to the server (writes),
body bytes returned (reads) and bytes copied server-side (``x-amz-copy-source``).

Faults: :meth:`S3Proxy.add_fault` makes the n-th matching request answer 503 SlowDown
or drop the connection, to test retries and rollback against a real server.

SigV4 signs the Host header; the proxy forwards it unchanged, so signatures hold.
"""

from __future__ import annotations

import http.client
import re
import socket
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

_RANGE_RE = re.compile(r"bytes=(\d+)-(\d+)")
_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te", "trailer"}


@dataclass
class BucketCounters:
    requests: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    bytes_in: int = 0  # request bodies: data written to the store
    bytes_out: int = 0  # object GET response bodies: data read from the store
    listing_bytes: int = 0  # bucket listing responses (metadata, not file data)
    bytes_copied: int = 0  # server-side copies into this bucket (CopyObject, UploadPartCopy)
    bytes_copied_out: int = 0  # server-side copies whose source is in this bucket
    copies_unsized: int = 0  # whole-object copies into this bucket whose size could not be learnt

    @property
    def total_requests(self) -> int:
        return sum(self.requests.values())

    def as_dict(self) -> dict:
        return {
            "requests": dict(self.requests),
            "total_requests": self.total_requests,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "listing_bytes": self.listing_bytes,
            "bytes_copied": self.bytes_copied,
            "bytes_copied_out": self.bytes_copied_out,
            "copies_unsized": self.copies_unsized,
        }


@dataclass
class Fault:
    method: str | None
    key_pattern: re.Pattern | None
    kind: str  # "503" or "reset"
    nth: int  # 1-based: fail the nth matching request
    times: int  # how many consecutive matching requests fail from the nth on
    seen: int = 0

    def matches(self, method: str, key: str) -> bool:
        if self.method and self.method != method:
            return False
        return not (self.key_pattern and not self.key_pattern.search(key))


class S3Proxy:
    """Counting, fault-injecting proxy. Use as a context manager; ``url`` is its endpoint."""

    def __init__(self, upstream_url: str, head_client=None):
        """``head_client``: an S3 client for the upstream, used to size whole-object copies."""
        u = urlsplit(upstream_url)
        self.head_client = head_client
        self.upstream = (u.hostname, u.port or 80)
        self.lock = threading.Lock()
        self.counters: dict[str, BucketCounters] = defaultdict(BucketCounters)
        self.faults: list[Fault] = []
        #: whole-object copies not sized yet, sized by :meth:`settle`: ``(bucket, copy source, the
        #: source version the store copied, the key written, the version it made)``
        self.unsized: list[tuple[str, str, str | None, str, str | None]] = []
        #: every request as ``(method, bucket, key, query, status, copy source or "")`` while
        #: :meth:`keep_log` is on
        self.log: list[tuple[str, str, str, str, int, str]] | None = None
        self.server: ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None
        self.url = ""

    # -- control
    def add_fault(self, kind: str, *, method: str | None = None, key: str | None = None, nth: int = 1, times: int = 1):
        if kind not in ("503", "reset"):
            raise ValueError("fault kind is '503' or 'reset'")
        with self.lock:
            self.faults.append(Fault(method, re.compile(key) if key else None, kind, nth, times))

    def clear_faults(self):
        with self.lock:
            self.faults.clear()

    def reset_counters(self):
        with self.lock:
            self.counters = defaultdict(BucketCounters)
            self.unsized = []

    def settle(self) -> None:
        """Size the whole-object copies counted since the last call (a HEAD of each source version
        through ``head_client``) and add their bytes to the counters. A copy's answer does not
        say its size, and a HEAD while the copy is answered would put a second request on the
        store's and the proxy's clock inside every copy a measured tool makes: it would time
        the proxy's bookkeeping, not the tool. So it waits until the counters are read."""
        with self.lock:
            todo, self.unsized = self.unsized, []
        sized = [(u[0], u[1], self._copy_size(*u)) for u in todo]
        with self.lock:
            for bucket, src, n in sized:
                if n is None:
                    self.counters[bucket].copies_unsized += 1
                else:
                    self._count_copy(bucket, src, n)

    def _copy_size(self, bucket: str, src: str, src_version: str | None, key: str, version: str | None):
        """The size of a whole-object copy, asked after the fact: its source at the version the
        store copied, else the version it made; the keys as they are now where no version is
        known (an unversioned bucket). None when none of them is there any more (a rename's
        source deleted in an unversioned bucket, and its copy since)."""
        from botocore.exceptions import ClientError

        path, _, query = unquote(src).lstrip("/").partition("?versionId=")
        src_bucket, _, src_key = path.partition("/")
        tries = [(src_bucket, src_key, query or src_version), (bucket, key, version)]
        tries += [(b, k, None) for b, k, v in tries if v]
        for b, k, v in tries:
            try:
                return self._object_size(b, k, v)
            except ClientError:
                continue
        return None

    def _count_copy(self, bucket: str, src: str, copied: int) -> None:
        """Add ``copied`` bytes copied from ``src`` into ``bucket`` (under :attr:`lock`)."""
        if copied > 0:
            self.counters[bucket].bytes_copied += copied
            src_bucket = unquote(src).lstrip("/").split("/", 1)[0]
            self.counters[src_bucket].bytes_copied_out += copied

    def snapshot(self) -> dict[str, dict]:
        """Counters per bucket, as plain dicts (the copies :meth:`settle` sizes included)."""
        self.settle()
        with self.lock:
            return {b: c.as_dict() for b, c in self.counters.items()}

    def keep_log(self, on: bool = True) -> list[tuple[str, str, str, str, int, str]]:
        """Start (``on``) or stop logging every request (what each one was for); returns the log so
        far (:attr:`log`, in the order the answers came) and starts a new one."""
        with self.lock:
            old, self.log = self.log or [], ([] if on else None)
        return old

    def _fault_for(self, method: str, key: str) -> str | None:
        with self.lock:
            for f in self.faults:
                if f.matches(method, key):
                    f.seen += 1
                    if f.nth <= f.seen < f.nth + f.times:
                        return f.kind
        return None

    # -- lifecycle
    def start(self) -> str:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # headers and body go out in two writes: with Nagle on, the body waits for the
            # client's delayed ACK, 40 ms per request (measured: 44 ms -> under 5 ms per LIST)
            disable_nagle_algorithm = True

            def log_message(self, *args):  # quiet
                pass

            def _handle(self):
                path = urlsplit(self.path).path
                parts = unquote(path).lstrip("/").split("/", 1)
                bucket = parts[0] or "(service)"
                key = parts[1] if len(parts) > 1 else ""
                body = self._read_body()
                fault = proxy._fault_for(self.command, key)
                if fault == "reset":
                    self.close_connection = True
                    try:
                        self.connection.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    return
                if fault == "503":
                    msg = b"<Error><Code>SlowDown</Code><Message>injected by S3Proxy</Message></Error>"
                    self.send_response(503)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(msg)))
                    self.end_headers()
                    self.wfile.write(msg)
                    return
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=300)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                headers["Content-Length"] = str(len(body))
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                headers_out = resp.getheaders()
                conn.close()
                # count before answering: a client that reads the counters right after its
                # request returns must see that request
                copied = None
                src = self.headers.get("x-amz-copy-source")
                if src and resp.status < 300:
                    rng = _RANGE_RE.match(self.headers.get("x-amz-copy-source-range", ""))
                    # a whole-object copy does not say its size: the store is asked when the
                    # counters are read (settle), not while the copy waits for its answer
                    copied = int(rng.group(2)) - int(rng.group(1)) + 1 if rng else None
                    answer = {k.lower(): v for k, v in headers_out}
                with proxy.lock:
                    if proxy.log is not None:
                        proxy.log.append(
                            (self.command, bucket, key, urlsplit(self.path).query, resp.status, unquote(src or ""))
                        )
                    c = proxy.counters[bucket]
                    c.requests[self.command] += 1
                    decoded = self.headers.get("x-amz-decoded-content-length")
                    c.bytes_in += int(decoded) if decoded else len(body)
                    if self.command == "GET" and key:
                        c.bytes_out += len(data)
                    elif self.command == "GET":
                        c.listing_bytes += len(data)
                    if src and resp.status < 300:
                        if copied is None:
                            copied_version = answer.get("x-amz-copy-source-version-id")
                            made = answer.get("x-amz-version-id")
                            proxy.unsized.append((bucket, src, copied_version, key, made))
                        else:
                            proxy._count_copy(bucket, src, copied)
                # the store's own Date and Server, not the proxy's beside them (the s3 target reads
                # the store's clock and version from them)
                self.log_request(resp.status)
                self.send_response_only(resp.status, resp.reason)
                for k, v in headers_out:
                    if k.lower() not in _HOP and k.lower() != "content-length":
                        self.send_header(k, v)
                # a HEAD answers with the object's length and no body
                length = resp.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data))
                self.send_header("Content-Length", length)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _read_body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = bytearray()
                    while True:
                        line = self.rfile.readline()
                        size = int(line.split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return bytes(out)
                        out += self.rfile.read(size)
                        self.rfile.readline()
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n) if n else b""

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="s3proxy", daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        return self.url

    def _object_size(self, bucket: str, key: str, version: str | None) -> int:
        """Size of an object (at ``version``) by a HEAD through ``head_client``, 0 without one."""
        if self.head_client is None:
            return 0
        kw = {"VersionId": version} if version else {}
        return int(self.head_client.head_object(Bucket=bucket, Key=key, **kw)["ContentLength"])

    def stop(self):
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def __enter__(self) -> S3Proxy:
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()


def _serve_in_child(upstream_url: str, access_key: str, secret_key: str, conn) -> None:
    """The body of :class:`S3ProxyProcess`'s child: serve, answer commands until ``stop``."""
    from epochsync_dev.embedded import S3Endpoint

    head = S3Endpoint(upstream_url, access_key, secret_key).client()
    with S3Proxy(upstream_url, head_client=head) as proxy:
        conn.send(proxy.url)
        while True:
            cmd = conn.recv()
            if cmd == "stop":
                break
            if cmd == "reset":
                proxy.reset_counters()
                conn.send(None)
            elif cmd == "snapshot":
                conn.send(proxy.snapshot())


class S3ProxyProcess:
    """:class:`S3Proxy` in a child process, same ``url``/``reset_counters``/``snapshot``.

    For measurements: a proxy in the measured process takes its share of that process's
    interpreter (the GIL) while a tool run as a subprocess gets it for free. In its own
    process the proxy costs every tool the same.
    """

    def __init__(self, upstream_url: str, access_key: str, secret_key: str):
        self.args = (upstream_url, access_key, secret_key)
        self.url = ""
        self._proc = None
        self._conn = None

    def __enter__(self) -> S3ProxyProcess:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")  # no fork of a process that runs a JVM gateway and threads
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve_in_child, args=(*self.args, child), daemon=True, name="s3proxy")
        self._proc.start()
        if not self._conn.poll(60):
            self._proc.kill()
            raise RuntimeError("the S3 proxy process did not start within 60 s")
        self.url = self._conn.recv()
        return self

    @property
    def pid(self) -> int | None:
        """The proxy process's id (for measuring its CPU)."""
        return self._proc.pid if self._proc is not None else None

    def reset_counters(self) -> None:
        self._conn.send("reset")
        self._conn.recv()

    def snapshot(self) -> dict[str, dict]:
        self._conn.send("snapshot")
        return self._conn.recv()

    def __exit__(self, *exc) -> None:
        try:
            self._conn.send("stop")
        except OSError:
            pass
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
