"""The package's layout: folders by stage, no import cycles at import time, dev tools never shipped."""

from __future__ import annotations

import ast
from pathlib import Path

INCLUDE = Path(__file__).resolve().parents[2] / "include"
#: the folders of ``epochsync`` (README, "Layout"), and the only modules at its top
FOLDERS = {"core", "formats", "warehouse", "stages", "journal", "stores", "targets", "report", "airflow"}
TOP = {"__init__", "cli", "spark"}


def _modules(top: str) -> dict[str, Path]:
    out = {}
    for p in (INCLUDE / top).rglob("*.py"):
        name = ".".join(p.relative_to(INCLUDE).with_suffix("").parts).removesuffix(".__init__")
        out[name] = p
    return out


def _imports(path: Path, *, module_level: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if module_level else list(ast.walk(tree))
    found = set()
    for n in nodes:
        if isinstance(n, ast.ImportFrom) and n.module:
            found.add(n.module)
            found.update(f"{n.module}.{a.name}" for a in n.names)
        elif isinstance(n, ast.Import):
            found.update(a.name for a in n.names)
    return found


def test_every_module_lives_in_a_stage_folder():
    mods = _modules("epochsync")
    top = {name.split(".")[1] for name in mods if name.count(".") >= 1}
    loose = {name.split(".")[1] for name, p in mods.items() if name.count(".") == 1 and p.name != "__init__.py"}
    assert loose <= TOP, f"modules outside the stage folders: {sorted(loose - TOP)}"
    assert top - TOP <= FOLDERS, f"folders the README does not list: {sorted(top - TOP - FOLDERS)}"


def test_no_import_cycle_at_import_time():
    mods = _modules("epochsync")
    graph = {m: {t for t in _imports(p, module_level=True) if t in mods and t != m} for m, p in mods.items()}
    # a package's __init__ importing its own modules is how packages work, not a cycle
    graph = {m: {t for t in ts if not t.startswith(m + ".")} for m, ts in graph.items()}
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*path[path.index(t) :], t]))
            if t not in state:
                visit(t, [*path, t])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_the_shipped_package_never_imports_the_dev_tools():
    for name, path in _modules("epochsync").items():
        used = {i for i in _imports(path, module_level=False) if i.split(".")[0] == "epochsync_dev"}
        assert not used, f"{name} imports {sorted(used)}: epochsync_dev is not shipped to executors"
    from epochsync.spark import package_sources

    shipped = [n for n, _ in package_sources()]
    assert shipped and all(n.startswith("epochsync/") for n in shipped)
    assert not [n for n in shipped if "/.ruff_cache/" in n or "__pycache__" in n]


def test_snapshots_do_not_reach_into_the_merge():
    """The cycle issue 14 named: snapshot used merge's private ``_conform``; tables hold it now."""
    used = _imports(INCLUDE / "epochsync/warehouse/snapshots.py", module_level=False)
    assert not [i for i in used if i.startswith("epochsync.stages")]
