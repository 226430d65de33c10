"""Replica targets: one contract (:class:`epochsync.targets.base.Target`), two backends.

``posix`` (a directory tree) and ``s3`` (one object per path under a prefix, or a
striped layout of its own). :func:`open_target` builds the right one from a
:class:`epochsync.core.config.TargetConfig`.
"""

from __future__ import annotations

from epochsync.targets.base import Entry, Target, open_target

__all__ = ["Entry", "Target", "open_target"]
