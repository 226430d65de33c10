"""The documentation: generated pages current, the strict build, the README's shape, the words
of the user pages, and the shell examples of Getting started run as written."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from support.docs import GETTING_STARTED, README, ROOT, TOUR_MARK, commands, fenced_blocks, install_block, tour_block

DOCS = ROOT / "docs"
#: pages that may tell how a figure was reached (commit ids, hours, before/after): the design
#: decisions, and the benchmarks' method
INTERNAL_PAGES = {DOCS / "INTERNALS.md"}
#: shell blocks of Getting started too long for the docs tests: each is a make target whose
#: recipe the named test runs (make test is this suite)
EXPENSIVE = {"make demo": "tests/integration/test_demo.py", "make test": None}


def test_the_generated_pages_are_current():
    from epochsync_dev.docs import REGENERATE, stale_pages

    stale = [str(p.relative_to(ROOT)) for p in stale_pages()]
    assert not stale, f"stale generated pages: {', '.join(stale)}: run {REGENERATE}"


def test_every_config_key_has_a_description():
    from epochsync_dev.docs.reference import config_keys_without_description

    missing = config_keys_without_description()
    assert not missing, (
        "keys of the config without a description (a docstring under the field in "
        f"include/epochsync/core/config.py): {', '.join(missing)}"
    )


def test_the_generators_pick_up_what_the_code_declares():
    """A verb or a config key the code adds shows in the pages without an edit to the generators."""
    from epochsync import cli
    from epochsync.core.config import config_schema
    from epochsync_dev.docs.reference import cli_reference, config_reference

    page = cli_reference()
    for verb in cli.VERBS:
        assert f"## `epochsync {verb}`" in page, verb
    schema = config_schema()
    keys = set(schema["properties"])
    for d in schema["$defs"].values():
        keys |= set(d.get("properties", {}))
    page = config_reference()
    assert all(f"| `{k}` |" in page for k in keys), sorted(k for k in keys if f"| `{k}` |" not in page)


def test_the_site_builds_strictly(built_site):
    for page in ("index.html", "reference/configuration.html", "reference/cli.html", "benchmarks/results.html"):
        assert (built_site / page).is_file(), page
    api = (built_site / "reference" / "python-api.html").read_text()
    assert "load_config" in api and "rollback_target" in api and 'class="doc doc-' in api  # mkdocstrings rendered
    assert ":func:" not in api and ":class:" not in api  # Sphinx roles as code (epochsync_dev.docs.griffe_roles)


def test_the_readme_is_short_and_for_users():
    text = README.read_text()
    lines = text.count("\n") + (0 if text.endswith("\n") else 1)
    assert lines <= 200, f"README.md has {lines} lines: at most 200 (the rest belongs on the docs site)"
    shell = [c for lang, _, body in fenced_blocks(text) if lang == "bash" for c in commands(body)]
    assert "make demo" in shell and "make test" in shell
    from epochsync_dev.docs.benchmarks import figure_markers_present

    assert figure_markers_present(text), "the README's headline figures need their generated-table markers"
    assert _words(text, "README.md") == []
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text)
    assert links and not [link for link in links if not (ROOT / link).exists()], links


def _prose(text: str) -> str:
    """The text outside fenced blocks and inline code."""
    text = re.sub(r"^```.*?^```\s*$", "", text, flags=re.M | re.S)
    text = re.sub(r"<svg.*?</svg>", "", text, flags=re.S)
    return re.sub(r"`[^`\n]*`", "", text)


_COMMIT = re.compile(r"(?<![\w./-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,12}(?![\w-])")
_HOUR = re.compile(r"(?<![T\d:])(?:[01]?\d|2[0-3]):[0-5]\d(?![\d])")
_NARRATIVE = re.compile(r"\b(?:measured|issue \d+|was \d[\d.,]* ?s\b|before this change)", re.I)


def _words(text: str, name: str) -> list[str]:
    prose = _prose(text)
    found = [f"{name}: commit id {m.group(0)!r}" for m in _COMMIT.finditer(prose)]
    found += [f"{name}: hour of the day {m.group(0)!r}" for m in _HOUR.finditer(prose)]
    if not name.startswith("benchmarks/"):  # the method page tells how things are measured
        found += [f"{name}: measurement narrative {m.group(0)!r}" for m in _NARRATIVE.finditer(prose)]
    return found


def test_user_pages_speak_to_users():
    """No commit ids, hours of the day or measured-before/after stories outside Internals."""
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        if page not in INTERNAL_PAGES:
            found += _words(page.read_text(), str(page.relative_to(DOCS)))
    assert found == [], "\n".join(found)


def test_the_word_checks_catch_what_they_are_for():
    assert _words("fixed in 7326c5d, measured at 12:58", "x.md") == [
        "x.md: commit id '7326c5d'",
        "x.md: hour of the day '12:58'",
        "x.md: measurement narrative 'measured'",
    ]
    assert _words("`7326c5d` at 2026-01-01T00:05:00Z, fid [0x200000402:0x1:0x0]", "x.md") == []


def _getting_started_blocks() -> list[tuple[Path, int, str, str]]:
    out = []
    for page in sorted(GETTING_STARTED.glob("*.md")):
        blocks = fenced_blocks(page.read_text())
        for i, (lang, _, body) in enumerate(blocks):
            if lang in ("bash", "sh", "shell", "console"):
                after = blocks[i + 1][2] if i + 1 < len(blocks) and blocks[i + 1][0] == "text" else None
                out.append((page, i, body, after))
    return out


def test_getting_started_has_only_bash_shell_blocks_and_one_tour():
    for page in sorted(GETTING_STARTED.glob("*.md")):
        langs = {lang for lang, _, _ in fenced_blocks(page.read_text())}
        assert langs <= {"bash", "text", "yaml"}, f"{page.name}: blocks of {sorted(langs)}: shell examples are bash"
    tours = [body for _, _, body, _ in _getting_started_blocks() if body.startswith(TOUR_MARK)]
    assert tours == [tour_block(README.read_text())], "Getting started's tour must be the README's, line for line"
    assert "run_tour(" in (ROOT / "tests" / "integration" / "test_demo.py").read_text(), (
        "the demo test runs the tour on its demo's output"
    )


def test_the_expensive_blocks_are_what_make_demo_and_make_test_run():
    makefile = (ROOT / "Makefile").read_text()
    for _, _, body, _ in _getting_started_blocks():
        if body.startswith(TOUR_MARK) or body.strip() not in EXPENSIVE:
            continue
        target = body.strip().split()[1]
        assert re.search(rf"^{target}:", makefile, re.M), f"no make target {target}"
    recipe = re.search(r"^demo:.*\n\t(.*)$", makefile, re.M).group(1)
    assert "-m epochsync_dev.demo" in recipe, recipe
    assert '"epochsync_dev.demo"' in (ROOT / EXPENSIVE["make demo"]).read_text()
    from support.docs import FULL_DEMO_EPOCHS

    from epochsync_dev.demo import parse_args

    assert parse_args([]).epochs == FULL_DEMO_EPOCHS, "the tour names the full demo's last epochs"


CHEAP = [
    pytest.param(page, body, after, id=f"{page.stem}-{i}")
    for page, i, body, after in _getting_started_blocks()
    if not body.startswith(TOUR_MARK) and body.strip() not in EXPENSIVE and body != install_block()
]


def test_the_install_block_is_run_by_the_wheel_test():
    """``pip install 'epochsync[all]'`` needs an index that has the package: the wheel test runs the
    page's block as written, in a fresh venv, with the wheel it built as that index."""
    assert "install_block()" in (ROOT / "tests" / "integration" / "test_wheel.py").read_text()


