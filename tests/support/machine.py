"""What a test needs of the machine, and waiting on another process.

:func:`cannot_run_here`: the one rule of the tests that need something of the machine (a Gluster
volume, a btrfs loop image, glusterfind): skipped where it is missing, failed instead when the
variable CI sets where it installed it (``EPOCHSYNC_REQUIRE_GLUSTER``, ``EPOCHSYNC_REQUIRE_BTRFS``)
says it must be there.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import NoReturn

import pytest


def cannot_run_here(require_env: str, what: str, reason: object) -> NoReturn:
    """Skips the test (fails it when ``require_env`` is set), saying ``what`` cannot run and why."""
    if os.environ.get(require_env):
        pytest.fail(f"{require_env} is set but {what} cannot run here: {reason}")
    pytest.skip(f"{what} cannot run here: {reason}")


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Waits until ``path`` exists (a stalled fault's marker, say) while ``proc`` runs."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"exited {proc.returncode} before stalling: {proc.stderr.read()[-3000:]}"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
