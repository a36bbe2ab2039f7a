"""An exact, deterministic memory tracker for any device: it follows every tensor storage's life.

A TorchDispatchMode sees every tensor an op returns; a weakref finalizer on its untyped storage sees it freed.
Sizes are summed per category, so the peak and its breakdown are exact to the byte and repeatable, with no
allocator in between (rounding to the CUDA allocator's 512-byte blocks is optional, for predictions).

Each storage also belongs to a module: the one that owns it (parameters, their gradients and optimizer state) or
the one that was running when it was allocated (trackers/modules.py tells the tracker which, in forward and in
backward). Live bytes are summed per (module, category) too, and the sums at the peak say where the peak comes
from.
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from dataclasses import dataclass, field

import torch

from membench.allocator.events import DEFAULT_STREAM, TraceEvent
from membench.common.vocab import CATEGORIES, OTHER, PHASE_CATEGORY, RECOMPUTED
from membench.private import (
    PRIM_DEVICE,
    TorchDispatchMode,
    fake_device,
    fsdp_storage_modules,
    has_composite_implicit_kernel,
    is_traceable_wrapper_subclass,
    tree_flatten,
)
from membench.trackers import recompute

NO_MODULE = "(no module)"  # allocated outside any tracked module: the loss, the optimizer step, the inputs
NOT_COUNTED = -1  # the key of a storage excluded from the count (a CUDA prediction's host tensors)


@dataclass
class Peak:
    bytes: int = 0
    phase: str = "setup"
    step: int = -1
    breakdown: dict[str, int] = field(default_factory=dict)
    modules: dict[tuple[str, str], int] | None = None  # (module, category) -> bytes; filled lazily, see _changed


class StorageTracker(TorchDispatchMode):
    """Live bytes of all tensor storages created (or registered) while it is active, by category.

    round_to: sizes are rounded up to a multiple of this (1 = exact; 512 = the CUDA caching allocator's block).
    budget: raise torch.OutOfMemoryError once live bytes pass it (a GPU of that size, simulated on CPU).
    timeline: keep (event, phase, step, bytes per category) for every allocation and free.
    device_types: count only storages on these device types (e.g. ("cpu",) for host memory); None: all.
    trace: keep every allocation and free in order, with its raw (unrounded) size, as the allocator simulator
    reads it: TraceEvent.alloc(key, nbytes) and TraceEvent.free(key), on the default stream. A prediction's reserved
    memory comes from it.
    """

    def __init__(self, round_to: int = 1, budget: int | None = None, timeline: bool = False,
                 device_types: tuple[str, ...] | None = None, trace: bool = False):
        super().__init__()
        self.trace: list[TraceEvent] | None = [] if trace else None
        # Beside the trace: calls whose allocations depend on more than their outputs' sizes (CUDA kernel scratch,
        # predict/emulate/registry.KernelCall), kept so that fit can work them out at other batch sizes.
        self.kernel_calls: list | None = [] if trace else None
        self.kernels = None  # a CUDA prediction's predict.emulate.kernels.CudaKernels: called around every op
        self.on_op = None  # called (func, args, kwargs, out) after every op this mode runs (predict/time's recorder)
        # A prediction of several streams (predict/streams.py): the stream an allocation would be made on now, as a
        # small int (0: the default stream); an allocation's trace event then carries it, when it is not 0.
        self.stream_of = None
        self._stream_keys: dict[int, int] = {}  # storage key -> its stream, for those not on the default stream
        self.stream_bytes: dict[int, dict[str, int]] = {}  # stream -> category -> bytes allocated there (see below)
        self.device_types = device_types
        self.unseen = False  # while True, storages made are not counted (a CUDA run makes them on the host)
        # A CUDA prediction's memory outside the caching allocator (predict/emulate/off_device.OffDeviceLedger):
        # told of each op's outputs first, it keeps host tensors out of the count.
        self.off_device = None
        self.round_to = round_to
        self.budget = budget
        self.record_timeline = timeline
        self.phase = "setup"
        self.step = -1
        self.live: dict[int, tuple[int, str, str]] = {}  # storage key -> (bytes, category, module)
        self._keys = _StorageKeys(self._free)  # storage -> key
        self._counter = itertools.count()
        self.by_category = dict.fromkeys(CATEGORIES, 0)
        self.current = 0
        self.peak = Peak()
        self.events: list[tuple[str, int, tuple[int, ...]]] = []
        self.event_modules: list[str] = []  # beside events: the module running at each one (the timeline's hover)
        # Which module is running: a stack in forward (module hooks push and pop), and in backward the module
        # whose backward node last started (a checkpointed block's recomputed forward pushes on top of it).
        self.module = NO_MODULE
        self._module_stack: list[str] = []
        self._backward_module = NO_MODULE
        self.by_module: dict[tuple[str, str], int] = {}
        # The per-module sums are copied at the peak only when the peak is over (the next free): copying them at
        # every allocation that raises the peak would cost a dict copy per allocation while memory grows.
        self._peak_modules_pending = True

    # --- the dispatch hook ---------------------------------------------------------------------------------
    def __enter__(self):
        self._unpatch = _see_fsdp_storage_resizes(self)
        return super().__enter__()

    def __exit__(self, *exc):
        self._unpatch()
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is PRIM_DEVICE and (device := fake_device(args[0])) is not None:
            # The autograd engine and the optimizers ask a fake tensor's device about ten times per op; it
            # allocates nothing, and passing it down the modes below took a third of a prediction.
            return device
        if torch.is_inference_mode_enabled() and has_composite_implicit_kernel(func):
            # Under inference_mode a composite op (einsum, linear, matmul) reaches dispatch modes whole, and its
            # decomposition would run below this mode, unseen: its temporaries (layout copies) would be missed.
            # Run the decomposition here, with this mode on top again, as it runs outside inference_mode.
            with self:
                return func.decompose(*args, **(kwargs or {}))
        kernels, called = self.kernels, func
        if kernels is not None:  # a CUDA prediction: the in-place paths a plain run takes where this mode changes them
            func = kernels.rewrite(func, args, kwargs)
        out = func(*args, **(kwargs or {}))
        if self.off_device is not None:
            self.off_device.made(args, out)
        if kernels is not None:  # and what CUDA kernels allocate besides their outputs
            kernels.after(func, args, kwargs, out, self)
        self.track_outputs(out)
        if self.on_op is not None:
            self.on_op(called, args, kwargs or {}, out)
        return out

    def track_outputs(self, out) -> None:
        """Count an op's outputs (already counted ones are skipped: a kernel hook may count them first)."""
        # Most ops return a tensor or a plain tuple of them, whose leaves are themselves in order: those skip
        # pytree's flattening (3% of a prediction's time under cProfile, 70B shape at 32 layers).
        if isinstance(out, torch.Tensor):
            self.track(out)
            return
        if type(out) in (tuple, list) and all(isinstance(t, torch.Tensor) for t in out):
            for t in out:
                self.track(t)
            return
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.track(t)

    # --- registering and categorising ----------------------------------------------------------------------
    def track(self, tensor: torch.Tensor, category: str | None = None, module: str | None = None) -> None:
        """Count a tensor's storage if not yet counted; with a category (and owning module), (re)classify it."""
        if is_traceable_wrapper_subclass(tensor):  # e.g. FSDP's DTensor: the memory is in its local shards
            inner = (getattr(tensor, name) for name in tensor.__tensor_flatten__()[0])
            self.track_all(inner, category, module)
            return
        if tensor.layout != torch.strided or (self.device_types and tensor.device.type not in self.device_types):
            return
        if self.unseen:
            return
        storage = tensor.untyped_storage()
        key = self._keys.get(storage)
        nbytes = storage.nbytes()
        size = self._rounded(nbytes)
        if key is None:
            if size == 0:
                return
            key = next(self._counter)
            self._keys[storage] = key  # and self._free(key) when the storage is freed
            self._trace_alloc(key, nbytes)
            self._add(key, size, category or self._phase_category(), module or self.module)
        elif key == NOT_COUNTED:
            return
        else:
            old_size, old_category, old_module = self.live[key]
            if size != old_size:
                self._trace_free(key)
                self._trace_alloc(key, nbytes)
            if size != old_size or (category and category != old_category) or (module and module != old_module):
                # Nothing freed since the peak: the peak is now, and a new label (optimizer state stored by a first
                # step) belongs in the peak's breakdown too.
                at_peak = self._peak_modules_pending and size == old_size
                self._remove(key)
                self._add(key, size, category or old_category, module or old_module)
                if at_peak:
                    self.peak.breakdown = dict(self.by_category)
                    self._peak_modules_pending = True

    def exclude(self, tensor: torch.Tensor) -> None:
        """Never count this tensor's storage (not yet counted): memory of another device than the one measured."""
        storage = tensor.untyped_storage()
        if storage not in self._keys:
            self._keys[storage] = NOT_COUNTED

    def excluded(self, tensor: torch.Tensor) -> bool:
        return self._keys.get(tensor.untyped_storage()) == NOT_COUNTED

    def resized(self, tensor: torch.Tensor) -> None:
        """A storage resized in place (FSDP frees and re-allocates unsharded parameters so): a new allocation."""
        key = self._keys.get(tensor.untyped_storage())
        if key is not None and key != NOT_COUNTED:
            nbytes = tensor.untyped_storage().nbytes()
            self._trace_free(key)
            self._trace_alloc(key, nbytes)
            self._remove(key)
            self._add(key, self._rounded(nbytes), self._phase_category(), self.module)

    def _phase_category(self) -> str:
        if recompute.active():  # a checkpointed block's forward, run again in backward
            return RECOMPUTED
        return PHASE_CATEGORY.get(self.phase, OTHER)

    def track_all(self, tensors, category: str, module: str | None = None) -> None:
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self.track(t, category, module)

    # --- phases --------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def in_phase(self, phase: str):
        previous, self.phase = self.phase, phase
        self._clear_modules()  # a phase starts outside any module (and a forward that raised leaves no stack)
        try:
            yield
        finally:
            self.phase = previous
            self._clear_modules()

    def reset_peak(self) -> None:
        self.peak = Peak(self.current, self.phase, self.step, dict(self.by_category))
        self._peak_modules_pending = True

    # --- modules (called by trackers/modules.py) ----------------------------------------------------------
    def enter_module(self, name: str) -> None:
        self._module_stack.append(name)
        self.module = name

    def exit_module(self, name: str) -> None:
        stack = self._module_stack
        if stack and stack[-1] == name:
            stack.pop()
        self.module = stack[-1] if stack else self._backward_module

    def backward_module(self, name: str) -> None:
        """The backward of `name` starts: what backward allocates from now on is its."""
        self._backward_module = name
        if not self._module_stack:
            self.module = name

    def _clear_modules(self) -> None:
        self._module_stack.clear()
        self.module = self._backward_module = NO_MODULE

    def peak_modules(self) -> dict[tuple[str, str], int]:
        """Live bytes per (module, category) at the peak."""
        if self._peak_modules_pending:  # the peak is now: nothing was freed since it was reached
            self.peak.modules = dict(self.by_module)
            self._peak_modules_pending = False
        return self.peak.modules or {}

    def top_modules(self, n: int = 10) -> list[tuple[str, str, int]]:
        """The n largest (module, category, bytes) at the peak, largest first (ties by name: deterministic)."""
        held = sorted(self.peak_modules().items(), key=lambda kv: (-kv[1], kv[0]))
        return [(module, category, size) for (module, category), size in held[:n] if size > 0]

    def clear_events(self) -> None:
        self.events.clear()
        self.event_modules.clear()

    # --- bookkeeping ---------------------------------------------------------------------------------------
    def _rounded(self, nbytes: int) -> int:
        r = self.round_to
        return -(-nbytes // r) * r if r > 1 else nbytes

    def _add(self, key: int, size: int, category: str, module: str) -> None:
        self.live[key] = (size, category, module)
        self.by_category[category] += size
        held = self.by_module
        held[module, category] = held.get((module, category), 0) + size
        self.current += size
        self._changed()
        if self.budget is not None and self.current > self.budget:
            raise torch.OutOfMemoryError(
                f"membench: live tensor memory {self.current} bytes passed the budget of {self.budget} bytes")

    def _remove(self, key: int) -> None:
        if self._peak_modules_pending:  # the first free after the peak: the sums are still those at the peak
            self.peak_modules()
        size, category, module = self.live.pop(key)
        self.by_category[category] -= size
        held = self.by_module
        left = held.get((module, category), 0) - size  # absent: a 0-byte storage (FSDP's resize_(0))
        if left:
            held[module, category] = left
        else:
            held.pop((module, category), None)  # keep the dict small: copied at every peak
        self.current -= size

    def _free(self, key: int) -> None:
        if key in self.live:
            self._trace_free(key)
            self._remove(key)
            self._changed()

    # A diagnostic's (predict/beside.py, naming what each predicted allocation was): when set, called as
    # observer(tracker, event) after each event a tracing tracker keeps.
    observer = None

    def _traced(self, event: TraceEvent) -> None:
        self.trace.append(event)
        if StorageTracker.observer is not None:
            StorageTracker.observer(self, event)

    def _trace_alloc(self, key: int, nbytes: int) -> None:
        stream = self.stream_of() if self.stream_of is not None else DEFAULT_STREAM
        if stream != DEFAULT_STREAM:
            self._stream_keys[key] = stream
        if self.trace is not None:
            self._traced(TraceEvent.alloc(key, nbytes, stream))

    def _trace_free(self, key: int) -> None:
        """A storage (or a size of it) lets go of its block: counted for its stream by the category it has now."""
        if self.stream_of is not None:
            self._count_on_stream(key, self._stream_keys.pop(key, DEFAULT_STREAM))
        if self.trace is not None:
            self._traced(TraceEvent.free(key))

    def _count_on_stream(self, key: int, stream: int) -> None:
        size, category, _ = self.live[key]
        held = self.stream_bytes.setdefault(stream, {})
        held[category] = held.get(category, 0) + size

    def bytes_by_stream(self) -> dict[int, dict[str, int]]:
        """Bytes allocated on each stream, by category: each storage (each size of one FSDP resizes) counted once,
        by the category it had when freed, or has now."""
        totals = {stream: dict(held) for stream, held in self.stream_bytes.items()}
        for key, (size, category, _) in self.live.items():
            held = totals.setdefault(self._stream_keys.get(key, 0), {})
            held[category] = held.get(category, 0) + size
        return {stream: {c: b for c, b in held.items() if b} for stream, held in totals.items()}

    def _changed(self) -> None:
        if self.current > self.peak.bytes:
            self.peak = Peak(self.current, self.phase, self.step, dict(self.by_category))
            self._peak_modules_pending = True
        if self.record_timeline:
            self.events.append((self.phase, self.step, tuple(self.by_category[c] for c in CATEGORIES)))
            self.event_modules.append(self.module)


class _StorageKeys:
    """Storage -> its key, by identity, holding no storage alive; `freed(key)` is called as a counted storage is
    freed. One weak reference per storage: a WeakIdKeyDictionary entry and a weakref.finalize per storage (two
    weak references, a finalizer registry entry and a Python lookup object per query) took a tenth of the tracker's
    time per op. A storage's entry goes as it is freed, before its id can be another's."""

    def __init__(self, freed):
        self._held: dict[int, tuple[weakref.ref, int]] = {}
        self._freed = freed

    def get(self, storage) -> int | None:
        held = self._held.get(id(storage))
        return None if held is None else held[1]

    def __contains__(self, storage) -> bool:
        return id(storage) in self._held

    def __setitem__(self, storage, key: int) -> None:
        held, freed, ident = self._held, self._freed, id(storage)

        def gone(_, ident=ident, key=key):
            held.pop(ident, None)
            if key != NOT_COUNTED:
                freed(key)

        held[ident] = (weakref.ref(storage, gone), key)


def _see_fsdp_storage_resizes(tracker: StorageTracker):
    """FSDP2 frees unsharded parameters with `storage.resize_(0)`, which no dispatch mode sees: wrap its two
    helpers so the tracker hears of it. Only when FSDP is already imported (importing it costs a second)."""
    modules = fsdp_storage_modules()
    if not modules:
        return lambda: None
    originals = {(m, name): getattr(m, name) for m in modules
                 for name in ("alloc_storage", "free_storage") if hasattr(m, name)}

    def wrap(fn):
        def resize(tensor):
            fn(tensor)
            tracker.resized(tensor)
        return resize

    for (module, name), fn in originals.items():
        setattr(module, name, wrap(fn))

    def unpatch():
        for (module, name), fn in originals.items():
            setattr(module, name, fn)

    return unpatch
