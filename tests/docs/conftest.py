"""The documentation site, built once (``mkdocs build --strict``) for every docs test that reads it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def built_site(tmp_path_factory) -> Path:
    """The site's folder, built from the tree as it is; a warning (a broken link, a page
    missing from the nav) fails the build and so every test that uses it."""
    mkdocs = Path(sys.executable).with_name("mkdocs")
    if not mkdocs.exists():
        found = shutil.which("mkdocs")
        if found is None:
            pytest.fail("mkdocs is not installed: make test installs requirements-docs.txt into .venv")
        mkdocs = Path(found)
    site = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
    return site
