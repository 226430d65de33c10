"""epochsync's Airflow operators: :class:`~epochsync.airflow.operators.stage.EpochStageOperator`, an
epoch's Spark stage as a client of the Spark Connect server."""
