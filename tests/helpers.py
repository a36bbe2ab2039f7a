"""Small helpers shared by tests: run a spec in-process under the exact tracker."""

from __future__ import annotations

import dataclasses

from membench.spec import RunSpec
from membench.step import build_state, train_step
from membench.techniques import instantiate
from membench.trackers.memory import CpuMeter
from membench.workloads import load_workload


def spec(workload="vit-tiny", batch_size=4, techniques=(), **kw) -> RunSpec:
    return RunSpec(workload=workload, batch_size=batch_size, techniques=tuple(techniques), **kw).validated()


def measure(s: RunSpec, steps: int = 2, warmup: int = 1) -> tuple[dict, CpuMeter, object, tuple]:
    """Warm up, reset the peak, run `steps` steps on one held batch; returns (memory result, meter, state, batch)."""
    workload = load_workload(s.workload)
    techniques = instantiate(s)
    for t in techniques:
        t.validate(s, workload)
    meter = CpuMeter(budget=s.memory_budget)
    import torch

    with meter.active():
        state = build_state(s, workload, techniques, on_model=meter.attach_model)
        meter.attach_optimizers(state.optimizers)
        batch = workload.make_batch(s.batch_size, torch.Generator().manual_seed(0))
        meter.track_inputs(batch)
        for i in range(warmup):
            train_step(state, batch, meter.phase)
        meter.reset_peak()
        for i in range(steps):
            train_step(state, batch, meter.phase)
    return meter.result(), meter, state, batch


def replace(s: RunSpec, **kw) -> RunSpec:
    return dataclasses.replace(s, **kw).validated()
