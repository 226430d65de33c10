"""One way to get a Spark session, for the CLI, the Airflow tasks, the benchmarks and the tests.

Every stage is a client of **one long-lived Spark application**: a Spark Connect server
(``sc://host:port``), started by ``make demo``, ``make airflow`` and the tests
(:class:`epochsync_dev.embedded.SparkConnectServer`), or run on a cluster. Where the remote
comes from, first found wins:

1. the ``remote`` argument (Airflow tasks: the ``spark_connect`` connection);
2. ``$EPOCHSYNC_SPARK_REMOTE`` (or Spark's own ``$SPARK_REMOTE``);
3. the config's ``spark.remote`` key (``Config.spark_remote``), passed by the CLI.

Without any, the CLI falls back to an in-process local session (``local[2]``, a JVM of its
own: about 10 s to start), so ``epochsync replicate`` works on a laptop with nothing running.

A Connect session gets the ``epochsync`` package as a Python artifact
(:func:`ship_package`): the server's executors import it from there, so the server needs
nothing of ours installed. Code that runs on Spark uses the DataFrame API only (no RDDs,
Spark contexts, accumulators or JVM handles), so the same code runs on both kinds of session.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import tempfile
import threading
import zipfile
from pathlib import Path

from epochsync.spark_server import (
    SMALL_JVM_OPTIONS,
    SMALL_SQL_CONF,
    autostart_enabled,
    ensure_server,
    spark_profile,
)

#: environment variable naming the Spark Connect server (``sc://127.0.0.1:15002``)
REMOTE_ENV = "EPOCHSYNC_SPARK_REMOTE"
#: the Airflow connection (provider type ``spark_connect``) the stage tasks use
SPARK_CONN_ID = "spark_connect_default"

#: SQL settings of every epochsync session (Connect or classic)
SESSION_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.sources.partitionOverwriteMode": "dynamic",
    # The merge's plan is wide (dozens of CASE columns over several joins): inferring
    # constraints through it was about half of a small epoch's merge (3.6 -> 2.0 s, the
    # optimizer alone); the filters it would add are on join keys that are never null.
    "spark.sql.constraintPropagation.enabled": "false",
    # A Connect session caches analyzed plans, data source reads included: a read of a
    # warehouse table resolved by an earlier run on the same session (a DAG run's tasks,
    # replicate's per-target session) would keep that run's file listing after the table
    # was rewritten, and fail with FILE_NOT_EXIST (seen after an interrupted replicate).
    "spark.connect.session.planCache.enabled": "false",
}

DEFAULT_SHUFFLE_PARTITIONS = 4


def resolve_remote(remote: str | None = None, cfg=None) -> str | None:
    """The Spark Connect URL to use, or None for an in-process local session (see module doc)."""
    return (
        remote
        or os.environ.get(REMOTE_ENV)
        or os.environ.get("SPARK_REMOTE")
        or (getattr(cfg, "spark_remote", None) if cfg is not None else None)
        or None
    )


def spark_session(
    app_name: str = "epochsync",
    *,
    remote: str | None = None,
    cfg=None,
    master: str | None = None,
    shuffle_partitions: int | None = None,
    extra_conf: dict[str, str] | None = None,
    session_key: str | None = None,
):
    """A prepared session: Connect when a remote is configured (see :func:`resolve_remote`),
    else classic in-process on ``master`` (default ``$EPOCHSYNC_SPARK_MASTER`` or ``local[2]``).

    ``session_key`` (Connect only): open the server-side session named by it and the
    package's content hash (:func:`run_session_remote`) instead of a new one, and keep it
    when this client stops: runs with the same key (``epochsync replicate`` of one target,
    again and again) find its package and Python workers warm, and a changed package gets a
    session of its own.
    """
    url = None if master else resolve_remote(remote, cfg)
    if url is None and master is None and autostart_enabled():
        # no server configured: the local one this and later commands share (started if need be)
        url = ensure_server(progress=lambda line: print(f"epochsync: {line}", file=sys.stderr, flush=True))
    if url:
        from pyspark.sql import SparkSession

        key = f"{session_key}/{os.path.basename(package_zip())}" if session_key else None

        def connect(target: str):
            try:
                builder = SparkSession.builder.remote(target)
                # a keyed session is that session, whatever other session this process holds
                return builder.create() if key else builder.getOrCreate()
            except Exception as exc:  # grpc's errors are many; one line says what to check
                from epochsync.core.errors import EpochsyncError

                raise EpochsyncError(
                    f"cannot reach the Spark Connect server {url}: {str(exc).splitlines()[0][:300]} "
                    f"(is it running? {REMOTE_ENV} or the config's spark.remote name it)"
                ) from None

        check_reachable(url)
        if not key or "session_id=" in url:
            session = connect(url)
            exit_without_retries(session)
        else:
            # renewed first when the server has closed it (open_keyed_remote)
            session = connect(open_keyed_remote(url, key))
            session.release_session_on_close = False
            exit_without_retries(session)
    else:
        session = _classic_session(app_name, master, extra_conf)
    return prepare_session(session, shuffle_partitions=shuffle_partitions, extra_conf=extra_conf)


def check_reachable(url: str, timeout: float = 5.0) -> None:
    """Raise ``EpochsyncError`` at once when nothing listens at the Connect URL's host and port.

    The client opens no connection before its first request and then retries for about 10
    minutes: ``epochsync replicate`` against a server that is not running would hang that
    long before saying so.
    """
    import socket
    from urllib.parse import urlparse

    from epochsync.core.errors import EpochsyncError

    u = urlparse(url.split(";", 1)[0])
    host, port = u.hostname or "localhost", u.port or 15002
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as exc:
        raise EpochsyncError(
            f"cannot reach the Spark Connect server {url.split(';', 1)[0]}: {exc.strerror or exc} "
            f"(is it running? {REMOTE_ENV} or the config's spark.remote name it)"
        ) from None


def exit_without_retries(session) -> None:
    """At interpreter exit, let ``session``'s client give up its requests after the try in hand.

    A Connect client sends requests after a query (the release of its buffered results, in
    threads) and at exit (its ML cache clean-up, a session release), each under a retry
    policy of up to 15 tries over about 10 minutes. When the server has gone (stopped,
    crashed, restarted) the process then hangs after its last line while those retries
    wait: measured, more than 5 minutes, and ``epochsync replicate`` would hang so after
    reporting the lost server. At exit this sets the client's retry policies to no more
    tries, in place, so the release threads stop after the wait in hand (the interpreter
    joins them before the ``atexit`` hooks run, hence ``threading``'s own exit hook, which
    runs first) and the client's clean-up tries once. A live server still answers that try.
    """
    import threading

    client = session.client

    def no_retries() -> None:
        import warnings

        warnings.filterwarnings("ignore", message=r"\[RETRIES_EXCEEDED\]")  # one try is what this asks for
        try:
            for policy in client.get_retry_policies():  # the objects the running retries read
                policy.max_retries = 0
            client.set_retry_policies([])
        except Exception:  # nothing to do on a client without them
            pass

    try:
        threading._register_atexit(no_retries)  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):  # another Python, or the interpreter is already exiting
        pass


def _classic_session(app_name: str, master: str | None, extra_conf: dict[str, str] | None):
    from pyspark.sql import SparkSession

    # executors run the interpreter that has epochsync and its dependencies
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    master = master or os.environ.get("EPOCHSYNC_SPARK_MASTER") or "local[2]"
    conf = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": os.environ.get("EPOCHSYNC_DRIVER_MEMORY", "2g"),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.python.worker.reuse": "true",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.driver.extraJavaOptions": f"{SMALL_JVM_OPTIONS} -Dderby.system.home={tempfile.gettempdir()}",
    }
    conf.update(extra_conf or {})
    builder = SparkSession.builder.appName(app_name).master(master)
    for k, v in conf.items():
        builder = builder.config(k, v)
    return builder.getOrCreate()


def is_connect(spark) -> bool:
    """True for a Spark Connect session (a client of a server), False for a classic one."""
    if isinstance(spark, LazySession):
        spark = spark.session()
    return type(spark).__module__.startswith("pyspark.sql.connect")


class LazySession:
    """A Spark session opened the first time something other than tagging asks for it.

    ``epochsync replicate`` hands one to every stage: a stage whose work is small enough to
    run in this process (an empty epoch, a small ingest, merge or apply: ``docs/INTERNALS.md``,
    "Small epochs in this process") never calls it, and an epoch whose stages all stay here
    neither imports pyspark nor connects (nor starts the local server). Tags added before
    the session exists are added to it when it opens.
    """

    def __init__(self, opener) -> None:
        self._opener = opener
        self._session = None
        self._tags: list[str] = []

    @property
    def opened(self):
        """The session if it has been opened, else None."""
        return self._session

    def session(self):
        """The session, opened now if need be."""
        if self._session is None:
            self._session = self._opener()
            for tag in self._tags:
                self._session.addTag(tag)
        return self._session

    def addTag(self, tag: str) -> None:  # noqa: N802 (pyspark's name)
        """Tag the session's jobs from now on (kept until the session opens)."""
        self._tags.append(tag)
        if self._session is not None:
            self._session.addTag(tag)

    def removeTag(self, tag: str) -> None:  # noqa: N802 (pyspark's name)
        """Stop tagging with ``tag``."""
        if tag in self._tags:
            self._tags.remove(tag)
        if self._session is not None:
            self._session.removeTag(tag)

    def __getattr__(self, name: str):
        return getattr(self.session(), name)


