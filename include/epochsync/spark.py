"""One Spark session builder for the Spark apps, the CLI and the test fixture."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def spark_session(
    app_name: str = "epochsync",
    *,
    master: str | None = None,
    shuffle_partitions: int | None = None,
    extra_conf: dict[str, str] | None = None,
):
    """Get or create the session.

    ``master`` defaults to ``$EPOCHSYNC_SPARK_MASTER``, else whatever spark-submit set,
    else ``local[2]``. The UI is off and shuffle partitions are few: epochs are small
    relative to a cluster, and 200 default partitions would cost more than the work.
    """
    from pyspark.sql import SparkSession

    # Executors must run the same interpreter as the driver (the venv with epochsync).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    master = master or os.environ.get("EPOCHSYNC_SPARK_MASTER")
    if master:
        builder = builder.master(master)
    elif "spark.master" not in _submitted_conf():
        builder = builder.master("local[2]")
    parts = shuffle_partitions or int(os.environ.get("EPOCHSYNC_SHUFFLE_PARTITIONS", "4"))
    conf = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(parts),
        "spark.default.parallelism": str(parts),
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.sources.partitionOverwriteMode": "dynamic",
        "spark.driver.memory": os.environ.get("EPOCHSYNC_DRIVER_MEMORY", "2g"),
        "spark.sql.adaptive.enabled": "true",
        "spark.python.worker.reuse": "true",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.driver.extraJavaOptions": "-Dderby.system.home=" + str(Path(os.environ.get("TMPDIR", "/tmp"))),
    }
    conf.update(extra_conf or {})
    for k, v in conf.items():
        builder = builder.config(k, v)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(os.environ.get("EPOCHSYNC_SPARK_LOG_LEVEL", "WARN"))
    return session


def _submitted_conf() -> dict[str, str]:
    """spark-submit passes its --master through this environment variable's conf."""
    from pyspark import SparkConf

    return dict(SparkConf().getAll())
