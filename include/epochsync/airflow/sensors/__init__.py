"""epochsync's Airflow sensors: the epoch closed on every server
(:mod:`~epochsync.airflow.sensors.epoch_closed`), and the previous epoch committed
(:mod:`~epochsync.airflow.sensors.previous_epoch`)."""
