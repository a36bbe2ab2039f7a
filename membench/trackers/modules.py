"""Which module is running, for the storage tracker: where the peak comes from, by module.

Forward: a pre-hook and a post-hook on every submodule push and pop its qualified name (`blocks.3.mlp`, from
`model.named_modules()`; the model itself by its class name), so an allocation belongs to the innermost module
running. Backward: when a module's forward returns, a pre-hook goes on the autograd node that made its output;
when that node starts in backward, the module's backward has started, and what backward allocates from then on is
that module's. A node made by several nested modules (a block whose output is its last layer's) is claimed by the
innermost, so backward is attributed as finely as forward.

Why not torch.utils.module_tracker.ModuleTracker: its backward hooks (register_multi_grad_hook) hold a module's
input gradients until all of them are computed, which can move the peak; a node pre-hook holds nothing, so the
totals (checked against torch's MemTracker to the byte) do not change. Ops between two child modules in backward
(a residual add in the parent) count for the child whose backward ran last: close, not exact.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from membench.private import queue_backward_callback
from membench.trackers.storage import NO_MODULE

CLAIM = "membench_module"  # key in an autograd node's metadata: the innermost module that produced it


class ModuleScopes:
    """Hooks on every submodule of `model` that tell `owner.tracker` (read at each call; None: do nothing) which
    module runs. `remove()` takes them all off."""

    def __init__(self, model: nn.Module, owner):
        self.owner = owner
        self.names = module_names(model)
        self._handles = []
        self._callback_queued = False
        for module, name in self.names.items():
            self._handles.append(module.register_forward_pre_hook(functools.partial(self._enter, name)))
            self._handles.append(module.register_forward_hook(functools.partial(self._exit, name)))

    def _enter(self, name: str, module, args) -> None:
        if torch.compiler.is_compiling():  # traced by Dynamo: nothing (a compiled region is its caller's)
            return
        tracker = self.owner.tracker
        if tracker is not None:
            tracker.enter_module(name)

    def _exit(self, name: str, module, args, output) -> None:
        if torch.compiler.is_compiling():
            return
        tracker = self.owner.tracker
        if tracker is None:
            return
        tracker.exit_module(name)
        if torch.is_grad_enabled():
            for node in _output_nodes(output):
                if CLAIM not in node.metadata:  # the innermost module returned first: it keeps the node
                    node.metadata[CLAIM] = name
                    node.register_prehook(functools.partial(self._backward, name))

    def _backward(self, name: str, grad_outputs) -> None:
        tracker = self.owner.tracker
        if tracker is None:
            return
        tracker.backward_module(name)
        if not self._callback_queued:  # when this backward ends, what follows (an optimizer step) is no module's
            queue_backward_callback(self._backward_done)
            self._callback_queued = True

    def _backward_done(self) -> None:
        self._callback_queued = False
        tracker = self.owner.tracker
        if tracker is not None:
            tracker.backward_module(NO_MODULE)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


def module_names(model: nn.Module) -> dict[nn.Module, str]:
    """Each module's qualified name (the model itself: its class name). A module reachable under two names
    (shared weights' owner) keeps the first, as named_modules() gives it once."""
    return {m: name or type(model).__name__ for name, m in model.named_modules()}


def parameter_owners(model: nn.Module) -> dict[torch.Tensor, str]:
    """Each parameter and buffer -> the qualified name of the module holding it (the model: its class name), in
    the order `model.to(device)` copies them (what a prediction registers its fake parameters in)."""
    root = type(model).__name__
    owners: dict[torch.Tensor, str] = {}
    for named in (model.named_parameters(), model.named_buffers()):
        for name, tensor in named:
            owners.setdefault(tensor, name.rpartition(".")[0] or root)
    ordered = {t: owners[t] for t in _apply_order(model) if t in owners}
    return {**ordered, **owners}


def _apply_order(module: nn.Module, seen: set[int] | None = None):
    """The tensors in the order nn.Module._apply visits them: each child first (depth first), then the module's
    own parameters, then its buffers; a tensor shared by two modules, once. On a GPU, a model built on the host and
    moved with `.to(device)` allocates its parameters in this order, not named_parameters()'s (the module's own
    first), which decides how they are laid out in the allocator's first segments."""
    seen = set() if seen is None else seen
    for child in module.children():
        yield from _apply_order(child, seen)
    for named in (module.named_parameters(recurse=False), module.named_buffers(recurse=False)):
        for _, tensor in named:
            if id(tensor) not in seen:
                seen.add(id(tensor))
                yield tensor


def _output_nodes(output):
    """The autograd nodes that made a module's output tensors (a tensor, or a tuple/list/dict of them)."""
    if isinstance(output, torch.Tensor):
        if output.grad_fn is not None:
            yield output.grad_fn
    elif isinstance(output, (tuple, list)):
        for item in output:
            yield from _output_nodes(item)
    elif isinstance(output, dict):
        for item in output.values():
            yield from _output_nodes(item)