@pytest.mark.parametrize(("page", "body", "output"), CHEAP)
def test_a_getting_started_block_runs_as_written(page, body, output, tmp_path):
    """Run in a scratch folder holding the page's titled files (``yaml title="epochsync.yaml"``)
    and the repository's ``tests`` and ``.venv``; the text block right after it is its output."""
    for _lang, title, text in fenced_blocks(page.read_text()):
        if title:
            (tmp_path / title).write_text(text)
    for name in ("tests", ".venv"):
        (tmp_path / name).symlink_to(ROOT / name)
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", body],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(ROOT / "include")),
    )
    assert done.returncode == 0, f"{page.name}:\n{body}\nexit {done.returncode}: {done.stderr[-3000:]}"
    if output is not None:
        assert done.stdout.strip() == output.strip(), f"{page.name}: the page shows other output than\n{body}"


def test_a_new_kind_of_source_gets_its_sections_without_an_edit():
    """A tagged union of mappings (as ``targets[]`` is by ``kind``) gets a section per kind and
    one for the list itself, whatever the list: a ``sources[]`` by kind too, for instance."""
    from epochsync_dev.docs.reference import _ConfigPage

    def source(kind: str, extra: str) -> dict:
        return {
            "type": "object",
            "description": f"A {kind} source.",
            "properties": {
                "kind": {"const": kind, "description": "the kind"},
                extra: {"type": "string", "description": "x"},
            },
            "required": ["kind"],
        }

    schema = {
        "properties": {
            "sources": {
                "type": "array",
                "items": {
                    "discriminator": {
                        "propertyName": "kind",
                        "mapping": {"lustre": "#/$defs/Lustre", "gluster": "#/$defs/Gluster"},
                    },
                    "oneOf": [{"$ref": "#/$defs/Lustre"}, {"$ref": "#/$defs/Gluster"}],
                },
                "description": "the file systems",
            }
        },
        "$defs": {"Lustre": source("lustre", "mdts"), "Gluster": source("gluster", "volume")},
    }
    page = _ConfigPage(schema)
    page.walk(schema, "", "top level")
    text = page.render()
    assert "## `sources[]` {#sources}" in text
    assert "## `sources[] (kind: gluster)` {#sources-kind-gluster}" in text and "| `volume` |" in text
    assert "## `sources[] (kind: lustre)` {#sources-kind-lustre}" in text and "| `mdts` |" in text
