"""Typed JSON: dataclasses to plain JSON values and back, every field's type checked on the way in.

Every file membench reads back (results, run specs, timelines) goes through `build_checked`, so a malformed or
hand-edited file is refused with one line naming the file and the field, the same way for all of them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import types
import typing
from pathlib import Path
from typing import Union

from membench.common.errors import UserError


def to_plain(value):
    """Dataclasses, lists, dicts and paths as plain JSON values; a NaN or infinity as None (strict JSON)."""
    if dataclasses.is_dataclass(value):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return None  # strict JSON has no NaN or Infinity
    if isinstance(value, Path):
        return str(value)
    return value


# Text in a file may hold what a terminal obeys: ESC starts sequences that retitle it (OSC), move the cursor or
# rewrite what is shown; CR and backspace overwrite a line; bidi overrides reorder what is read. Every string
# read back is made inert here, once, so every output (terminal, markdown, HTML, CSV) shows such a character as
# its escape (`\x1b`) instead of obeying it. Tab and newline stay: tracebacks and messages have lines.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def inert_text(text: str) -> str:
    """`text` with every control character and bidi override written as its escape (ESC as `\\x1b`)."""
    return _CONTROL.sub(_escape, text)


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


class _Bad(Exception):
    """A field of the wrong type: turned into one UserError naming the file and the field."""

    def __init__(self, field: str, expected: str, value):
        super().__init__(field)
        self.field, self.expected, self.value = field, expected, value


def _convert(tp, value, name: str):
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        options = [o for o in typing.get_args(tp) if o is not type(None)]
        if value is None and len(options) < len(typing.get_args(tp)):
            return None
        if len(options) == 1:  # X | None: the error inside X names the innermost field
            return _convert(options[0], value, name)
        for option in options:
            try:
                return _convert(option, value, name)
            except _Bad:
                continue
        raise _Bad(name, " or ".join(_type_name(o) for o in typing.get_args(tp)), value)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise _Bad(name, "an object", value)
        return _build(tp, value, name + ".")
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise _Bad(name, "a list", value)
        item = typing.get_args(tp)[0]
        items = [_convert(item, v, f"{name}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise _Bad(name, "an object", value)
        item = typing.get_args(tp)[1]
        return {inert_text(k): _convert(item, v, f"{name}.{k}") for k, v in value.items()}
    if origin is typing.Literal:
        if value in typing.get_args(tp):
            return value
        raise _Bad(name, "one of " + ", ".join(map(str, typing.get_args(tp))), value)
    plain = isinstance(value, bool) if tp is bool else (
        isinstance(value, int) and not isinstance(value, bool) if tp is int else
        isinstance(value, (int, float)) and not isinstance(value, bool) if tp is float else
        isinstance(value, str) if tp in (str, Path) else False)
    if not plain:
        raise _Bad(name, _type_name(tp), value)
    if tp in (str, Path):
        value = inert_text(value)
    return float(value) if tp is float else Path(value) if tp is Path else value


def _show(value) -> str:
    text = json.dumps(value) if isinstance(value, (str, int, float, bool, type(None))) else type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def _build(cls, data: dict, prefix: str = ""):
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            kwargs[f.name] = _convert(hints[f.name], data[f.name], prefix + f.name)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise _Bad(prefix + f.name, "present", "missing")
    return cls(**kwargs)


def build_checked(cls, data: dict, where: str):
    """`cls` from plain JSON data, every field's type checked; one UserError naming `where` and the field."""
    try:
        return _build(cls, data)
    except _Bad as bad:
        field = inert_text(json.dumps(bad.field, ensure_ascii=False)[1:-1])[:200]  # keys come from the file
        if bad.expected == "present":
            raise UserError(f"{where}: field {field} is missing") from None
        raise UserError(f"{where}: field {field} must be {bad.expected}, got {_show(bad.value)}") from None
    except RecursionError:
        raise UserError(f"{where}: nested too deeply to be a membench result") from None
