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
from membench.spec import LIBRARY_OPTIMIZERS, OPTIMIZERS
from membench.workloads import import_attr

# Options a built-in optimizer accepts beyond lr (techniques pass foreach/fused; others are dropped for it).
_BUILTIN = {
    "adam": (torch.optim.Adam, {}, ("foreach", "fused")),
    "adamw": (torch.optim.AdamW, {"weight_decay": 0.01}, ("foreach", "fused")),
    "sgd": (torch.optim.SGD, {}, ("foreach", "fused")),
    "sgd-momentum": (torch.optim.SGD, {"momentum": 0.9}, ("foreach", "fused")),
    "adafactor": (getattr(torch.optim, "Adafactor", None), {}, ("foreach",)),
}

# From a library, by name: (module, class, the pip package). Each keeps its library's defaults but lr (bitsandbytes'
# and torchao's AdamW: weight_decay 1e-2); its state is what predict/emulate/lowbit_optimizers.py allocates.
LIBRARY = {
    "adamw8bit": ("bitsandbytes.optim", "AdamW8bit", "bitsandbytes"),
    "paged-adamw8bit": ("bitsandbytes.optim", "PagedAdamW8bit", "bitsandbytes"),
    "torchao-adamw8bit": ("torchao.optim", "AdamW8bit", "torchao"),
    "torchao-adamw4bit": ("torchao.optim", "AdamW4bit", "torchao"),
    "torchao-adamwfp8": ("torchao.optim", "AdamWFp8", "torchao"),
}
assert tuple(LIBRARY) == LIBRARY_OPTIMIZERS


def library_class(name: str) -> type:
    """The library optimizer's class; UserError (with the install hint) where the library is not installed or this
    release of it lacks the class."""
    module_name, cls_name, package = LIBRARY[name]
    import importlib
    import logging

    # torchao's import warns of its pytree registrations, bitsandbytes' of CPU kernels it could not load (for
    # 4-bit matmuls, not its optimizers): neither concerns the user.
    quiet = [logging.getLogger(name) for name in ("torch.utils._pytree", "bitsandbytes")]
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.ERROR)
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        raise UserError(f"optimizer {name} needs {package}, which is not installed: pip install 'membench[finetune]' "
                        f"(or pip install {package})") from None
    finally:
        for logger, level in zip(quiet, levels):
            logger.setLevel(level)
    cls = getattr(module, cls_name, None)
    if cls is None:
        raise UserError(f"optimizer {name}: {module_name} has no {cls_name} in the installed {package} "
                        f"{getattr(importlib.import_module(package), '__version__', '')}; upgrade {package}")
    return cls


def supports(name: str, option: str) -> bool:
    """Whether the optimizer takes `option` (foreach, fused). A user's factory: if its signature takes it."""
    if name in _BUILTIN:
        return option in _BUILTIN[name][2]
    if name in LIBRARY:  # a library's own kernels: neither takes foreach or fused
        return False
    params = inspect.signature(user_factory(name)).parameters
    return option in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def cuda_defaults_to_foreach(name: str) -> bool:
    """Whether torch picks the multi-tensor (foreach) step on CUDA when foreach is not given: Adam, AdamW and SGD do
    (torch.optim.optimizer._default_to_fused_or_foreach); Adafactor does not (foreach=None means single-tensor)."""
    return name in ("adam", "adamw", "sgd", "sgd-momentum")


