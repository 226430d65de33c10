"""The default demo's transcript in the README and Getting started, from a real run.

``make demo-transcript`` runs ``make demo`` and keeps its ``demo-transcript.txt`` as
``bench/results/demo.txt``; ``make docs-ref`` writes it between the markers below in each page
that has them. ``make test`` runs the same demo (``tests/integration/test_demo.py``) and checks
that the kept transcript is that run's, apart from its timings (:func:`shape`): the seed fixes
everything else, so a change that moves a figure of the demo fails there until the transcript
is made again.
"""

from __future__ import annotations

import re
from pathlib import Path

BEGIN = "<!-- the default demo's transcript: make demo-transcript, then make docs-ref -->"
END = "<!-- end of the demo's transcript -->"
#: where ``make demo-transcript`` keeps the run's transcript
RESULT = "demo.txt"
#: the pages that show it
PAGES = ("README.md", "docs/getting-started/index.md")
MAKE_AGAIN = "make demo-transcript (it runs make demo), then make docs-ref"


def transcript_lines(lines: list[str], report: str | None, verdict: str, workdir: Path) -> str:
    """The transcript a demo run writes: its per-epoch lines, the report and the verdict, with the
    run's folder written as ``var/demo`` (make demo's)."""
    out = list(lines)
    if report:
        out.append(f"demo: report {report}")
    out.append(verdict)
    return "\n".join(out).replace(str(workdir), "var/demo") + "\n"


def shape(transcript: str) -> str:
    """The transcript without what differs between two runs of one seed: the seconds an epoch
    took, the demo's total and the progress lines a slow stage prints."""
    keep = [line for line in transcript.splitlines() if not line.startswith("    ... ")]
    text = "\n".join(keep)
    text = re.sub(r"\s+\d+\.\ds\s", " <s> ", text)  # right-aligned: the padding differs too
    return re.sub(r"in \d+s:", "in <s>:", text)


def with_transcript(page: str, transcript: str | None) -> str:
    """``page`` with the transcript written between its markers (unchanged without markers or
    a kept transcript)."""
    if transcript is None or BEGIN not in page:
        return page
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n```text\n{transcript.rstrip()}\n```\n{END}{tail}"


def kept_transcript(results: Path) -> str | None:
    path = results / RESULT
    return path.read_text() if path.is_file() else None
