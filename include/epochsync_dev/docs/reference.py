"""The reference pages generated from the code: the configuration (from the pydantic models'
JSON Schema) and the command line (from the argument parsers).

Both walk what the code declares, so a key or a verb added to the code appears here at the
next ``make docs-ref`` without any edit to this module: a new source ``kind`` (a tagged
union of mappings, like ``targets[]``) gets a section per kind, a new verb of ``epochsync``
(``cli.VERBS``) a section of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
from collections.abc import Iterator
from typing import Any

from epochsync_dev.docs import BANNER

# --------------------------------------------------------------------------- configuration

#: what the config's value types mean, told once at the top of the page (keyed by the name
#: the Type column uses; the texts come from the schema where it has them)
_NAME_HELP = "letters, digits, `_`, `-` and `.`, starting with a letter or a digit"


class _ConfigPage:
    def __init__(self, schema: dict[str, Any]):
        self.schema = schema
        self.defs: dict[str, Any] = schema.get("$defs", {})
        self.sections: list[tuple[str, str, str, list[tuple[str, str, str, str]]]] = []
        self.value_types: dict[str, str] = {}
        #: list paths whose entries are a union tagged by a key: path -> (tag, [(value, section)])
        self.unions: dict[str, tuple[str, list[tuple[str, str]]]] = {}

    # one section per mapping of the file, depth first, in the models' key order
    def walk(self, node: dict[str, Any], path: str, title: str) -> None:
        rows: list[tuple[str, str, str, str]] = []
        later: list[tuple[dict[str, Any], str, str]] = []
        required = set(node.get("required", ()))
        for key, prop in node.get("properties", {}).items():
            sub = f"{path}.{key}" if path else key
            type_text, nested = self.type_of(prop, sub)
            later += nested
            rows.append((key, type_text, self.default_of(prop, key in required, type_text), self.describe(prop)))
        self.sections.append((path or "top level", title, _plain(node.get("description", "")), rows))
        for child, child_path, child_title in later:
            self.walk(child, child_path, child_title)

    def deref(self, node: dict[str, Any]) -> dict[str, Any]:
        ref = node.get("$ref")
        return self.defs[ref.rsplit("/", 1)[-1]] if ref else node

    def type_of(self, prop: dict[str, Any], path: str) -> tuple[str, list[tuple[dict[str, Any], str, str]]]:
        """The Type column of ``prop`` and the mappings under it that get sections of their own."""
        if "$ref" in prop or prop.get("type") == "object":
            return f"mapping ([below](#{_anchor(path)}))", [(self.deref(prop), path, path)]
        if "anyOf" in prop:
            members = [m for m in prop["anyOf"] if m.get("type") != "null"]
            if len(members) == 1:
                return self.type_of(members[0], path)
            unit = {m.get("description") for m in members if m.get("type") in ("integer", "number")}
            text = next((m["description"] for m in members if m.get("type") == "string" and m.get("description")), "")
            for name, numeric in (("size", "bytes"), ("duration", "seconds")):
                if numeric in unit:
                    self.value_types[name] = f"a number of {numeric}, or a string: {_plain(text)}"
                    return f"[{name}](#value-types)", []
            parts = [self.type_of(m, path) for m in members]
            return " or ".join(t for t, _ in parts), [n for _, ns in parts for n in ns]
        if "oneOf" in prop:
            tag = prop.get("discriminator", {}).get("propertyName", "kind")
            mapping = prop.get("discriminator", {}).get("mapping", {})
            nested = []
            links = []
            for value, ref in mapping.items():
                sub = f"{path} ({tag}: {value})"
                nested.append((self.defs[ref.rsplit("/", 1)[-1]], sub, sub))
                links.append(f"[{value}](#{_anchor(sub)})")
            self.unions[path] = (tag, [(value, sub) for value, (_, sub, _) in zip(mapping, nested, strict=True)])
            return f"mapping by `{tag}`: " + ", ".join(links), nested
        if "const" in prop:
            return f"`{prop['const']}`", []
        if "enum" in prop:
            return "one of " + ", ".join(f"`{v}`" for v in prop["enum"]), []
        kind = prop.get("type")
        if kind == "array":
            items = prop.get("items", {})
            inner, nested = self.type_of(items, path + "[]")
            if "$ref" in items or "oneOf" in items:
                inner = inner.replace("mapping (", "mappings (", 1) if inner.startswith("mapping (") else inner
                return "list of " + inner, nested
            least = ", at least one" if prop.get("minItems") else ""
            return f"list of {inner}{least}", nested
        if kind == "string":
            pattern = prop.get("pattern")
            if pattern and _is_name_pattern(pattern):
                self.value_types["name"] = _NAME_HELP
                return "[name](#value-types)", []
            if prop.get("format") == "date-time":
                return "ISO 8601 time", []
            if pattern:
                return f"string starting with `{pattern.lstrip('^')}`", []
            return "string", []
        if kind in ("integer", "number"):
            lo, hi = prop.get("minimum"), prop.get("maximum")
            word = "whole number" if kind == "integer" else "number"
            if lo is not None and hi is not None:
                return f"{word} from {lo} to {hi}", []
            if lo is not None:
                return f"{word}, at least {lo}", []
            return word, []
        if kind == "boolean":
            return "true or false", []
        return "any", []

    def default_of(self, prop: dict[str, Any], required: bool, type_text: str) -> str:
        if required:
            return "required"
        if "default" not in prop:
            return "its keys' defaults" if type_text.startswith("mapping") else ""
        value = prop["default"]
        if value is None:
            return "none"
        shown = f"`{json.dumps(value)}`"
        if "size" in type_text and isinstance(value, int) and value >= 1024:
            return f"{shown} ({_binary(value)})"
        if "duration" in type_text and isinstance(value, (int, float)):
            return f"`{value:g}` ({_seconds(value)})"
        return shown

    def describe(self, prop: dict[str, Any]) -> str:
        text = prop.get("description")
        if not text:
            inner = prop.get("items", prop)
            target = inner
            if "anyOf" in inner:
                target = next((m for m in inner["anyOf"] if "$ref" in m), inner)
            if "$ref" in target:
                text = self.deref(target).get("description", "")
        return _plain(text or "")

    def render(self) -> str:
        out = [
            BANNER.format(source="the pydantic models of include/epochsync/core/config.py"),
            "",
            "# Configuration reference",
            "",
            "Every key of the YAML file, generated from the models that validate it. Unknown keys are",
            "refused; a key set to nothing (`key:` or `key: null`) takes its default. Check a file",
            "without running anything with `python -m epochsync.core.config FILE`. The same models",
            "give the file's JSON Schema, [config.schema.json](../config.schema.json), for editors",
            "(put `# yaml-language-server: $schema=<path of config.schema.json>` on the file's first line).",
            "",
        ]
        if self.value_types:
            out += ["## Value types {#value-types}", "", "| type | written as |", "|---|---|"]
            out += [f"| {name} | {_cell(text)} |" for name, text in sorted(self.value_types.items())]
            out.append("")
        told = set()
        for path, title, description, rows in self.sections:
            union = next((u for u in self.unions if path.startswith(u + " (") and u not in told), None)
            if union is not None:  # the list itself: its entries' keys depend on the tag
                told.add(union)
                tag, kinds = self.unions[union]
                links = ", ".join(f"[{value}](#{_anchor(sub)})" for value, sub in kinds)
                out += [
                    f"## `{union}` {{#{_anchor(union)}}}",
                    "",
                    f"The keys of an entry depend on its `{tag}`: {links}.",
                    "",
                ]
            heading = "Top level" if path == "top level" else f"`{title}`"
            out += [f"## {heading} {{#{_anchor(path)}}}", ""]
            if description:
                out += [description, ""]
            out += ["| key | type | default | description |", "|---|---|---|---|"]
            out += [f"| `{k}` | {_cell(t)} | {_cell(d)} | {_cell(x)} |" for k, t, d, x in rows]
            out.append("")
        return "\n".join(out)


def _is_name_pattern(pattern: str) -> bool:
    from epochsync.core.config_values import NAME_RE

    return pattern == NAME_RE.pattern


def _anchor(path: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-") or "top-level"


def _plain(text: str) -> str:
    """A docstring as Markdown: ``literal`` marks become code, < and > are not HTML."""
    text = " ".join(text.split()).replace("``", "`")
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # outside code spans
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _binary(n: int) -> str:
    for unit, size in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"


def _seconds(s: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size and s % size == 0:
            return f"{int(s // size)}{unit}"
    return f"{s:g}s"


def config_reference() -> str:
    """The configuration reference page (``docs/reference/configuration.md``)."""
    from epochsync.core.config import config_schema

    page = _ConfigPage(config_schema())
    page.walk(page.schema, "", "top level")
    return page.render()


def config_keys_without_description() -> list[str]:
    """The key paths of the file whose reference row has no description (the docs tests refuse them)."""
    from epochsync.core.config import config_schema

    page = _ConfigPage(config_schema())
    page.walk(page.schema, "", "top level")
    return [f"{path}.{key}" for path, _, _, rows in page.sections for key, _, _, text in rows if not text.strip()]


# --------------------------------------------------------------------------- command line


@contextlib.contextmanager
def _columns(n: int) -> Iterator[None]:
    """argparse wraps usage lines to the terminal: a fixed width keeps the page the same anywhere."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(n)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def _option_rows(parser: argparse.ArgumentParser) -> list[tuple[str, str, str, str]]:
    formatter = parser._get_formatter()
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action.help == argparse.SUPPRESS:
            continue
        if action.option_strings:
            name = ", ".join(f"`{s}`" for s in action.option_strings)
        else:
            name = f"`{action.metavar or action.dest}`"
        if action.nargs == 0:
            value = "(flag)"
        elif action.choices is not None:
            value = " | ".join(f"`{c}`" for c in action.choices)
        else:
            metavar = action.metavar or (action.dest.upper() if action.option_strings else action.dest)
            value = f"`{metavar}`" + (" …" if action.nargs in ("*", "+") else "")
        if action.required or (not action.option_strings and action.nargs not in ("?", "*")):
            default = "required"
        elif action.nargs == 0 or action.default in (None, argparse.SUPPRESS) or action.default == []:
            default = ""
        else:
            default = f"`{action.default}`"
        text = formatter._expand_help(action) if action.help else ""
        rows.append((name, value, default, _plain(text)))
    return rows


