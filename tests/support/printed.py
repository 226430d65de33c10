"""The commands the documentation and the code print for a person to run, found and parsed
without running them (``tests/docs/test_printed_commands.py``).

Where they are found:

- the pages (``docs/**/*.md``, ``README.md``): every line of a shell block and every ``$ `` line
  of a text block is a command as written (continuations joined, comments dropped); inline code
  and the other lines of text blocks are read as text;
- the code (``include/epochsync``, ``include/epochsync_dev``, ``dags``, ``plugins``): every string
  constant or f-string that is not a docstring (a DAG file's, shown in the UI, is one), read as text
  (an f-string's fields become placeholders): messages, hints, ``--help`` texts and epilogs;
- the banner ``make airflow`` prints (:func:`epochsync_dev.devstack.banner`), read as text;
- what ``make help`` prints: the Makefile's target descriptions, and the variables they name.

In text, a command starts at ``epochsync VERB``, ``python -m epochsync_dev VERB``, ``python -m
epochsync[_dev].MODULE``, ``make TARGET`` or ``airflow GROUP``; quoted (``'...'``, ``"..."``,
backticks) it is what the quotes hold, otherwise it ends where the words stop being arguments
(the parser of the command says which words it takes). A command that names an option is one to
run: it must parse whole, required options included, unless it holds ``...`` (shortened on
purpose: ``epochsync replicate ... --epoch E``); a bare ``epochsync VERB`` names the verb and only
has to exist.

Placeholders (``FILE``, ``E``, ``E-1``, ``<target>``, ``$CFG``, an f-string's ``{field}``) stand
for a value the parser accepts there: a choice, a number or a word, whichever it takes.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: the code that prints: the package, the development tools, the DAG files and the plugin
CODE = (ROOT / "include" / "epochsync", ROOT / "include" / "epochsync_dev", ROOT / "dags", ROOT / "plugins")

#: a placeholder, once the text is tokenized
P = "@P@"
#: an f-string's field, before tokenizing
_FIELD_OPEN, _FIELD_CLOSE = "\u27e8", "\u27e9"

_PROGRAM = re.compile(
    r"(?<![\w./@-])(?P<prog>(?:(?:\.venv/bin/|var/airflow/bin/|[\w./@-]*/bin/)?(?:epochsync|airflow))"
    r"|python3? -m epochsync(?:_dev)?(?:\.\w+)*|make)(?= +\S)"
)
#: words after ``make`` that are English, not a target (``make it one``)
MAKE_PROSE = frozenset("a an the it its them that this these those sure up one every each no all".split())
_PLACEHOLDER = re.compile(r"^(?:[A-Z][A-Z0-9_]*(?:[+-]\d+)?(?:\.\.\.)?|\$\{?\w+\}?|.*@P@.*)$")
_SHELL_LANGS = {"bash", "sh", "shell", "console"}


def _module_clis() -> dict[str, tuple[str, tuple[str, ...]]]:
    """``python -m MODULE`` that are the command lines: module -> (kind, the verb it stands for)."""
    from epochsync_dev.cli import DEV_VERBS

    out = {"epochsync.cli": ("epochsync", ()), "epochsync_dev": ("dev", ()), "epochsync_dev.cli": ("dev", ())}
    for verb, (module, _) in DEV_VERBS.items():
        out.setdefault(module, ("dev", (verb,)))  # python -m epochsync_dev.bench NAME: the bench verb
    return out


_MODULE_CLIS = _module_clis()


@dataclass
class Printed:
    """One command found where a person reads it."""

    where: str  #: ``docs/x.md:12`` or ``include/epochsync/y.py:34``
    text: str  #: as printed (placeholders as found)
    tokens: list[str]  #: the command's words (placeholders as :data:`P`), program first
    whole: bool  #: a command line as written (a shell block's line), not a mention in text
    run_by: str = ""  #: the test that runs it for real, if one does

    @property
    def kind(self) -> str:
        """``epochsync``, ``dev`` (``python -m epochsync_dev``), ``module`` (``python -m
        epochsync.MODULE``), ``make`` or ``airflow``."""
        prog = self.tokens[0]
        if prog == "make":
            return "make"
        if prog == "python":
            return _MODULE_CLIS.get(self.tokens[2], ("module",))[0]
        return prog

    @property
    def argv(self) -> list[str]:
        """The words after the program (``python -m epochsync_dev.bench all``: ``bench all``)."""
        if self.tokens[0] != "python":
            return self.tokens[1:]
        return [*_MODULE_CLIS.get(self.tokens[2], ("", ()))[1], *self.tokens[3:]]

    def __str__(self) -> str:
        return f"{self.where}: {self.text}"


# --------------------------------------------------------------------------- finding


def _shell_split(text: str) -> list[list[str]]:
    """The simple commands of a shell line (split at ``&&``, ``||``, ``;``, ``|``; redirections dropped)."""
    lex = shlex.shlex(text, posix=True, punctuation_chars=";&|<>")
    lex.whitespace_split = True
    lex.commenters = ""
    try:
        words = list(lex)
    except ValueError:
        words = text.split()
    out, cur, skip = [], [], False
    for w in words:
        if skip:
            skip = False
            continue
        if w in ("&&", "||", ";", "|", "&"):
            out.append(cur)
            cur = []
        elif w in (">", ">>", "<", "2>", "&>"):
            skip = True
        elif re.fullmatch(r"\d?>&?\d?", w):
            continue
        else:
            cur.append(w)
    out.append(cur)
    return [c for c in out if c]


def _placeholders(text: str) -> str:
    """``<a target>`` and f-string fields as :data:`P` (one word, whatever they hold)."""
    text = re.sub(rf"{_FIELD_OPEN}[^{_FIELD_CLOSE}]*{_FIELD_CLOSE}", P, text)
    return re.sub(r"<[^<>\s|][^<>|\n]*>", P, text)


def _program(words: list[str]) -> list[str] | None:
    """``words`` from its program on (``sudo``, ``env`` and ``VAR=value`` dropped), or None when the
    program is not one of the project's."""
    while words and (words[0] in ("sudo", "env", "exec") or re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0])):
        words = words[1:]
    if not words:
        return None
    name = Path(words[0]).name
    if re.fullmatch(r"(?:\S*/bin/)?(epochsync|airflow)", words[0]):
        return [name, *words[1:]]
    if name == "make":
        return words
    if re.fullmatch(r"python3?(\.\d+)?", name) and len(words) > 2 and words[1] == "-m":
        if re.fullmatch(r"epochsync(_dev)?(\.\w+)*", words[2]):
            return ["python", "-m", *words[2:]]
    if name in _WRAPPERS:  # docker compose run --rm SERVICE python -m epochsync...
        inner = next((i for i, w in enumerate(words) if re.fullmatch(r"python3?", Path(w).name)), None)
        return _program(words[inner:]) if inner else None
    return None


