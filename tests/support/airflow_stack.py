"""Shared set-up of the Airflow integration tests: a simulated source in SeaweedFS and an Airflow env."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def airflow_env(base: Path, seaweed, *, config: Path | None = None, extra: dict | None = None) -> dict[str, str]:
    """Environment for Airflow processes: own home and SQLite DB, the project's dags and plugins."""
    from epochsync.spark import REMOTE_ENV
    from epochsync_dev.devstack import airflow_environment

    conns = {
        "source_s3": seaweed.airflow_conn_json(),
        "replica_s3": seaweed.airflow_conn_json(),
    }
    env = airflow_environment(
        base / "airflow-home",
        port=int((extra or {}).get("AIRFLOW__API__PORT", "8080")),
        config=config,
        connections=conns,
        # the test run's Connect server (the spark_connect fixture sets it)
        spark_url=os.environ[REMOTE_ENV],
        extra={"EPOCHSYNC_BUILD_DIR": str(base / "build"), **(extra or {})},
    )
    env.pop("EPOCHSYNC_INJECT_FAILURE", None)
    return env


def simulate(base: Path, env: dict[str, str], *, epochs: int, files: int, seed: int) -> Path:
    """``epochsync simulate`` into a fresh bucket; returns the config it wrote."""
    out = base / "sim"
    bucket = "src-" + uuid.uuid4().hex[:10]
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
        "--bucket",
        bucket,
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return out / "epochsync.yaml"


def with_prefix(config: Path, prefix: str) -> Path:
    """The simulated config with the s3 target under its own prefix (tests share one bucket)."""
    import yaml

    doc = yaml.safe_load(config.read_text())
    for t in doc["targets"]:
        if t["kind"] == "s3":
            t["prefix"] = prefix
    config.write_text(yaml.safe_dump(doc, sort_keys=False))
    return config


def dagtest(env: dict[str, str], dag_id: str, epoch: int, *, conf: dict | None = None) -> dict:
    """Run one epoch with dag.test() in the kept ``dagtest --serve`` process of ``env``'s Airflow home
    (as the demo runs its epochs); returns run and task states, and the run's output as ``log``."""
    import tempfile

    from epochsync.airflow.dagtest import kept_process

    home = env["AIRFLOW_HOME"]
    fd, log = tempfile.mkstemp(prefix=f"{dag_id}-e{epoch}-", suffix=".log", dir=os.path.dirname(home))
    os.close(fd)
    result = kept_process(env, cwd=ROOT).run(dag_id, epoch, log, conf=conf, env=env)
    result["log"] = Path(log).read_text(errors="replace")
    assert "DAGTEST_RESULT " in result["log"], f"dag.test produced no result:\n{result['log'][-6000:]}"
    return result


def truth(sim_dir: Path, epoch: int) -> dict[str, tuple]:
    """Ground truth of the simulated source at ``epoch``: path -> (type, size, sha256, symlink, perms)."""
    out = {}
    for line in (sim_dir / "truth" / f"epoch={epoch}.jsonl").read_text().splitlines():
        r = json.loads(line)
        out[r["path"]] = (
            r["type"],
            r["size"] if r["type"] == "file" else 0,
            r["sha256"] if r["type"] == "file" else None,
            r.get("symlink"),
            # a symlink's permission bits mean nothing on POSIX (and an s3 replica has none)
            None if r["type"] == "symlink" else r["mode"] & 0o7777,
        )
    return out


