"""Memory meters: the exact storage tracker on CPU, the caching allocator's own statistics on CUDA.

Both answer the same questions (peak, phase of the peak, memory after a step) so results compare across devices.
"""

from __future__ import annotations

import collections
import contextlib
import os
from collections.abc import Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

import torch
from torch import nn

from membench.common import vocab as cat
from membench.results import Memory, ModuleBytes
from membench.trackers.compiled import CompiledStorageTracker
from membench.trackers.modules import ModuleScopes, parameter_owners
from membench.trackers.storage import StorageTracker
from membench.trackers.timeline import Recording


@runtime_checkable
class Meter(Protocol):
    """What a run's memory is read through (measure.Session holds one from build to the last step): CpuMeter on CPU
    and for predictions, CudaMeter on a CUDA GPU; make_meter picks. Both answer the same questions (peak, its phase
    and step, memory after a step) in one Memory record."""

    device: Literal["cpu", "cuda"]
    tracker: StorageTracker | None  # categories, modules and phases, where this meter keeps them (CUDA: recording)

    def attach_model(self, model: nn.Module) -> None:
        """Hook the model's parameters and gradients (again after a technique replaces them)."""

    def attach_optimizers(self, optimizers: Iterable[torch.optim.Optimizer]) -> None:
        """Hook the optimizers' state as it is made."""

    def detach(self) -> None:
        """Every hook off, and no reference kept to the model or the optimizers."""

    def active(self) -> AbstractContextManager[Meter]:
        """Measuring within this block (CPU: the storage tracker dispatching; CUDA: always)."""

    def recording(self, stem: Path) -> AbstractContextManager[Recording]:
        """The recording pass: every event kept, for the timeline (files named from `stem`)."""

    def track_inputs(self, batch) -> None:
        """A step's input batch, counted as inputs where the meter tells categories apart."""

    def phase(self, name: str) -> AbstractContextManager[None]:
        """Within this block, allocations belong to phase `name` (a key of vocab.PHASE_CATEGORY)."""

    def start_step(self, step: int) -> None:
        """The steps' index from here: the peak's step."""

    def reset_peak(self) -> None:
        """The peak from here on: the measured steps'."""

    def current(self) -> int:
        """Bytes allocated now."""

    def close(self) -> None:
        """Undo what this meter set process-wide."""

    def result(self) -> Memory:
        """What was measured, as one Memory record."""


class _Categorised:
    """Tells a StorageTracker (when there is one) which tensors are parameters, gradients, optimizer state, and
    which module owns them or is running (trackers/modules.py).

    The hooks go on at build time, before any technique's own hooks (opt-in-bwd frees a gradient in its hook),
    do nothing while `tracker` is None (CUDA outside its recording pass), and all come off at `detach`, so the
    timed steps run with nothing of membench attached.
    """

    tracker: StorageTracker | None = None
    # False for a model the stack compiles whole: its module hooks would be traced away (trackers/modules.py), and
    # removing them at detach would make Dynamo compile it again (it guards on a module's hooks).
    module_scopes = True

    def attach_model(self, model: nn.Module) -> None:
        """Called at build, and again by a technique that replaces the parameters (FSDP): hooks go on once."""
        self.model = model
        self._handles = getattr(self, "_handles", [])
        if getattr(self, "_scopes", None) is not None:
            self._scopes.remove()
        self._scopes = ModuleScopes(model, self) if self.module_scopes else None
        self._owners = parameter_owners(model)
        self._register_model()
        for p in model.parameters():
            if p.requires_grad:
                self._handles.append(p.register_post_accumulate_grad_hook(self._track_grad))

    def _register_model(self) -> None:
        if self.tracker is not None:
            for tensor, owner in self._owners.items():
                self.tracker.track(tensor, cat.PARAMS, owner)
            for p in self.model.parameters():
                if p.grad is not None:
                    self.tracker.track(p.grad, cat.GRADS, self._owners.get(p))

    def _track_grad(self, param) -> None:
        if self.tracker is not None and param.grad is not None:
            self.tracker.track(param.grad, cat.GRADS, self._owners.get(param))

    def attach_optimizers(self, optimizers) -> None:
        self.optimizers = list(optimizers)
        for opt in optimizers:
            opt.state = _StateTable(opt.state, self._store_state)
            self._handles.append(opt.register_step_post_hook(self._track_state))

    def _store_state(self, param, value) -> None:
        if self.tracker is not None and isinstance(value, torch.Tensor):
            self.tracker.track(value, cat.OPTIMIZER, getattr(self, "_owners", {}).get(param))

    def _track_state(self, optimizer, args=(), kwargs=None) -> None:
        """After each step: whatever state the optimizer holds (an optimizer that stores its state other than by
        `state[param][key] = tensor` is seen here)."""
        if self.tracker is not None:
            owners = getattr(self, "_owners", {})
            for param, state in optimizer.state.items():
                self.tracker.track_all(state.values(), cat.OPTIMIZER, owners.get(param))

    def detach(self) -> None:
        """Remove every hook membench put on the model and optimizers, and let go of them: after this the meter
        holds no reference to the model, its parameters or the optimizers (their state), so the caller can free
        them (the equivalence check builds two more models on the same device)."""
        for handle in getattr(self, "_handles", []):
            handle.remove()
        self._handles = []
        for opt in getattr(self, "optimizers", ()):
            if isinstance(opt.state, _StateTable):
                opt.state = opt.state.plain()
        if getattr(self, "_scopes", None) is not None:
            self._scopes.remove()
            self._scopes = None
        self.model, self.optimizers, self._owners = None, [], {}


