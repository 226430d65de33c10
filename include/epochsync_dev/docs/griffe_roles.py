"""A griffe extension for the Python API page: the package's docstrings use Sphinx roles
(``:func:`epochsync.spark.spark_session```), which Markdown would print as they are; this
turns each into inline code. Named in ``mkdocs.yml`` (mkdocstrings' ``extensions``)."""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|exc|obj|const):`~?([^`]+)`")


def plain_roles(text: str) -> str:
    """``text`` with every Sphinx role written as inline code."""
    return _ROLE.sub(r"`\1`", text)


class PlainRoles(griffe.Extension):
    """Rewrites the Sphinx roles of every docstring griffe loads."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain_roles(obj.docstring.value)