#: programs that run another command given on their own command line
_WRAPPERS = {"docker", "kubectl", "ssh"}


def _starts_a_command(line: str) -> bool:
    """Whether a line of a text block is a command line, not output (``epochsync parse: error: ...``)."""
    words = _program(_tokens(line)) if line.strip() else None
    if not words or len(words) < (4 if words[0] == "python" else 2):
        return False
    return not words[3 if words[0] == "python" else 1].endswith(":")


def commands_of_line(line: str) -> list[list[str]]:
    """The project's commands in one shell line, each as its words (placeholders as :data:`P`)."""
    line = _placeholders(line)
    found = []
    for words in _shell_split(line):
        cmd = _program(words)
        if cmd is not None:
            found.append(cmd)
    return found


def _mention_end(text: str, start: int) -> int:
    """Where an unquoted command that starts at ``start`` stops: the end of its line, or the first
    ``" ("``, ``", "``, ``"; "``, ``": "`` or a ``.``/``)`` that ends a sentence."""
    ends = re.compile(r"(?<!\\)\n").search(text, start)
    end = ends.start() if ends else len(text)
    m = re.compile(r" \(|, |; | -->|:(?: |$)|[.)](?: |$)|\)").search(text, start, end)
    return m.start() if m else end


def mentions(text: str) -> list[tuple[int, str, bool]]:
    """The commands mentioned in a text: ``(offset, command text, quoted)``."""
    out, done = [], 0
    for m in _PROGRAM.finditer(text):
        if m.start() < done:
            continue  # inside the last one: ``make airflow`` is no ``airflow`` command
        before = text[m.start() - 1] if m.start() else ""
        if before and before in "'\"`":
            end = text.find(before, m.end())
            if end < 0:
                continue
            out.append((m.start(), text[m.start() : end], True))
        else:
            end = _mention_end(text, m.start())
            out.append((m.start(), text[m.start() : end], False))
        done = end
    return out


