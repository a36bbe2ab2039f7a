"""How membench measures a training step's memory: the one procedure behind every memory number it gives.

The worker runs it on real tensors, the predictor on fake tensors (inside FakeTensorMode), and the tests and
benchmarks call it as it is, so a change in how memory is measured reaches all of them at once:

    session = Session(spec, stack, workload, meter, data)
    build = session.build()          # the model and optimizer, built under the meter (construction peak)
    session.warm_up(n)               # steps that create the optimizer state: afterwards the steady state
    memory = session.measure(1)      # reset the peak, run the measured step(s), read the meter
    session.record_timeline(stem)    # optional: a separate pass that keeps every allocation and free
    session.detach()                 # from here on, steps run with nothing of membench attached
    session.bare_step(i)             # what timing, FLOP counting and benchmarks run
    session.release()                # the model and optimizer freed (before the equivalence check)
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from membench import private
from membench.results import Memory, TimelineInfo
from membench.spec import RunSpec
from membench.step import TrainState, build_state, train_step
from membench.techniques import Stack
from membench.trackers import timeline
from membench.trackers.memory import Meter
from membench.trackers.storage import StorageTracker
from membench.workloads import Batch, Workload


@dataclass(frozen=True)
class Build:
    """Model construction: how long it took and its peaks (device, and host memory when tracked)."""

    seconds: float
    peak_bytes: int
    host_peak_bytes: int | None


def untimed(step: Callable[[int], float], indices) -> tuple[list[float], list[float]]:
    return [], [step(i) for i in indices]


class Session:
    """One training state under a memory meter, from construction to the last measured step.

    `stage` says what it is doing (an out-of-memory error names it). The meter is a CpuMeter (the exact
    storage tracker; on fake tensors, a prediction) or a CudaMeter (the caching allocator's counters).
    """

    def __init__(self, spec: RunSpec, stack: Stack, workload: Workload, meter: Meter, data: Iterator[Batch],
                 track_host: bool = True):
        self.spec, self.stack, self.workload, self.meter, self.data = spec, stack, workload, meter, data
        self.track_host = track_host
        self.state: TrainState | None = None
        self.next_index = 0
        self.stage = "setup"

    def build(self) -> Build:
        """Construction is its own phase: on CUDA the allocator's peak since it began; host memory is tracked
        exactly too (building in fp32 on the host first is what init-on-device avoids)."""
        self.stage = "build"
        start = time.perf_counter()
        host = StorageTracker(device_types=("cpu",)) if self.track_host else contextlib.nullcontext()
        with self.meter.active(), self.meter.phase("setup"), host:
            self.state = build_state(self.spec, self.workload, self.stack.techniques, on_model=self.meter.attach_model)
        self.meter.attach_optimizers(self.state.optimizers)
        return Build(seconds=time.perf_counter() - start, peak_bytes=self.meter.result().peak_allocated_bytes,
                     host_peak_bytes=host.peak.bytes if self.track_host else None)

    def step(self, i: int) -> float:
        """One training step seen by the meter: its phases, its inputs, its allocations."""
        self.meter.start_step(i)
        batch = next(self.data)
        self.meter.track_inputs(batch)
        return train_step(self.state, batch, self.meter.phase)

    def bare_step(self, i: int) -> float:
        """One training step with nothing of membench in it (after detach)."""
        return train_step(self.state, next(self.data))

    def next_batch(self, i: int) -> Batch:
        """The next batch, made outside the step: timing.time_steps makes it before its clock starts."""
        return next(self.data)

    def bare_step_on(self, batch: Batch) -> float:
        """One training step on a batch already made, with nothing of membench in it: what is timed."""
        return train_step(self.state, batch)

    def _indices(self, n: int) -> range:
        first, self.next_index = self.next_index, self.next_index + n
        return range(first, first + n)

    def warm_up(self, steps: int) -> None:
        self.stage = "warmup"
        with self.meter.active():
            for i in self._indices(steps):
                self.step(i)

    def skip(self, steps: int) -> None:
        """Go on as if `steps` steps had run, unseen (a prediction that writes its warm-up step instead of running
        it): the next step has their index and the batch after theirs."""
        for _ in self._indices(steps):
            self.meter.track_inputs(next(self.data))

    def measure(self, steps: int = 1, run_steps=untimed) -> tuple[Memory, list[float], list[float]]:
        """Reset the peak and run `steps` steps under the meter; returns (memory, step times, losses).

        run_steps(step, indices) -> (times, losses): untimed by default; on CUDA, where reading the allocator's
        counters costs nothing, the worker passes its timer and the measured steps are the timed ones.
        """
        self.stage = "measure"
        self.meter.reset_peak()
        with self.meter.active():
            times, losses = run_steps(self.step, self._indices(steps))
        return self.meter.result(), times, losses

    def record_timeline(self, stem: Path, steps: int = timeline.TIMELINE_STEPS) -> TimelineInfo:
        """A separate pass of a few untimed steps that keeps every allocation and free (recording slows steps
        down, so it never overlaps the measured or timed ones). Writes `<stem>.timeline.json`."""
        self.stage = "timeline"
        start = time.perf_counter()
        with self.meter.recording(stem) as recording:
            for i in self._indices(steps):
                self.step(i)
        return TimelineInfo(**recording.save(stem), seconds=time.perf_counter() - start, ran_eager=self._eager())

    def _eager(self) -> str | None:
        """What of a compiled model the recording pass ran eager: its tracker is a dispatch mode, under which Dynamo
        runs compiled code eager (torch/_dynamo/convert_frame.py)."""
        names = private.compiled_modules(self.state.model)
        tracker = self.meter.tracker
        if not names or (tracker is not None and tracker.ignore_compile_internals()):  # trackers/compiled.py
            return None
        which = "the model's forward" if names == [""] else "the forward of " + ", ".join(map(repr, names))
        measured = "ran compiled" if self.spec.device == "cuda" else "ran eager too (a CPU run's meter is one)"
        return f"torch.compile: {which} ran eager in this pass; the measured step {measured}"

    def detach(self) -> None:
        self.meter.detach()

    def release(self) -> None:
        """Let go of the model, its gradients and the optimizers' state (the meter lets go of them at detach):
        what runs next, the equivalence check's two models, starts from memory this run no longer holds."""
        self.meter.detach()
        self.state = None
        gc.collect()  # hooks' closures and autograd nodes form reference cycles that can hold a model

    def timed_indices(self, steps: int) -> range:
        self.stage = "time"
        return self._indices(steps)