class _ParamState(dict):
    """One parameter's optimizer state, which tells the meter of each value the moment the optimizer stores it."""

    def __init__(self, items, param, on_store):
        super().__init__(items)
        self.param, self.on_store = param, on_store

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        self.on_store(self.param, value)


class _StateTable(collections.defaultdict):
    """An optimizer's `state` while the meter is attached. State created inside a measured step (a first step, as
    with --warmup 0) is optimizer state from its first byte, in the peak's breakdown too, not a temporary of the
    step. Optimizers fill it as `self.state[p]["exp_avg"] = ...`; `plain()` gives torch's own form back."""

    def __init__(self, table, on_store):
        super().__init__(dict)
        self.on_store = on_store
        for param, state in table.items():
            dict.__setitem__(self, param, _ParamState(state, param, on_store))

    def __missing__(self, param):
        state = self[param] = _ParamState({}, param, self.on_store)
        return state

    def plain(self) -> collections.defaultdict:
        return collections.defaultdict(dict, {param: dict(state) for param, state in self.items()})


TOP_MODULES = 10  # kept in the result; the terminal shows 5


def top_modules(tracker: StorageTracker, n: int = TOP_MODULES) -> list[ModuleBytes]:
    return [ModuleBytes(module=m, category=c, bytes=b) for m, c, b in tracker.top_modules(n)]


class CpuMeter(_Categorised):
    """Exact live tensor bytes on CPU, by category, via StorageTracker. Deterministic: same run, same bytes."""

    device = "cpu"

    def __init__(self, budget: int | None = None, timeline: bool = False, round_to: int = 1, trace: bool = False,
                 compiled: bool = False):
        # compiled: torch.compile'd code runs compiled under the tracker, its Inductor buffers counted
        # (trackers/compiled.py); else it runs eager, as under any dispatch mode.
        kind = CompiledStorageTracker if compiled else StorageTracker
        self.module_scopes = not compiled
        self.tracker = kind(round_to=round_to, budget=budget, timeline=timeline, trace=trace)

    @contextlib.contextmanager
    def active(self):
        with self.tracker:
            yield self

    @contextlib.contextmanager
    def recording(self, stem: Path):
        """The tracker again, now keeping every event: the recording pass (see measure.Session.record_timeline)."""
        t = self.tracker
        t.clear_events()
        t.record_timeline = True
        try:
            with t:
                yield Recording(t)
        finally:
            t.record_timeline = False

    def track_inputs(self, batch) -> None:
        self.tracker.track_all(batch, cat.INPUTS)

    def phase(self, name: str):
        return self.tracker.in_phase(name)

    def start_step(self, step: int) -> None:
        self.tracker.step = step

    def reset_peak(self) -> None:
        self.tracker.reset_peak()

    def current(self) -> int:
        return self.tracker.current

    def close(self) -> None:
        """Nothing process-wide to undo on CPU."""

    def result(self) -> Memory:
        peak = self.tracker.peak
        rounding = self.tracker.round_to
        method = "storage-tracker" + (f", {rounding}-byte blocks" if rounding > 1 else "")
        if isinstance(self.tracker, CompiledStorageTracker):
            method += ", Inductor's buffers hooked"
        return Memory(device="cpu", method=method, peak_allocated_bytes=peak.bytes, peak_active_bytes=peak.bytes,
                      peak_phase=peak.phase, peak_step=peak.step, breakdown_at_peak=dict(peak.breakdown),
                      current_bytes=self.tracker.current, current_breakdown=dict(self.tracker.by_category),
                      top_modules=top_modules(self.tracker))