def prepare_session(spark, *, shuffle_partitions: int | None = None, extra_conf: dict[str, str] | None = None):
    """Give ``spark`` epochsync's SQL settings and, on Connect, the package; returns it.

    Idempotent; the Airflow tasks call it on the session the provider built.
    """
    parts = shuffle_partitions or int(os.environ.get("EPOCHSYNC_SHUFFLE_PARTITIONS", DEFAULT_SHUFFLE_PARTITIONS))
    conf = dict(SESSION_CONF)
    conf["spark.sql.shuffle.partitions"] = str(parts)
    if spark_profile(session_master(spark)) == "small":
        conf.update(SMALL_SQL_CONF)
    for k, v in (extra_conf or {}).items():
        if k.startswith("spark.sql."):
            conf[k] = v
    set_confs(spark, conf)
    if is_connect(spark):
        ship_package(spark)
    return spark


def set_confs(spark, conf: dict[str, str]) -> None:
    """Set session settings: on Connect every one in a single request."""
    set_all = getattr(spark.conf, "_set_all", None)
    if set_all is not None:
        set_all(conf, silent=False)
    else:
        for k, v in conf.items():
            spark.conf.set(k, v)


def session_master(spark) -> str:
    """The master of the application behind ``spark`` (``local[2]``, ``spark://…``)."""
    try:
        return spark.conf.get("spark.master", "local") or "local"
    except Exception:  # a server that hides it: treat as a cluster
        return "cluster"