@functools.cache
def user_factory(name: str) -> Callable[..., torch.optim.Optimizer]:
    """`package.module:factory`: a torch.optim.Optimizer subclass, or a Python function that builds one from the
    parameters. Anything else (a builtin such as os:system or builtins:eval, another class) is refused before it is
    called, as is an optimizer the training step cannot drive (refuse_unusable)."""
    factory = import_attr(name, "optimizer")
    if isinstance(factory, type):
        if not issubclass(factory, torch.optim.Optimizer) or factory is torch.optim.Optimizer:
            raise UserError(f"optimizer {name!r} is the class {factory.__name__}, not a subclass of "
                            "torch.optim.Optimizer")
        refuse_unusable(name, factory)
    elif not (inspect.isfunction(factory) or isinstance(factory, functools.partial)):
        raise UserError(f"optimizer {name!r} is a {type(factory).__name__}, not an optimizer: give a "
                        "torch.optim.Optimizer subclass or a Python function that builds one from the parameters")
    try:  # called as make() calls it: the parameters, and the options it takes by name (lr at least)
        inspect.signature(factory).bind(None, **_taken(factory, {"lr": 1.0}))
    except (TypeError, ValueError):
        raise UserError(f"optimizer {name!r} cannot be called with the parameters alone (it needs more arguments): "
                        "give a torch.optim.Optimizer subclass or a function of the parameters") from None
    return factory


def _taken(factory: Callable, kwargs: dict) -> dict:
    """Of the options make() has, those the factory takes by name (all of them where it takes **kwargs)."""
    taken = inspect.signature(factory).parameters
    if any(p.kind is p.VAR_KEYWORD for p in taken.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in taken}


def refuse_unusable(name: str, cls: type) -> None:
    """An optimizer membench's training step cannot drive: one whose step() needs a closure (LBFGS re-evaluates the
    loss itself; the step calls optimizer.step() after backward), or SparseAdam (sparse gradients only: a model's
    dense parameters get dense ones, which it rejects)."""
    closure = inspect.signature(cls.step).parameters.get("closure")
    if closure is not None and closure.default is inspect.Parameter.empty:
        raise UserError(f"optimizer {name!r}: {cls.__name__}.step needs a closure that re-evaluates the loss, and "
                        "membench's training step calls step() after backward, as most loops do")
    if issubclass(cls, torch.optim.SparseAdam):
        raise UserError(f"optimizer {name!r}: {cls.__name__} takes sparse gradients only (nn.Embedding(sparse=True)); "
                        "a model's dense parameters get dense gradients, which it rejects")


def check(name: str) -> None:
    """Refuse an unknown name, an optimizer this torch lacks, or a factory that cannot be imported, up front."""
    if name in _BUILTIN:
        if _BUILTIN[name][0] is None:
            raise UserError(f"optimizer {name} needs torch >= 2.5 (torch.optim.{name.capitalize()}); this is torch "
                            f"{torch.__version__}")
        return
    if name in LIBRARY:
        library_class(name)
        return
    if ":" not in name:
        raise UserError(f"unknown optimizer {name!r}; valid: {', '.join(OPTIMIZERS + LIBRARY_OPTIMIZERS)}, or "
                        "package.module:factory")
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
    if name in LIBRARY:
        refuse_options(name, options)
        return library_class(name)(params, lr=lr)
    factory = user_factory(name)
    optimizer = factory(params, **_taken(factory, {"lr": lr, **options}))
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UserError(f"optimizer factory {name!r} must return a torch.optim.Optimizer built from the parameters "
                        f"it is given, got {type(optimizer).__name__}")
    refuse_unusable(name, type(optimizer))
    return optimizer


def refuse_options(name: str, options: dict) -> None:
    """A library optimizer asked for foreach or fused (fused-adam): a refusal, not a no-op."""
    if any(options.values()):
        raise UserError(f"optimizer {name} does not take {', '.join(sorted(k for k in options if options[k]))}")


def check_device(name: str, device: str) -> None:
    """torchao's optimizers compile their step (torch.compile), which dynamo refuses under a dispatch mode: the
    storage tracker that measures a CPU run (and that a CPU-target prediction stands for) is one."""
    if name in LIBRARY and LIBRARY[name][2] == "torchao" and device == "cpu":
        raise UserError(f"optimizer {name}: torchao compiles its step, which cannot run under the storage tracker "
                        "that measures a CPU run; measure it with --device cuda, or predict it (membench predict)")