# Where a CUDA timeline's categories come from (TimelineInfo.source).
HISTORY_SOURCE = "the allocator's history, labelled by phase, module and tensor"
STORAGE_TRACKER_SOURCE = ("the storage tracker (a dispatch mode, under which backward takes some out-of-place "
                          "paths the measured steps do not); snapshot from the allocator's history")
ASYNC_SOURCE = ("the storage tracker (a dispatch mode, under which backward takes some out-of-place paths the "
                "measured steps do not); no snapshot: backend:cudaMallocAsync records no history")


class CudaMeter(_Categorised):
    """The CUDA caching allocator's statistics, read per phase: a phase's peak is the allocator's peak since the
    phase began, so the peak's phase costs no extra synchronisation. What the driver sees (CUDA context, cuBLAS
    workspaces, NCCL buffers) is read with cudaMemGetInfo after the steps."""

    device = "cuda"

    def __init__(self, budget: int | None = None):
        self.budget = budget
        self.callers_fraction = None  # what a budget replaced, restored at close (a run in the caller's process)
        if budget is not None:
            device = torch.cuda.current_device()  # a torchrun rank's own GPU (distributed.process_group set it)
            total = torch.cuda.get_device_properties(device).total_memory
            # an older torch (2.4) cannot read the fraction back: restored to 1.0, the one a process starts with
            read = getattr(torch.cuda, "get_per_process_memory_fraction", lambda device: 1.0)
            self.callers_fraction = read(device)
            self.fraction_device = device
            torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total), device)
        self.peaks = {"allocated": 0, "reserved": 0, "active": 0}
        self.peak_phase, self.peak_step, self.step = "setup", -1, -1
        self.tracker = None  # during the recording pass only: cuda.AllocatorLabels (or a StorageTracker)
        self.recorded = None  # after it: cuda.AllocatorTimeline, whose first_step a prediction is compared with

    @contextlib.contextmanager
    def active(self):
        yield self

    @contextlib.contextmanager
    def recording(self, stem: Path):
        """The recording pass on CUDA: the allocator's history for memory_viz, labelled with the phases, steps,
        modules and the tensors' categories, and read back into the timeline (trackers/cuda.py): the pass runs the
        step as the measured steps do. Where the history cannot carry labels (torch before 2.14), the categories
        come from the storage tracker, a dispatch mode, whose backward takes some out-of-place paths a plain step
        does not; with backend:cudaMallocAsync (no history at all) from the storage tracker alone."""
        from membench.trackers import cuda

        if cuda.labels_supported():
            with self._labelled_history(stem) as recording:
                yield recording
            return
        # Device memory only: pinned host copies (opt-offload, act-offload, fsdp-offload's shards) and the CPU
        # input batch are host memory, and counting them would misplace exactly the offload techniques' peaks.
        self.tracker = StorageTracker(round_to=512, timeline=True, device_types=("cuda",))
        self._register_model()
        for opt in getattr(self, "optimizers", ()):
            self._track_state(opt)
        recording = Recording(self.tracker)
        history = cuda.history_supported()
        try:
            with (cuda.recorded_history(stem.parent / f"{stem.name}.snapshot.pickle") if history
                  else contextlib.nullcontext({})) as info, self.tracker:
                yield recording
            recording.files.update(info, source=STORAGE_TRACKER_SOURCE if history else ASYNC_SOURCE)
        finally:
            self.tracker = None

    @contextlib.contextmanager
    def _labelled_history(self, stem: Path):
        from membench.trackers import cuda

        self.tracker = labels = cuda.AllocatorLabels()
        self._register_model()  # what is alive now is named before recording starts (labels.before)
        for opt in getattr(self, "optimizers", ()):
            self._track_state(opt)
        recording = Recording(labels)
        try:
            with cuda.recorded_history(stem.parent / f"{stem.name}.snapshot.pickle", labels=labels) as info:
                yield recording
            recording.tracker = self.recorded = info.pop("timeline")
            recording.files.update(info, source=HISTORY_SOURCE)
        finally:
            self.tracker = None

    def track_inputs(self, batch) -> None:
        pass

    def close(self) -> None:
        """The memory fraction is process-wide: a run in the caller's own process leaves the caller's own."""
        if self.callers_fraction is not None:
            torch.cuda.set_per_process_memory_fraction(self.callers_fraction, self.fraction_device)

    @contextlib.contextmanager
    def phase(self, name: str):
        torch.cuda.reset_peak_memory_stats()
        try:
            if self.tracker is not None:
                with self.tracker.in_phase(name):
                    yield
            else:
                yield
        finally:
            stats = torch.cuda.memory_stats()
            allocated = stats.get("allocated_bytes.all.peak", 0)
            if allocated > self.peaks["allocated"]:
                self.peak_phase, self.peak_step = name, self.step
            self._fold(allocated, stats.get("reserved_bytes.all.peak", 0), stats.get("active_bytes.all.peak", 0))

    def _fold(self, allocated: int, reserved: int, active: int) -> None:
        self.peaks["allocated"] = max(self.peaks["allocated"], allocated)
        self.peaks["reserved"] = max(self.peaks["reserved"], reserved)
        self.peaks["active"] = max(self.peaks["active"], active)

    def start_step(self, step: int) -> None:
        self.step = step
        if self.tracker is not None:
            self.tracker.step = step

    def reset_peak(self) -> None:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        self.retries_before = torch.cuda.memory_stats().get("num_alloc_retries", 0)
        self.peaks = dict.fromkeys(self.peaks, 0)
        self._fold(torch.cuda.memory_allocated(), torch.cuda.memory_reserved(), torch.cuda.memory_allocated())
        self.peak_phase, self.peak_step = "setup", self.step

    def current(self) -> int:
        return torch.cuda.memory_allocated()

    def result(self) -> Memory:
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        stats = torch.cuda.memory_stats()
        backend = torch.cuda.get_allocator_backend()
        method = "cuda-caching-allocator" if backend == "native" else f"cuda {backend} (torch's counters of its pool)"
        return Memory(device="cuda", method=method, peak_allocated_bytes=self.peaks["allocated"],
                      peak_reserved_bytes=self.peaks["reserved"], peak_active_bytes=self.peaks["active"],
                      alloc_retries=stats.get("num_alloc_retries", 0) - getattr(self, "retries_before", 0),
                      driver_used_bytes=total - free, device_total_bytes=total, peak_phase=self.peak_phase,
                      peak_step=self.peak_step, current_bytes=torch.cuda.memory_allocated(),
                      allocator_settings=allocator_label(os.environ))


def allocator_label(env) -> str:
    """The allocator settings a process with this environment runs with, as a record keeps them (so that its
    prediction, now or later, can follow them): 'default', or PYTORCH_CUDA_ALLOC_CONF's text (as written where
    membench cannot read it; torch itself refuses such a setting at its first allocation)."""
    from membench.allocator import settings_from_env
    from membench.common.errors import UserError

    try:
        return settings_from_env(env).label()
    except UserError:
        return env.get("PYTORCH_CUDA_ALLOC_CONF") or env.get("PYTORCH_ALLOC_CONF", "")


def make_meter(device: str, budget: int | None = None, compiled: bool = False) -> Meter:
    """compiled: the stack compiles the model (techniques/compile.py); on CPU the tracker then lets it run compiled."""
    return CudaMeter(budget) if device == "cuda" else CpuMeter(budget, compiled=compiled)
