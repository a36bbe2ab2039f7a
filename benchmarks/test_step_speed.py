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
    same state and batches. Rounds interleave the two, and alternate which goes first, so drift (a neighbour's
    load, clocks) hits both alike. The ratio's median comes with a 95% confidence interval (order statistics, as
    membench reports step times) and its IQR, in extra_info and printed; the goal on a GPU is under 2%, i.e. an
    interval that stays below 1.02."""
    torch.set_num_threads(1)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    spec = RunSpec("gpt-tiny", 8, device=device)
    steps, rounds, ratios = 5, 21, []
    # What is timed is the bare step: from the same build and batches, membench's timed loop trains exactly as a
    # bare loop of train_step does (same losses, bit for bit), so the ratio below compares the same work.
    timed_losses = timing.time_steps(_session(spec).bare_step, range(steps))[1]
    twin = _session(spec)
    assert timed_losses == [train_step(twin.state, next(twin.data)) for _ in range(steps)]
    session = _session(spec)

    def bare() -> float:
        start = time.perf_counter()
        for _ in range(steps):
            train_step(session.state, next(session.data))  # returns a .item(): synchronised, as membench's step
        return time.perf_counter() - start

    def membench() -> float:
        start = time.perf_counter()
        timing.time_steps(session.bare_step, range(steps))
        return time.perf_counter() - start

    bare(), membench()  # warm both paths (allocator, kernels) before anything is compared
    for i in range(rounds):
        if i % 2:
            ratios.append(membench() / bare())
        else:
            b = bare()
            ratios.append(membench() / b)
    q = statistics.quantiles(ratios, n=4)
    low, high, level = timing.median_ci(ratios)
    median = statistics.median(ratios)
    benchmark.extra_info.update(overhead_ratio_median=median, overhead_ratio_iqr=q[2] - q[0],
                                overhead_ratio_ci=[low, high], overhead_ratio_ci_level=level, device=device)
    verdict = ("within noise of no overhead" if low <= 1 <= high else
               "under the 2% goal" if high < 1.02 else "above the 2% goal" if low > 1.02 else "not resolved")
    print(f"\nmembench timed steps / bare loop on {device}: median {median:.4f}, {level:.0%} CI {low:.4f}-{high:.4f}, "
          f"IQR {q[0]:.4f}-{q[2]:.4f} over {rounds} interleaved rounds of {steps} steps: {verdict}")
    benchmark.pedantic(membench, rounds=3)
