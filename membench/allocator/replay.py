"""Replaying a recorded trace through the simulator, and comparing it with what the real allocator did."""

from __future__ import annotations

import dataclasses
import time

from membench.allocator.settings import AllocatorSettings
from membench.allocator.simulator import CachingAllocator, OutOfMemory
from membench.allocator.snapshot import ALLOC, FREE, SEGMENT_ALLOC, SEGMENT_FREE, Trace


@dataclasses.dataclass
class Actual:
    """What the real allocator did during the trace, read from its events."""

    initial_reserved_bytes: int
    peak_reserved_bytes: int
    segment_allocations: list[tuple[int, int]]  # (which alloc event caused it, 1-based; segment size)
    segment_frees: int
    allocs: int
    frees: int


@dataclasses.dataclass
class Replay:
    settings: AllocatorSettings
    peak_reserved_bytes: int
    peak_allocated_bytes: int
    allocated_at_peak_reserved: int
    segment_allocations: list[tuple[int, int]]
    segment_frees: int
    same_address: int  # allocations the simulator placed at the recorded address
    allocs_replayed: int
    oom: bool
    num_alloc_retries: int
    seconds: float

    @property
    def fragmentation_at_peak_bytes(self) -> int:
        """Reserved but not allocated when reserved memory peaked."""
        return self.peak_reserved_bytes - self.allocated_at_peak_reserved


def actual_of(trace: Trace) -> Actual:
    reserved = peak = sum(s.size for s in trace.segments)
    initial = reserved
    allocs = frees = seg_frees = 0
    segs = []
    for event in trace.events:
        action = event["action"]
        if action == ALLOC:
            allocs += 1
        elif action in (FREE, "free"):
            frees += 1
        elif action == SEGMENT_ALLOC:
            reserved += event["size"]
            peak = max(peak, reserved)
            segs.append((allocs + 1, event["size"]))  # cudaMalloc runs inside the malloc that comes next
        elif action == SEGMENT_FREE:
            reserved -= event["size"]
            seg_frees += 1
    return Actual(initial, peak, segs, seg_frees, allocs, frees)


def replay(trace: Trace, settings: AllocatorSettings | None = None, capacity: int | None = None,
           recorded_addresses: bool = True) -> Replay:
    """Run the trace's allocations and frees through the simulator, from the state rebuilt at its first event.

    A run of consecutive segment_free events is one torch.cuda.empty_cache() (or the release of cached segments
    before a retried cudaMalloc, which frees the same segments). New segments are placed at the addresses the
    trace recorded while the simulator asks for the same sizes in the same order (the driver's choice of address
    only breaks ties between equal-size free blocks); elsewhere, or with recorded_addresses=False, they are laid
    out one after another.
    """
    settings = settings or trace.settings
    recorded = [(e["size"], e["addr"]) for e in trace.events if e["action"] == SEGMENT_ALLOC]
    cursor = 0

    def recorded_address(size: int) -> int:
        nonlocal cursor
        if cursor < len(recorded) and recorded[cursor][0] == size:
            cursor += 1
            return recorded[cursor - 1][1]
        return alloc._bump_address(size)

    started = time.perf_counter()
    alloc = CachingAllocator(settings, capacity, segment_address=recorded_address if recorded_addresses else None)
    blocks = {}
    for seg in trace.segments:
        for (addr, _, _), block in zip(seg.allocated, alloc.add_segment(seg.address, seg.size, seg.is_small,
                                                                        seg.allocated, seg.stream)):
            blocks[addr] = block
    alloc.peak_reserved, alloc.peak_allocated = alloc.reserved, alloc.allocated
    alloc.allocated_at_peak_reserved, alloc.reserved_at_peak_allocated = alloc.allocated, alloc.reserved
    same = allocs = 0
    oom = False
    previous = None
    for event in trace.events:
        action = event["action"]
        if action == ALLOC:
            try:
                block = alloc.malloc(event["size"], event.get("stream", 0))
            except OutOfMemory:
                oom = True
                break
            allocs += 1
            same += block.ptr == event["addr"]
            blocks[event["addr"]] = block
        elif action in (FREE, "free"):
            alloc.free(blocks.pop(event["addr"]))
        elif action == SEGMENT_FREE and previous != SEGMENT_FREE:
            alloc.empty_cache()
        previous = action
    seconds = time.perf_counter() - started
    new_segments = [(e.at_malloc, e.size) for e in alloc.segment_log if e.action in ("alloc", "map")]
    frees = sum(e.action in ("free", "unmap") for e in alloc.segment_log)
    return Replay(settings, alloc.peak_reserved, alloc.peak_allocated, alloc.allocated_at_peak_reserved,
                  new_segments, frees, same, allocs, oom, alloc.num_alloc_retries, seconds)


@dataclasses.dataclass
class Comparison:
    matched: int  # segment allocations equal in position, size and the allocation that caused them
    total: int  # segment allocations recorded
    first_difference: int | None  # index of the first segment allocation that differs
    exact: bool  # all segment allocations matched, no extra ones, and the peak reserved equal to the byte


def compare(actual: Actual, simulated: Replay) -> Comparison:
    a, s = actual.segment_allocations, simulated.segment_allocations
    matched = sum(x == y for x, y in zip(a, s))
    first = next((i for i, (x, y) in enumerate(zip(a, s)) if x != y), None)
    if first is None and len(a) != len(s):
        first = min(len(a), len(s))
    exact = first is None and actual.peak_reserved_bytes == simulated.peak_reserved_bytes and not simulated.oom
    return Comparison(matched, len(a), first, exact)
