"""The documentation's shell examples, as the docs tests and the demo test read and run them."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
GETTING_STARTED = ROOT / "docs" / "getting-started"
#: the first line of the five-minute tour's block (README and Getting started): run on a demo's output
TOUR_MARK = "# after make demo"
#: the epochs of the full `make demo` the tour's `changes` line names; the demo test maps them onto its own
FULL_DEMO_EPOCHS = 6

_FENCE = re.compile(r"^```(\w*)([^\n]*)\n(.*?)^```\s*$", re.M | re.S)


def fenced_blocks(text: str) -> list[tuple[str, str, str]]:
    """``(language, title, body)`` of every fenced block of a Markdown text, in order."""
    out = []
    for m in _FENCE.finditer(text):
        title = re.search(r'title="([^"]+)"', m.group(2))
        out.append((m.group(1), title.group(1) if title else "", m.group(3)))
    return out


def commands(block: str) -> list[str]:
    """The command lines of a shell block (comments dropped, continuation lines joined)."""
    joined = block.replace("\\\n", " ")
    lines = [re.sub(r"\s+#.*$", "", line).strip() for line in joined.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def tour_block(text: str) -> str:
    """The body of the one shell block that starts with :data:`TOUR_MARK`."""
    found = [body for lang, _, body in fenced_blocks(text) if lang == "bash" and body.startswith(TOUR_MARK)]
    assert len(found) == 1, f"expected one shell block starting with {TOUR_MARK!r}, found {len(found)}"
    return found[0]


#: the page whose Install block installs the package (run by the wheel test, from a local index)
INSTALL_PAGE = GETTING_STARTED / "real-source.md"


def install_block() -> str:
    """The body of :data:`INSTALL_PAGE`'s one shell block of ``pip install`` lines."""
    found = [b for lang, _, b in fenced_blocks(INSTALL_PAGE.read_text()) if lang == "bash" and "pip install" in b]
    assert len(found) == 1, f"expected one pip install block in {INSTALL_PAGE.name}, found {len(found)}"
    return found[0]


def run_tour(workdir: Path, epochs: int) -> dict[str, subprocess.CompletedProcess]:
    """Run the README's five-minute tour on the output of a demo run with ``--workdir workdir
    --epochs epochs`` (instead of ``var/demo`` and the full demo's epochs); returns each
    command's result, keyed by its verb. Fails on a non-zero exit status."""
    results = {}
    env = dict(os.environ, PATH=f"{ROOT / '.venv' / 'bin'}:{os.environ.get('PATH', '')}")
    for line in commands(tour_block(README.read_text())):
        cmd = line.replace("var/demo/", f"{workdir}/").replace(
            f"--from {FULL_DEMO_EPOCHS - 1} --to {FULL_DEMO_EPOCHS}", f"--from {epochs - 1} --to {epochs}"
        )
        done = subprocess.run(
            ["bash", "-o", "pipefail", "-c", cmd], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, f"{cmd}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        results[cmd.split()[1]] = done
    return results
