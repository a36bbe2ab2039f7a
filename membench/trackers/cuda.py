"""CUDA memory snapshots: the caching allocator's own history, for pytorch.org/memory_viz, and the recording pass's
timeline read back from it.

The only module that uses torch's private snapshot APIs (through membench.private: the history, the snapshot, the
OOM observer, the history's labels). Recording history slows every allocation down (it keeps a stack trace per
event), so it is only ever on during the separate, untimed recording pass. The number of recorded entries is capped
so a snapshot stays small enough for the viewer to open.

The recording pass runs the step exactly as the measured steps do, with no dispatch mode: under one (the storage
tracker is one) torch's backward formulas and the autograd engine take out-of-place paths a plain step does not
(predict/emulate/inplace_backward.py), so the pass would record allocations the measured steps never make.
Instead `AllocatorLabels` stamps the phase, step and module on the allocator's own history as they change
(torch.cuda.memory._set_memory_metadata: per thread; the module hooks that run on autograd's backward thread stamp
that thread), and names the tensors it is told about (parameters, gradients, optimizer state) with annotations;
`replay_history` reads the history back into the categorised timeline. With backend:cudaMallocAsync there is no
history (libc10_cuda.so, torch 2.14: "cudaMallocAsync does not yet support recordHistory"): the meter then records
with the storage tracker, and says so (TimelineInfo.source).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import pickle
import sys
import traceback
from pathlib import Path

import torch

from membench import private
from membench.common.fsio import atomic_write_bytes
from membench.common.vocab import CATEGORIES, OTHER, PHASE_CATEGORY, RECOMPUTED, TEMPORARIES
from membench.results import SiteBytes
from membench.trackers import recompute
from membench.trackers.storage import NO_MODULE, Peak

MAX_ENTRIES = 100_000  # alloc/free events kept (a ring buffer); ~ tens of MB of pickle with stack traces


def save_snapshot(path: Path) -> int:
    """Pickle the allocator's state (and history, if recorded) the way memory_viz reads it; returns its size."""
    return atomic_write_bytes(path, pickle.dumps(private.memory_snapshot(), protocol=4))


def _block_sizes(snapshot: dict):
    """Trace sizes are what was asked for (requested bytes: torch's record_trace passes the request, and
    block->requested_size at free_completed, c10/cuda/CUDACachingAllocator.cpp), memory_allocated() counts whole
    blocks: round a request to the block the allocator gives it, under the settings the snapshot was recorded with,
    as the allocator simulator does, so a sum of trace sizes is in blocks too."""
    from membench.allocator.settings import AllocatorSettings, settings_from_snapshot
    from membench.allocator.simulator import round_size
    from membench.common.errors import UserError

    try:
        settings = settings_from_snapshot(snapshot.get("allocator_settings"))
    except UserError as exc:  # a measurement never fails for it: 512-byte blocks, as most settings round
        print(f"membench: the snapshot's allocator settings could not be read ({exc}); its requests are counted "
              "in 512-byte blocks", file=sys.stderr)
        settings = AllocatorSettings()
    return lambda size: round_size(size, settings)


def trace_summary(snapshot: dict, device: int, start_bytes: int, max_entries: int) -> dict:
    """Allocated bytes (whole blocks) over the recorded trace: its peak, to cross-check the tracker's 512-byte-rounded
    peak.

    start_bytes is torch.cuda.memory_allocated() when recording began (blocks); each traced request counts as its
    rounded block (_block_sizes). A trace that hit max_entries lost its first events (a ring buffer), so its peak
    cannot be trusted and is left out.
    """
    traces = snapshot.get("device_traces") or []
    trace = traces[device] if device < len(traces) else []
    summary = {"trace_entries": len(trace), "trace_truncated": len(trace) >= max_entries}
    if summary["trace_truncated"]:
        return summary
    block = _block_sizes(snapshot)
    current = peak = start_bytes
    for entry in trace:
        if entry["action"] == "alloc":
            current += block(entry["size"])
            peak = max(peak, current)
        elif entry["action"] == "free_completed":
            current -= block(entry["size"])
    summary["trace_peak_allocated_bytes"] = peak
    return summary


