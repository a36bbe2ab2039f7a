"""Workloads by name: built-in ViTs and GPTs, Hugging Face models (`hf:NAME`), the user's own
`package.module:factory`, or a `Workload` object handed to the Python API (registered under a name here)."""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import re
import sys
from collections.abc import Callable

from membench.common.errors import UserError
from membench.workloads.base import Batch, Workload


def _builtin() -> dict[str, Callable[..., Workload]]:
    from membench.workloads import cnn, gpt, vit

    table: dict[str, Callable[..., Workload]] = {}
    table.update({name: functools.partial(vit.vit, name) for name in vit.CONFIGS})
    table.update({name: functools.partial(gpt.gpt, name) for name in gpt.CONFIGS})
    table["cnn-bn"] = cnn.cnn_bn
    return table


BUILTIN = ("vit-tiny", "vit-small", "vit_b_16", "vit_l_16", "gpt-tiny", "gpt-mini", "gpt-small", "gpt-medium",
           "cnn-bn")
HF_PREFIX = "hf:"
# Workload objects given to membench.run_sweep in this process, by the name their runs are recorded under. A
# forked child inherits them; a fresh `python -m membench.child.worker` process cannot see them.
REGISTERED: dict[str, Workload] = {}
VALID = f"{', '.join(BUILTIN)}, hf:NAME (Hugging Face), or package.module:factory"


# package.module:factory, each part a Python identifier: checked before anything is imported, so a path
# ('../../etc:passwd'), a relative import ('.x:f') or an empty name never reaches importlib.
_USER_WORKLOAD = re.compile(r"[^\W\d]\w*(\.[^\W\d]\w*)*:[^\W\d]\w*")
_MAX_NAME = 200  # longer dotted names make file names the system refuses (ENAMETOOLONG) while importing


def load_workload(name: str, seq_len: int | None = None) -> Workload:
    """A built-in name, `hf:NAME`, or 'package.module:factory' for the user's own model (see Workload).

    seq_len: tokens per sample for a text workload (--seq-len); None keeps the workload's default.
    """
    if name in REGISTERED:
        if seq_len is not None:
            raise UserError(f"--seq-len is for workloads built by name; workload {name!r} is a Workload object")
        return REGISTERED[name]
    check_workload_name(name)
    if name.startswith(HF_PREFIX):
        from membench.workloads import hf

        return hf.hf_workload(name.removeprefix(HF_PREFIX), seq_len)
    if ":" in name:
        return _load_user(name, seq_len)
    return _call_factory(_builtin()[name], name, seq_len)


def is_user_workload(name: str) -> bool:
    """A user's `package.module:factory` (their code, loaded only in a child process by `membench run`), not a
    built-in, a Hugging Face model by name, or a Workload object handed to the API."""
    return ":" in name and not name.startswith(HF_PREFIX) and name not in REGISTERED


def check_workload_name(name: str) -> None:
    if name in BUILTIN or name in REGISTERED:
        return
    shown = repr(name) if len(name) <= 80 else repr(name[:80]) + f"... ({len(name)} characters)"
    if name.startswith(HF_PREFIX):
        if len(name) > _MAX_NAME or name == HF_PREFIX:
            raise UserError(f"workload {shown}: write hf:NAME with a Hugging Face model name or model type "
                            f"(at most {_MAX_NAME} characters)")
        return
    if ":" not in name:
        raise UserError(f"unknown workload {shown}; valid: {VALID}")
    if len(name) > _MAX_NAME or not _USER_WORKLOAD.fullmatch(name):
        raise UserError(f"workload {shown} is not package.module:factory (Python identifiers joined by dots, a "
                        f"colon, the factory's name; at most {_MAX_NAME} characters), nor a built-in: {VALID}")


def import_attr(name: str, what: str):
    """`package.module:attr`, imported as pytest and uvicorn do for their module:attr arguments: from the working
    directory first, so `membench run --workload mypkg.bench:my_model` finds ./mypkg without installing it."""
    module_name, _, attr = name.partition(":")
    if not module_name or not attr:
        raise UserError(f"{what} {name!r} must be package.module:attribute")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except (ImportError, OSError) as exc:
        raise UserError(f"cannot import {what} module {module_name!r} (from {cwd} or the installed packages): "
                        f"{exc}") from None
    if not hasattr(module, attr):
        raise UserError(f"{what} {name!r}: {module_name} has no callable {attr!r}")
    return getattr(module, attr)


def _call_factory(factory: Callable[..., Workload], name: str, seq_len: int | None) -> Workload:
    if seq_len is None:
        return factory()
    params = inspect.signature(factory).parameters
    if "seq_len" not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        raise UserError(f"--seq-len is for text workloads; workload {name!r} does not take a seq_len")
    return factory(seq_len=seq_len)


def _load_user(name: str, seq_len: int | None) -> Workload:
    factory = import_attr(name, "workload")
    if not callable(factory):
        raise UserError(f"workload {name!r}: {name.partition(':')[0]} has no callable {name.partition(':')[2]!r}")
    workload = _call_factory(factory, name, seq_len)
    if not isinstance(workload, Workload):
        raise UserError(f"workload factory {name!r} must return membench.workloads.Workload, "
                        f"got {type(workload).__name__}")
    return workload


__all__ = ["Batch", "Workload", "load_workload", "check_workload_name", "is_user_workload", "import_attr", "BUILTIN",
           "REGISTERED"]
