"""``wait_epoch_closed``: the epoch DAG's first task, a sensor that waits until every server of the
source has closed the run's epochs, then publishes them for the run's other tasks."""

from __future__ import annotations

from airflow.sdk import BaseSensorOperator, PokeReturnValue

from epochsync.airflow.tasks import RunEpochs, committed_epoch, missing_epoch_servers, resolve_run_epochs
from epochsync.core.config import load_config


class EpochClosedSensor(BaseSensorOperator):
    """Waits until every server of the source has closed the run's epoch; publishes the run's epochs.

    Reschedule mode by default (no worker slot held while waiting). On timeout the
    task fails with the servers still missing their ``EPOCH`` record, by name.
    """

    template_fields = ("config_path",)

    def __init__(self, *, config_path: str, source: str, target: str, **kwargs):
        kwargs.setdefault("mode", "reschedule")
        super().__init__(**kwargs)
        self.config_path = config_path
        self.source = source
        self.target = target
        self._missing: list[str] = []
        self._epochs: RunEpochs | None = None

    def poke(self, context) -> PokeReturnValue:
        """Returns done, with the run's epochs as XCom, once the last of them is closed on every server."""
        config = load_config(self.config_path)
        src = config.source(self.source)
        params = dict(context["params"])
        committed = None
        if int(params.get("max_epochs_per_run") or 1) > 1:
            committed = committed_epoch(config, self.target)
        epochs = resolve_run_epochs(
            start=src.epoch.start,
            interval_s=src.epoch.interval_s,
            params=params,
            data_interval_end=context.get("data_interval_end"),
            committed=committed,
        )
        self._epochs = epochs
        # E closed implies every earlier epoch closed: checking the last is enough
        self._missing = missing_epoch_servers(config, self.source, epochs.through)
        if self._missing:
            self.log.info(
                "epoch %d of %s not closed yet: waiting for EPOCH records from %s",
                epochs.through,
                self.source,
                ", ".join(self._missing),
            )
            return PokeReturnValue(is_done=False)
        from epochsync.airflow.sensors.previous_epoch import record_run
        from epochsync.journal.undo import mark_closed_seen

        mark_closed_seen(config.warehouse, self.target, epochs.through)
        ti = context["ti"]
        # the run's epochs on record: a later epoch's wait_previous_epoch waits for this run
        record_run(config.warehouse, self.target, ti.dag_id, ti.run_id, epochs.first, epochs.through)
        feed = config.target(self.target).kind == "feed"
        self.log.info(
            "epoch %d of %s is closed; this run %s epochs %d..%d %s %s%s",
            epochs.through,
            self.source,
            "publishes" if feed else "replicates",
            epochs.first,
            epochs.through,
            "to feed" if feed else "into",
            self.target,
            (" (dry run: stops after merge)" if feed else " (dry run: stops after translate)")
            if epochs.dry_run
            else "",
        )
        return PokeReturnValue(is_done=True, xcom_value=epochs.as_xcom())

    def execute(self, context):
        """Wait like any sensor; returns what the sensor pushes, and a timeout names the servers still
        missing their EPOCH record."""
        from airflow.sdk.exceptions import AirflowSensorTimeout

        try:
            return super().execute(context)
        except AirflowSensorTimeout as exc:
            epoch = self._epochs.through if self._epochs else "?"
            raise AirflowSensorTimeout(
                f"epoch {epoch} of source {self.source!r} did not close within {self.timeout:.0f}s: "
                f"servers still missing their EPOCH record: {', '.join(self._missing) or '(unknown)'}; "
                f"check that their changelog readers run and publish to the changelog URI ({exc})"
            ) from exc
