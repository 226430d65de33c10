"""``make airflow``: SeaweedFS, a Spark Connect server and ``airflow standalone`` on loopback.

Starts the embedded S3 server, simulates a small source into it (``epochsync
simulate``), points ``EPOCHSYNC_CONFIG`` at the simulated config, and runs
``airflow standalone`` (SQLite, LocalExecutor, low parallelism) with the project's
``dags/`` and ``plugins/``, the connections passed as ``AIRFLOW_CONN_*`` variables
(``spark_connect_default`` → the Spark Connect server it starts on ``local[2]``,
``source_s3`` and ``replica_s3`` → SeaweedFS).
Prints the UI address and login, and stops everything on Ctrl-C.

:class:`AirflowStandalone` is also what the scheduler and UI tests start.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: git-ignored (``/var/`` in .gitignore): Airflow home, SeaweedFS data, the simulated source
VAR = ROOT / "var"
ADMIN = "admin"
#: ``[database] sql_alchemy_connect_args`` of the stack: SQLite waits up to 60 s for a lock
#: (its default, 5 s, is shorter than a busy scheduler's write transaction on two shared
#: cores: ``airflow backfill create`` failed with "database is locked" once)
SQLITE_CONNECT_ARGS = {"timeout": 60}


def write_admin_password(home: Path, password: str | None = None) -> str:
    """Pre-seed the simple auth manager's password file so the login is known (and printed)."""
    password = password or secrets.token_urlsafe(12)
    home.mkdir(parents=True, exist_ok=True)
    path = home / "simple_auth_manager_passwords.json"
    path.write_text(json.dumps({ADMIN: password}))
    path.chmod(0o600)
    return password


def airflow_environment(
    home: Path,
    *,
    port: int,
    config: Path | None,
    connections: dict[str, str],
    parallelism: int = 2,
    extra: dict[str, str] | None = None,
    spark_url: str | None = None,
) -> dict[str, str]:
    """The environment of every Airflow process of the stack (standalone and its children)."""
    venv_bin = str(Path(sys.executable).parent)
    env = dict(os.environ)
    env.update(
        {
            "PATH": os.pathsep.join([venv_bin, env.get("PATH", "")]),
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS": "epochsync_dev.devstack.SQLITE_CONNECT_ARGS",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            # two shared cores: a couple of task processes at a time, one parser, one API worker
            "AIRFLOW__CORE__PARALLELISM": str(parallelism),
            "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": str(parallelism),
            "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "15",
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "simple_auth_manager_passwords.json"),
            "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
            "AIRFLOW__TRIGGERER__CAPACITY": "50",
            "PYTHONUNBUFFERED": "1",
        }
    )
    if spark_url:
        from epochsync.airflow.operators.stage import spark_connect_conn_json
        from epochsync.spark import REMOTE_ENV, SPARK_CONN_ID

        env["AIRFLOW_CONN_" + SPARK_CONN_ID.upper()] = spark_connect_conn_json(spark_url)
        env[REMOTE_ENV] = spark_url  # the CLI run beside the stack uses the same server
    if config is not None:
        env["EPOCHSYNC_CONFIG"] = str(config)
    for conn_id, value in connections.items():
        env["AIRFLOW_CONN_" + conn_id.upper()] = value
    env.update(extra or {})
    return env


#: prefixes of the variables the stack's Airflow runs with (besides PATH and PYTHONPATH): what
#: :func:`write_airflow_wrapper` carries, and never the rest of the caller's environment
STACK_VARIABLE_PREFIXES = ("AIRFLOW_", "EPOCHSYNC_")


def wrapper_path(home: Path) -> Path:
    """``<home>/bin/airflow``: the ``airflow`` command with the stack's environment (what the stack prints)."""
    return Path(home) / "bin" / "airflow"


def write_airflow_wrapper(home: Path, env: dict[str, str]) -> Path:
    """Write ``<home>/bin/airflow``: runs the venv's ``airflow`` with the variables the stack's own
    Airflow runs with (home, database, DAG and plugin folders, ``PYTHONPATH``, connections, config).

    ``airflow backfill create`` run with only ``AIRFLOW_HOME`` and ``EPOCHSYNC_CONFIG`` fails
    with ``TimetableNotRegistered``: it parses the DAGs, and the timetable is in the stack's
    plugin folder. The script holds the connections' local keys: it is the owner's only (0700).
    """
    import shlex

    keep = {k: v for k, v in env.items() if k.startswith(STACK_VARIABLE_PREFIXES) or k in ("PATH", "PYTHONPATH")}
    keep.setdefault("PYTHONPATH", str(ROOT / "include"))
    if str(ROOT / "include") not in keep["PYTHONPATH"].split(os.pathsep):
        keep["PYTHONPATH"] = os.pathsep.join([str(ROOT / "include"), keep["PYTHONPATH"]])
    path = wrapper_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["#!/bin/sh", "# written by the epochsync dev stack: airflow with the stack's environment"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(keep.items())]
    lines.append(f'exec {shlex.quote(str(Path(sys.executable).parent / "airflow"))} "$@"')
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.chmod(0o700)
    tmp.replace(path)
    return path


