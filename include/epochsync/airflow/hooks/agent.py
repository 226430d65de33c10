"""The connection type ``epochsync_agent``: how the pipeline reaches the ``epochsync agent`` of each
Gluster server (a source's ``agent_conn_id``).

Its password is the agents' shared secret; its extras ``ca``, ``cert`` and ``key`` are the
paths of the operator's CA and of a client certificate and key, for TLS. The Airflow UI shows
the form for it (the provider registers the type: :mod:`epochsync.airflow.provider`), and
:meth:`EpochsyncAgentHook.get_settings` is what the cut and the pull read
(:func:`epochsync.stores.connections.resolve_agent`).
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook


class EpochsyncAgentHook(BaseHook):
    """The agents of a Gluster source, as one Airflow connection (see the module docstring)."""

    conn_name_attr = "agent_conn_id"
    default_conn_name = "epochsync_agent"
    conn_type = "epochsync_agent"
    hook_name = "epochsync agent"

    def __init__(self, agent_conn_id: str = default_conn_name, **kwargs):
        super().__init__(**kwargs)
        self.agent_conn_id = agent_conn_id

    def get_settings(self):
        """The agents' :class:`~epochsync.stores.connections.AgentSettings` of this connection."""
        from epochsync.stores.connections import resolve_agent

        return resolve_agent(self.agent_conn_id)

    def get_conn(self):
        """The connection's settings (an agent is reached per server, by the URL the source names)."""
        return self.get_settings()

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """The UI form: the secret as password, the TLS files in the extras; no host, port or login
        (each server's agent URL is in the source's ``agents``)."""
        return {
            "hidden_fields": ["host", "schema", "login", "port"],
            "relabeling": {"password": "Shared secret"},
            "placeholders": {
                "password": "the secret every agent of the source was started with",
                "extra": '{"ca": "/etc/epochsync/ca.pem", "cert": "/etc/epochsync/client.pem", "key": "/etc/epochsync/client.key"}',
            },
        }
