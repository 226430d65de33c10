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


def jvm_options() -> str:
    """``SPARK_SUBMIT_OPTS`` for local stages: the small profile's JVM options, plus the
    class-data archive (:func:`ensure_cds_archive`) when one was built for this JDK and Spark.

    Measured on this machine: a trivial spark-submit went from 8.6 s wall (9.8 CPU-s) to
    5.3 s (6.3 CPU-s) with the archive; every epoch DAG run pays five of them.
    """
    path = cds_archive_path()
    if path is not None and path.exists():
        return f"{SMALL_JVM_OPTIONS} -XX:SharedArchiveFile={path} -Xshare:auto"
    return SMALL_JVM_OPTIONS


def _java() -> str | None:
    import shutil

    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return os.path.join(home, "bin", "java")
    return shutil.which("java")


def cds_archive_path() -> Path | None:
    """``build/spark-cds-<key>.jsa``: the key covers the JDK build and Spark's jars, so a new
    JDK or Spark gets a new archive (a stale one would only be ignored by the JVM, slower)."""
    import hashlib
    import subprocess

    if os.environ.get("EPOCHSYNC_SPARK_CDS", "1") in ("0", "false", "no"):
        return None
    java = _java()
    if java is None:
        return None
    try:
        import pyspark

        jars = Path(pyspark.__file__).parent / "jars"
        version = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    except (ImportError, OSError, subprocess.SubprocessError):
        return None
    digest = hashlib.sha256(version.encode())
    for jar in sorted(jars.glob("*.jar")):
        digest.update(f"{jar.name}:{jar.stat().st_size}\n".encode())
    from epochsync.paths import build_dir

    try:
        return build_dir() / f"spark-cds-{digest.hexdigest()[:12]}.jsa"
    except OSError:
        return None


def ensure_cds_archive(say=None, timeout: float = 300) -> Path | None:
    """Build the JVM class-data archive for spark-submit once (about 15 s), by running
    ``spark_apps/warmup.py`` (the queries the stages use) with ``-XX:ArchiveClassesAtExit``.

    Returns the archive, or None (no java, disabled with ``EPOCHSYNC_SPARK_CDS=0``, or the
    build failed: then stages simply start without it).
    """
    import subprocess
    import sys
    import uuid

    path = cds_archive_path()
    if path is None or path.exists():
        return path
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    say(f"building the JVM class-data archive for spark-submit (once): {path}")
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    from epochsync.paths import project_dir

    app = project_dir() / "spark_apps" / "warmup.py"
    env = dict(os.environ)
    env["SPARK_SUBMIT_OPTS"] = f"{SMALL_JVM_OPTIONS} -XX:ArchiveClassesAtExit={tmp}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH")]))
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    submit = str(Path(sys.executable).parent / "spark-submit")
    try:
        done = subprocess.run([submit, "--master", "local[2]", str(app)], env=env, capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip
        if done.returncode == 0 and tmp.exists():
            os.replace(tmp, path)  # atomic: a concurrent builder's archive is as good
            return path
        say(f"class-data archive not built (spark-submit exited {done.returncode}): {done.stderr.strip()[-300:]}")
    except (OSError, subprocess.SubprocessError) as exc:
        say(f"class-data archive not built: {exc}")
    finally:
        if tmp.exists():
            tmp.unlink()
    return None


def warmup_main() -> int:
    """``spark_apps/warmup.py``: the kinds of queries the stages run, so their classes are archived."""
    import tempfile

    spark = spark_session("epochsync-warmup")
    with tempfile.TemporaryDirectory() as d:
        df = spark.range(2000).selectExpr(
            "id % 97 AS fid", "id AS ord", "named_struct('s', id, 'e', id + 10) AS iv", "array(id, id + 1) AS a",
            "cast(id AS string) AS name",
        )  # fmt: skip
        df.write.mode("overwrite").partitionBy("fid").parquet(d + "/t")
        back = spark.read.parquet(d + "/t")
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        w = Window.partitionBy("fid").orderBy("ord")
        agg = (
            back.select("*", F.explode("a").alias("x"), F.max("ord").over(w).alias("m"), F.lead("ord").over(w).alias("n"))
            .groupBy("fid")
            .agg(F.max(F.struct("ord", "name")).alias("l"), F.collect_list("iv").alias("ivs"), F.count_if(F.col("x") > 3))
        )  # fmt: skip
        joined = agg.join(back.select("fid", "name"), "fid", "full").join(agg.select("fid"), "fid", "left_anti")
        joined.write.mode("overwrite").parquet(d + "/u")
        spark.read.parquet(d + "/u").count()
        import pyarrow as pa

        def arrow(batches):
            for b in batches:
                yield pa.RecordBatch.from_pydict({"n": [b.num_rows]})

        spark.range(10, numPartitions=2).mapInArrow(arrow, "n long").collect()
        spark.sparkContext.parallelize(range(4), 2).map(lambda x: x * 2).collect()
    spark.stop()
    return 0


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
