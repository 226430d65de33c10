"""The local Spark Connect server the CLI starts, finds and lets go when idle; the ``spark`` verb.

Without a configured server (no ``$EPOCHSYNC_SPARK_REMOTE``, ``$SPARK_REMOTE`` or config
``spark.remote``), every command that needs Spark used to start a JVM of its own: 10-20 s
per ``epochsync replicate``. Now the first such command starts one local Spark Connect
server in the background and the later ones use it, warm:

- :func:`ensure_server` finds the server recorded in the state folder
  (``$EPOCHSYNC_SPARK_HOME``, default ``~/.local/state/epochsync/spark``) or starts one:
  ``python -m epochsync.spark_server serve`` in a session of its own (it outlives the
  command), which runs ``spark-submit ... SparkConnectServer`` on 127.0.0.1 and a free port
  (:func:`server_command`) and writes ``server.json`` once the port listens. Starting is
  serialized by an ``flock`` (``start.lock``): two first commands at once start one server.
- While a command uses the server it holds a shared ``flock`` on ``use.lock`` (the kernel
  drops it when the command ends, however it ends) and touches ``last-used`` when it ends.
  The server stops itself once nobody holds ``use.lock`` and ``last-used`` is older than
  the idle time (``$EPOCHSYNC_SPARK_IDLE``, default 30 min); it takes ``use.lock``
  exclusively for that, so a command arriving meanwhile waits, then starts a new one.
- A recorded server whose supervisor is gone (killed, the machine rebooted), whose pid now
  names another process, or whose port does not answer is stale: its JVM, if still there,
  is stopped and a new server starts. A server of another pyspark version is replaced.
- ``epochsync spark start|stop|status`` does the same by hand.
- ``$EPOCHSYNC_SPARK_AUTOSTART=0`` turns this off: a command then runs Spark in process
  (``local[2]``), as before.

Everything here is the standard library and the venv's pyspark (its ``spark-submit``); a
JDK (17 or 21) must be on the ``PATH`` or in ``$JAVA_HOME``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from epochsync.core.errors import EpochsyncError
from epochsync.core.shutdown import process_running, process_start

#: where the local server keeps its state (default ``~/.local/state/epochsync/spark``)
HOME_ENV = "EPOCHSYNC_SPARK_HOME"
#: ``0``: no local server; commands without a configured one run Spark in process
AUTOSTART_ENV = "EPOCHSYNC_SPARK_AUTOSTART"
#: idle time before the local server stops (``30m``, ``90s``, ``2h``; default 30 minutes)
IDLE_ENV = "EPOCHSYNC_SPARK_IDLE"
DEFAULT_IDLE_S = 30 * 60
#: SQL settings of the "small" profile: interpreted expressions and static plans.
#: Epoch jobs on one machine are many small queries whose literals (epoch numbers, paths)
#: change every run: compiling generated code and adaptive re-planning (one job per
#: shuffle stage) cost more than they save (a small epoch's merge: 13 -> 5 JVM CPU-s).
SMALL_SQL_CONF = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    "spark.sql.adaptive.enabled": "false",
}

#: JVM options of a local Spark (the server's driver, a classic local session)
SMALL_JVM_OPTIONS = "-XX:+UseSerialGC"

#: how often the server looks whether it is idle
IDLE_POLL_S = 5.0
#: idle time after which the server drops a Connect session nobody released
SESSION_IDLE_TIMEOUT = "10min"
CONNECT_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
INFO, START_LOCK, USE_LOCK, LAST_USED, LOG = "server.json", "start.lock", "use.lock", "last-used", "server.log"


# --------------------------------------------------------------------------- the JVM


def spark_profile(master: str) -> str:
    """``small`` (local masters: interpreted SQL, static plans) or ``default`` (Spark's own).

    ``$EPOCHSYNC_SPARK_PROFILE`` overrides: the benchmarks run with ``default``.
    """
    forced = os.environ.get("EPOCHSYNC_SPARK_PROFILE")
    if forced:
        return forced
    return "small" if master.startswith("local") else "default"


def pyspark_home() -> Path:
    """The pyspark package folder: a complete ``SPARK_HOME`` (bin/, jars/) shipped in the venv."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def daemon_dir() -> Path | None:
    """The folder of ``epochsync_daemon`` (the executors' preloading Python daemon) in the checkout, if there is one."""
    from epochsync.warehouse.paths import project_dir

    d = project_dir() / "spark_apps" / "daemon"
    return d if (d / "epochsync_daemon.py").exists() else None


#: the Spark setting that makes Python workers fork from ``epochsync_daemon``
DAEMON_CONF = {"spark.python.daemon.module": "epochsync_daemon"}


def server_command(
    master: str,
    port: int,
    work_dir: Path,
    *,
    driver_memory: str,
    event_log: Path | None = None,
    conf: dict[str, str] | None = None,
    preload_daemon: bool = True,
) -> list[str]:
    """``spark-submit`` of a Spark Connect server on ``127.0.0.1:port`` (the embedded servers' and the CLI's)."""
    settings = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": "4",
        "spark.python.worker.reuse": "true",
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.local.dir": str(work_dir / "local"),
        "spark.driver.extraJavaOptions": f"{SMALL_JVM_OPTIONS} -Dderby.system.home={work_dir}",
        "spark.sql.warehouse.dir": str(work_dir / "spark-warehouse"),
        "spark.log.level": os.environ.get("EPOCHSYNC_SPARK_LOG_LEVEL", "WARN"),
        # an apply task must not be re-run behind the driver's back (see epochsync.stages.apply)
        "spark.task.maxFailures": "1",
        # kept sessions (a DAG's, replicate's per target) are never released: the server
        # drops one once it has been idle this long
        "spark.connect.session.manager.defaultSessionTimeout": SESSION_IDLE_TIMEOUT,
    }
    if preload_daemon:
        settings.update(DAEMON_CONF)
    if not master.startswith("local"):
        settings.update(
            {
                "spark.executor.memory": os.environ.get("EPOCHSYNC_EXECUTOR_MEMORY", "2g"),
                "spark.executor.extraJavaOptions": SMALL_JVM_OPTIONS,
            }
        )
    if spark_profile(master if master.startswith("local") else "local") == "small":
        settings.update(SMALL_SQL_CONF)
    if event_log is not None:
        event_log.mkdir(parents=True, exist_ok=True)
        settings.update(
            {
                "spark.eventLog.enabled": "true",
                "spark.eventLog.dir": event_log.as_uri(),
                # plain JSON lines, one file per application (what epochsync_dev.eventlog reads)
                "spark.eventLog.compress": "false",
                "spark.eventLog.rolling.enabled": "false",
            }
        )
    settings.update(conf or {})
    cmd = [str(pyspark_home() / "bin" / "spark-submit"), "--class", CONNECT_CLASS, "--master", master]
    cmd += ["--name", "epochsync", "--driver-memory", driver_memory]
    for k, v in settings.items():
        cmd += ["--conf", f"{k}={v}"]
    return cmd