def _verb_section(parser: argparse.ArgumentParser, title: str, level: int, note: str = "") -> list[str]:
    out = [f"{'#' * level} `{title}`", ""]
    if parser.description:
        out += [_plain(parser.description), ""]
    if note:
        out += [note, ""]
    out += ["```", parser.format_usage().strip(), "```", ""]
    rows = _option_rows(parser)
    if rows:
        out += ["| argument | value | default | description |", "|---|---|---|---|"]
        out += [f"| {a} | {_cell(v)} | {_cell(d)} | {_cell(t)} |" for a, v, d, t in rows]
        out.append("")
    sub = _subparsers(parser)
    for name, child in sub.choices.items() if sub else ():
        out += _verb_section(child, f"{title} {name}", level + 1)
    return out


def cli_reference() -> str:
    """The command-line reference page (``docs/reference/cli.md``), one section per verb."""
    from epochsync import cli

    with _columns(88):
        top = cli.build_parser(None)
        verbs = list(_subparsers(top).choices)
        from epochsync.core.errors import EXIT_CODES

        out = [
            BANNER.format(source="the argument parsers of include/epochsync/cli.py and each verb's configure_<verb>"),
            "",
            "# Command-line reference",
            "",
            _plain(top.description or ""),
            "",
            "```",
            top.format_usage().strip(),
            "```",
            "",
        ]
        out += ["| verb | what it does |", "|---|---|"]
        out += [f"| [`{v}`](#{_anchor('epochsync ' + v)}) | {_cell(_plain(cli.VERBS[v][1]))} |" for v in verbs]
        out.append("")
        for verb in verbs:
            parser = _subparsers(cli.build_parser(verb)).choices[verb]
            out += _verb_section(parser, f"epochsync {verb}", 2)
        from epochsync_dev import cli as dev

        out += [
            "",
            "## Development tools",
            "",
            "The simulator and the benchmarks are the project's own: they run from a checkout as",
            f"`{dev.PROG} VERB` and are not in the package (`epochsync --help` does not list them).",
            "",
            "| verb | what it does |",
            "|---|---|",
        ]
        out += [
            f"| [`{v}`](#{'python-m-epochsync_dev-' + v}) | {_cell(_plain(dev.DEV_VERBS[v][1]))} |"
            for v in dev.DEV_VERBS
        ]
        out.append("")
        for verb in dev.DEV_VERBS:
            parser = _subparsers(dev.build_parser(verb)).choices[verb]
            out += _verb_section(parser, f"{dev.PROG} {verb}", 3)
        out += [
            "",
            "## Exit codes",
            "",
            "Every error prints one line on standard error, saying what failed and where, and exits with",
            "the status of its class, so a script or an alert can tell them apart:",
            "",
            "| status | meaning |",
            "|---|---|",
        ]
        out += [f"| {code} | {_cell(_plain(what))} |" for code, what in EXIT_CODES]
    return "\n".join(out) + "\n"
