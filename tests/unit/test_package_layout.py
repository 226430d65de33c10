"""The package's layout: folders by stage, no import cycles (not even inside functions), layers, dev tools never shipped, no module over 1,000 lines."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

INCLUDE = Path(__file__).resolve().parents[2] / "include"
#: the folders of ``epochsync`` (README, "Layout"), and the only modules at its top
FOLDERS = {
    "core",
    "formats",
    "warehouse",
    "stages",
    "journal",
    "stores",
    "sources",
    "targets",
    "report",
    "airflow",
    "agent",
}
TOP = {"__init__", "cli", "spark", "spark_server"}


def _modules(top: str) -> dict[str, Path]:
    out = {}
    for p in (INCLUDE / top).rglob("*.py"):
        name = ".".join(p.relative_to(INCLUDE).with_suffix("").parts).removesuffix(".__init__")
        out[name] = p
    return out


def _imports(path: Path, *, module_level: bool) -> set[str]:
    return set(_import_lines(path, module_level=module_level))


def _import_lines(path: Path, *, module_level: bool) -> dict[str, int]:
    """Returns every name an ``import`` of ``path`` may load (``from a import b``: ``a`` and ``a.b``),
    with the line of its first import; all of them, inside functions too, unless ``module_level``.

    ``importlib.import_module("...")`` and ``__import__("...")`` with a literal string count too.
    """
    tree = ast.parse(path.read_text())
    nodes = tree.body if module_level else list(ast.walk(tree))
    found: dict[str, int] = {}
    for n in nodes:
        names: list[str] = []
        if isinstance(n, ast.ImportFrom) and n.module:
            names = [n.module, *(f"{n.module}.{a.name}" for a in n.names)]
        elif isinstance(n, ast.Import):
            names = [a.name for a in n.names]
        elif isinstance(n, ast.Call) and _call_name(n.func) in {"import_module", "__import__"}:
            if n.args and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str):
                names = [n.args[0].value]
        for name in names:
            found.setdefault(name, n.lineno)
    return found


def _call_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else None


def _import_graph(top: str, *, module_level: bool) -> dict[str, dict[str, int]]:
    """Returns module → {module of the same package it imports: line}.

    A package's ``__init__`` importing its own modules is how packages work, not an edge;
    a module importing its package (or any other module) is one.
    """
    mods = _modules(top)
    graph = {}
    for m, p in mods.items():
        found = _import_lines(p, module_level=module_level)
        graph[m] = {t: line for t, line in found.items() if t in mods and t != m and not t.startswith(m + ".")}
    return graph


def _find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """Returns the modules of one import cycle, first module repeated at the end, or None."""
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> list[str] | None:
        state[m] = 1
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                return [*path[path.index(t) :], t]
            if t not in state:
                found = visit(t, [*path, t])
                if found:
                    return found
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m, [m])
            if found:
                return found
    return None


def _describe(cycle: list[str], graph: dict[str, dict[str, int]], top: str) -> str:
    mods = _modules(top)
    steps = [
        f"{a} -> {b} ({mods[a].relative_to(INCLUDE)}:{graph[a][b]})" for a, b in zip(cycle, cycle[1:], strict=False)
    ]
    return "import cycle: " + " -> ".join(cycle) + "\n  " + "\n  ".join(steps)


def test_every_module_lives_in_a_stage_folder():
    mods = _modules("epochsync")
    top = {name.split(".")[1] for name in mods if name.count(".") >= 1}
    loose = {name.split(".")[1] for name, p in mods.items() if name.count(".") == 1 and p.name != "__init__.py"}
    assert loose <= TOP, f"modules outside the stage folders: {sorted(loose - TOP)}"
    assert top - TOP <= FOLDERS, f"folders the README does not list: {sorted(top - TOP - FOLDERS)}"


def test_no_import_cycle_at_import_time():
    graph = _import_graph("epochsync", module_level=True)
    cycle = _find_cycle(graph)
    assert cycle is None, _describe(cycle, graph, "epochsync")


def test_no_import_cycle_even_inside_functions():
    """A function-level import in a cycle still ties the two modules together: neither can be
    understood, moved or tested without the other (docs/INTERNALS.md, "Imports")."""
    graph = _import_graph("epochsync", module_level=False)
    cycle = _find_cycle(graph)
    assert cycle is None, _describe(cycle, graph, "epochsync")


def test_the_cycle_finder_sees_imports_inside_functions(tmp_path, monkeypatch):
    pkg = tmp_path / "pkg"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("from pkg.low import a\n")  # its own module: not a cycle
    (pkg / "low" / "a.py").write_text("import os\n\ndef f():\n    from pkg.high import b\n")
    (pkg / "high.py").write_text("import importlib\n\nfrom pkg.low.a import f\n")
    monkeypatch.setattr(sys.modules[__name__], "INCLUDE", tmp_path)
    assert _find_cycle(_import_graph("pkg", module_level=True)) is None
    graph = _import_graph("pkg", module_level=False)
    assert _find_cycle(graph) == ["pkg.high", "pkg.low.a", "pkg.high"]
    assert "pkg/low/a.py:4" in _describe(["pkg.high", "pkg.low.a", "pkg.high"], graph, "pkg")
    (pkg / "low" / "a.py").write_text("import importlib\n\ndef f():\n    importlib.import_module('pkg.high')\n")
    assert _find_cycle(_import_graph("pkg", module_level=False)) == ["pkg.high", "pkg.low.a", "pkg.high"]


#: who may import whom: a module imports only from its own layer or those before it (the
#: longest prefix names a module's layer). ``report.changes`` (the change records between
#: two committed epochs) sits below the stages because the feed's publish stage uses it;
#: ``report.status`` reads the stages' state, so the rest of ``report`` sits above them. The
#: agent's protocol and client sit with the stores (a source's reads and the S3 settings use
#: them); the agent itself serves the sources' snapshots, so it sits with them.
LAYERS = [
    "core",
    "formats",
    "warehouse stores agent.protocol agent.client",
    "sources agent",
    "targets",
    "journal",
    "spark spark_server",
    "report.changes",
    "stages",
    "report",
    "airflow",
    "cli",
]


def _layer(module: str) -> int | None:
    rel = module.removeprefix("epochsync.")
    best = None
    for i, names in enumerate(LAYERS):
        for name in names.split():
            if (rel == name or rel.startswith(name + ".")) and (best is None or len(name) > len(best[1])):
                best = (i, name)
    return None if best is None else best[0]


def test_packages_import_only_from_lower_layers():
    graph = _import_graph("epochsync", module_level=False)
    mods = _modules("epochsync")
    wrong = []
    for a, targets in graph.items():
        if a == "epochsync":
            continue
        assert _layer(a) is not None, f"{a} is in no layer of LAYERS"
        for b, line in targets.items():
            if b != "epochsync" and _layer(b) > _layer(a):
                wrong.append(f"{a} imports {b} ({mods[a].relative_to(INCLUDE)}:{line})")
    assert not wrong, "imports against the layering " + " < ".join(LAYERS) + ":\n  " + "\n  ".join(sorted(wrong))


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


#: the most lines a shipped module may have: past it, a module holds more than one concern
#: (issue 53: ``targets/s3.py`` had grown to 2,100 lines, the target and the S3 client in one)
MAX_MODULE_LINES = 1000
#: modules allowed past it for now, each with the work that ends it. ``stages/merge.py`` is
#: being rewritten (issue 52); the rewrite splits it, and removes it from here.
OVER_MAX_LINES = {"epochsync/stages/merge.py"}


def _module_lines() -> dict[str, int]:
    return {
        str(p.relative_to(INCLUDE)): len(p.read_text().splitlines())
        for p in sorted((INCLUDE / "epochsync").rglob("*.py"))
    }


def test_no_shipped_module_is_over_the_line_limit():
    over = {name: n for name, n in _module_lines().items() if n > MAX_MODULE_LINES and name not in OVER_MAX_LINES}
    assert not over, f"shipped modules over {MAX_MODULE_LINES:,} lines (split each by concern): " + ", ".join(
        f"{name} ({n:,})" for name, n in sorted(over.items())
    )


def test_every_line_limit_exception_is_still_needed():
    """An exception that no longer applies goes, so it cannot shelter the module's next growth."""
    lines = _module_lines()
    stale = sorted(name for name in OVER_MAX_LINES if lines.get(name, 0) <= MAX_MODULE_LINES)
    assert not stale, f"remove from OVER_MAX_LINES (gone or now at most {MAX_MODULE_LINES:,} lines): {', '.join(stale)}"
