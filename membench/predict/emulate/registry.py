"""The registry of CUDA emulations: what a CUDA GPU does that fake tensors on CPU do not, one registered class each.

Shaped like torch's flop registry (torch/utils/flop_counter.py: `register_flop_formula(ops)` puts one formula per
op in a table the counter looks ops up in): a module of predict/emulate/ defines a subclass of `Emulation` and
decorates it with `@emulation`; `CudaKernels` (predict/emulate/kernels.py) imports every module of this package
(`load_all`), makes each registered class once per prediction with the target GPU (`cls(gpu)`), and builds its op
table from their `ops`. An emulation does one or more of:

- `rewrite(func, args, kwargs)`: before one of its `ops` runs, the op (or a Python kernel) to run instead;
- `after(func, args, kwargs, out, tracker)`: after one of its `ops` ran, allocations and frees through the
  storage tracker (trackers/storage.py: `track`, `track_outputs`, `exclude`);
- `scratch(func, args, kwargs, out)`: after one of its `ops` ran, the allocations and frees its CUDA kernel makes
  inside the kernel, as `TraceEvent`s keyed by name, with `OUTPUTS` where the kernel allocates its outputs amid
  them (`outputs_amid`); the base `after` runs them and keeps the call (`KernelCall`) so that fit can work them
  out again at other batch sizes;
- `composite` and `kernel`: a CompositeImplicitAutograd op (by name) whose kernel `kernel` replaces while the
  prediction runs (at the dispatcher, so also in backward, where checkpointing recomputes the forward).

`ops` is a frozenset of the aten ops (or the Python kernels a rewrite put in their place) it acts on, or `ALL_OPS`.
Around an op the emulations of that op run in `order` (lower first; then by module and class name): each rewrite
gets the op as the ones before left it, and a rewrite that returns a Python kernel of its own (not an aten op) ends
the chain; the `after`s get the op that ran. """

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass

import torch

from membench.allocator.events import TraceEvent
from membench.common.vocab import OTHER

ALL_OPS = None  # an emulation's `ops`: every op
SCRATCH_MODULE = "(CUDA kernel scratch)"
OUTPUTS = TraceEvent("alloc", "(the op's outputs)")  # where, among an `outputs_amid` op's scratch events


class Emulation:
    """One part of what CUDA does differently from fake tensors on CPU (see the module's docstring)."""

    ops: frozenset | None = frozenset()
    order: int = 50
    composite: str | None = None  # the name of the aten op whose CompositeImplicitAutograd kernel `kernel` replaces
    outputs_amid: bool = False  # scratch: the kernel allocates the op's outputs at OUTPUTS among its events

    def __init__(self, gpu):
        self.gpu = gpu

    def rewrite(self, func, args, kwargs):
        return func

    def after(self, func, args, kwargs, out, tracker) -> None:
        """By default, runs `scratch`'s events through the tracker (an emulation with no scratch leaves it)."""
        if type(self).scratch is not Emulation.scratch:
            run_scratch(self, func, args, kwargs, out, tracker)

    def scratch(self, func, args, kwargs, out) -> list[TraceEvent]:
        return []

    def kernel(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} replaces no composite kernel")

    @classmethod
    def acts_before(cls) -> bool:
        return cls.rewrite is not Emulation.rewrite

    @classmethod
    def acts_after(cls) -> bool:
        return cls.after is not Emulation.after or cls.scratch is not Emulation.scratch


REGISTRY: list[type[Emulation]] = []


def emulation(cls: type[Emulation]) -> type[Emulation]:
    """Registers an Emulation subclass (a class decorator): every CUDA prediction made after this uses it."""
    if not (isinstance(cls, type) and issubclass(cls, Emulation)):
        raise TypeError(f"@emulation registers Emulation subclasses, not {cls!r}")
    if cls not in REGISTRY:
        REGISTRY.append(cls)
    return cls


def unregister(cls: type[Emulation]) -> None:
    """Takes a registered class out (a test's toy emulation)."""
    REGISTRY.remove(cls)


def load_all() -> list[type[Emulation]]:
    """Every registered emulation, in `order`, after importing each module of this package (which registers its
    own): a new emulation is one new module here, and nothing else to edit."""
    package = importlib.import_module(__package__)
    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{__package__}.{module.name}")
    return sorted(REGISTRY, key=lambda cls: (cls.order, cls.__module__, cls.__qualname__))