def server_env(log_dir: Path, *, preload_daemon: bool = True) -> dict[str, str]:
    """The environment of a Spark process started here: loopback only, the venv's Python, logs in ``log_dir``."""
    env = dict(os.environ)
    env.update(
        SPARK_HOME=str(pyspark_home()),
        SPARK_LOCAL_IP="127.0.0.1",  # loopback only, never the machine's other interfaces
        SPARK_LOG_DIR=str(log_dir),
        PYSPARK_PYTHON=env.get("EPOCHSYNC_PYSPARK_PYTHON", sys.executable),
        PYSPARK_DRIVER_PYTHON=env.get("EPOCHSYNC_PYSPARK_PYTHON", sys.executable),
    )
    # the server's executors import epochsync from the artifact each session ships, not from
    # here: their path gets only the folder of the daemon module (DAEMON_CONF)
    daemon = daemon_dir()
    if preload_daemon and daemon is not None:
        env["PYTHONPATH"] = str(daemon)
    else:
        env.pop("PYTHONPATH", None)
    env.pop("SPARK_REMOTE", None)
    env.pop("SPARK_CONNECT_MODE_ENABLED", None)
    return env


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listens(port: int, timeout: float = 1.0) -> bool:
    """Whether something accepts connections on ``127.0.0.1:port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout):
            return True
    except OSError:
        return False


def stop_group(proc: subprocess.Popen | None, timeout: float = 5.0) -> None:
    """SIGTERM the process group of ``proc`` (started with a session of its own), then SIGKILL after ``timeout``."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


# --------------------------------------------------------------------------- the state folder