def _alternatives(tokens: list[str]) -> list[list[str]]:
    """A synopsis' ``a|b|c`` as one command per alternative (brackets of optional parts dropped)."""
    tokens = [t.strip("[]") if re.fullmatch(r"\[?[^\[\]]*\]?", t) else t for t in tokens]
    tokens = [t for t in tokens if t]
    choices = [t.split("|") if "|" in t and "||" not in t else [t] for t in tokens]
    return [list(c) for c in itertools.islice(itertools.product(*choices), 16)]


def _tokens(text: str) -> list[str]:
    try:
        return shlex.split(_placeholders(text))
    except ValueError:
        return _placeholders(text).split()


def _from_text(where: str, text: str, line_of) -> list[Printed]:
    out = []
    text = _placeholders(text)  # a field's expression may hold what ends a command: ``)``, quotes
    for offset, cmd, quoted in mentions(text):
        words = _program(_tokens(re.sub(r"\\\n\s*", " ", cmd)))
        if words is None or len(words) < (4 if words[0] == "python" else 2):
            continue
        if words[3 if words[0] == "python" else 1].endswith(":"):
            continue  # a program's name before its message (``epochsync replicate: error: ...``)
        if not quoted and not _names_a_command(words):
            continue
        for alt in _alternatives(words):
            out.append(Printed(f"{where}:{line_of(offset)}", cmd.strip(), alt, whole=False))
    return out


def _names_a_command(words: list[str]) -> bool:
    """Whether unquoted words that start like a command are one (``epochsync is`` is prose)."""
    if words[0] == "make":
        return words[1] not in MAKE_PROSE
    if words[0] == "epochsync":
        from epochsync.cli import VERBS

        return words[1] in VERBS or words[1] == "VERB" or words[1].startswith("--")
    if words[0] == "python" and words[2] == "epochsync_dev":
        from epochsync_dev.cli import DEV_VERBS

        return words[3] in DEV_VERBS or words[3] == "VERB" or words[3].startswith("--")
    return True


def _line_of(text: str):
    return lambda offset: text.count("\n", 0, offset) + 1


_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.M | re.S)
#: an inline code span; it may go on over a line break, not over a blank line
_INLINE_CODE = re.compile(r"(?<!`)`(?!`)((?:[^`\n]|\n(?![ \t]*\n))+?)`")


def doc_commands(page: Path) -> list[Printed]:
    """The commands of one Markdown page."""
    text = page.read_text()
    where = str(page.relative_to(ROOT))
    line_of = _line_of(text)
    out = []
    # the text outside the fenced blocks, each block as its line breaks (lines stay where they are)
    prose = _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    for m in _FENCE.finditer(text):
        lang, body = m.group(1), m.group(2)
        first = line_of(m.start(2))
        if lang in ("yaml", "json", "python", "toml", "ini"):
            continue
        if lang in _SHELL_LANGS:
            out += _block_commands(where, first, body, every_line=True)
        else:
            out += _block_commands(where, first, body, every_line=False)
    prose_line = _line_of(prose)
    for m in _INLINE_CODE.finditer(prose):
        span = m.group(1).replace("\n", " ")
        out += _from_text(where, f"`{span}`", lambda _o, n=prose_line(m.start()): n)
    return out


