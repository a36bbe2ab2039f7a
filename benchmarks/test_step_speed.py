"""Step time per technique on small workloads (pytest-benchmark), with the step's exact peak memory attached, and
membench's own overhead in timed steps against a bare loop of the same step.

Run with `nox -s bench` (saves a run under .benchmarks/) and `nox -s bench_compare` (fails when a step's minimum
time is 15% slower than the last saved run). Timing is only meaningful on the same, quiet machine; memory here is
the exact CPU tracker's, deterministic anywhere.
"""

from __future__ import annotations

import itertools
import statistics
import time

import pytest
import torch

from membench.measure import Session
from membench.spec import RunSpec
from membench.step import batches, train_step
from membench.techniques import resolve
from membench.trackers import timing
from membench.trackers.memory import CpuMeter
from membench.workloads import load_workload

WORKLOADS = [("vit-tiny", 8), ("gpt-tiny", 8)]
STACKS = [(), ("accum",), ("ckpt",), ("opt-in-bwd",)]


def _session(spec: RunSpec, data=None) -> Session:
    """Built, warmed up (the optimizer state exists), memory measured once, then detached: what the worker times."""
    workload = load_workload(spec.workload)
    session = Session(spec, resolve(spec), workload, CpuMeter(), data or batches(workload, spec))
    session.build()
    session.warm_up(1)
    session.measure(1)
    session.detach()
    return session


@pytest.mark.parametrize("stack", STACKS, ids=lambda s: "+".join(s) or "baseline")
@pytest.mark.parametrize("name, batch_size", WORKLOADS)
def test_step(benchmark, name, batch_size, stack):
    torch.set_num_threads(1)  # less noise from thread scheduling on shared CI machines
    spec = RunSpec(name, batch_size, techniques=stack, accum_steps=2)
    batch = load_workload(name).make_batch(batch_size, torch.Generator().manual_seed(0))
    session = _session(spec, itertools.repeat(batch))
    memory = session.meter.result()
    benchmark.extra_info.update(peak_allocated_bytes=memory.peak_allocated_bytes,
                                peak_phase=memory.peak_phase, breakdown_at_peak=memory.breakdown_at_peak)
    benchmark.pedantic(train_step, args=(session.state, batch), rounds=10, warmup_rounds=1)


def test_membench_timing_overhead(benchmark):
    """membench's timed steps (Session.bare_step under timing.time_steps) against a bare loop of train_step on the
    same state and batches: rounds interleave the two so drift hits both alike. The ratio (median and IQR over
    rounds) is in extra_info and printed; the goal on a GPU is under 2%."""
    torch.set_num_threads(1)
    spec = RunSpec("gpt-tiny", 8)
    session = _session(spec)
    steps, rounds, ratios = 5, 15, []

    def bare() -> float:
        start = time.perf_counter()
        for _ in range(steps):
            train_step(session.state, next(session.data))
        return time.perf_counter() - start

    def membench() -> float:
        start = time.perf_counter()
        timing.time_steps(session.bare_step, range(steps))
        return time.perf_counter() - start

    for _ in range(rounds):
        ratios.append(membench() / bare())
    q = statistics.quantiles(ratios, n=4)
    benchmark.extra_info.update(overhead_ratio_median=statistics.median(ratios), overhead_ratio_iqr=q[2] - q[0])
    print(f"\nmembench timed steps / bare loop: median {statistics.median(ratios):.4f}, IQR {q[0]:.4f}-{q[2]:.4f} "
          f"over {rounds} interleaved rounds of {steps} steps")
    benchmark.pedantic(membench, rounds=3)
