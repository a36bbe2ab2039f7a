"""Workloads by name: built-in ViTs and GPTs, or the user's own `package.module:factory`."""

from __future__ import annotations

import functools
import importlib
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


def load_workload(name: str) -> Workload:
    """A built-in name, or 'package.module:factory' for the user's own model (see Workload)."""
    if ":" in name:
        return _load_user(name)
    table = _builtin()
    if name not in table:
        raise UserError(f"unknown workload {name!r}; valid: {', '.join(BUILTIN)}, or package.module:factory")
    return table[name]()


def check_workload_name(name: str) -> None:
    if ":" not in name and name not in BUILTIN:
        raise UserError(f"unknown workload {name!r}; valid: {', '.join(BUILTIN)}, or package.module:factory")


def _load_user(name: str) -> Workload:
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UserError(f"cannot import workload module {module_name!r}: {exc}") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise UserError(f"workload {name!r}: {module_name} has no callable {attr!r}")
    workload = factory()
    if not isinstance(workload, Workload):
        raise UserError(f"workload factory {name!r} must return membench.workloads.Workload, "
                        f"got {type(workload).__name__}")
    return workload


__all__ = ["Batch", "Workload", "load_workload", "check_workload_name", "BUILTIN"]
