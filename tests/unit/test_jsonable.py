"""One JSON cleaner for stats, plans and reports."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from epochsync.core.jsonable import jsonable, scalars


@dataclass
class Point:
    epoch: int
    where: Path


def test_jsonable_makes_json_of_nested_values():
    value = {1: (Point(3, Path("/x")), {"k": [1.5, None, True]}), "p": Path("/y")}
    out = jsonable(value)
    assert out == {"1": [{"epoch": 3, "where": "/x"}, {"k": [1.5, None, True]}], "p": "/y"}
    assert json.loads(json.dumps(out)) == out
    assert value[1][0].where == Path("/x")  # the input is left as it was


def test_scalars_keeps_the_flat_figures_only():
    assert scalars({"records": 3, "seconds": 1.5, "ok": True, "name": "t", "nested": {"a": 1}, "none": None}) == {
        "records": 3,
        "seconds": 1.5,
        "ok": True,
        "name": "t",
    }
    assert scalars(None) == {} and scalars([1]) == {}