def _block_commands(where: str, first: int, body: str, *, every_line: bool) -> list[Printed]:
    """A fenced block's commands: each line of a shell block, each ``$ `` line of another block;
    the other lines of a text block are read as text."""
    out, prose = [], []
    lines = body.split("\n")
    i = 0
    while i < len(lines):
        n, line = first + i, lines[i]
        while line.endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line[:-1] + " " + lines[i].strip()
        i += 1
        bare = line.strip()
        dollar = bare.startswith("$ ")
        if dollar:
            bare = bare[2:]
        is_command = every_line or dollar or _starts_a_command(re.sub(r"(^|\s)#.*$", "", bare).strip())
        if is_command:
            bare = re.sub(r"(^|\s)#.*$", "", bare).strip()
            for words in commands_of_line(bare) if bare else []:
                for alt in _alternatives(words):
                    out.append(Printed(f"{where}:{n}", bare, alt, whole=True))
        elif not bare.startswith("usage:"):
            prose.append((n, line))
    # the other lines are read as text, a paragraph at a time (a message wrapped over lines)
    for _, para in itertools.groupby(prose, key=lambda nl: bool(nl[1].strip())):
        para = list(para)
        para = [(n, line[:-1] if line.endswith("\\") else line) for n, line in para]
        joined = " ".join(line for _, line in para)
        starts = list(itertools.accumulate([len(line) + 1 for _, line in para], initial=0))

        def line_of(offset, para=para, starts=starts):
            return para[max(i for i, s in enumerate(starts[:-1]) if s <= offset)][0]

        out += _from_text(where, joined, line_of)
    return out


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
            if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _render(node: ast.AST) -> str | None:
    """A string constant's text, or an f-string's with each field as a placeholder."""
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    parts = []
    for v in node.values:
        # the field's expression without its quotes: they would end a quoted command early
        shown = re.sub(r"['\"]", "", ast.unparse(v.value)) if isinstance(v, ast.FormattedValue) else v.value
        parts.append(shown if isinstance(v, ast.Constant) else f"{_FIELD_OPEN}{shown}{_FIELD_CLOSE}")
    return "".join(parts)


def code_strings(path: Path) -> list[tuple[int, str]]:
    """``(line, text)`` of every string of a module that is not a docstring (f-strings rendered); a
    module docstring a DAG shows in the UI (``doc_md=__doc__``) is one."""
    source = path.read_text()
    tree = ast.parse(source)
    skip = _docstrings(tree)
    if "doc_md=__doc__" in source and tree.body and isinstance(tree.body[0], ast.Expr):
        skip.discard(id(tree.body[0].value))
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skip |= {id(v) for v in node.values}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Constant, ast.JoinedStr)) and id(node) not in skip:
            text = _render(node)
            if text and _PROGRAM.search(text):
                out.append((node.lineno, text))
    return sorted(out)


def code_commands(path: Path) -> list[Printed]:
    """The commands a module's strings print."""
    where = str(path.relative_to(ROOT))
    out = []
    for line, text in code_strings(path):
        out += _from_text(where, text, lambda o, line=line, text=text: line + text.count("\n", 0, o))
    return out


def banner_commands(tmp: Path) -> list[Printed]:
    """The commands of the banner ``make airflow`` prints, rendered for a stack in ``tmp``."""
    from types import SimpleNamespace

    from epochsync_dev import devstack
    from epochsync_dev.simulate.verb import write_config

    config = write_config(tmp, bucket="source", conn_id="source_s3", servers=("MDT0000",), root_fid="[0x1:0x1:0x0]")
    stack = SimpleNamespace(
        url="http://127.0.0.1:8080", log_path=tmp / "standalone.log", wrapper=devstack.wrapper_path(tmp / "airflow")
    )
    endpoint = SimpleNamespace(url="http://127.0.0.1:8333", access_key="key")
    text = devstack.banner(stack, "password", config, 6, endpoint, "sc://127.0.0.1:15002")
    where = f"{Path(devstack.__file__).relative_to(ROOT)}:banner"
    out = _from_text(where, text, lambda _o: "banner")
    for cmd in devstack.printed_commands(text):
        out += [Printed(f"{where} (printed_commands)", cmd, w, whole=True) for w in commands_of_line(cmd)]
    return out


