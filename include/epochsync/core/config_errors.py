"""A config mistake as the one line a person reads: the file, the key path
(``targets[1].verify.sample``) and what was expected, from pydantic's report
(:func:`config_error`), which never reaches the user itself."""

from __future__ import annotations

import difflib
import types
import typing
from typing import Annotated, Any

from pydantic import ValidationError
from pydantic_core import PydanticCustomError

from epochsync.core.errors import ConfigError


def key_error(key: str, reason: str) -> PydanticCustomError:
    """A rule across keys, reported at ``key`` (relative to the mapping it is raised in)."""
    return PydanticCustomError("config_key", "{reason}", {"key": key, "reason": reason})


def _kind(v: Any) -> str:
    kinds: dict[type, str] = {dict: "a mapping", list: "a list", str: "a string"}
    return kinds.get(type(v), type(v).__name__)


#: pydantic's error types for a key the mapping does not take
_UNKNOWN_KEY = ("extra_forbidden", "unexpected_keyword_argument", "invalid_key")
_MAPPING = ("dataclass_type", "dataclass_args_type", "model_type", "model_attributes_type", "dict_type")
_LIST = ("list_type", "tuple_type", "iterable_type")


def config_error(
    file: str, root: type, exc: ValidationError, refused: dict[type, dict[str, str]] | None = None
) -> ConfigError:
    """The one line a person reads for pydantic's report: file, key path, what was expected.

    The first problem is told (an unknown key before the others: a misspelt key is also a
    missing one); fixing it shows the next."""
    errors = sorted(exc.errors(include_url=False), key=lambda e: e["type"] not in _UNKNOWN_KEY)
    err = errors[0]
    kind, ctx, value, loc = err["type"], err.get("ctx") or {}, err.get("input"), err["loc"]
    if kind == "invalid_key":  # YAML reads `on:`, `yes:`, `1:` as keys that are no strings
        loc = (*loc[:-1], str(value))
    path, mapping = _key_path(root, loc)
    last = str(loc[-1]) if loc else ""
    tag = str(ctx.get("discriminator", "kind")).strip("'")
    if tag.endswith("()"):  # a callable discriminator (sources: kind defaults to changelogs)
        tag = "kind"
    if kind == "config_key":
        path = _join(path, ctx["key"])
        reason = ctx["reason"]
    elif kind in _UNKNOWN_KEY:
        hint = (refused or {}).get(mapping, {}).get(last) if mapping else None
        reason = hint or _unknown_key(last, _keys_of(mapping))
    elif kind == "missing":
        reason = "missing required key"
    elif kind == "union_tag_not_found":
        path, reason = _join(path, tag), "missing required key"
    elif kind == "union_tag_invalid":
        options = str(ctx.get("expected_tags", "")).replace("'", "")
        path, reason = _join(path, tag), f"expected one of {options}, got {value.get(tag)!r}"
    elif kind == "value_error":
        reason = str(ctx.get("error", err["msg"]))
    elif kind in _MAPPING:
        reason = f"expected a mapping, got {_kind(value)}"
    elif kind in _LIST:
        reason = f"expected a list, got {_kind(value)}"
    elif kind == "too_short":
        reason = "expected a non-empty list"
    elif kind == "string_type":
        reason = f"expected a string, got {value!r}"
    else:
        reason = f"{err['msg'][0].lower()}{err['msg'][1:]}, got {value!r}"
    return ConfigError(file, path or "(top level)", reason)


def _join(path: str, key: str) -> str:
    if not path:
        return key
    return path + key if key.startswith("[") else f"{path}.{key}"


def _key_path(root: type, loc: tuple) -> tuple[str, type | None]:
    """``targets[1].verify.sample`` for pydantic's location ``('targets', 1, 'posix', 'verify',
    'sample')`` (a union's tag is not a key of the file), and the class of the mapping that
    holds the last key."""
    path, tp, mapping = "", root, None  # type: tuple[str, Any, type | None]
    for part in loc:
        tp = _unwrap(tp)
        members = _tagged(tp)
        if members and part in members:
            tp = members[part]
            continue
        mapping = tp if _keys_of(tp) else None
        if isinstance(part, int) and mapping and part < len(_keys_of(mapping)):
            part = list(mapping.__pydantic_fields__)[part]  # a positional argument of a constructor
        if isinstance(part, int) and not mapping:
            path += f"[{part}]"
            args = typing.get_args(tp)
            tp = args[0] if args else None
        else:
            path = _join(path, str(part))
            fields = getattr(tp, "__pydantic_fields__", {})
            tp = next((f.annotation for n, f in fields.items() if (f.alias or n) == part or n == part), None)
    return path, mapping


def _unwrap(tp: Any) -> Any:
    """The type under ``Annotated[...]`` and ``X | None``."""
    while True:
        if typing.get_origin(tp) is Annotated:
            tp = typing.get_args(tp)[0]
            continue
        args = typing.get_args(tp)
        if typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args:
            rest = [a for a in args if a is not type(None)]
            if len(rest) == 1:
                tp = rest[0]
                continue
        return tp


def _tagged(tp: Any) -> dict[str, type]:
    """The members of a union told apart by ``kind``, by tag."""
    if typing.get_origin(tp) not in (typing.Union, types.UnionType):
        return {}
    out = {}
    for member in typing.get_args(tp):
        member = _unwrap(member)
        field = getattr(member, "__pydantic_fields__", {}).get("kind")
        for tag in typing.get_args(field.annotation) if field is not None else ():
            out[tag] = member
    return out


def _keys_of(tp: Any) -> list[str]:
    """The keys a mapping of the file takes (its YAML spellings)."""
    fields = getattr(tp, "__pydantic_fields__", None) or {}
    return [f.alias or n for n, f in fields.items()]


def _unknown_key(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
    mean = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown key ({mean}known keys here: {', '.join(sorted(known))})"
