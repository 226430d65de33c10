"""What the agent and its clients agree on: the requests, how one is signed, the refusals.

Every request is HTTP (over TLS when the agent has a certificate) and carries
``X-Epochsync-Auth: <unix seconds>:<hex HMAC-SHA256>``, the HMAC of
``METHOD\\nPATH?QUERY\\nSECONDS\\nSHA256(BODY)`` keyed with the shared secret (an Airflow
connection's password on the pipeline's side, a file only root reads on the server's). A
signature older or newer than :data:`MAX_SKEW_S` is refused, so a captured request cannot be
replayed later. There is no anonymous mode: an agent without a secret does not start.

A refusal is a status and a JSON body ``{"error": kind, "message": one line}``; the client raises
the :class:`AgentError` subclass of that kind, whose message names what was refused and why.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time

from epochsync.core.errors import SourceError

#: seconds a signature stays valid either side of the agent's clock
MAX_SKEW_S = 300
#: the header that carries the signature
AUTH_HEADER = "X-Epochsync-Auth"
#: the largest byte range one read returns (a client splits larger ones)
MAX_READ = 64 << 20
#: a gfid as Gluster writes it
GFID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
#: names the agent gives snapshots and accepts: a cut's (``epoch-0000000012``) or a test's
SNAPSHOT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
#: the changelog files a client may ask for, by name
CHANGELOG_NAME = re.compile(r"CHANGELOG\.\d+|HTIME\.\d+|CHANGELOG")


class AgentError(SourceError):
    """An agent refused a request or could not be reached; the message says which and why."""

    kind = "failed"
    status = 500


class AgentAuthError(AgentError):
    """The request's signature is wrong, missing or too old (a wrong secret, a clock off)."""

    kind = "auth"
    status = 401


class AgentPathError(AgentError):
    """The request names something outside the agent's own snapshots (a path, a bad name)."""

    kind = "path"
    status = 403


class AgentNotFound(AgentError):
    """No file of that gfid in the snapshot (or no such brick)."""

    kind = "not-found"
    status = 404


class AgentGone(AgentError):
    """The snapshot asked for does not exist (purged, or never taken)."""

    kind = "gone"
    status = 410


class AgentUnreachable(AgentError):
    """The agent could not be reached (its server down or cut off, the agent not running)."""

    kind = "unreachable"
    status = 599  # never sent: the client's own


class AgentBadRequest(AgentError):
    """The request is malformed (a body that is not what the request takes)."""

    kind = "bad-request"
    status = 400


class AgentBusy(AgentError):
    """The agent is serving as many requests as it allows; try again."""

    kind = "busy"
    status = 503


ERRORS = {
    cls.kind: cls
    for cls in (
        AgentError,
        AgentAuthError,
        AgentPathError,
        AgentNotFound,
        AgentGone,
        AgentBadRequest,
        AgentBusy,
        AgentUnreachable,
    )
}


def sign(secret: bytes, method: str, target: str, body: bytes, now: float | None = None) -> str:
    """The :data:`AUTH_HEADER` value for a request to ``target`` (path and query)."""
    seconds = int(now if now is not None else time.time())
    return f"{seconds}:{_mac(secret, method, target, seconds, body)}"


def verify(secret: bytes, header: str | None, method: str, target: str, body: bytes, now: float | None = None) -> None:
    """Raises :class:`AgentAuthError` unless ``header`` signs this request with ``secret``, recently."""
    if not header or ":" not in header:
        raise AgentAuthError(f"no {AUTH_HEADER} header: every request to the agent is signed with its secret")
    stamp, _, mac = header.partition(":")
    try:
        seconds = int(stamp)
    except ValueError:
        raise AgentAuthError(f"{AUTH_HEADER}: {stamp!r} is not a time") from None
    now = now if now is not None else time.time()
    if abs(now - seconds) > MAX_SKEW_S:
        raise AgentAuthError(
            f"the request was signed {now - seconds:+.0f} s from the agent's clock (at most {MAX_SKEW_S} s either way)"
        )
    if not hmac.compare_digest(mac, _mac(secret, method, target, seconds, body)):
        raise AgentAuthError("wrong signature: the client's secret is not this agent's")


def _mac(secret: bytes, method: str, target: str, seconds: int, body: bytes) -> str:
    msg = f"{method}\n{target}\n{seconds}\n{hashlib.sha256(body).hexdigest()}".encode()
    return hmac.new(secret, msg, hashlib.sha256).hexdigest()
