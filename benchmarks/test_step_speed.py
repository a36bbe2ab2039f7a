"""Step time per technique on small workloads (pytest-benchmark), with the step's exact peak memory attached.

Run with `nox -s bench` (saves a run under .benchmarks/) and `nox -s bench_compare` (fails when a step's minimum
time is 15% slower than the last saved run). Timing is only meaningful on the same, quiet machine; memory here is
the exact CPU tracker's, deterministic anywhere.
"""

from __future__ import annotations

import pytest
import torch

from membench.spec import RunSpec
from membench.step import batches, build_state, train_step
from membench.techniques import instantiate
from membench.trackers.memory import CpuMeter
from membench.workloads import load_workload

WORKLOADS = [("vit-tiny", 8), ("gpt-tiny", 8)]
STACKS = [(), ("accum",), ("ckpt",), ("opt-in-bwd",)]


def _peak(spec: RunSpec, workload) -> dict:
    """One warm-up step and one tracked step, as `membench run` measures memory on cpu."""
    meter = CpuMeter()
    data = batches(workload, spec)
    with meter.active():
        state = build_state(spec, workload, instantiate(spec), on_model=meter.attach_model)
        meter.attach_optimizers(state.optimizers)
        train_step(state, next(data), meter.phase)
        meter.reset_peak()
        train_step(state, next(data), meter.phase)
    return meter.result()


@pytest.mark.parametrize("stack", STACKS, ids=lambda s: "+".join(s) or "baseline")
@pytest.mark.parametrize("name, batch_size", WORKLOADS)
def test_step(benchmark, name, batch_size, stack):
    torch.set_num_threads(1)  # less noise from thread scheduling on shared CI machines
    spec = RunSpec(name, batch_size, techniques=stack, accum_steps=2)
    workload = load_workload(name)
    memory = _peak(spec, workload)
    benchmark.extra_info.update(peak_allocated_bytes=memory["peak_allocated_bytes"],
                                peak_phase=memory["peak_phase"], breakdown_at_peak=memory["breakdown_at_peak"])
    state = build_state(spec, workload, instantiate(spec))
    data = batches(workload, spec)
    train_step(state, next(data))  # the first step creates the optimizer state: not a steady-state step
    batch = next(data)
    benchmark.pedantic(train_step, args=(state, batch), rounds=10, warmup_rounds=1)
