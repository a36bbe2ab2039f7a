"""Workloads by name: built-in ViTs and GPTs, or the user's own `package.module:factory`."""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Callable

from membench.errors import UserError
from membench.workloads.base import Batch, Workload


def _builtin() -> dict[str, Callable[[], Workload]]:
    from membench.workloads import cnn, gpt, vit

    table: dict[str, Callable[[], Workload]] = {}
    table.update({name: functools.partial(vit.vit, name) for name in vit.CONFIGS})
    table.update({name: functools.partial(gpt.gpt, name) for name in gpt.CONFIGS})
    table["cnn-bn"] = cnn.cnn_bn
    return table


BUILTIN = ("vit-tiny", "vit-small", "vit_b_16", "vit_l_16", "gpt-tiny", "gpt-mini", "gpt-small", "gpt-medium",
           "cnn-bn")


# package.module:factory, each part a Python identifier: checked before anything is imported, so a path
# ('../../etc:passwd'), a relative import ('.x:f') or an empty name never reaches importlib.
_USER_WORKLOAD = re.compile(r"[^\W\d]\w*(\.[^\W\d]\w*)*:[^\W\d]\w*")
_MAX_NAME = 200  # longer dotted names make file names the system refuses (ENAMETOOLONG) while importing


def load_workload(name: str) -> Workload:
    """A built-in name, or 'package.module:factory' for the user's own model (see Workload)."""
    check_workload_name(name)
    if ":" in name:
        return _load_user(name)
    return _builtin()[name]()


def is_user_workload(name: str) -> bool:
    """A user's `package.module:factory` (their code), not a built-in (membench's)."""
    return ":" in name


def check_workload_name(name: str) -> None:
    if ":" not in name and name in BUILTIN:
        return
    shown = repr(name) if len(name) <= 80 else repr(name[:80]) + f"... ({len(name)} characters)"
    if ":" not in name:
        raise UserError(f"unknown workload {shown}; valid: {', '.join(BUILTIN)}, or package.module:factory")
    if len(name) > _MAX_NAME or not _USER_WORKLOAD.fullmatch(name):
        raise UserError(f"workload {shown} is not package.module:factory (Python identifiers joined by dots, a "
                        f"colon, the factory's name; at most {_MAX_NAME} characters), nor a built-in: "
                        f"{', '.join(BUILTIN)}")


def _load_user(name: str) -> Workload:
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except (ImportError, OSError) as exc:
        raise UserError(f"cannot import workload module {module_name!r}: {exc}") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise UserError(f"workload {name!r}: {module_name} has no callable {attr!r}")
    workload = factory()
    if not isinstance(workload, Workload):
        raise UserError(f"workload factory {name!r} must return membench.workloads.Workload, "
                        f"got {type(workload).__name__}")
    return workload


__all__ = ["Batch", "Workload", "load_workload", "check_workload_name", "is_user_workload", "BUILTIN"]
