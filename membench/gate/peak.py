"""The `memory_peak` fixture's measuring side (the plugin, membench/gate/pytest_plugin.py, imports it only when a
test asks for the fixture): a storage tracker around a block of the test's code, and the module hooks that say
which of a model's modules holds what."""

from __future__ import annotations

import pytest
import torch

from membench.common.vocab import GRADS
from membench.gate.measurement import Measurement
from membench.private import tree_flatten
from membench.trackers.modules import ModuleScopes, parameter_owners
from membench.trackers.storage import StorageTracker


class BlockTracker(StorageTracker):
    """The storage tracker for a block of user code: a view or in-place result of a tensor made before the block
    (a weight's transpose, `x.add_(1)`) shares that tensor's storage, which is not new memory and is not counted.
    (Inside a membench run every such tensor is registered up front; a test's tensors are not.)"""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = None
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            if t.layout == torch.strided and t.device.type == "cpu" and t.untyped_storage() not in self._keys:
                if inputs is None:
                    inputs = {a.untyped_storage().data_ptr() for a in tree_flatten((args, kwargs))[0]
                              if isinstance(a, torch.Tensor) and a.layout == torch.strided}
                if t.untyped_storage().data_ptr() in inputs:
                    continue  # an alias of memory from before the block
            self.track(t)
        return out



class _Owner:
    tracker = None


class MemoryPeak:
    """The `memory_peak` fixture's value. `memory_peak(name, model=None)` is a context manager yielding a
    Measurement; `memory_peak(fn, *args, **kwargs)` measures one call, returns the Measurement (`.result`: what
    fn returned)."""

    def __init__(self, request: pytest.FixtureRequest, gate):  # gate: the plugin's _Gate, checked at each block's end
        self.request, self.gate = request, gate
        self.measured: list[Measurement] = []

    def __call__(self, name_or_fn="peak", *args, model: torch.nn.Module | None = None, **kwargs):
        if callable(name_or_fn):
            name = getattr(name_or_fn, "__name__", None) or type(name_or_fn).__name__  # a module: its class
            with self._measure(name, model) as m:
                m.result = name_or_fn(*args, **kwargs)
            return m
        if args or kwargs:
            raise TypeError("memory_peak(name, model=None) takes no other arguments; to measure a call, pass "
                            "the function first: memory_peak(fn, *args)")
        return self._measure(str(name_or_fn), model)

    def _measure(self, name: str, model):
        return _Block(self, name, model)


class _Block:
    def __init__(self, peak: MemoryPeak, name: str, model):
        if any(m.name == name for m in peak.measured):
            raise ValueError(f"memory_peak: this test already measured a block named {name!r}; name each block")
        self.peak, self.name, self.model = peak, name, model

    def __enter__(self) -> Measurement:
        self.owner = _Owner()
        self.scopes = ModuleScopes(self.model, self.owner) if self.model is not None else None
        self.tracker = self.owner.tracker = BlockTracker(device_types=("cpu",))
        self.handles = []
        if self.model is not None:  # gradients of the model's parameters: category and owner known
            owners = parameter_owners(self.model)
            for p in self.model.parameters():
                if p.requires_grad:
                    self.handles.append(p.register_post_accumulate_grad_hook(
                        lambda p, owner=owners.get(p): self.tracker.track(p.grad, GRADS, owner)))
        self.tracker.__enter__()
        self.measurement = Measurement(self.name)
        return self.measurement

    def __exit__(self, *exc):
        self.tracker.__exit__(*exc)
        self.owner.tracker = None
        if self.scopes is not None:
            self.scopes.remove()
        for handle in self.handles:
            handle.remove()
        m, t = self.measurement, self.tracker
        m.peak_bytes, m.breakdown = t.peak.bytes, {c: b for c, b in t.peak.breakdown.items() if b}
        m.top_modules = t.top_modules(5) if self.model is not None else []
        self.peak.measured.append(m)
        if exc[0] is None:
            self.peak.gate.check(self.peak.request.node.nodeid, m)
        return False
