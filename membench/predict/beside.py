"""A measured run's own prediction, beside its measurement: every `membench run` predicts each run on fake tensors
for the device it ran on (the CPU, or the GPU's entry in spec/gpu.py), after the run measured everything, in
the worker's process, and records both peaks, the error, and, where they differ by more than TOLERANCE, the first
allocation or free where the predicted step and the step the allocator recorded part ways (each side's category,
module and Python line), with the files to attach to a report. A user's GPU run so validates the predictor on
their model and card. `--no-predict` turns it off.

On CPU the prediction is for the CPU target (predict.run: round_to=1) and must equal the measurement to the byte.
On CUDA it is compared with the allocator's counters (max_memory_allocated: whole blocks, against the simulator's
own count of blocks; max_memory_reserved against the simulated reserved), and its step's events with the first
step the recording pass recorded (trackers/cuda.AllocatorTimeline.first_step; the pass runs the step as the
measured steps do).
"""

from __future__ import annotations

import json
import sys
import time
import traceback
import types
from dataclasses import dataclass
from pathlib import Path

from membench.allocator.events import TraceEvent
from membench.common.errors import UserError
from membench.common.fsio import atomic_write_text
from membench.predict import gpus
from membench.results import AllocationSide, Divergence, Memory, PredictionCheck
from membench.spec import Job
from membench.techniques import resolve
from membench.trackers.cuda import RecordedEvent, allocation_site
from membench.trackers.storage import StorageTracker

#: On CUDA, a prediction within 1% of the measured peak (allocated and reserved each) counts as the same. On the
#: eight real traces (README) allocated was within 0.01% and reserved within 0.45% (one 40 MiB segment whose place
#: depends on the driver's addresses). On CPU the tolerance is 0: the same bytes.
TOLERANCE = 0.01
REPORT_FILES = ("{run}.json", "{run}.snapshot.pickle", "{run}.prediction.json")


@dataclass(frozen=True)
class Target:
    """What the prediction is for: the GPU entry (None: the CPU) and, in words, why that one."""

    gpu: str | None
    described: str


def target_for(device: str, properties=None, device_name: str = "") -> Target | str:
    """The GPU of spec/gpu.py's table that stands for this device: the one with its compute capability,
    multiprocessor count and threads per multiprocessor (what a prediction reads: cuBLAS's workspace, the attention
    kernel, reductions' scratch), the one its name matches preferred where several do; else one of the same compute
    capability, saying which scratch sizes then differ. A str: why none can."""
    if device != "cuda":
        return Target(None, "cpu")
    cc = (properties.major, properties.minor)
    sms, threads = properties.multi_processor_count, properties.max_threads_per_multi_processor
    same_cc = [g for g in gpus.GPUS.values() if g.compute_capability == cc]
    exact = [g for g in same_cc if g.sm_count == sms and g.max_threads_per_sm == threads]
    named = [g for g in exact if g is gpus.find(device_name)]  # the table's one name-matching rule
    if named or exact:
        g = (named or exact)[0]
        return Target(g.name, f"{g.name} (sm{cc[0]}{cc[1]}, {sms} SMs: as this {device_name or 'GPU'})")
    if same_cc:
        g = same_cc[0]
        return Target(g.name, f"{g.name} (sm{cc[0]}{cc[1]}; this {device_name or 'GPU'} has {sms} SMs of {threads} "
                              f"threads, {g.name} {g.sm_count} of {g.max_threads_per_sm}: reductions' scratch may "
                              "differ)")
    return (f"no GPU in membench's table (spec/gpu.py) has compute capability {cc[0]}.{cc[1]} "
            f"({device_name or 'this GPU'})")


def target_named(device_name: str) -> Target | str:
    """target_for the GPU of membench's table that a record names (its environment's device_name), from that GPU's
    own properties: what a CPU machine predicts a recorded GPU run for."""
    gpu = gpus.find(device_name)
    if gpu is None:
        raise UserError(f"no GPU in membench's table is named {device_name[:60]!r}; it has: {', '.join(gpus.GPUS)}")
    properties = types.SimpleNamespace(major=gpu.compute_capability[0], minor=gpu.compute_capability[1],
                                       multi_processor_count=gpu.sm_count,
                                       max_threads_per_multi_processor=gpu.max_threads_per_sm)
    return target_for("cuda", properties, device_name)