def executor_slots(spark) -> int:
    """Task slots of the application: ``spark.default.parallelism`` when set, else the master's cores."""
    try:
        value = spark.conf.get("spark.default.parallelism", None)
        if value:
            return max(1, int(value))
    except Exception:  # a Connect server may refuse to show a static setting
        pass
    m = re.fullmatch(r"local\[(\d+)\]", session_master(spark))
    return int(m.group(1)) if m else 2


def task_failure_cause(exc: BaseException) -> str:
    """The last Python exception line inside a Spark task failure."""
    text = str(exc)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ("Error:" in ln or "Failure:" in ln or "Exception:" in ln) and not ln.startswith("at "):
            if "py4j" in ln or "org.apache.spark" in ln:
                continue
            return ln
    return lines[0] if lines else type(exc).__name__


def run_report_tasks(spark, n: int, task, *, tag: str, what: str) -> list[dict]:
    """Run ``task(index)`` for every index below ``n`` as one Spark job of ``n`` tasks; returns
    the dicts the tasks yielded.

    ``mapInArrow`` over task numbers (``task`` and what it closes over travel with the job;
    each dict comes back as a JSON row). The job carries the session tag ``tag``. On any exit
    while it runs, a signal too (KeyboardInterrupt, the shutdown's exit), the tag is
    interrupted: the job runs on the server, not in this process, and a task that had not
    started yet would otherwise go on after the caller has moved on (after a rollback, for
    apply). A task failure becomes one ``EpochsyncError`` line: ``<what> failed on an
    executor: <cause>``.
    """
    import json

    from epochsync.core.errors import EpochsyncError

    def run(batches):
        import pyarrow as pa

        for b in batches:
            for index in b.column(0).to_pylist():
                for r in task(index):
                    yield pa.RecordBatch.from_pydict({"report": [json.dumps(r)]})

    spark.addTag(tag)
    try:
        rows = spark.range(0, n, 1, numPartitions=n).mapInArrow(run, "report string").collect()
    except BaseException as exc:
        try:
            spark.interruptTag(tag)
        except Exception:  # the job is already over; nothing left to interrupt
            pass
        if not isinstance(exc, Exception):
            raise
        raise EpochsyncError(f"{what} failed on an executor: {task_failure_cause(exc)}") from None
    finally:
        spark.removeTag(tag)
    return [json.loads(r["report"]) for r in rows]


