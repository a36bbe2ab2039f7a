"""The smallest cluster that fits (`membench fit --by world-size`): for each technique at a fixed batch per rank, the
fewest ranks whose every rank's whole-device estimate (predict/device.py: reserved + the CUDA context + NCCL's
buffers, reserved as replayed under the card where it reserves more) is within the budget, with its margin.

The search: world sizes 1, 2, 4, ... up to the most a prediction plays (1024) until one fits; then, between the last
that did not and that one, a bisection over multiples of 8 (GPUs come 8 to a node) where the gap is wider than 8,
else over every count. It assumes that more ranks never need more memory per rank, which holds for sharding (each
rank's shards shrink, what is unsharded stays) but not exactly: uneven shards differ by an element or so per
parameter. A stack without a distributed technique keeps everything on every rank: its answer is its one size.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from membench.spec import Job

MAX_WORLD = 1024  # spec.CHECKS["world_size"].high: the most ranks a prediction plays
NODE = 8


@dataclass
class WorldFit:
    """One technique's answer: the smallest world size within the budget (0: none up to MAX_WORLD), its per-rank
    peak (the largest rank's), and the largest world size tried that does not fit."""

    run: str
    world_size: int
    peak: int | None
    over_world: int | None
    over_peak: int | None
    predictions: int
    distributed: bool  # False: the world size changes nothing per rank


def world_sizes_to_try(low: int, high: int) -> list[int]:
    """Between a world size that does not fit (low) and one that does (high): multiples of 8 where the gap is wider
    than 8, else every count, in order."""
    step = NODE if high - low > NODE else 1
    return [w for w in range(low + 1, high) if w % step == 0]


def smallest_world(job: Job, budget: int, peak_at: Callable[[Job], int | None], distributed: bool,
                   on_probe: Callable[[int, int | None], None] | None = None) -> WorldFit:
    """peak_at(job at a world size) -> the per-rank peak, or None where it cannot be predicted (raises through)."""
    seen: dict[int, int | None] = {}

    def peak(world: int) -> int | None:
        if world not in seen:
            seen[world] = peak_at(Job(dataclasses.replace(job.run, nproc_per_node=world), job.measure, job.launch))
            if on_probe is not None:
                on_probe(world, seen[world])
        return seen[world]

    def fits(world: int) -> bool:
        p = peak(world)
        return p is not None and p <= budget

    if not distributed:
        fit = fits(1)
        return WorldFit(job.name, 1 if fit else 0, peak(1), None if fit else 1, None if fit else peak(1), 1, False)
    world, last_over = 1, None
    while not fits(world):
        last_over = world
        if world >= MAX_WORLD:
            return WorldFit(job.name, 0, None, world, peak(world), len(seen), True)
        world = min(world * 2, MAX_WORLD)
    if last_over is not None:
        candidates = world_sizes_to_try(last_over, world)
        lo, hi = 0, len(candidates)  # bisect: the first candidate that fits, else `world`
        while lo < hi:
            mid = (lo + hi) // 2
            if fits(candidates[mid]):
                hi = mid
            else:
                lo = mid + 1
        world = candidates[lo] if lo < len(candidates) else world
        last_over = max((w for w in seen if w < world and not fits(w)), default=last_over)
    return WorldFit(job.name, world, peak(world), last_over, None if last_over is None else peak(last_over),
                    len(seen), True)


def rank_peak(record) -> int | None:
    """A prediction's whole-device estimate for its fullest rank (predict/verdict.device_peak for rank 0, whose
    replay under the card it holds; each other rank whose shards differ from its reserved memory)."""
    from membench.predict.device import run_mesh, whole_device
    from membench.predict.verdict import device_peak

    peak = device_peak(record)
    if peak is None:
        return None
    mesh = run_mesh(record.spec.run)
    others = [whole_device(k.peak_reserved_bytes, mesh).total for k in record.ranks or ()
              if k.rank != 0 and k.peak_reserved_bytes is not None]
    return max([peak.nbytes, *others])


def world_answer(fits: list[WorldFit], budget: int) -> str:
    """One line: the fewest ranks each technique needs within the budget per rank, with the margin."""
    from membench.common.units import fmt_bytes

    said = []
    for f in fits:
        if not f.distributed:
            said.append(f"{f.run} keeps everything on every rank: "
                        + (f"fits ({fmt_bytes(budget - f.peak)} to spare)" if f.world_size else "does not fit"))
        elif f.world_size:
            said.append(f"{f.run} needs {f.world_size} rank{'s' if f.world_size > 1 else ''} "
                        f"({fmt_bytes(budget - f.peak)} to spare per rank)")
        else:
            said.append(f"{f.run} does not fit at {f.over_world} ranks"
                        + (f" ({fmt_bytes(f.over_peak - budget)} over)" if f.over_peak is not None else ""))
    return f"within {fmt_bytes(budget)} per rank (whole device): " + "; ".join(said) + "."
