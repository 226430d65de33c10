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
    submitted_master = _submitted_conf().get("spark.master")
    if master:
        builder = builder.master(master)
    elif not submitted_master:
        builder = builder.master("local[2]")
    effective_master = master or submitted_master or "local[2]"
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
    if spark_profile(effective_master) == "small":
        # Epoch jobs on one machine are many small queries: compiling generated code and
        # C2-optimizing the JVM cost more than they save (measured: the merge rule tests
        # ran 187 s -> 140 s with C1 only). Interpreted expressions instead of Janino-compiled
        # ones, and static plans instead of adaptive re-planning (one job per query rather than
        # one per shuffle stage), cut a small epoch's merge from about 13 to 5 JVM CPU-seconds.
        # Clusters and benchmarks keep Spark's defaults.
        conf["spark.sql.codegen.wholeStage"] = "false"
        conf["spark.sql.codegen.factoryMode"] = "NO_CODEGEN"
        conf["spark.sql.adaptive.enabled"] = "false"
        conf["spark.driver.extraJavaOptions"] += " " + SMALL_JVM_OPTIONS
    conf.update(extra_conf or {})
    for k, v in conf.items():
        builder = builder.config(k, v)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(os.environ.get("EPOCHSYNC_SPARK_LOG_LEVEL", "WARN"))
    return session


#: JVM options of the "small" profile (also exported as SPARK_SUBMIT_OPTS by the demo,
#: the tests and make airflow, so spark-submit's driver JVM starts with them).
SMALL_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def spark_profile(master: str) -> str:
    """``small`` (local masters: fast start, interpreted SQL) or ``default`` (Spark's own settings).

    ``$EPOCHSYNC_SPARK_PROFILE`` overrides: the benchmarks run with ``default``.
    """
    forced = os.environ.get("EPOCHSYNC_SPARK_PROFILE")
    if forced:
        return forced
    return "small" if master.startswith("local") else "default"


def _submitted_conf() -> dict[str, str]:
    """spark-submit passes its --master through this environment variable's conf."""
    from pyspark import SparkConf

    return dict(SparkConf().getAll())
