"""Which fast paths an epoch took, and the test-only switch that breaks one on purpose.

- :data:`PATHS` counts, per process, each plan path translate chose and each coverage rule
  verify used (``took("verify.s3.parts")``): one dictionary increment, read by the net's
  coverage table (``tests/integration/test_net.py``, ``docs/INTERNALS.md``, "Fast paths and
  what proves them"). Nothing in the package reads it.
- :func:`mutant` is **test-only**: ``EPOCHSYNC_MUTANT=<name>`` breaks the named fast path or
  verify shortcut (the names are :data:`MUTANTS`), so that a test can show the net or verify
  catches it. Never set it anywhere else: a mutant replicates wrong bytes on purpose.
"""

from __future__ import annotations

import os
from collections import Counter

#: plan paths and verify rules taken in this process (see the module docstring)
PATHS: Counter[str] = Counter()

#: the mutants :func:`mutant` knows, each one site in the package (name -> what it breaks)
MUTANTS: dict[str, str] = {
    "copy-when-ranges-cover": "translate: a whole-file copy of the source version when the ranges cover [0, size) "
    "(the fallback 6e2f029 removed)",
    "copy-ignores-length": "translate: a whole-file copy of the source version whatever length it holds",
    "part-copy-past-base": "translate: a multipart upload copies E-1's object past its length (the growth not uploaded)",
    "patch-keeps-stale-tail": "apply: a patch lays only the bytes pulled over E-1's, not zeros past the version's end",
    "small-whole-drops-hole": "apply: a small file read whole drops the zeros past its version's end",
    "verify-checksum-stale": "verify: a PUT's checksum covers a file whatever version is current",
    "verify-parts-stale": "verify: a multipart upload's parts cover a file whatever version is current",
    "verify-copy-stale": "verify: a server-side copy covers a file whatever version is current",
    "verify-ranges-stale": "verify: a posix file's written ranges cover it whatever its identity now",
    "verify-carried-any": "translate: every entry there at E-1 and E counts as carried (verify leaves it out)",
}


def took(path: str) -> None:
    """Count one use of a plan path or verify rule (:data:`PATHS`)."""
    PATHS[path] += 1


def mutant(name: str) -> bool:
    """Test-only: is the mutant ``name`` switched on (``EPOCHSYNC_MUTANT``)? See the module docstring."""
    return os.environ.get("EPOCHSYNC_MUTANT") == name
