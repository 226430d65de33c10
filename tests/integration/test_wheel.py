"""The user's package: the wheel holds ``epochsync`` alone, says what it needs, and runs an epoch.

The wheel is built from the checkout (``pip wheel``) and installed into a fresh venv, so that
nothing of the checkout (``include/``, the development tools) is on its path. Its dependencies
are the pinned set's, the same versions ``requirements.txt`` installs: the fresh venv reaches
them through a path file added after the install (so that pip never sees the checkout's own
editable install), and the test checks that each range the wheel declares accepts the version
there. From that venv: ``--version``, ``--help`` without the development verbs, the agent's
verbs with every extra's module refused (what a Gluster server installs is the core), ``check``
of a config, and one epoch replicated, equal to the simulated truth.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from support.docs import install_block
from support.histories import assert_equals_truth, simulate

from epochsync.targets import open_target

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
#: what only the extras bring (Airflow, Spark, S3 and what they pull in)
EXTRAS_ONLY = {
    "airflow",
    "pyspark",
    "pyarrow",
    "duckdb",
    "pandas",
    "numpy",
    "boto3",
    "botocore",
    "sqlalchemy",
    "pendulum",
}


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, timeout=600, **kw)


def _requirements(whl: Path) -> list[str]:
    with zipfile.ZipFile(whl) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def test_the_wheel_alone_installs_and_replicates_an_epoch(seaweed, spark, tmp_path):
    from importlib.metadata import PackageNotFoundError, version

    from packaging.requirements import Requirement

    out, cfg = simulate(seaweed, tmp_path / "sim", 1, seed=5)
    dist = tmp_path / "dist"
    # built from a copy of the checkout's files: a build writes its metadata beside the package
    # (include/epochsync.egg-info), where the tests' own processes would read the package twice
    tree = tmp_path / "tree"
    listed = _run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT)
    for rel in filter(None, listed.stdout.split("\0")):
        src = Path(ROOT) / rel
        if src.is_file():
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, tree / rel)
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", dist, tree], cwd=tmp_path)
    assert built.returncode == 0, built.stderr[-2000:]
    assert not (Path(ROOT) / "include" / "epochsync.egg-info").exists()
    (whl,) = dist.glob("epochsync-*.whl")
    with zipfile.ZipFile(whl) as z:
        tops = {n.split("/", 1)[0] for n in z.namelist()}
        assert "epochsync/agent/deploy/epochsync-agent.service" in z.namelist()
        points = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert tops == {"epochsync", whl.name.split("-py3")[0] + ".dist-info"}, tops
    # Airflow finds the plugin and the provider in the installed package
    assert "epochsync = epochsync.airflow.plugin:EpochsyncPlugin" in points, points
    assert "provider_info = epochsync.airflow.provider:get_provider_info" in points, points

    # every range the wheel declares (the core and every extra) accepts the pinned version
    for line in _requirements(whl):
        req = Requirement(line)
        if req.name == "epochsync":
            continue  # the 'all' extra, made of the others
        try:
            have = version(req.name)
        except PackageNotFoundError:
            pytest.fail(f"the wheel needs {req}, which the pinned set does not install")
        assert req.specifier.contains(have, prereleases=True), f"the wheel needs {req}; the pinned set has {have}"

    venv = tmp_path / "venv"
    assert _run([sys.executable, "-m", "venv", venv]).returncode == 0
    py, epochsync = venv / "bin" / "python", venv / "bin" / "epochsync"
    installed = _run([py, "-m", "pip", "install", "-q", "--no-deps", whl], cwd=tmp_path)
    assert installed.returncode == 0, installed.stderr[-2000:]
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    (site / "pinned-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # then Getting started's install block, as written, with the wheel as the only index: pip finds
    # the package installed and every requirement of its extras met by the pinned set (through the
    # .pth; the checkout's own editable install is behind the venv's copy on sys.path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL")}
    env.update(PATH=f"{venv / 'bin'}:{env.get('PATH', '')}", PIP_NO_INDEX="1", PIP_FIND_LINKS=str(dist))
    installed = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", install_block()],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-2000:]

    where = _run([py, "-c", "import epochsync; print(epochsync.__file__)"], cwd=tmp_path)
    assert where.stdout.startswith(str(site)), where.stdout + where.stderr
    dev = _run([py, "-c", "import epochsync_dev"], cwd=tmp_path)
    assert dev.returncode != 0 and "No module named 'epochsync_dev'" in dev.stderr
    v = _run([epochsync, "--version"], cwd=tmp_path)
    assert v.returncode == 0 and v.stdout.strip() == "epochsync 0.1.0", v
    helped = _run([epochsync, "--help"], cwd=tmp_path).stdout
    assert "replicate" in helped and "simulate" not in helped and "bench" not in helped, helped

    # the agent (a Gluster server's: the core install) imports none of the extras
    blocked = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        f"        if name.split('.')[0] in {sorted(EXTRAS_ONLY)!r}: raise ImportError('an extra: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import epochsync.agent.server, epochsync.agent.cli, epochsync.sources.gluster.bricks\n"
        "from epochsync.cli import main\n"
        "sys.exit(main(['agent', 'check', '--help']))\n"
    )
    agent = _run([py, "-c", blocked], cwd=tmp_path)
    assert agent.returncode == 0 and "agent check" in agent.stdout, agent.stderr[-2000:]

    checked = _run([epochsync, "check", "--config", cfg.file], cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    done = _run([epochsync, "replicate", "--config", cfg.file, "--target", "local", "--epoch", "1"], cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "epoch 1: committed" in done.stdout
    assert_equals_truth(open_target(cfg.target("local")), out, 1)