def make_help_commands(path: Path | None = None) -> list[Printed]:
    """What ``make help`` prints: each target's description read as text, and each ``VAR=value``
    it names as ``make TARGET VAR=value`` (a variable the target is said to take)."""
    path = path or ROOT / "Makefile"
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        m = re.match(r"^([a-zA-Z][\w-]*):.*## (.*)$", line)
        if not m:
            continue
        where = f"{path.relative_to(ROOT)}:{n} (make help)"
        out += _from_text(where.rsplit(":", 1)[0], m.group(2), lambda _o, n=n: f"{n} (make help)")
        for var in re.findall(r"(?<![\w])(?<!\$\()([A-Z][A-Z0-9_]*=[\w.,|-]+)", m.group(2)):
            out.append(Printed(where, f"make {m.group(1)} {var}", ["make", m.group(1), var], whole=True))
    return out


def doc_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def code_modules() -> list[Path]:
    return [p for root in CODE for p in sorted(root.rglob("*.py"))]


def every_command(tmp: Path) -> list[Printed]:
    """Every command the pages, the code and the ``make airflow`` banner print."""
    out = []
    for page in doc_pages():
        out += doc_commands(page)
    for module in code_modules():
        out += code_commands(module)
    return out + make_help_commands() + banner_commands(tmp)


# --------------------------------------------------------------------------- checking


def _value_for(action: argparse.Action) -> str:
    """A value ``action`` accepts, for a placeholder."""
    if action.choices:
        return str(next(iter(action.choices)))
    for candidate in ("1", "2026-01-01T00:00:00+00:00", "x"):
        try:
            if action.type is not None:
                action.type(candidate)
        except Exception:  # noqa: BLE001 - any refusal means: try the next
            continue
        return candidate
    return "x"


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def _positionals(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not a.option_strings and not isinstance(a, argparse._SubParsersAction)]


def _arg_like(word: str) -> bool:
    """Whether an unquoted word after a command is one of its arguments, not the sentence going on."""
    return bool(_PLACEHOLDER.match(word) or re.search(r"[/._=:0-9@]", word))


@dataclass
class Parsed:
    """What :func:`check_with_parser` made of a command."""

    argv: list[str] = field(default_factory=list)  #: the words given to the parser, placeholders filled in
    error: str = ""  #: argparse's message, empty when the command parses
    shortened: bool = False  #: ends in ``...``
    names_options: bool = False  #: names an option: a command to run, not a verb's name


def check_with_parser(parser: argparse.ArgumentParser, words: list[str], *, whole: bool) -> Parsed:
    """Parse ``words`` (the command after its program) with ``parser``, placeholders filled in.

    In text (``whole`` false) the words stop at the first that is not an argument. A command
    that names no option, or ends in ``...``, may leave out required arguments."""
    out = Parsed()
    p, positionals = parser, _positionals(parser)
    i = 0
    while i < len(words):
        w = words[i]
        if w in ("...", "…") or w.endswith("..."):
            out.shortened = True  # `epochsync replicate ... --epoch E`: the words left out are
            if len(w) <= 3:
                i += 1
                continue
            w = w[:-3]
        if w.startswith("-") and w not in ("-", "--"):
            out.names_options = True
            action = p._option_string_actions.get(w.split("=", 1)[0])
            if action is None and "=" not in w:
                # an abbreviation argparse would take, or an unknown option: the parser says which
                out.argv.append(w)
                i += 1
                if i < len(words) and not words[i].startswith("-") and _PLACEHOLDER.match(words[i]):
                    out.argv.append("x")
                    i += 1
                continue
            out.argv.append(w if P not in w else w.split("=", 1)[0] + "=" + _value_for(action))
            i += 1
            if action is not None and "=" not in w and action.nargs != 0:
                if i < len(words) and (whole or not words[i].startswith("-")):
                    v = words[i]
                    out.argv.append(_value_for(action) if _PLACEHOLDER.match(v) else v)
                    i += 1
            continue
        sub = _subparsers(p)
        if sub is not None:
            if _PLACEHOLDER.match(w) and w not in sub.choices:
                break  # `epochsync VERB --help`: any verb
            if not whole and w not in sub.choices:
                break
            out.argv.append(w)
            p, positionals = sub.choices.get(w, p), _positionals(sub.choices.get(w, p))
            i += 1
            continue
        if positionals and (whole or _arg_like(w) or w in (positionals[0].choices or ())):
            action = positionals[0]
            out.argv.append(_value_for(action) if _PLACEHOLDER.match(w) else w)
            if action.nargs not in ("+", "*", argparse.REMAINDER):
                positionals = positionals[1:]
            if action.nargs == argparse.REMAINDER:
                out.argv += words[i + 1 :]
                break
            i += 1
            continue
        if whole:
            out.argv.append(w)
            i += 1
            continue
        break
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(out.argv)
    except SystemExit as exc:
        if exc.code not in (0, None):
            out.error = err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {exc.code}"
    if out.error and (out.shortened or not out.names_options) and _only_missing(out.error):
        out.error = ""
    return out