# --- kernel scratch, kept for fit ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelCall:
    """A call that may take scratch, as a trace keeps it: where in the trace its scratch events begin, how many
    there are (none, at these sizes), and the layouts of its tensors, from which fit works out its scratch at other
    batch sizes (the scratch is not affine in the batch: a kernel splits a reduction only past some size)."""

    at: int
    count: int
    func: object
    layout: tuple  # layout_of((args, kwargs, out))
    part: int = 0  # of an `outputs_amid` op: 0 before its outputs are allocated, 1 after


def layout_of(value):
    """A value with each tensor replaced by its layout: ("tensor", shape, strides, offset, dtype, storage bytes)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), tuple(value.stride()), value.storage_offset(), value.dtype,
                value.untyped_storage().nbytes())
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(layout_of(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, layout_of(v)) for k, v in value.items()))
    return value


def from_layout(layout):
    """layout_of's value again, with meta tensors of those layouts (nothing allocated)."""
    if isinstance(layout, tuple) and layout and layout[0] == "tensor":
        _, shape, stride, offset, dtype, nbytes = layout
        base = torch.empty(nbytes // dtype.itemsize, dtype=dtype, device="meta")
        return base.as_strided(shape, stride, offset)
    if isinstance(layout, tuple) and layout and layout[0] in ("list", "tuple"):
        items = [from_layout(v) for v in layout[1]]
        return items if layout[0] == "list" else tuple(items)
    if isinstance(layout, tuple) and layout and layout[0] == "dict":
        return {k: from_layout(v) for k, v in layout[1]}
    return layout


def scratch_parts(emulation: Emulation, events: list[TraceEvent]) -> list[list[TraceEvent]]:
    """A kernel's events in the parts its outputs' allocation divides them into: one, unless it allocates its
    outputs amid its scratch."""
    if not emulation.outputs_amid:
        return [events]
    at = events.index(OUTPUTS)
    return [events[:at], events[at + 1:]]


def run_scratch(emulation: Emulation, func, args, kwargs, out, tracker) -> None:
    """Allocates and frees an op's scratch through the tracker, with the op's outputs where the kernel allocates
    them: first (before the kernel runs), or at OUTPUTS; keeps the call where the tracker keeps kernel calls."""
    live = {}
    layout = None
    for part, events in enumerate(scratch_parts(emulation, emulation.scratch(func, args, kwargs or {}, out))):
        if part or not emulation.outputs_amid:
            tracker.track_outputs(out)
        at = len(tracker.trace) if tracker.trace is not None else 0
        for event in events:
            if event.kind == "alloc":  # held only in `live`, so that deleting it there frees it
                live[event.key] = torch.empty(event.size, dtype=torch.uint8)
                tracker.track(live[event.key], OTHER, SCRATCH_MODULE)
            else:
                del live[event.key]  # its storage's last reference: the tracker sees it freed now
        if tracker.kernel_calls is not None:
            layout = layout or layout_of((tuple(args), dict(kwargs or {}), out))
            tracker.kernel_calls.append(KernelCall(at, len(tracker.trace) - at, func, layout, part))


class KernelScratch:
    """The scratch of each op some registered emulation gives scratch for, on `gpu`: what fit asks of a kept call
    at other batch sizes (predict/fit/affine.py)."""

    def __init__(self, gpu):
        self.by_op: dict = {}
        for cls in load_all():
            if cls.scratch is not Emulation.scratch:
                instance = cls(gpu)
                self.by_op.update(dict.fromkeys(cls.ops, instance))

    def events(self, func, args, kwargs, out) -> list[TraceEvent]:
        """Its allocations and frees keyed by name, in the kernel's order ([] for most ops), with OUTPUTS where the
        kernel allocates its outputs amid them."""
        found = self.by_op.get(func)
        return found.scratch(func, args, kwargs or {}, out) if found is not None else []

    def events_of(self, call: KernelCall, layout: tuple | None = None) -> list[TraceEvent]:
        """The scratch events of a kept call, or of the same call with other layouts (fit's other batch sizes)."""
        args, kwargs, out = from_layout(call.layout if layout is None else layout)
        return scratch_parts(self.by_op[call.func], self.events(call.func, args, kwargs, out))[call.part]
