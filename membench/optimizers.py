"""Optimizers by name, or the user's own `package.module:factory`.

The optimizer decides a large share of training memory through its state: none (SGD), one copy of the parameters
(SGD with momentum), two (Adam, AdamW), factored row and column statistics (Adafactor), or whatever a user's
optimizer keeps (8-bit states, ...). The techniques build optimizers through `make` (one over all parameters, or
one per parameter for opt-in-bwd), so every technique works with every optimizer.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

import torch

from membench.common.errors import UserError
from membench.spec import OPTIMIZERS
from membench.workloads import import_attr

# Options a built-in optimizer accepts beyond lr (techniques pass foreach/fused; others are dropped for it).
_BUILTIN = {
    "adam": (torch.optim.Adam, {}, ("foreach", "fused")),
    "adamw": (torch.optim.AdamW, {"weight_decay": 0.01}, ("foreach", "fused")),
    "sgd": (torch.optim.SGD, {}, ("foreach", "fused")),
    "sgd-momentum": (torch.optim.SGD, {"momentum": 0.9}, ("foreach", "fused")),
    "adafactor": (getattr(torch.optim, "Adafactor", None), {}, ("foreach",)),
}


def supports(name: str, option: str) -> bool:
    """Whether the optimizer takes `option` (foreach, fused). A user's factory: if its signature takes it."""
    if name in _BUILTIN:
        return option in _BUILTIN[name][2]
    params = inspect.signature(user_factory(name)).parameters
    return option in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def cuda_defaults_to_foreach(name: str) -> bool:
    """Whether torch picks the multi-tensor (foreach) step on CUDA when foreach is not given: Adam, AdamW and SGD do
    (torch.optim.optimizer._default_to_fused_or_foreach); Adafactor does not (foreach=None means single-tensor)."""
    return name in ("adam", "adamw", "sgd", "sgd-momentum")


@functools.cache
def user_factory(name: str) -> Callable[..., torch.optim.Optimizer]:
    factory = import_attr(name, "optimizer")
    if not callable(factory):
        raise UserError(f"optimizer {name!r}: {name.partition(':')[0]} has no callable {name.partition(':')[2]!r}")
    return factory


def check(name: str) -> None:
    """Refuse an unknown name, an optimizer this torch lacks, or a factory that cannot be imported, up front."""
    if name in _BUILTIN:
        if _BUILTIN[name][0] is None:
            raise UserError(f"optimizer {name} needs torch >= 2.5 (torch.optim.{name.capitalize()}); this is torch "
                            f"{torch.__version__}")
        return
    if ":" not in name:
        raise UserError(f"unknown optimizer {name!r}; valid: {', '.join(OPTIMIZERS)}, or package.module:factory")
    user_factory(name)


def make(name: str, params, lr: float, **options) -> torch.optim.Optimizer:
    """The optimizer `name` over `params`. options (foreach, fused) go only to an optimizer that takes them."""
    check(name)
    if name in _BUILTIN:
        cls, defaults, accepted = _BUILTIN[name]
        unsupported = set(options) - set(accepted)
        if any(options[k] for k in unsupported):  # e.g. fused=True asked of Adafactor: a refusal, not a no-op
            raise UserError(f"optimizer {name} does not take {', '.join(sorted(unsupported))}")
        return cls(params, lr=lr, **defaults, **{k: v for k, v in options.items() if k in accepted})
    factory = user_factory(name)
    kwargs = {"lr": lr, **options}
    taken = inspect.signature(factory).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in taken.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in taken}
    optimizer = factory(params, **kwargs)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UserError(f"optimizer factory {name!r} must return a torch.optim.Optimizer built from the parameters "
                        f"it is given, got {type(optimizer).__name__}")
    return optimizer