def _only_missing(error: str) -> bool:
    return bool(re.search(r"the following arguments are required|one of the arguments .* is required", error))


def check_epochsync(cmd: Printed) -> str:
    """Empty when ``cmd`` (``epochsync ...`` or ``python -m epochsync_dev ...``) parses, else why not."""
    from epochsync import cli

    words = cmd.argv
    if cmd.kind == "dev":
        from epochsync_dev import cli as dev_cli

        verbs, build = dev_cli.DEV_VERBS, dev_cli.build_parser
    else:
        verbs, build = cli.VERBS, cli.build_parser
    verb = words[0] if words else ""
    if not words or (verb not in verbs and not verb.startswith("-") and not _PLACEHOLDER.match(verb)):
        return f"no verb {verb!r}" if words else "no verb"
    parser = build(verb if verb in verbs else None)
    return check_with_parser(parser, words, whole=cmd.whole).error


def check_module(cmd: Printed) -> str:
    """``python -m epochsync[_dev].MODULE ...``: the module runs as a program, and its words parse
    with the parser its entry point builds (when that entry point builds a parser before it does
    anything else: it is called with ``parse_args`` stopped at its first call, so nothing runs)."""
    import importlib
    import importlib.util

    name = cmd.tokens[2]
    try:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            spec = importlib.util.find_spec(f"{name}.__main__")
    except ModuleNotFoundError:
        spec = None
    if spec is None or spec.origin is None:
        return f"no module {name} that runs as a program (python -m {name})"
    tree = ast.parse(Path(spec.origin).read_text())
    entry = _entry_point(tree)
    if entry is None:
        return f"{name} does not run as a program (no __main__ block)"
    if not _parses_first(tree, entry):
        return ""  # runs; its options are not checked here (see module_options_unchecked)
    module = importlib.import_module(spec.name)
    parser = _captured_parser(getattr(module, entry))
    return "" if parser is None else check_with_parser(parser, cmd.tokens[3:], whole=cmd.whole).error