class _Naming:
    """While installed as the storage tracker's observer: what each traced event of a prediction was (category,
    module, Python line), by its index in the tracker's trace."""

    def __init__(self):
        self.sides: dict[int, AllocationSide] = {}
        self._pending: tuple | None = None  # an allocation whose category the tracker records just after it

    def __call__(self, tracker: StorageTracker, event: TraceEvent) -> None:
        self._resolve()
        if event.kind == "alloc":
            index = len(tracker.trace) - 1
            frames = [{"filename": f.f_code.co_filename, "line": f.f_lineno, "name": f.f_code.co_name}
                      for f in _stack()]
            self.sides[index] = AllocationSide(kind="alloc", size=event.size, site=allocation_site(frames))
            self._pending = (tracker, event.key, index)

    def _resolve(self) -> None:
        if self._pending is not None:
            tracker, key, index = self._pending
            _, category, module = tracker.live.get(key, (None, None, None))
            side = self.sides[index]
            side.category, side.module = category, module
            self._pending = None

    def __enter__(self):
        StorageTracker.observer = self
        return self

    def __exit__(self, *exc):
        StorageTracker.observer = None
        self._resolve()


def _stack(depth: int = 60):
    frame = sys._getframe(2)
    while frame is not None and depth > 0:
        yield frame
        frame, depth = frame.f_back, depth - 1


def predicted_step(traced, sides: dict[int, AllocationSide]) -> list[AllocationSide]:
    """The measured step of a prediction as its sequence of allocations and frees (requested bytes), each named."""
    sizes: dict = {}
    sites: dict = {}
    step = []
    for index, event in enumerate(map(TraceEvent.of, traced.events)):
        if event.kind == "alloc":
            sizes[event.key], sites[event.key] = event.size, sides.get(index, AllocationSide())
        if index < traced.measured_from or event.kind not in ("alloc", "free"):
            continue
        if event.kind == "alloc":
            step.append(_side(sides.get(index), "alloc", event.size))
        else:
            was = sites.get(event.key, AllocationSide())
            step.append(AllocationSide("free", sizes.get(event.key), was.category, was.module, was.site))
    return step


def _side(side: AllocationSide | None, kind: str, size: int) -> AllocationSide:
    side = side or AllocationSide()
    return AllocationSide(kind, size, side.category, side.module, side.site)


def first_divergence(predicted: list[AllocationSide], recorded: list[RecordedEvent]) -> Divergence | None:
    """The first position where the two steps' events (kind and requested bytes, in order) differ; None when the
    two are the same event for event."""
    for index in range(max(len(predicted), len(recorded))):
        p = predicted[index] if index < len(predicted) else AllocationSide()
        r = recorded[index] if index < len(recorded) else None
        if r is None or (p.kind, p.size) != (r.kind, r.size):
            measured = AllocationSide() if r is None else AllocationSide(r.kind, r.size, r.category, r.module,
                                                                          r.site or None)
            return Divergence(index=index, predicted=p, measured=measured)
    return None


def _error(predicted: int | None, measured: int | None) -> float | None:
    if predicted is None or not measured:
        return None
    return (predicted - measured) / measured


@dataclass
class Predicted:
    """A run predicted for a target: the traced prediction (predict.run.Traced) and what each traced allocation was
    (category, module, Python line), by its index in the trace."""

    traced: object
    sides: dict[int, AllocationSide]


def predict_for(job: Job, target: Target) -> Predicted:
    """Predict `job` for `target`, naming each allocation as it is traced. Raises predict.run.CannotPredict."""
    from membench.predict.run import predict_traced

    with _Naming() as naming:
        traced = predict_traced(job.with_run(gpu=target.gpu) if target.gpu else job, derive_warmup=False)
    return Predicted(traced, naming.sides)


