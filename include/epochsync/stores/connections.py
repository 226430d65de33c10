"""Resolve an Airflow connection id to S3 client settings, with or without Airflow.

Keys never live in code or config: the config names a ``conn_id`` and the
credentials come from ``AIRFLOW_CONN_<ID>`` (JSON or URI form, the same variable
Airflow itself reads) or, inside Airflow, from its connection store.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote, urlparse

from epochsync.core.errors import StoreError


@dataclass(frozen=True)
class S3Settings:
    """Plain, picklable client settings (shipped to Spark executors)."""

    conn_id: str
    endpoint_url: str | None = None
    access_key: str | None = None
    secret_key: str | None = None
    region: str = "us-east-1"

    def client(self, **kwargs):
        """A boto3 client for these settings (:func:`epochsync.stores.s3.make_client`'s policy)."""
        from epochsync.stores.s3 import make_client

        return make_client(self, **kwargs)

    def describe(self) -> str:
        """Returns the connection id and endpoint, for messages."""
        return f"{self.conn_id} ({self.endpoint_url or 'AWS default endpoint'})"


def _from_json(conn_id: str, text: str) -> S3Settings:
    d = json.loads(text)
    extra = d.get("extra") or {}
    if isinstance(extra, str):
        extra = json.loads(extra) if extra.strip() else {}
    host = d.get("host")
    endpoint = extra.get("endpoint_url") or (host if host and "://" in str(host) else None)
    return S3Settings(
        conn_id=conn_id,
        endpoint_url=endpoint,
        access_key=d.get("login") or extra.get("aws_access_key_id"),
        secret_key=d.get("password") or extra.get("aws_secret_access_key"),
        region=extra.get("region_name") or "us-east-1",
    )


def _from_uri(conn_id: str, text: str) -> S3Settings:
    u = urlparse(text)
    extra = dict(parse_qsl(u.query))
    return S3Settings(
        conn_id=conn_id,
        endpoint_url=extra.get("endpoint_url"),
        access_key=unquote(u.username) if u.username else None,
        secret_key=unquote(u.password) if u.password else None,
        region=extra.get("region_name") or "us-east-1",
    )


def _airflow_connection(conn_id: str, var: str):
    """Airflow's connection ``conn_id`` from its store, or None outside Airflow; a StoreError when
    Airflow does not know it."""
    try:
        from airflow.sdk import BaseHook
    except ImportError:
        return None
    try:
        return BaseHook.get_connection(conn_id)
    except Exception as exc:  # Airflow raises its own not-found types
        raise StoreError(f"connection {conn_id!r} is not defined: set ${var} or add it in Airflow ({exc})") from None


def resolve_s3(conn_id: str) -> S3Settings:
    """Settings for ``conn_id``: env var first, then Airflow's store if importable."""
    var = "AIRFLOW_CONN_" + conn_id.upper()
    text = os.environ.get(var)
    if text:
        try:
            return _from_json(conn_id, text) if text.lstrip().startswith("{") else _from_uri(conn_id, text)
        except (ValueError, AttributeError) as exc:
            raise StoreError(f"connection {conn_id!r}: cannot parse ${var}: {exc}") from None
    conn = _airflow_connection(conn_id, var)
    if conn is not None:
        extra = conn.extra_dejson or {}
        return S3Settings(
            conn_id=conn_id,
            endpoint_url=extra.get("endpoint_url") or None,
            access_key=conn.login or None,
            secret_key=conn.password or None,
            region=extra.get("region_name") or "us-east-1",
        )
    raise StoreError(
        f"connection {conn_id!r} is not defined: set ${var} (JSON: conn_type, login, password, extra.endpoint_url)"
    )


@dataclass(frozen=True)
class AgentSettings:
    """How to reach a source's agents: the shared secret (the connection's password) and, for TLS,
    the CA that signed the agents' certificates and this client's own (the connection's extras
    ``ca``, ``cert``, ``key``). Picklable: a pull's reader carries it to the executors."""

    conn_id: str
    secret: str
    ca: str | None = None
    cert: str | None = None
    key: str | None = None

    def client(self, url: str):
        """An :class:`epochsync.agent.client.AgentClient` of the agent at ``url``."""
        from epochsync.agent.client import AgentClient

        return AgentClient(url, self.secret, ca=self.ca, cert=self.cert, key=self.key)


def resolve_agent(conn_id: str) -> AgentSettings:
    """The agents' settings of connection ``conn_id``: ``$AIRFLOW_CONN_<ID>`` first (JSON, or a URI
    whose password is the secret), then Airflow's store; a StoreError when it has no password."""
    var = "AIRFLOW_CONN_" + conn_id.upper()
    text = os.environ.get(var)
    password: str | None = None
    extra: dict[str, Any] = {}
    if text:
        try:
            if text.lstrip().startswith("{"):
                d = json.loads(text)
                password, extra = d.get("password"), d.get("extra") or {}
                if isinstance(extra, str):
                    extra = json.loads(extra) if extra.strip() else {}
            else:
                u = urlparse(text)
                password, extra = (unquote(u.password) if u.password else None), dict(parse_qsl(u.query))
        except (ValueError, AttributeError) as exc:
            raise StoreError(f"connection {conn_id!r}: cannot parse ${var}: {exc}") from None
    else:
        conn = _airflow_connection(conn_id, var)
        if conn is None:
            raise StoreError(f"connection {conn_id!r} is not defined: set ${var} (JSON: password = the agents' secret)")
        password, extra = conn.password, conn.extra_dejson or {}
    if not password:
        raise StoreError(f"connection {conn_id!r} has no password: it is the agents' shared secret")
    return AgentSettings(conn_id, password, extra.get("ca"), extra.get("cert"), extra.get("key"))