# Frames that say nothing about where a step allocates: torch's own, and membench's meters and prediction machinery
# (the storage tracker's dispatch hook, fake tensors' emulation) that a prediction's stack runs through.
_NOT_A_SITE = ("/torch/", "/membench/trackers/", "/membench/predict/")


def allocation_site(frames: list[dict]) -> str:
    """The Python line that asked for a block: the innermost frame outside torch itself and membench's own
    machinery (the user's code, the workload's, the training loop), else the innermost Python frame. Frames are
    innermost first, as memory_viz shows them."""
    python = [f for f in frames or () if str(f.get("filename", "")).endswith(".py")]
    outside = [f for f in python if not any(part in str(f["filename"]).replace("\\", "/") for part in _NOT_A_SITE)]
    frame = (outside or python or [None])[0]
    if frame is None:
        return "(no Python frame)"
    return f"{frame['filename']}:{frame.get('line', '?')} ({frame.get('name', '?')})"


def top_sites(snapshot: dict, device: int = 0, n: int = 10) -> list[SiteBytes]:
    """The blocks live at the peak of the recorded trace, summed by allocation site, largest first.

    Only what the trace saw allocated counts (blocks allocated before recording began have no frames here). The
    live set is copied at the first free after a new peak, not at every allocation that raises it."""
    traces = snapshot.get("device_traces") or []
    trace = traces[device] if device < len(traces) else []
    block = _block_sizes(snapshot)  # the blocks' bytes, as trace_summary counts them
    live: dict[int, tuple[int, str]] = {}
    current = peak = 0
    at_peak: dict[int, tuple[int, str]] = {}
    pending = False
    for entry in trace:
        action = entry.get("action")
        if action == "alloc":
            size = block(entry["size"])
            live[entry["addr"]] = (size, allocation_site(entry.get("frames", [])))
            current += size
            if current > peak:
                peak, pending = current, True
        elif action == "free_completed" and entry["addr"] in live:
            if pending:
                at_peak, pending = dict(live), False
            current -= live.pop(entry["addr"])[0]
    if pending:
        at_peak = dict(live)
    by_site: dict[str, list[int]] = {}
    for size, site in at_peak.values():
        total = by_site.setdefault(site, [0, 0])
        total[0] += size
        total[1] += 1
    ranked = sorted(by_site.items(), key=lambda kv: (-kv[1][0], kv[0]))[:n]
    return [SiteBytes(site=site, bytes=b, blocks=k) for site, (b, k) in ranked]


@contextlib.contextmanager
def recorded_history(path: Path, max_entries: int = MAX_ENTRIES, labels: AllocatorLabels | None = None):
    """Record the allocator's history inside the block, then save the snapshot at `path`.

    Yields a dict that is filled, after the block, with the snapshot's file name, size and trace summary; with
    `labels` (stamped on the history inside the block), also "timeline": the pass read back (replay_history).
    """
    info: dict = {}
    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    # Python frames only: allocation_site reads nothing else, and C++ frames ("all", the default) are
    # symbolised when the snapshot is taken, which can take minutes on a large model.
    # Stacks at allocations only (context "alloc"; the default "all" takes one at each free too, and membench reads
    # none of those): a free recorded with its stack while C++ unwinds a Python exception loses the exception
    # (torch 2.11 on an H200). Checkpoint's early stop raises so, from a pack hook after an op (CUDA dropout)
    # allocated its output, and the lost stop became "SystemError: <built-in method dropout ...> returned NULL
    # without setting an exception" in ckpt's recording pass. A free's entry still names its block.
    private.record_memory_history(max_entries=max_entries, stacks="python", context="alloc")
    try:
        if labels is not None:
            labels.start()
        yield info
        torch.cuda.synchronize()
        snapshot = private.memory_snapshot()
        size = atomic_write_bytes(path, pickle.dumps(snapshot, protocol=4))
        device = torch.cuda.current_device()
        info.update({"snapshot": path.name, "snapshot_bytes": size, "snapshot_max_entries": max_entries,
                     **trace_summary(snapshot, device, start, max_entries),
                     "top_sites": top_sites(snapshot, device)})
        if labels is not None:
            info["timeline"] = replay_history(_trace(snapshot, device), labels, start, _block_sizes(snapshot))
    finally:
        if labels is not None:
            labels.stop()
        private.record_memory_history(enabled=None)