def collect_arrow(df):
    """``df``'s rows as an Arrow table, in one request.

    pyspark's Connect ``toArrow()`` first asks the server for the schema (an analysis of the
    whole plan) and then runs it (analyzed again): on the merge's plan that first request
    was half of the stage (1.4 of 2.8 s, cProfile, 2026-11-27). The execute request alone
    returns the Arrow batches with their types; a classic session has no such cost.
    """
    to_table = getattr(df, "_to_table", None)
    if is_connect(df.sparkSession) and to_table is not None:
        return to_table()[0]
    return df.toArrow()


#: inputs below this many rows are planned for one partition without broadcast joins
TINY_INPUT_ROWS = 20_000


def size_partitions(
    spark, rows: int, *, per_partition: int = 200_000, most: int | None = None, extra: dict[str, str] | None = None
) -> int:
    """Set the session's shuffle partitions for an input of about ``rows`` rows; returns the number.

    A tiny input (below :data:`TINY_INPUT_ROWS`) gets one partition and no broadcast joins:
    on a warm server its cost is Spark's per-job and per-task overhead, not data, and a
    broadcast is a job of its own (measured on a 1,700-record merge: 25 jobs and 51 stages
    became 7 jobs and 24 stages, about 5 s to 3-4 s; docs/INTERNALS.md). Larger inputs get
    enough partitions that each stays in memory, and the server's broadcast threshold.
    ``extra``: more session settings, sent in the same request.
    """
    most = most or int(os.environ.get("EPOCHSYNC_MAX_SHUFFLE_PARTITIONS", "64"))
    conf = dict(extra or {})
    if rows < TINY_INPUT_ROWS:
        n = 1
        conf["spark.sql.autoBroadcastJoinThreshold"] = "-1"
    else:
        n = max(2, min(most, -(-max(rows, 1) // per_partition)))
        spark.conf.unset("spark.sql.autoBroadcastJoinThreshold")
    conf["spark.sql.shuffle.partitions"] = str(n)
    set_confs(spark, conf)
    return n


# --------------------------------------------------------------------------- the package as an artifact

_shipped: dict[str, str] = {}
_ship_lock = threading.Lock()


def package_sources() -> list[tuple[str, Path]]:
    """(name in zip, file) for every source file of the package, in a stable order."""
    import epochsync

    root = Path(epochsync.__file__).resolve().parent
    out = []
    for path in sorted(root.rglob("*")):
        inside = path.relative_to(root).parts[:-1]  # no caches (__pycache__, .ruff_cache): they change the hash
        if (
            path.is_file()
            and not any(d == "__pycache__" or d.startswith(".") for d in inside)
            and path.suffix not in (".pyc", ".pyo")
        ):
            out.append(("epochsync/" + path.relative_to(root).as_posix(), path))
    return out


def package_zip() -> str:
    """Path of ``epochsync-<hash>.zip`` holding the package; built once per distinct source tree.

    Built from the sources on disk, so a clean checkout needs no build step; a changed
    source gives a new name (content hash), so a running job never sees a half-written zip.
    """
    from epochsync.warehouse.paths import build_dir

    sources = package_sources()
    digest = hashlib.sha256()
    for name, path in sources:
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    target = build_dir() / f"epochsync-{digest.hexdigest()[:16]}.zip"
    if target.exists():
        return str(target)
    fd, tmp = tempfile.mkstemp(prefix=".epochsync-", suffix=".zip", dir=target.parent)
    os.close(fd)
    try:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, path in sources:
                info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))  # same sources, same bytes
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = 0o644 << 16
                zf.writestr(info, path.read_bytes())
        os.replace(tmp, target)  # atomic: concurrent builders write the same bytes
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return str(target)


#: session conf naming the package zip a Connect session already holds (sessions outlive
#: processes: the tasks of a DAG's runs share one, see :func:`open_keyed_remote`)
SHIPPED_CONF = "epochsync.package"


def ship_package(spark) -> str:
    """Add the package zip to a Connect session's Python path (executors import it), once per session;
    returns the zip's path.

    The session remembers what it holds in :data:`SHIPPED_CONF`, so a second process on the
    same session (the next task of a DAG run) neither uploads the zip again nor starts new
    Python workers.
    """
    key = getattr(spark, "session_id", None) or str(id(spark))
    with _ship_lock:
        if key in _shipped:
            return _shipped[key]
        path = package_zip()
        name = os.path.basename(path)
        if spark.conf.get(SHIPPED_CONF, None) != name:
            spark.addArtifacts(path, pyfile=True)
            spark.conf.set(SHIPPED_CONF, name)
        _shipped[key] = path
        return path


def is_session_closed(exc: BaseException) -> bool:
    """The server closed the session this client named (idle timeout, or released)."""
    return "SESSION_CLOSED" in str(exc) or "SESSION_NOT_FOUND" in str(exc)


def _generation_file(key: str) -> Path:
    from epochsync.warehouse.paths import build_dir

    return build_dir() / "spark-sessions" / hashlib.sha256(key.encode()).hexdigest()[:24]


def keyed_remote(url: str, key: str, *, renew: bool = False) -> str:
    """``url`` naming the kept session of ``key`` (:func:`run_session_remote` of the key and
    its generation). A session the server has closed (idle past its timeout) cannot be
    opened again under its id: ``renew=True`` moves the key to a new generation, which the
    next runs on this machine then use too."""
    path = _generation_file(key)
    try:
        gen = path.read_text().strip() or "0"
    except FileNotFoundError:
        gen = "0"
    if renew:
        import uuid

        gen = uuid.uuid4().hex
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{gen}")
        tmp.write_text(gen)
        os.replace(tmp, path)
    return run_session_remote(url, f"{key}/{gen}")


def open_keyed_remote(url: str, key: str) -> str:
    """:func:`keyed_remote` of ``key``, moved to a new generation first when the server has
    closed that session (idle past ``defaultSessionTimeout``, or released).

    For URLs handed to code that sets options on the session before any of ours runs: the
    provider's ``PySparkOperator`` calls ``getOrCreate()`` with the task's conf, and on a
    closed session that fails with ``SESSION_CLOSED`` before the stage could renew it. One
    request (a conf read, which also creates the session on the server when it is new).
    """
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    check_reachable(url)
    remote = keyed_remote(url, key)
    probe = SparkSession.builder.remote(remote).create()
    assert isinstance(probe, ConnectSession)  # a builder with a remote URL makes a Connect session
    probe.release_session_on_close = False  # stop() closes this client only
    exit_without_retries(probe)
    try:
        probe.conf.get("spark.sql.session.timeZone")
    except Exception as exc:
        if not is_session_closed(exc):
            raise
        remote = keyed_remote(url, key, renew=True)
    finally:
        probe.stop()
    return remote


def forget_default_session() -> None:
    """Unset this process's default and active Spark Connect session (without stopping it).

    ``SparkSession.builder.getOrCreate()`` returns the process's default session whatever
    URL its conf names: one left behind by an earlier task of the process (``dag.test()``
    runs every task in one) would silently take a stage onto another session or server.
    """
    try:
        from pyspark.sql.connect.session import SparkSession as ConnectSession
    except ImportError:  # no Connect client: nothing to forget
        return
    with ConnectSession._lock:
        ConnectSession._default_session = None
    ConnectSession._active_session.session = None


def base_remote(spark) -> str:
    """The ``sc://`` URL of ``spark``'s server, its parameters but the session id kept."""
    u = spark.client._builder.url
    params = [p for p in (u.params or "").split(";") if p and not p.startswith("session_id=")]
    return f"sc://{u.netloc}/" + (";" + ";".join(params) if params else "")


def run_session_remote(url: str, run_key: str) -> str:
    """``url`` naming the Connect session of ``run_key`` (a key and its generation, through
    :func:`keyed_remote`): every client of the key opens the same server-side session, so
    the package is shipped once and the Python workers the first one started serve the
    next ones (a fresh session costs about 1 s of worker start before its first Python step).

    The session id is a UUID derived from ``run_key``; the server drops the session when it
    has been idle for ``spark.connect.session.manager.defaultSessionTimeout`` (the embedded
    server and compose's: :data:`epochsync.spark_server.SESSION_IDLE_TIMEOUT`).
    """
    import uuid

    # a name-based UUID with the version bits of a random one (what clients and server expect)
    session_id = str(uuid.UUID(bytes=uuid.uuid5(uuid.NAMESPACE_URL, f"epochsync:{run_key}").bytes, version=4))
    base = url.rstrip("/")
    if ";" in base:  # sc://host:port/;user_id=... : params after the path
        return f"{base};session_id={session_id}"
    return f"{base}/;session_id={session_id}"
