"""epochsync's Airflow hooks: :class:`~epochsync.airflow.hooks.agent.EpochsyncAgentHook`, the
connection type of the Gluster servers' agents."""
