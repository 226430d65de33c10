"""The installed epochsync's version, as ``epochsync --version`` and an agent's info say it."""

from __future__ import annotations


def package_version() -> str:
    """The installed distribution's version (the source tree's, when run from a checkout)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("epochsync")
    except PackageNotFoundError:
        return "(not installed: a source checkout)"
