"""Plain JSON values from what stages return (stats, plans, reports): one cleaner for every caller."""

from __future__ import annotations

from dataclasses import asdict, is_dataclass
from typing import Any


def jsonable(value: Any) -> Any:
    """``value`` as JSON can hold it: dicts with string keys, lists, scalars; dataclasses as
    dicts; anything else as its ``str``. Returns a new structure; ``value`` is not changed."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if is_dataclass(value) and not isinstance(value, type):
        return jsonable(asdict(value))
    return str(value)


def scalars(d: Any) -> dict:
    """The scalar (number, string, bool) entries of a dict, for one-line summaries; ``{}`` if ``d`` is no dict."""
    return {k: v for k, v in d.items() if isinstance(v, (int, float, str, bool))} if isinstance(d, dict) else {}