def module_options_unchecked(cmd: Printed) -> bool:
    """Whether :func:`check_module` checks only that ``cmd``'s module runs, not its words."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(cmd.tokens[2])
        if spec is not None and spec.submodule_search_locations:
            spec = importlib.util.find_spec(f"{cmd.tokens[2]}.__main__")
    except ModuleNotFoundError:
        return True
    if spec is None or spec.origin is None:
        return True
    tree = ast.parse(Path(spec.origin).read_text())
    entry = _entry_point(tree)
    return entry is None or not _parses_first(tree, entry)


def _entry_point(tree: ast.Module) -> str | None:
    """The name of the module's function its ``if __name__ == "__main__":`` block (or, in a
    ``__main__.py``, its top level) calls."""
    blocks = [
        n.body
        for n in tree.body
        if isinstance(n, ast.If) and "__name__" in ast.unparse(n.test) and "__main__" in ast.unparse(n.test)
    ]
    for stmt in itertools.chain(*blocks, [n for n in tree.body if isinstance(n, ast.Expr)]):
        for call in (c for c in ast.walk(stmt) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)):
            if call.func.id not in ("exit", "print"):
                return call.func.id
    return None


#: calls a function may make before it parses its command line, and still have done nothing
_HARMLESS = frozenset(
    "ArgumentParser add_argument add_subparsers add_parser add_mutually_exclusive_group add_argument_group "
    "set_defaults list tuple dict str split join parse_args".split()
)


def _parses_first(tree: ast.Module, entry: str) -> bool:
    """Whether ``entry`` (a function of ``tree``) parses its command line before anything else:
    every statement before its first ``parse_args`` call only builds the parser."""
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == entry), None)
    if fn is None:
        return False
    for stmt in fn.body:
        calls = [c for c in ast.walk(stmt) if isinstance(c, ast.Call)]
        names = {c.func.attr if isinstance(c.func, ast.Attribute) else getattr(c.func, "id", "") for c in calls}
        if isinstance(stmt, (ast.Import, ast.ImportFrom)) or (isinstance(stmt, ast.Expr) and not calls):
            continue
        if not names <= _HARMLESS:
            return False
        if "parse_args" in names:
            return True
    return False


class _Parsed(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser


def _captured_parser(entry) -> argparse.ArgumentParser | None:
    """The parser ``entry`` builds, caught at its first ``parse_args`` (nothing after it runs)."""

    def stop(self, *_a, **_k):
        raise _Parsed(self)

    original = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = stop
    try:
        try:
            entry([])
        except TypeError:
            entry()  # a main() that reads sys.argv itself
    except _Parsed as caught:
        return caught.parser
    finally:
        argparse.ArgumentParser.parse_args = original
    return None


@dataclass(frozen=True)
class Makefile:
    """The targets of the Makefile and the variables each target's recipe reads."""

    targets: dict[str, set[str]]

    @classmethod
    def read(cls, path: Path = ROOT / "Makefile") -> Makefile:
        text = path.read_text()
        targets: dict[str, set[str]] = {}
        for m in re.finditer(r"^([a-zA-Z][\w-]*):(?!=)([^\n]*)\n((?:\t[^\n]*\n?)*)", text, re.M):
            targets[m.group(1)] = set(re.findall(r"\$\(([A-Z_][A-Z0-9_]*)\)", m.group(3)))
        return cls(targets)

    def check(self, cmd: Printed) -> str:
        words = cmd.tokens[1:]
        target = words[0]
        if target not in self.targets:
            return f"no make target {target!r}"
        for w in words[1:]:
            var = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)=.*", w)
            if var:
                if var.group(1) not in self.targets[target]:
                    reads = ", ".join(sorted(self.targets[target])) or "none"
                    return f"make {target} does not read {var.group(1)} (its recipe reads: {reads})"
            elif w.startswith("-"):
                return f"make has no option {w!r} for this (a make option, not the target's)"
            elif cmd.whole and w not in self.targets:
                return f"no make target {w!r}"
            elif not cmd.whole:
                break
        return ""


def check_airflow(commands: list[Printed]) -> list[str | None]:
    """Parse every ``airflow ...`` command with airflow's own CLI parser, in one child process (the
    import of airflow stays out of the tests' process); returns for each command why it does not
    parse, an empty string when it does, or None when the words in text after ``airflow`` name no
    airflow command (``the airflow part``: prose)."""
    if not commands:
        return []
    payload = json.dumps([[c.tokens[1:], c.whole] for c in commands])
    code = (
        "import json, sys\n"
        "from airflow.cli.cli_parser import get_parser\n"
        "from support.printed import check_with_parser\n"
        "parser = get_parser()\n"
        "groups = next(a for a in parser._actions if a.choices).choices\n"
        "print(json.dumps([check_with_parser(parser, w, whole=whole).error if whole or w[0] in groups else None\n"
        "                  for w, whole in json.load(sys.stdin)]))\n"
    )
    with tempfile.TemporaryDirectory(prefix="airflow-cli-") as home:
        env = dict(
            os.environ,
            AIRFLOW_HOME=home,
            AIRFLOW__CORE__LOAD_EXAMPLES="False",
            PYTHONPATH=os.pathsep.join([str(ROOT / "include"), str(ROOT / "tests")]),
        )
        done = subprocess.run(
            [sys.executable, "-c", code], input=payload, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT
        )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