def replica(config: Path, target: str, env: dict[str, str]) -> tuple[int, dict[str, tuple]]:
    """(manifest epoch, path -> (type, size, sha256, symlink, perms)) of a target, read like a user would."""
    code = (
        "import json, sys\n"
        "from epochsync.core.config import load_config\n"
        "from epochsync.journal.undo import manifest_epoch\n"
        "from epochsync.targets import open_target\n"
        f"t = open_target(load_config({str(config)!r}).target({target!r}))\n"
        "rows = {e.path: [e.type, e.size if e.type == 'file' else 0, e.sha256 if e.type == 'file' else None,"
        " e.symlink, None if e.type == 'symlink' else e.mode] for e in t.walk()}\n"
        "print(json.dumps({'epoch': manifest_epoch(t.read_manifest()), 'rows': rows}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    return doc["epoch"], {p: tuple(v) for p, v in doc["rows"].items() if p}


def run_env_for(env: dict[str, str]) -> dict[str, str]:
    return dict(env)


__all__ = [
    "ROOT",
    "airflow_env",
    "simulate",
    "with_prefix",
    "dagtest",
    "truth",
    "replica",
    "run_env_for",
    "os",
]


# --------------------------------------------------------------------------- a running `airflow standalone`


class SchedulerStack:
    """`airflow standalone` (what `make airflow` runs) on a free loopback port, with a simulated source."""

    def __init__(self, base: Path, seaweed, *, epochs: int = 3, files: int = 16, seed: int = 21):
        from epochsync_dev.devstack import AirflowStandalone, write_admin_password
        from epochsync_dev.embedded import free_port

        self.base = base
        self.seaweed = seaweed
        self.epochs = epochs
        env = airflow_env(base, seaweed)
        self.config = simulate(base, env, epochs=epochs, files=files, seed=seed)
        self.sim = self.config.parent
        self.port = free_port()
        home = base / "airflow-home"
        self.password = write_admin_password(home)
        self.env = airflow_env(
            base,
            seaweed,
            config=self.config,
            # as `make airflow`: no scheduled run, the simulated epochs run by backfill or trigger
            extra={"AIRFLOW__API__PORT": str(self.port), "EPOCHSYNC_SCHEDULE_FROM": "never"},
        )
        self.airflow = AirflowStandalone(home, self.env, self.port)
        self._token = None

    def start(self) -> SchedulerStack:
        self.airflow.start(timeout=600)
        self.airflow.create_pools(self.config)  # as `make airflow`: one pool per target, one slot
        return self

    def stop(self) -> None:
        # nothing runs any more when a test's stack stops: airflow standalone takes more than
        # 30 s to leave on SIGINT (measured: a 33 s teardown), SIGTERM after 3 s instead
        self.airflow.stop(grace=3)

    @property
    def url(self) -> str:
        return self.airflow.url

    def banner(self) -> str:
        """What `make airflow` prints for this stack (the commands in it run as printed)."""
        from epochsync_dev.devstack import banner

        return banner(
            self.airflow, self.password, self.config, self.epochs, self.seaweed, os.environ["EPOCHSYNC_SPARK_REMOTE"]
        )

    def token(self) -> str:
        if self._token is None:
            self._token = self.airflow.token(self.password)
        return self._token

    def api(self, method: str, path: str, body: dict | None = None) -> dict:
        return self.airflow.api(method, path, self.token(), body)

    def wait_for_dag(self, dag_id: str, timeout: float = 300) -> dict:
        import time
        import urllib.error

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                return self.api("GET", f"/dags/{dag_id}")
            except urllib.error.HTTPError as exc:
                if exc.code != 404:
                    raise
            time.sleep(3)
        raise TimeoutError(f"DAG {dag_id} not parsed within {timeout:.0f}s:\n{self.airflow.tail()}")

    def unpause(self, dag_id: str) -> None:
        self.wait_for_dag(dag_id)
        self.api("PATCH", f"/dags/{dag_id}", {"is_paused": False})

    def runs(self, dag_id: str) -> list[dict]:
        return self.api("GET", f"/dags/{dag_id}/dagRuns?order_by=logical_date&limit=100")["dag_runs"]

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        from urllib.parse import quote

        tis = self.api("GET", f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances")["task_instances"]
        return {t["task_id"]: t["state"] for t in tis}

    def wait_runs_done(self, dag_id: str, count: int, timeout: float) -> list[dict]:
        import time

        deadline = time.monotonic() + timeout
        runs: list[dict] = []
        while time.monotonic() < deadline:
            try:
                runs = self.runs(dag_id)
            except (TimeoutError, OSError) as exc:  # URLError too: a busy API server on two shared cores
                print(f"wait_runs_done: the API did not answer ({exc}); asking again", flush=True)
                time.sleep(10)
                continue
            if len(runs) >= count and all(r["state"] in ("success", "failed") for r in runs):
                return runs
            time.sleep(10)
        raise TimeoutError(
            f"{dag_id}: runs not finished within {timeout:.0f}s: "
            f"{[(r['run_id'], r['state']) for r in runs]}\n{self.airflow.tail()}"
        )


_STACK: dict = {}


def scheduler_stack_fixture(seaweed, spark_connect, tmp_path_factory):
    """Body of the session-scoped ``scheduler_stack`` fixtures of the backfill and UI tests.

    Each module declares its own fixture from this body; the first one starts the stack
    and stops it at the end of the session, the other reuses it (one Airflow start, not two).
    """
    if "stack" in _STACK:
        yield _STACK["stack"]
        return
    stack = SchedulerStack(tmp_path_factory.mktemp("scheduler"), seaweed).start()
    _STACK["stack"] = stack
    try:
        yield stack
    finally:
        _STACK.pop("stack", None)
        stack.stop()
