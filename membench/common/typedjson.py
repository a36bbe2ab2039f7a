"""Typed JSON: dataclasses to plain JSON values and back, every field's type checked on the way in.

Every file membench reads back (results, run specs, timelines, the pytest plugin's baselines) goes through
`build_checked`, so a malformed or hand-edited file is refused with one line naming the file and the field, the
same way for all of them; result files and baseline files are read from disk by one reader (`read_json_file`:
a regular file of bounded size, UTF-8, strict JSON with bounded numbers, `check_values`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import stat
import types
import typing
from pathlib import Path
from typing import Any, Union

from membench.common.errors import UserError
from membench.common.units import fmt_bytes


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
        key, item = typing.get_args(tp)
        return {_convert(key, k, f"{name} key"): _convert(item, v, f"{name}.{k}") for k, v in value.items()}
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


MAX_DIGITS = 30  # no byte count, step or seed has more; int() of a 5,000-digit number fails in Python itself
MAX_MAGNITUDE = 1e30  # above any byte count or rate a device measures; 1e308 overflows the charts' axes
MAX_NAME = 1024  # a name longer than a path cannot be a run's (its file is named after it)


def bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise ValueError(f"an integer of {len(text)} digits, at most {MAX_DIGITS}")
    return int(text)


def check_values(data, where: str, field_name: str = "") -> None:
    """Values no measurement produces, refused with the innermost field named: text that is not Unicode (lone
    surrogates), numbers out of range, a name longer than a file name."""
    if isinstance(data, dict):
        for key, value in data.items():
            key = str(key) if str(key).isprintable() else repr(key)  # a key holding a newline stays on one line
            check_values(value, where, f"{field_name}.{key}" if field_name else key)
    elif isinstance(data, list):
        for i, value in enumerate(data):
            check_values(value, where, f"{field_name}[{i}]")
    elif isinstance(data, str):
        try:
            data.encode("utf-8")
        except UnicodeEncodeError:
            raise UserError(f"{where}: field {field_name} is not valid Unicode text (a lone surrogate)") from None
        if field_name == "name" and len(data) > MAX_NAME:
            raise UserError(f"{where}: field name has {len(data)} characters, at most {MAX_NAME}")
    elif isinstance(data, (int, float)) and not isinstance(data, bool) and abs(data) > MAX_MAGNITUDE:
        raise UserError(f"{where}: field {field_name} is {data:.3g}, beyond {MAX_MAGNITUDE:g}: not a measurement")


def parse_json(text: str, where: str) -> Any:
    """Plain JSON values from text, or one UserError naming `where`: NaN and Infinity (which older writers of
    results wrote for an unknown number) read as no value, integers of at most MAX_DIGITS digits, every value
    within `check_values`."""
    try:
        data = json.loads(text, parse_constant=lambda c: None, parse_int=bounded_int)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError, as is bounded_int's
        raise UserError(f"{where} is corrupt (not JSON: {str(exc)[:120]})") from None
    try:
        check_values(data, where)
    except RecursionError:
        raise UserError(f"{where}: nested too deeply to be a membench file") from None
    return data


def read_json_file(path: Path, where: str, max_bytes: int, what: str) -> Any:
    """A JSON file's plain values (`parse_json`), read only where it is a regular file (a FIFO would block the
    read, a device never end it) of at most max_bytes; every problem one UserError naming `where`. what: what such
    a file is, for the message ("a membench result")."""
    try:
        mode = Path(path).stat().st_mode  # through a symlink: what it points at
        if stat.S_ISDIR(mode):
            raise UserError(f"{where} is not a regular file but a folder: not {what}")
        if not stat.S_ISREG(mode):
            raise UserError(f"{where} is not a regular file (a device, a pipe or a socket): not {what}")
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise UserError(f"{where} does not exist") from None
    except OSError as exc:
        raise UserError(f"cannot read {where}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise UserError(f"{where} is over {fmt_bytes(max_bytes)}: not {what}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{where} is corrupt (not UTF-8 text)") from None
    return parse_json(text, where)
