"""Replica targets: one contract (:class:`epochsync.targets.base.Target`), three backends.

``posix`` (a directory tree), ``s3`` (one object per path under a prefix, or a striped
layout of its own) and ``feed`` (change files for consumers). :func:`open_target` builds
the right one from a :class:`epochsync.core.config.TargetConfig`; it lives here, above
the backends, because each backend imports ``base`` (the contract) and ``base`` imports
none of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from epochsync.core.errors import EpochsyncError
from epochsync.targets.base import Entry, Target

if TYPE_CHECKING:  # pragma: no cover
    from epochsync.core.config import TargetConfig

__all__ = ["Entry", "Target", "open_target"]


def open_target(cfg: TargetConfig) -> Target:
    """Returns the backend for ``cfg.kind``: a PosixTarget, an S3Target or a FeedTarget."""
    if cfg.kind == "posix":
        from epochsync.targets.posix import PosixTarget

        return PosixTarget(cfg)
    if cfg.kind == "s3":
        from epochsync.targets.s3 import S3Target

        return S3Target(cfg)
    if cfg.kind == "feed":
        from epochsync.targets.feed import FeedTarget

        return FeedTarget(cfg)
    raise EpochsyncError(f"target {cfg.name}: unknown kind {cfg.kind!r}")