def state_dir() -> Path:
    """Where the local server keeps ``server.json``, its locks, log and scratch (``$EPOCHSYNC_SPARK_HOME``)."""
    env = os.environ.get(HOME_ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "epochsync" / "spark"


def autostart_enabled() -> bool:
    """Whether commands without a configured server use (and start) the local one (``$EPOCHSYNC_SPARK_AUTOSTART``)."""
    return os.environ.get(AUTOSTART_ENV, "1") != "0"


def idle_seconds(text: str | None = None) -> float:
    """The idle time before the server stops: ``text`` or ``$EPOCHSYNC_SPARK_IDLE`` (``90s``, ``30m``, ``2h``, seconds)."""
    text = (text if text is not None else os.environ.get(IDLE_ENV, "")).strip()
    if not text:
        return DEFAULT_IDLE_S
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        if text[-1] in units:
            return float(text[:-1]) * units[text[-1]]
        return float(text)
    except ValueError:
        raise EpochsyncError(f"{IDLE_ENV}={text!r}: give a duration like 90s, 30m or 2h") from None


@dataclass
class ServerInfo:
    """What ``server.json`` records of a running local server."""

    pid: int  # the supervisor (python -m epochsync.spark_server serve)
    pid_start: str
    jvm_pid: int
    port: int
    url: str
    started: float
    idle_s: float
    master: str
    pyspark: str
    python: str

    def supervisor_alive(self) -> bool:
        """Whether the recorded supervisor is still that process (a recycled pid starts later)."""
        return process_running(self.pid, self.pid_start)


def read_info(d: Path) -> ServerInfo | None:
    """The server recorded in ``d`` (None: none, or a record that does not parse)."""
    try:
        return ServerInfo(**json.loads((d / INFO).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _write_info(d: Path, info: ServerInfo) -> None:
    tmp = d / f".{INFO}.{os.getpid()}"
    tmp.write_text(json.dumps(asdict(info), indent=1))
    os.replace(tmp, d / INFO)


def _pyspark_version() -> str:
    from importlib.metadata import version

    return version("pyspark")


@contextlib.contextmanager
def _flock(path: Path, kind: int):
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, kind)
        yield fd
    finally:
        os.close(fd)


#: this process's shared lock on ``use.lock`` (held until it exits)
_use_fd: int | None = None


def _hold_use_lock(d: Path) -> None:
    """Say "in use" for as long as this process lives: a shared ``flock`` on ``use.lock``, and
    ``last-used`` touched now and at exit (the server's idle time counts from then)."""
    global _use_fd
    import atexit
    import fcntl

    if _use_fd is not None:
        return
    fd = os.open(d / USE_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_SH)  # waits while a server is stopping for idleness
    _use_fd = fd
    _touch(d / LAST_USED)
    atexit.register(_touch, d / LAST_USED)


def _touch(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.touch()


# --------------------------------------------------------------------------- clients


def server_state(d: Path | None = None) -> tuple[str, ServerInfo | None]:
    """``("running", info)``, ``("stale", info)`` (recorded, but its supervisor, pid or port is gone) or ``("none", None)``."""
    d = d or state_dir()
    info = read_info(d)
    if info is None:
        return "none", None
    if info.supervisor_alive() and listens(info.port):
        return "running", info
    return "stale", info


def ensure_server(*, progress=None, timeout: float = 180.0, use: bool = True) -> str:
    """The ``sc://`` URL of the local server, started first when there is none (or a stale one).

    With ``use`` this process holds the server "in use" until it exits (see the module doc).
    ``progress`` receives one line when a server is started.
    """
    d = state_dir()
    d.mkdir(parents=True, exist_ok=True)
    if use:
        _hold_use_lock(d)
    import fcntl

    with _flock(d / START_LOCK, fcntl.LOCK_EX):
        state, info = server_state(d)
        if state == "running" and info is not None and info.pyspark == _pyspark_version():
            return info.url
        if state == "running" and info is not None:  # another pyspark: its protocol may differ
            _say(
                progress,
                f"the local Spark server runs pyspark {info.pyspark}, this is {_pyspark_version()}: replacing it",
            )
            _stop_recorded(d, info)
        elif state == "stale" and info is not None:
            _say(progress, f"the local Spark server recorded in {d} is gone (pid {info.pid}): starting a new one")
            _stop_recorded(d, info)
        return _start(d, progress, timeout)


def _say(progress, line: str) -> None:
    if progress is not None:
        progress(line)


def _start(d: Path, progress, timeout: float) -> str:
    idle = idle_seconds()
    log = open(d / LOG, "ab")
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "epochsync.spark_server", "serve", "--state", str(d), "--idle", str(idle)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # it outlives this command, and a Ctrl-C here does not reach it
            close_fds=True,
        )
    finally:
        log.close()
    _say(progress, f"starting a local Spark server (it stops after {idle:.0f} s idle; log: {d / LOG}) ...")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = read_info(d)
        if info is not None and info.pid == proc.pid:
            return info.url
        if proc.poll() is not None:
            raise EpochsyncError(
                f"the local Spark server did not start (exit {proc.returncode}); log: {d / LOG}\n{_tail(d / LOG)}"
            )
        time.sleep(0.2)
    stop_group(proc)
    raise EpochsyncError(
        f"the local Spark server did not listen within {timeout:.0f} s; log: {d / LOG}\n{_tail(d / LOG)}"
    )


def _tail(path: Path, n: int = 12) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def _stop_recorded(d: Path, info: ServerInfo, timeout: float = 20.0) -> None:
    """Stop the recorded server (its supervisor, else the JVM left behind) and forget it."""
    if info.supervisor_alive():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(info.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while info.supervisor_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        if info.supervisor_alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(info.pid, signal.SIGKILL)
    if _is_our_java(info.jvm_pid, d):  # a supervisor killed with -9 leaves its JVM
        with contextlib.suppress(ProcessLookupError):
            os.killpg(info.jvm_pid, signal.SIGKILL)
    with contextlib.suppress(FileNotFoundError):
        (d / INFO).unlink()


def _is_our_java(pid: int, d: Path) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    return CONNECT_CLASS in cmd and str(d / "work") in cmd


def stop_server(*, wait: bool = True, progress=None) -> str:
    """Stop the local server: after the commands using it end (``wait``), or at once. Returns what happened."""
    import fcntl

    d = state_dir()
    state, info = server_state(d)
    if info is None:
        return "no local Spark server is recorded"
    if state == "stale":
        _stop_recorded(d, info)
        return f"the recorded local Spark server (pid {info.pid}) was already gone; forgot it"
    d.mkdir(parents=True, exist_ok=True)
    fd = os.open(d / USE_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                _stop_recorded(d, info)
                return f"stopped the local Spark server (pid {info.pid}) while a command was using it"
            _say(progress, "a command is using the local Spark server: waiting for it to end (--now stops it at once)")
            fcntl.flock(fd, fcntl.LOCK_EX)
        _stop_recorded(d, info)
    finally:
        os.close(fd)
    return f"stopped the local Spark server (pid {info.pid}, {info.url})"


# --------------------------------------------------------------------------- the supervisor


def serve(d: Path, idle_s: float, *, master: str | None = None, driver_memory: str | None = None) -> int:
    """Run the server until it is idle for ``idle_s`` or told to stop; returns the exit status.

    Starts the JVM, records ``server.json`` once the port listens, then every
    :data:`IDLE_POLL_S` seconds: exits when the JVM died, or stops it when no command
    holds ``use.lock`` and ``last-used`` is older than ``idle_s``.
    """
    import fcntl

    d.mkdir(parents=True, exist_ok=True)
    work = d / "work"
    work.mkdir(exist_ok=True)
    master = master or os.environ.get("EPOCHSYNC_SPARK_MASTER") or f"local[{max(1, os.cpu_count() or 2)}]"
    memory = driver_memory or os.environ.get("EPOCHSYNC_DRIVER_MEMORY", "3g")
    port = free_port()
    daemon = daemon_dir() is not None
    event_log = os.environ.get("EPOCHSYNC_SPARK_EVENT_LOG")
    cmd = server_command(
        master,
        port,
        work,
        driver_memory=memory,
        preload_daemon=daemon,
        event_log=Path(event_log) if event_log else None,
    )
    jvm = subprocess.Popen(
        cmd, cwd=work, env=server_env(work, preload_daemon=daemon), stdin=subprocess.DEVNULL, start_new_session=True
    )
    import threading

    stopping = {"signal": None}
    wake = threading.Event()

    def on_signal(signum, frame):
        stopping["signal"] = signum
        wake.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    started = time.time()

    def finish(code: int, why: str) -> int:
        stop_group(jvm)
        info = read_info(d)
        if info is not None and info.pid == os.getpid():
            with contextlib.suppress(FileNotFoundError):
                (d / INFO).unlink()
        print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} spark server {os.getpid()}: {why}", flush=True)
        return code

    deadline = time.monotonic() + 180
    while not listens(port, 0.5):
        if stopping["signal"]:
            return finish(0, "stopped before it listened")
        if jvm.poll() is not None:
            return finish(1, f"the JVM exited with {jvm.returncode} before it listened")
        if time.monotonic() > deadline:
            return finish(1, "the JVM did not listen within 180 s")
        time.sleep(0.3)
    _write_info(
        d,
        ServerInfo(
            pid=os.getpid(),
            pid_start=process_start(os.getpid()) or "",
            jvm_pid=jvm.pid,
            port=port,
            url=f"sc://127.0.0.1:{port}",
            started=started,
            idle_s=idle_s,
            master=master,
            pyspark=_pyspark_version(),
            python=sys.executable,
        ),
    )
    _touch(d / LAST_USED)
    print(
        f"{time.strftime('%Y-%m-%d %H:%M:%S')} spark server {os.getpid()}: listening on 127.0.0.1:{port} ({master})",
        flush=True,
    )
    while True:
        wake.wait(min(IDLE_POLL_S, max(0.5, idle_s / 4)))
        if stopping["signal"]:
            return finish(0, f"stopped by {signal.Signals(stopping['signal']).name}")
        if jvm.poll() is not None:
            return finish(1, f"the JVM exited with {jvm.returncode}")
        fd = os.open(d / USE_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a command is using it
            try:
                last = (d / LAST_USED).stat().st_mtime
            except OSError:
                last = started
            if time.time() - last >= idle_s:
                # still holding use.lock: a command arriving now waits, then starts a new server
                return finish(0, f"idle for {time.time() - last:.0f} s")
        finally:
            os.close(fd)


# --------------------------------------------------------------------------- the spark verb


def configure_spark(parser) -> None:
    """Add the ``spark`` verb's options to ``parser``."""
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    sub.add_parser("start", help="start the local Spark server now (commands start it when they need it)")
    stop = sub.add_parser("stop", help="stop the local Spark server once the commands using it end")
    stop.add_argument("--now", action="store_true", help="stop it at once, even under a running command")
    sub.add_parser("status", help="say whether the local Spark server runs, where, and since when")


def run_spark(args) -> int:
    """``epochsync spark start|stop|status``; returns the exit status."""
    if args.action == "start":
        url = ensure_server(progress=print, use=False)
        print(f"local Spark server at {url} (state in {state_dir()})")
        return 0
    if args.action == "stop":
        print(stop_server(wait=not args.now, progress=print))
        return 0
    state, info = server_state()
    if info is None:
        print(f"no local Spark server (state folder {state_dir()}); the next command that needs one starts it")
        return 0
    if state == "stale":
        print(
            f"stale: the local Spark server recorded in {state_dir()} (pid {info.pid}) is gone; the next command replaces it"
        )
        return 0
    import fcntl

    try:
        with _flock(state_dir() / USE_LOCK, fcntl.LOCK_EX | fcntl.LOCK_NB):
            users = "no command is using it"
    except BlockingIOError:
        users = "a command is using it"
    try:
        idle_for = time.time() - (state_dir() / LAST_USED).stat().st_mtime
    except OSError:
        idle_for = 0.0
    print(
        f"running: {info.url} (pid {info.pid}, {info.master}, pyspark {info.pyspark}), up {time.time() - info.started:.0f} s; "
        f"{users}; last used {idle_for:.0f} s ago, stops after {info.idle_s:.0f} s idle"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m epochsync.spark_server serve --state DIR --idle SECONDS``: the server's supervisor (:func:`serve`)."""
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m epochsync.spark_server", description="the local Spark server's supervisor"
    )
    sub = p.add_subparsers(dest="action", required=True)
    serve_p = sub.add_parser("serve")
    serve_p.add_argument("--state", required=True, help="the state folder (server.json, locks, log)")
    serve_p.add_argument("--idle", type=float, default=DEFAULT_IDLE_S, help="seconds idle before it stops")
    args = p.parse_args(argv)
    return serve(Path(args.state), args.idle)


if __name__ == "__main__":
    sys.exit(main())