def check(job: Job, measured: Memory, recorded: list[RecordedEvent] | None, stem: Path | None,
          properties=None, device_name: str = "") -> PredictionCheck:
    """Predict `job` for the device it ran on and set the prediction beside `measured`; never raises (a
    prediction that fails is this check's status, never the run's)."""
    started = time.perf_counter()
    spec = job.run
    stack = resolve(spec)
    if stack.distributed or spec.nproc_per_node > 1:
        return PredictionCheck(status="skipped", target=spec.device, detail="a distributed run: predicted per rank "
                               "by `membench predict --world-size`, not beside each rank's measurement")
    target = target_for(spec.device, properties, device_name)
    if isinstance(target, str):
        return PredictionCheck(status="skipped", target=spec.device, detail=target)
    from membench.predict.run import CannotPredict

    try:
        predicted = predict_for(job, target)
    except CannotPredict as exc:
        return PredictionCheck(status="skipped", target=target.described, detail=f"cannot predict: {exc}")
    except Exception as exc:  # noqa: BLE001 - the run's measurements stand whatever the predictor does
        traceback.print_exc()
        return PredictionCheck(status="error", target=target.described,
                               detail=f"the prediction raised {type(exc).__name__}: {str(exc)[:300]}",
                               seconds=time.perf_counter() - started)
    result = compare(job, predicted, measured, target, recorded, stem)
    result.seconds = time.perf_counter() - started
    return result


def compare(job: Job, predicted: Predicted, measured: Memory, target: Target, recorded: list[RecordedEvent] | None,
            stem: Path | None) -> PredictionCheck:
    """The prediction beside the measurement: both peaks and their errors; outside the tolerance, where the
    predicted step and the `recorded` one (CUDA) first part ways, and `<run>.prediction.json` written beside
    `stem`'s files with a hint naming what to attach to a report."""
    cuda = job.run.device == "cuda"
    memory = predicted.traced.memory
    # max_memory_allocated() counts whole blocks: the simulator's count of them, where there is one
    allocated = (memory.allocator_peak_allocated_bytes or memory.peak_allocated_bytes) if cuda \
        else memory.peak_allocated_bytes
    reserved = memory.peak_reserved_bytes if cuda else None
    tolerance = TOLERANCE if cuda else 0.0
    errors = [_error(allocated, measured.peak_allocated_bytes), _error(reserved, measured.peak_reserved_bytes)]
    within = all(e is None or abs(e) <= tolerance for e in errors)
    result = PredictionCheck(
        status="ok", target=target.described, tolerance=tolerance, predicted_peak_allocated_bytes=allocated,
        measured_peak_allocated_bytes=measured.peak_allocated_bytes, predicted_peak_reserved_bytes=reserved,
        measured_peak_reserved_bytes=measured.peak_reserved_bytes, allocated_error=errors[0],
        reserved_error=errors[1], within=within)
    if within:
        return result
    step = predicted_step(predicted.traced, predicted.sides)
    if recorded is not None:
        result.divergence = first_divergence(step, recorded)
        if result.divergence is None:
            result.detail = (f"the step's {len(step)} allocations and frees are the same as recorded, event for "
                             "event: the difference is the allocator's (which cached block a request reuses)")
    if stem is not None:
        _write_predicted_step(stem, job, step)
        names = ", ".join(f.format(run=stem.name) for f in REPORT_FILES if cuda or "snapshot" not in f)
        result.hint = f"to report this difference, attach {names} (in {stem.parent})"
    return result


def _write_predicted_step(stem: Path, job: Job, step: list[AllocationSide]) -> None:
    """`<run>.prediction.json`: the predicted step's events, as a report's attachment beside the snapshot."""
    from membench.common.typedjson import to_plain

    atomic_write_text(stem.parent / f"{stem.name}.prediction.json", json.dumps(
        {"run": job.to_dict(), "predicted_step": [to_plain(e) for e in step]}, indent=None))