def _trace(snapshot: dict, device: int) -> list[dict]:
    traces = snapshot.get("device_traces") or []
    return traces[device] if device < len(traces) else []


def history_supported() -> bool:
    """Whether the allocator records history and calls an OOM observer: the native caching allocator does,
    backend:cudaMallocAsync does neither (torch 2.14's libc10_cuda.so: "cudaMallocAsync does not yet support
    recordHistory", "... attachOutOfMemoryObserver"). Read without starting CUDA."""
    return torch.cuda.get_allocator_backend() == "native"


def labels_supported() -> bool:
    """Whether the history can carry the recording pass's labels (torch 2.14 can; older versions record without)."""
    return history_supported() and private.history_labels_supported()


# --- the recording pass's labels, and the timeline read back from them --------------------------------------------
SEP = "\x1f"  # between a label's fields: no module name or phase holds it
_passes = itertools.count()


class AllocatorLabels:
    """During the CUDA recording pass, what the storage tracker is during the CPU's, without being a dispatch mode:
    the meter's hooks (trackers/memory.py, trackers/modules.py) tell it the phase, step and module as they change,
    and it stamps them on the allocator's history of the thread that runs the hook; the tensors it is told about
    (parameters, gradients, optimizer state) it names: those alive when recording starts in `before`, the others
    with an annotation in the history. `token` tells this pass's labels from a thread's older ones."""

    round_to = 512

    def __init__(self):
        self.token = f"membench{os.getpid()}.{next(_passes)}"
        self.phase, self._step, self.module = "setup", -1, NO_MODULE
        self._stack: list[str] = []
        self._backward_module = NO_MODULE
        self.before: dict[int, tuple[int, str, str]] = {}  # storage address -> (bytes, category, module)
        self.recording = False

    # --- what a label says ---------------------------------------------------------------------------------
    def label(self) -> str:
        category = RECOMPUTED if recompute.active() else PHASE_CATEGORY.get(self.phase, OTHER)
        return SEP.join((self.token, self.phase, str(self._step), self.module, category))

    def _stamp(self) -> None:
        if self.recording:
            private.set_memory_metadata(self.label())

    def start(self) -> None:
        self.recording = True
        self._stamp()

    def stop(self) -> None:
        self.recording = False
        private.set_memory_metadata("")

    # --- the storage tracker's interface, as the meter and the module hooks call it ----------------------------
    @property
    def step(self) -> int:
        return self._step

    @step.setter
    def step(self, step: int) -> None:
        self._step = step
        self._stamp()

    @contextlib.contextmanager
    def in_phase(self, phase: str):
        previous, self.phase = self.phase, phase
        self._clear_modules()
        try:
            yield
        finally:
            self.phase = previous
            self._clear_modules()

    def enter_module(self, name: str) -> None:
        self._stack.append(name)
        self.module = name
        self._stamp()

    def exit_module(self, name: str) -> None:
        if self._stack and self._stack[-1] == name:
            self._stack.pop()
        self.module = self._stack[-1] if self._stack else self._backward_module
        self._stamp()

    def backward_module(self, name: str) -> None:
        self._backward_module = name
        if not self._stack:
            self.module = name
        self._stamp()

    def _clear_modules(self) -> None:
        self._stack.clear()
        self.module = self._backward_module = NO_MODULE
        self._stamp()

    def track(self, tensor: torch.Tensor, category: str | None = None, module: str | None = None) -> None:
        """Name a device tensor's block: its category and owner (parameters, gradients, optimizer state)."""
        if private.is_traceable_wrapper_subclass(tensor):  # FSDP's DTensor: the memory is its local shard
            self.track_all((getattr(tensor, n) for n in tensor.__tensor_flatten__()[0]), category, module)
            return
        if category is None or tensor.device.type != "cuda" or tensor.layout != torch.strided:
            return
        storage = tensor.untyped_storage()
        if storage.nbytes() == 0:
            return
        module = module or NO_MODULE
        if self.recording:
            private.annotate_tensor(tensor, SEP.join((self.token, category, module)))
        else:
            self.before[storage.data_ptr()] = (-(-storage.nbytes() // 512) * 512, category, module)

    def track_all(self, tensors, category: str, module: str | None = None) -> None:
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self.track(t, category, module)


BEFORE = -1  # the key of what was allocated before recording and is named by no tensor (cuBLAS workspaces, ...)
BEFORE_MODULE = "(allocated before the recording pass)"


@dataclasses.dataclass(frozen=True)
class RecordedEvent:
    """One allocation or free of the recorded step, as the allocator saw it: requested bytes, and what it was."""

    kind: str  # "alloc" or "free"
    size: int
    category: str
    module: str
    site: str  # allocation_site of its frames (a free: where the block was allocated, when recorded)


class AllocatorTimeline:
    """The recording pass as the allocator recorded it, in the storage tracker's terms (events, peak, modules at
    the peak) for trackers/timeline.py; `first_step`: the first recorded step's events, which predict/beside.py
    compares with a prediction."""

    round_to = 512

    def __init__(self):
        self.live: dict[int, tuple[int, str, str, str]] = {}  # address -> (block bytes, category, module, site)
        self.by_category = dict.fromkeys(CATEGORIES, 0)
        self.by_module: dict[tuple[str, str], int] = {}
        self.current = 0
        self.peak = Peak()
        self._peak_modules_pending = True
        self.events: list[tuple[str, int, tuple[int, ...]]] = []
        self.event_modules: list[str] = []
        self.first_step: list[RecordedEvent] = []

    def add(self, key: int, size: int, category: str, module: str, site: str = "") -> None:
        self.live[key] = (size, category, module, site)
        self.by_category[category] += size
        self.by_module[module, category] = self.by_module.get((module, category), 0) + size
        self.current += size

    def remove(self, key: int) -> tuple[int, str, str, str]:
        if self._peak_modules_pending:  # the first free after the peak: the sums are still the peak's
            self.peak.modules = dict(self.by_module)
            self._peak_modules_pending = False
        return self._unlink(key)

    def relabel(self, key: int, category: str, module: str) -> None:
        """A block named after it was allocated (a gradient, optimizer state): nothing freed since the peak, the
        peak is now, and its breakdown takes the name too (as the storage tracker's does)."""
        size, _, _, site = self._unlink(key)
        self.add(key, size, category, module, site)
        if self._peak_modules_pending and self.current == self.peak.bytes:
            self.peak.breakdown = dict(self.by_category)

    def _unlink(self, key: int) -> tuple[int, str, str, str]:
        size, category, module, site = self.live.pop(key)
        self.by_category[category] -= size
        left = self.by_module.get((module, category), 0) - size
        if left:
            self.by_module[module, category] = left
        else:
            self.by_module.pop((module, category), None)
        self.current -= size
        return size, category, module, site

    def changed(self, phase: str, step: int, module: str) -> None:
        if self.current > self.peak.bytes:
            self.peak = Peak(self.current, phase, step, dict(self.by_category))
            self._peak_modules_pending = True
        self.events.append((phase, step, tuple(self.by_category[c] for c in CATEGORIES)))
        self.event_modules.append(module)

    def top_modules(self, n: int = 10) -> list[tuple[str, str, int]]:
        if self._peak_modules_pending:
            self.peak.modules = dict(self.by_module)
            self._peak_modules_pending = False
        held = sorted((self.peak.modules or {}).items(), key=lambda kv: (-kv[1], kv[0]))
        return [(module, category, size) for (module, category), size in held[:n] if size > 0]


def _decode(text: str, token: str) -> list[str] | None:
    parts = (text or "").split(SEP)
    return parts[1:] if parts[0] == token and len(parts) in (3, 5) else None


class _Where:
    """The phase, step and module of each history entry, from its label. Labels of other passes, or none, come from
    autograd's backward thread before a module hook of this backward ran on it (the loss's backward): backward of
    the current step, no module; so does one of this pass with an earlier step (the thread's label from the last
    backward)."""

    def __init__(self, token: str):
        self.token, self.step, self.first_step = token, -1, None
        self.last = ("setup", -1, NO_MODULE, OTHER)

    def of(self, entry: dict) -> tuple[str, int, str, str]:
        if entry.get("action") == "annotate":  # its metadata is the annotation: it happens where the last did
            return self.last
        label = _decode(entry.get("user_metadata", ""), self.token)
        if label is None or len(label) != 4 or int(label[1]) < self.step:
            self.last = ("backward", self.step, NO_MODULE, TEMPORARIES)
            return self.last
        phase, step, module, category = label[0], int(label[1]), label[2], label[3]
        self.step = step
        if self.first_step is None and step >= 0:
            self.first_step = step
        self.last = (phase, step, module, category)
        return self.last


def replay_history(trace: list[dict], labels: AllocatorLabels, start_bytes: int, block) -> AllocatorTimeline:
    """The recording pass's timeline from the allocator's history (`trace`, labelled by `labels`): what was alive,
    by category and module, after each allocation, free and annotation, in blocks (`block` rounds a request as the
    allocator does). What was allocated before recording counts from the start: the named tensors as named, the
    rest (start_bytes, memory_allocated() then, minus those) as other memory."""
    timeline = AllocatorTimeline()
    for address, (size, category, module) in labels.before.items():
        timeline.add(address, size, category, module)
    timeline.add(BEFORE, max(0, start_bytes - timeline.current), OTHER, BEFORE_MODULE)
    where = _Where(labels.token)
    for entry in trace:
        action, address = entry.get("action"), entry.get("addr")
        if action not in ("alloc", "free_completed", "annotate"):
            continue
        phase, step, running, category = where.of(entry)
        event = None
        if action == "alloc":
            site = allocation_site(entry.get("frames", []))
            if address in timeline.live:  # a free the history lost (a full ring buffer)
                timeline.remove(address)
            timeline.add(address, block(entry["size"]), category, running, site)
            event = RecordedEvent("alloc", entry["size"], category, running, site)
        elif action == "free_completed":
            if address in timeline.live:
                _, was, owner, site = timeline.remove(address)
            else:  # allocated before recording, and named by no tensor
                left = timeline.remove(BEFORE)[0] - block(entry["size"])
                timeline.add(BEFORE, max(0, left), OTHER, BEFORE_MODULE)
                was, owner, site = OTHER, BEFORE_MODULE, ""
            event = RecordedEvent("free", entry["size"], was, owner, site)
        else:
            named = _decode(entry.get("user_metadata", ""), labels.token)
            if named is None or len(named) != 2 or address not in timeline.live:
                continue
            timeline.relabel(address, named[0], named[1])
        timeline.changed(phase, step, running)
        if event is not None and step == where.first_step:
            timeline.first_step.append(event)
    return timeline


# Where the OOM observer saves its snapshot: None when no run is measuring. The observer cannot be detached
# (torch._C._cuda_attach_out_of_memory_observer only adds), so one is attached per process, and each run points
# it at its own file for its duration: a later run in the same process never writes into an earlier run's folder.
_oom_path: list[Path | None] = [None]
_observer_attached = [False]


def snapshot_on_oom(path: Path) -> None:
    """Until stop_snapshot_on_oom, at an out-of-memory error, save what the allocator holds (segments and blocks;
    no history unless it was being recorded) at `path`, so an OOM run can still be opened in memory_viz."""
    _oom_path[0] = path
    if not _observer_attached[0]:
        private.attach_out_of_memory_observer(_observer)
        _observer_attached[0] = True


def stop_snapshot_on_oom() -> None:
    _oom_path[0] = None


def _observer(device, alloc, device_allocated, device_free) -> None:
    path = _oom_path[0]
    if path is None:
        return
    try:
        save_snapshot(path)
    except Exception:  # noqa: BLE001 - never turn an OOM into a different error; but say why it is missing
        print(f"membench: could not save the snapshot at OOM to {path}:", file=sys.stderr)
        traceback.print_exc()