class AirflowStandalone:
    """``airflow standalone`` in its own process group, logging to ``<home>/standalone.log``;
    :func:`write_airflow_wrapper` writes ``<home>/bin/airflow`` for the commands run beside it."""

    def __init__(self, home: Path, env: dict[str, str], port: int):
        self.home = Path(home)
        self.env = env
        self.port = port
        self.proc: subprocess.Popen | None = None
        self.log_path = self.home / "standalone.log"
        self.wrapper = wrapper_path(self.home)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def airflow(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        """Run an ``airflow`` CLI command against this stack's home and database."""
        out = subprocess.run(
            [str(Path(sys.executable).parent / "airflow"), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and out.returncode != 0:
            raise RuntimeError(f"airflow {' '.join(args)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
        return out

    def start(self, *, timeout: float = 300) -> AirflowStandalone:
        self.home.mkdir(parents=True, exist_ok=True)
        self.wrapper = write_airflow_wrapper(self.home, self.env)
        self.proc = self._spawn("standalone")
        self.wait_healthy(timeout=timeout)
        return self

    def _spawn(self, command: str) -> subprocess.Popen:
        """``airflow COMMAND`` in its own process group, appending to :attr:`log_path`."""
        with open(self.log_path, "ab") as log:
            return subprocess.Popen(
                [str(Path(sys.executable).parent / "airflow"), command],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.home,
                start_new_session=True,
            )

    def create_pools(self, config: Path) -> list[str]:
        """One pool with one slot per target of ``config`` (every task that writes a target takes it).

        The scheduler does not schedule a task whose pool is missing (it logs "Tasks using
        non-existent pool"), so every stack creates them as soon as its database exists.
        """
        from epochsync.core.config import load_config
        from epochsync.journal.lease import write_airflow_pools

        path = write_airflow_pools(load_config(config), self.home / "epochsync-pools.json")
        self.airflow("pools", "import", path)
        return sorted(json.loads(Path(path).read_text()))

    def health(self) -> dict:
        with urllib.request.urlopen(f"{self.url}/api/v2/monitor/health", timeout=5) as resp:
            return json.loads(resp.read())

    def wait_healthy(self, *, timeout: float = 300) -> None:
        """Until the API answers and the scheduler, DAG processor and triggerer heartbeat."""
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            gone = self.exited()
            if gone:
                raise RuntimeError(f"{gone}:\n{self.tail()}")
            try:
                h = self.health()
                last = h
                parts = ("metadatabase", "scheduler", "triggerer", "dag_processor")
                if all((h.get(p) or {}).get("status") == "healthy" for p in parts):
                    return
            except (urllib.error.URLError, OSError, ValueError) as exc:
                last = exc
            time.sleep(2)
        raise RuntimeError(f"airflow standalone not healthy within {timeout:.0f}s ({last}):\n{self.tail()}")

    def exited(self) -> str | None:
        """What ended, if a process of the stack did (None while it runs)."""
        if self.proc is not None and self.proc.poll() is not None:
            return f"airflow standalone exited with {self.proc.returncode}"
        return None

    def token(self, password: str) -> str:
        """A JWT for the REST API (simple auth manager)."""
        req = urllib.request.Request(
            f"{self.url}/auth/token",
            data=json.dumps({"username": ADMIN, "password": password}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())["access_token"]

    def api(self, method: str, path: str, token: str, body: dict | None = None) -> dict:
        req = urllib.request.Request(
            f"{self.url}/api/v2{path}",
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
            method=method,
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            text = resp.read()
            return json.loads(text) if text else {}

    def wait_for_dag(self, token: str, dag_id: str, timeout: float = 300) -> None:
        """Until the DAG processor has parsed ``dag_id`` (the REST API knows it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.api("GET", f"/dags/{dag_id}", token)
                return
            except urllib.error.HTTPError as exc:
                if exc.code != 404:
                    raise
            time.sleep(2)
        raise TimeoutError(f"DAG {dag_id} not parsed within {timeout:.0f}s:\n{self.tail()}")

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, grace: float = 30) -> None:
        """SIGINT to the whole process group (scheduler, API server, task processes), ``grace``
        seconds to exit, then SIGTERM, then SIGKILL."""
        if self.proc is None or self.proc.poll() is not None:
            self.proc = None
            return
        try:
            os.killpg(self.proc.pid, signal.SIGINT)
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc = None

    def __enter__(self) -> AirflowStandalone:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class AirflowServices(AirflowStandalone):
    """Airflow as ``docker-compose.yaml`` runs it: a PostgreSQL database (``database_url``), the
    LocalExecutor, and the scheduler, DAG processor, API server and triggerer as processes of their
    own (after ``airflow db migrate``), each in its own process group; one log for all. The same
    interface as :class:`AirflowStandalone`, which runs them all under ``airflow standalone`` on SQLite."""

    COMPONENTS = ("scheduler", "dag-processor", "api-server", "triggerer")

    def __init__(self, home: Path, env: dict[str, str], port: int, database_url: str):
        env = {k: v for k, v in env.items() if k != "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS"}  # SQLite's
        super().__init__(
            home,
            {
                **env,
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database_url,
                "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager."
                "SimpleAuthManager",
            },
            port,
        )
        self.log_path = self.home / "services.log"
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, *, timeout: float = 300) -> AirflowServices:
        self.home.mkdir(parents=True, exist_ok=True)
        self.wrapper = write_airflow_wrapper(self.home, self.env)
        self.airflow("db", "migrate", timeout=600)
        for name in self.COMPONENTS:
            self.procs[name] = self._spawn(name)
        self.wait_healthy(timeout=timeout)
        return self

    def exited(self) -> str | None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                return f"airflow {name} exited with {p.returncode}"
        return None

    def stop(self, grace: float = 30) -> None:
        """Each component's process group (its task processes too): SIGINT, ``grace`` seconds, then
        SIGTERM, then SIGKILL."""
        for sig, wait in ((signal.SIGINT, grace), (signal.SIGTERM, 15), (signal.SIGKILL, 5)):
            live = [p for p in self.procs.values() if p.poll() is None]
            for p in live:
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            for p in live:
                try:
                    p.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        self.procs = {}


def add_feed_target(config: Path, name: str = "audit") -> None:
    """Add a feed target (``kind: feed``, a folder beside the config) to a simulated config:
    its DAG (ingest, merge, publish) shows next to the replica DAGs."""
    import yaml

    doc = yaml.safe_load(config.read_text())
    if not any(t["name"] == name for t in doc["targets"]):
        doc["targets"].append(
            {"name": name, "source": "sim", "kind": "feed", "path": str(config.parent / "feeds" / name)}
        )
        config.write_text(yaml.safe_dump(doc, sort_keys=False))


def simulate_source(out: Path, env: dict[str, str], *, epochs: int, files: int, seed: int = 1) -> Path:
    """``python -m epochsync_dev simulate`` into the store of ``source_s3``; returns the config it writes."""
    cmd = [
        sys.executable,
        "-m",
        "epochsync_dev",
        "simulate",
        "--out",
        str(out),
        "--epochs",
        str(epochs),
        "--files",
        str(files),
        "--seed",
        str(seed),
        "--osts",
        "2",
        "--threads",
        "4",
    ]
    subprocess.run(cmd, env=env, check=True)
    return out / "epochsync.yaml"


def start_live_source(out: Path, env: dict[str, str], *, epochs: int, files: int, lead: float, interval: int = 30):
    """``python -m epochsync_dev simulate --live`` in the background (epoch 1 starts ``lead`` s from now); returns it and its config."""
    import math
    from datetime import UTC, datetime

    start = datetime.fromtimestamp(math.ceil((time.time() + lead) / interval) * interval, tz=UTC)
    cmd = [
        sys.executable,
        "-m",
        "epochsync_dev",
        "simulate",
        "--out",
        str(out),
        "--live",
        "--interval",
        f"{interval}s",
        "--start",
        start.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "--epochs",
        str(epochs),
        "--files",
        str(files),
        "--osts",
        "2",
        "--threads",
        "4",
    ]
    config = out / "epochsync.yaml"
    if config.exists():
        config.unlink()
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    deadline = time.monotonic() + 60
    while not config.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(
                f"python -m epochsync_dev simulate ... --live exited with {proc.returncode} before writing {config}"
            )
        time.sleep(0.5)
    return proc, config


def main(argv: list[str] | None = None) -> int:
    from epochsync.core.shutdown import Interrupted, signals_raise

    # SIGTERM (a CI timeout, kill) as well as Ctrl-C: stop everything, leave the targets committed
    try:
        with signals_raise():
            return _main(argv)
    except KeyboardInterrupt as exc:  # outside the stack's lifetime (before SeaweedFS, or while ending)
        sig = Interrupted.of(exc)
        print(f"make airflow: stopped by {sig.name}; nothing was running", file=sys.stderr)
        return 0 if sig.signum == signal.SIGINT else sig.exit_code


def _main(argv: list[str] | None) -> int:
    from epochsync_dev.embedded import SeaweedFS, free_port

    p = argparse.ArgumentParser(prog="make airflow", description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=int(os.environ.get("EPOCHSYNC_AIRFLOW_PORT", "8080")))
    p.add_argument("--home", type=Path, default=VAR / "airflow", help="AIRFLOW_HOME (default var/airflow)")
    p.add_argument("--epochs", type=int, default=4, help="epochs of the simulated source (default 4)")
    p.add_argument("--files", type=int, default=60, help="files of the simulated source (default 60)")
    p.add_argument(
        "--live",
        action="store_true",
        help="a live source: 30 s epochs produced in real time, each run created by the scheduler "
        "as its epoch closes (make airflow LIVE=1)",
    )
    args = p.parse_args(argv)
    port = args.port if _port_free(args.port) else free_port()

    from epochsync_dev.embedded import SparkConnectServer, warm_up_wanted

    weed = SeaweedFS(VAR / "seaweed")
    spark = SparkConnectServer("local[2]", work_dir=VAR / "spark", warm_up=warm_up_wanted())
    stack = config = live = None
    conns: dict[str, str] = {}
    try:
        endpoint = weed.start()
        print("make airflow: starting the Spark Connect server (local[2]) ...", flush=True)
        spark_url = spark.start()
        if spark.warm_up:
            print(
                f"make airflow: warming {spark_url} up in the background (log: {spark.work_dir / 'warm-up.log'})",
                flush=True,
            )
        conns = {
            "source_s3": endpoint.airflow_conn_json(),
            "replica_s3": endpoint.airflow_conn_json(),
        }
        base_env = airflow_environment(args.home, port=port, config=None, connections=conns, spark_url=spark_url)
        if args.live:
            print(
                f"make airflow: SeaweedFS S3 on {endpoint.url}; a live source in var/demo (30 s epochs) ...", flush=True
            )
            live, config = start_live_source(VAR / "demo", base_env, epochs=args.epochs, files=args.files, lead=90)
        else:
            print(f"make airflow: SeaweedFS S3 on {endpoint.url}; simulating a source into var/demo ...", flush=True)
            config = simulate_source(VAR / "demo", base_env, epochs=args.epochs, files=args.files)
            add_feed_target(config)
        _ensure_bucket(endpoint, "replica")
        password = write_admin_password(args.home)
        env = airflow_environment(
            args.home,
            port=port,
            config=config,
            connections=conns,
            spark_url=spark_url,
            # the simulated epochs lie in the past: the scheduler creates no run by itself,
            # the operator triggers epochs (or backfills them) and watches them in the UI;
            # a live source runs on the production schedule, one scheduled run per closed epoch
            extra={"AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False"}
            if args.live
            else {"EPOCHSYNC_SCHEDULE_FROM": "never", "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False"},
        )
        stack = AirflowStandalone(args.home, env, port)
        print("make airflow: starting airflow standalone (first start initialises the database) ...", flush=True)
        stack.start(timeout=600)
        stack.create_pools(config)
        print(banner(stack, password, config, args.epochs, endpoint, spark_url), flush=True)
        while stack.proc is not None and stack.proc.poll() is None:
            time.sleep(1)
        print(f"make airflow: airflow standalone exited; see {stack.log_path}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        from epochsync.core.shutdown import Interrupted, signals_deferred

        sig = Interrupted.of(exc)
        print(f"\nmake airflow: {sig.name}: stopping ...", flush=True)
        with signals_deferred():
            done = stop_stack(stack, weed, config, conns)
        print(f"make airflow: stopped by {sig.name}: {done}", flush=True)
        return 0 if sig.signum == signal.SIGINT else sig.exit_code
    finally:
        if live is not None and live.poll() is None:
            live.terminate()
        if stack is not None:
            stack.stop()
        spark.stop()
        weed.stop()


#: the banner's line before the backfill command (tests find the command after it)
BACKFILL_INTRO = "or replay every epoch in order:"


def backfill_command(stack: AirflowStandalone, config: Path, epochs: int) -> str:
    """The backfill of every simulated epoch, as the stack prints it (one line per ``\\``)."""
    first, last = _epoch_dates(config, epochs)
    return (
        f"{_shown(stack.wrapper)} backfill create --dag-id epochsync__sim__s3 \\\n"
        f"  --from-date {first} --to-date {last} --reprocess-behavior failed"
    )


def banner(stack: AirflowStandalone, password: str, config: Path, epochs: int, endpoint, spark_url: str) -> str:
    """What ``make airflow`` prints once the stack is up: where things are, and commands that run as printed."""
    command = "\n".join("    " + line for line in backfill_command(stack, config, epochs).splitlines())
    return (
        "\n"
        f"  Airflow UI   {stack.url}\n"
        f"  login        {ADMIN} / {password}\n"
        f"  config       {config}  ({epochs} closed epochs)\n"
        f"  S3 endpoint  {endpoint.url}  (key {endpoint.access_key})\n"
        f"  Spark        {spark_url}  (Spark Connect on local[2]; connection spark_connect_default)\n"
        f"  logs         {stack.log_path}\n"
        f"  airflow CLI  {_shown(stack.wrapper)}  (the airflow command with the stack's environment)\n"
        "  DAGs         epochsync__sim__local (posix replica), epochsync__sim__s3 (s3 replica),\n"
        "               epochsync__sim__audit (a feed: ingest, merge, publish),\n"
        "               epochsync_hydrate__<target>, epochsync_purge__sim\n"
        "\n"
        f"  Trigger epoch 1 in the UI (Trigger, param epoch = 1), {BACKFILL_INTRO}\n"
        f"{command}\n"
        "  A failed epoch and its rollback: trigger the next epoch with inject_failure = after=3.\n"
        f"  Pools        {', '.join(_pool_names(config))} (one slot: one writer per target)\n"
        "\n  Ctrl-C stops Airflow and SeaweedFS.\n"
    )


def printed_commands(text: str) -> list[str]:
    """The commands of a banner: the indented lines after :data:`BACKFILL_INTRO`, continuations joined."""
    block = []
    for line in text.split(BACKFILL_INTRO, 1)[1].splitlines()[1:]:
        if not line.startswith("    "):
            break
        block.append(line.strip())
    return [c.strip() for c in "\n".join(block).replace("\\\n", " ").splitlines() if c.strip()]


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it is below it (``var/airflow/bin/airflow``)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def stop_stack(stack: AirflowStandalone | None, weed, config: Path | None, conns: dict[str, str]) -> str:
    """Stop every process of the stack (task processes in sessions of their own too), then roll
    back any target a killed task left mid-epoch while the store still runs; one phrase."""
    from epochsync.core.shutdown import descendants, stop_processes
    from epochsync.stages.rollback import settle_targets

    keep = {weed.proc.pid} if weed.proc is not None else set()
    n = stop_processes(descendants(), keep=keep)  # the whole tree first: a killed parent orphans its children
    if stack is not None:
        stack.stop()
    parts = [f"{n} processes stopped"]
    if config is not None and weed.proc is not None:
        from epochsync.core.config import load_config

        os.environ.update({f"AIRFLOW_CONN_{k.upper()}": v for k, v in conns.items()})
        cfg = load_config(config)
        parts += settle_targets(cfg, [t.name for t in cfg.targets])
    return "; ".join(parts + ["SeaweedFS stopped"])


def _pool_names(config: Path) -> list[str]:
    from epochsync.core.config import load_config
    from epochsync.journal.lease import pool_name

    return [pool_name(t.name) for t in load_config(config).targets]


def _epoch_dates(config: Path, epochs: int) -> tuple[str, str]:
    """The logical dates (window starts) of epoch 1 and of the last simulated epoch."""
    from epochsync.core.config import load_config

    epoch = load_config(config).sources[0].epoch
    return epoch.window(1)[0].isoformat(), epoch.window(epochs)[0].isoformat()


def _ensure_bucket(endpoint, bucket: str) -> None:
    client = endpoint.client()
    try:
        client.create_bucket(Bucket=bucket)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    except Exception as exc:  # SeaweedFS answers BucketAlreadyExists for its own buckets
        if "BucketAlreadyExists" not in str(exc):
            raise


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


if __name__ == "__main__":
    sys.exit(main())
