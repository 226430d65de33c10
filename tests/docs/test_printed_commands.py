"""Every command the docs, the code and the dev stack print parses as printed (issue 50,
deliverable 7), without running it: ``epochsync`` and ``python -m epochsync_dev`` with the
verb's own parser, ``python -m epochsync.MODULE`` with the parser its entry point builds,
``make`` against the Makefile, ``airflow`` with airflow's own CLI parser. How they are found
and what counts as one: :mod:`support.printed`. A command that some test runs for real is
counted as run, by that test, and parsed here too."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.docs import GETTING_STARTED, README, TOUR_MARK
from support.printed import (
    ROOT,
    Makefile,
    Printed,
    banner_commands,
    check_airflow,
    check_epochsync,
    check_module,
    code_commands,
    doc_commands,
    every_command,
    module_options_unchecked,
)

#: commands some test runs for real: where they are printed -> the test that runs them
GETTING_STARTED_TEST = "tests/docs/test_docs.py::test_a_getting_started_block_runs_as_written"
TOUR_TEST = "tests/integration/test_demo.py (run_tour)"
BACKFILL_TEST = "tests/integration/test_airflow_backfill.py::test_the_printed_backfill_commits_every_epoch_in_order"
EXPENSIVE_TESTS = {"make demo": "tests/integration/test_demo.py", "make test": "make test (the suite itself)"}


@pytest.fixture(scope="module")
def printed(tmp_path_factory) -> list[Printed]:
    found = every_command(tmp_path_factory.mktemp("banner"))
    for cmd in found:
        cmd.run_by = _run_by(cmd)
    return found


def _run_by(cmd: Printed) -> str:
    page, _, line = cmd.where.partition(":")
    if cmd.where.endswith("(printed_commands)"):
        return BACKFILL_TEST
    if not cmd.whole or not line.isdigit():
        return ""
    path = ROOT / page
    if path != README and path.parent != GETTING_STARTED:
        return ""
    block = _block_at(path, int(line))
    if block is None:
        return ""
    if block.startswith(TOUR_MARK):
        return TOUR_TEST
    if block.strip() in EXPENSIVE_TESTS:
        return EXPENSIVE_TESTS[block.strip()]
    return GETTING_STARTED_TEST if path.parent == GETTING_STARTED else ""


def _block_at(page: Path, line: int) -> str | None:
    """The body of the shell block of ``page`` that holds ``line``."""
    text = page.read_text()
    for m in re.finditer(r"^```bash[^\n]*\n(.*?)^```", text, re.M | re.S):
        first = text.count("\n", 0, m.start(1)) + 1
        if first <= line < first + m.group(1).count("\n") + 1:
            return m.group(1)
    return None


def _failures(commands: list[Printed], check) -> list[str]:
    return [f"{c}\n    -> {err}" for c in commands if (err := check(c))]


def test_every_epochsync_command_parses_with_its_verbs_parser(printed):
    """An option renamed or removed, a verb gone, a required option left out of a command that
    names options: the page or source line that prints it is named."""
    cmds = [c for c in printed if c.kind in ("epochsync", "dev")]
    assert len(cmds) > 150, len(cmds)
    failed = _failures(cmds, check_epochsync)
    assert not failed, f"{len(failed)} printed commands do not parse:\n" + "\n".join(failed)


def test_every_module_command_runs_as_a_program_and_parses(printed):
    cmds = [c for c in printed if c.kind == "module"]
    assert cmds
    failed = _failures(cmds, check_module)
    assert not failed, f"{len(failed)} printed commands do not parse:\n" + "\n".join(failed)
    # the ones whose entry point does something before it parses are checked for the module only
    assert sum(not module_options_unchecked(c) for c in cmds) >= len(cmds) // 2


def test_every_make_command_names_a_target_and_variables_it_reads(printed):
    makefile = Makefile.read()
    cmds = [c for c in printed if c.kind == "make"]
    assert len(cmds) > 100, len(cmds)
    failed = _failures(cmds, makefile.check)
    assert not failed, f"{len(failed)} printed make commands do not run:\n" + "\n".join(failed)


def test_every_airflow_command_parses_with_airflows_cli(printed):
    cmds = [c for c in printed if c.kind == "airflow"]
    errors = check_airflow(cmds)
    commands = [c for c, e in zip(cmds, errors) if e is not None]  # None: "the airflow part" (prose)
    groups = {tuple(c.tokens[1:3]) for c in commands}
    assert {("backfill", "create"), ("pools", "import"), ("dags", "trigger")} <= groups, groups
    failed = [f"{c}\n    -> {e}" for c, e in zip(cmds, errors) if e]
    assert not failed, f"{len(failed)} printed airflow commands do not parse:\n" + "\n".join(failed)


def test_the_commands_run_for_real_are_counted_with_their_test(printed):
    """The getting-started blocks, the tour and the banner's backfill are run by the tests named;
    each of those tests exists and runs what it is said to."""
    run = {c.run_by for c in printed if c.run_by}
    assert {GETTING_STARTED_TEST, TOUR_TEST, BACKFILL_TEST} <= run, run
    for test in run - {EXPENSIVE_TESTS["make test"]}:
        path, _, name = test.partition("::")
        path = path.split(" ")[0]
        text = (ROOT / path).read_text()
        assert (name or "run_tour(") in text, test
    backfill = [c for c in printed if c.run_by == BACKFILL_TEST]
    assert [c.tokens[1:3] for c in backfill] == [["backfill", "create"]], backfill


def test_the_finder_sees_every_place_a_command_is_printed(printed):
    wheres = {c.where.split(":")[0] for c in printed}
    for place in (
        "README.md",
        "docs/getting-started/index.md",
        "docs/operations/rollback.md",
        "docs/reference/cli.md",
        "include/epochsync/stages/rollback.py",  # an error's hint
        "include/epochsync/report/status.py",  # status's hint
        "include/epochsync/formats/cli.py",  # a --help epilog
        "include/epochsync_dev/gluster.py",  # make gluster's banner
        "include/epochsync_dev/devstack.py",  # make airflow's banner
        "dags/epochsync_audit.py",  # a DAG's doc_md, shown in the UI
        "Makefile",  # make help
    ):
        assert place in wheres, place


# --------------------------------------------------------------------------- the checks can fail


def _one(cmds: list[Printed], prefix: str) -> Printed:
    found = [c for c in cmds if " ".join(c.tokens).startswith(prefix)]
    assert len(found) == 1, (prefix, cmds)
    return found[0]


def test_a_renamed_option_or_verb_fails_naming_the_line(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text(
        "# A page\n\n"
        "```bash\n"
        "epochsync rollback --config epochsync.yaml --target dr --no-chek\n"
        "epochsync replicat --config epochsync.yaml --target dr --epoch 3\n"
        "make demo SEEDS=1\n"
        "make demos\n"
        "```\n\n"
        "Run `epochsync rollback --target T` after `epochsync status` (or `epochsync changes ... --to E`).\n"
        "Prose is not read: epochsync replicate --nothing.\n"
    )
    monkeypatch.setattr("support.printed.ROOT", tmp_path)
    cmds = doc_commands(page)
    assert [c.where for c in cmds] == ["page.md:4", "page.md:5", "page.md:6", "page.md:7"] + ["page.md:10"] * 3
    assert "unrecognized arguments: --no-chek" in check_epochsync(_one(cmds, "epochsync rollback --config"))
    assert check_epochsync(_one(cmds, "epochsync replicat ")) == "no verb 'replicat'"
    makefile = Makefile.read()
    assert "does not read SEEDS" in makefile.check(_one(cmds, "make demo "))
    assert makefile.check(_one(cmds, "make demos")) == "no make target 'demos'"
    # a command that names options is one to run: it must be whole; a verb's name need not be
    assert "required: --config" in check_epochsync(_one(cmds, "epochsync rollback --target"))
    assert check_epochsync(_one(cmds, "epochsync status")) == ""
    assert check_epochsync(_one(cmds, "epochsync changes")) == ""  # shortened on purpose: `...`


def test_a_hint_in_the_code_is_found_with_its_fields_as_placeholders(tmp_path, monkeypatch):
    module = tmp_path / "hint.py"
    module.write_text(
        '"""A docstring saying `epochsync replicate --bad` is not printed."""\n'
        "def f(cfg, name, e):\n"
        "    raise ValueError(\n"
        "        f\"target {name}: run 'epochsync rollback --config {cfg.file} --target {name}' first; \"\n"
        '        f"then epochsync replicate --config {cfg.file} --target {name} --through {e} (or wait)"\n'
        "    )\n"
        "def g(name):\n"
        "    return f\"run 'epochsync audit --target {name['x']}' and make soak SEED={name}\"\n"
        "PROSE = 'epochsync is a tool, make it so; the airflow part runs first'\n"
    )
    monkeypatch.setattr("support.printed.ROOT", tmp_path)
    cmds = code_commands(module)
    # the words after `airflow` in text are a command or prose as airflow's parser says (check_airflow)
    assert " ".join(cmds[-1].tokens) == "airflow part runs first"
    cmds = cmds[:-1]
    shown = [(c.where, " ".join(c.tokens)) for c in cmds]
    assert shown == [
        ("hint.py:4", "epochsync rollback --config @P@ --target @P@"),
        ("hint.py:4", "epochsync replicate --config @P@ --target @P@ --through @P@"),
        ("hint.py:8", "epochsync audit --target @P@"),
        ("hint.py:8", "make soak SEED=@P@"),
    ]
    assert [check_epochsync(c) for c in cmds[:2]] == ["", ""]
    assert "required: --config" in check_epochsync(cmds[2])
    assert Makefile.read().check(cmds[3]) == ""


def test_the_banner_is_read_as_make_airflow_prints_it(tmp_path):
    cmds = banner_commands(tmp_path)
    whole = [c for c in cmds if c.whole]
    assert len(whole) == 1 and whole[0].tokens[:3] == ["airflow", "backfill", "create"], cmds
    assert "--reprocess-behavior" in whole[0].tokens
    broken = Printed("x", "", [*whole[0].tokens, "--max-runs", "1"], whole=True)
    prose = Printed("x", "", ["airflow", "part", "runs"], whole=False)
    ok, bad, not_a_command = check_airflow([whole[0], broken, prose])
    assert (ok, not_a_command) == ("", None)
    assert "unrecognized arguments: --max-runs" in bad, bad
