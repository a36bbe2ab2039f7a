"""Fragmentation named: where a CUDA prediction's measured step allocates no more than the memory the caching
allocator can have, but its reserved memory does not fit, how much of reserved is fragmentation, and whether other
allocator settings make it fit.

PyTorch's out-of-memory message suggests `expandable_segments:True` when reserved-but-unallocated memory is large
(c10/cuda/CUDACachingAllocator.cpp, "If reserved but unallocated memory is large try setting
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation"); `max_split_size_mb` keeps large cached
blocks from being split for small requests (docs/source/notes/cuda.rst, "Optimizing memory usage with
PYTORCH_CUDA_ALLOC_CONF"). A prediction has the trace: it replays it under the same memory with each, on top of the
run's own settings, and stops at the first that fits.

Imports no torch: the CLI's process prints `lines` from result records.
"""

from __future__ import annotations

import dataclasses

from membench.allocator.account import RESET
from membench.allocator.settings import AllocatorSettings, MiB
from membench.common.units import fmt_bytes
from membench.results.schema import Fragmented, SettingsTried

# Tried in this order, each on top of the run's own settings, until one fits. max_split_size_mb's values: blocks of
# that size or more are never split, so the large ones an earlier phase cached serve large requests only.
MAX_SPLIT_MB = (512, 128)


def alternatives(settings: AllocatorSettings) -> list[AllocatorSettings]:
    """The settings to try: expandable segments, then max_split_size_mb, each on top of the run's own, where the run
    does not set them already."""
    tried = [] if settings.expandable_segments else [dataclasses.replace(settings, expandable_segments=True, text="")]
    if settings.max_split_size is None:
        tried += [dataclasses.replace(settings, max_split_size=mb * MiB, text="") for mb in MAX_SPLIT_MB]
    return tried


def for_run(events: list, settings: AllocatorSettings, spec, memory) -> Fragmented | None:
    """`named` for a prediction of RunSpec `spec`: against its --memory-budget, else its card's memory less the CUDA
    context and NCCL's buffers (predict/device.py)."""
    from membench.predict import device, gpus

    capacity = spec.memory_budget or device.card_capacity(gpus.predicted_for(spec).memory_bytes, device.run_mesh(spec))
    return named(events, settings, capacity, memory, spec.memory_budget is not None, device.SEGMENT_PLACEMENT)


def named(events: list, settings: AllocatorSettings, capacity: int, memory, budget: bool,
          placement: str) -> Fragmented | None:
    """Fragmented where the measured step's peak allocated (blocks) fits `capacity` and the trace, replayed under it,
    runs out of memory; else None. `events` carries the measured step's reset (account.RESET); `memory`: the
    prediction's Memory, simulated unbounded, or under `capacity` as a memory fraction where `budget`
    (--memory-budget: then it is simulated unbounded here)."""
    from membench.allocator import simulate

    limit = dict(capacity=capacity, memory_fraction=1.0 if budget else None, placement=placement)
    if budget:
        if not memory.reserved_oom:
            return None
        unbounded = simulate(events, settings, placement=placement)
        peak_allocated, peak_reserved = unbounded.peak_allocated_bytes, unbounded.peak_reserved_bytes
    else:
        peak_allocated, peak_reserved = memory.allocator_peak_allocated_bytes, memory.peak_reserved_bytes
    if peak_allocated > capacity or peak_reserved <= capacity:
        return None
    under = simulate(events, settings, **limit)
    if not under.oom:  # releasing cached blocks was enough
        return None
    tried = []
    for other in alternatives(settings):
        r = simulate(events, other, **limit)
        tried.append(SettingsTried(other.label(), r.peak_reserved_bytes, r.oom))
        if not r.oom:
            break
    step = events.index(RESET) if RESET in events else 0
    return Fragmented(capacity_bytes=capacity, peak_allocated_bytes=peak_allocated, peak_reserved_bytes=peak_reserved,
                      fragmentation_bytes=peak_reserved - peak_allocated, oom_before_step=under.oom_at_event < step,
                      allocated_at_oom_bytes=under.final_allocated_bytes, tried=tried)


def line(name: str, f: Fragmented) -> str:
    """One run's sentence: what fits, how much is fragmentation, where it runs out, what the settings tried do."""
    where = (f"it runs out before the measured step, with {fmt_bytes(f.allocated_at_oom_bytes)} allocated "
             "(construction or warm-up: membench builds the whole model on the device, then a distributed technique "
             "shards it)" if f.oom_before_step else "it runs out in the step")
    tried = "; ".join(f"{t.settings}: " + ("out of memory" if t.oom else
                                           f"fits, reserving {fmt_bytes(t.peak_reserved_bytes)}") for t in f.tried)
    fits = next((t.settings for t in f.tried if not t.oom), None)
    verdict = (f"{fits} makes it fit" if fits else "no setting tried makes it fit" if f.tried
               else "no other setting to try")
    return (f"  {name}: peak allocated {fmt_bytes(f.peak_allocated_bytes)} fits the {fmt_bytes(f.capacity_bytes)} the "
            f"allocator can have, reserved {fmt_bytes(f.peak_reserved_bytes)} does not: "
            f"{fmt_bytes(f.fragmentation_bytes)} of it is fragmentation (reserved, never allocated at once in the "
            "step: split or cached blocks); "
            f"{where}; {tried + '; ' if tried else ''}{verdict}")


def lines(records: list) -> list[str]:
    """predict's lines for the runs whose allocated fits and reserved does not, under a head line."""
    found = [line(r.name, r.memory.fragmented) for r in records
             if r.memory is not None and getattr(r.memory, "fragmented", None) is not None]
    return ["FRAGMENTATION: peak allocated fits, reserved does not (predicted; each setting replayed on the same "
            "allocations):", *found] if found else []
