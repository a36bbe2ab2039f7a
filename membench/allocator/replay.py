"""Replaying a recorded trace through the simulator, and comparing it with what the real allocator did."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator

from membench.allocator import SimulationResult, run_events
from membench.allocator.events import DEFAULT_STREAM, TraceEvent
from membench.allocator.settings import AllocatorSettings
from membench.allocator.simulator import CachingAllocator
from membench.allocator.snapshot import ALLOC, FREE, SEGMENT_ALLOC, SEGMENT_FREE, Trace
from membench.common.typedjson import to_plain


@dataclasses.dataclass
class Actual:
    """What the real allocator did during the trace, read from its events."""

    initial_reserved_bytes: int
    peak_reserved_bytes: int
    segment_allocations: list[tuple[int, int]]  # (which alloc event caused it, 1-based; segment size)
    segment_frees: int
    allocs: int
    frees: int


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
           recorded_addresses: bool = True, memory_fraction: float | None = None,
           placement: str = "ascending") -> SimulationResult:
    """Run the trace's allocations and frees through the simulator, from the state rebuilt at its first event.

    A run of consecutive segment_free events is one torch.cuda.empty_cache() (or, with default settings, the release
    of cached segments before a retried cudaMalloc, which frees the same segments; a trace recorded with
    garbage_collection_threshold or max_split_size may free fewer there, and would not replay exactly). New segments
    are placed at the addresses the trace recorded while the simulator asks for the same sizes in the same order
    (the driver's choice of address only breaks ties between equal-size free blocks); elsewhere, or with
    recorded_addresses=False, the simulator places them by `placement` (CachingAllocator's: "ascending", one after
    another, or "top-down", each below the ones before).
    """
    settings = settings or trace.settings
    recorded = [(e["size"], e["addr"]) for e in trace.events if e["action"] == SEGMENT_ALLOC]
    cursor = 0

    def recorded_address(size: int) -> int | None:
        nonlocal cursor
        if cursor < len(recorded) and recorded[cursor][0] == size:
            cursor += 1
            return recorded[cursor - 1][1]
        return None  # the simulator lays it out itself

    alloc = CachingAllocator(settings, capacity, segment_address=recorded_address if recorded_addresses else None,
                             memory_fraction=memory_fraction, placement=placement)
    blocks = {}
    for seg in trace.segments:
        for (addr, _, _), block in zip(seg.allocated, alloc.add_segment(seg.address, seg.size, seg.is_small,
                                                                        seg.allocated, seg.stream)):
            blocks[addr] = block
    same = 0

    def placed(addr: int, block) -> None:
        nonlocal same
        same += block.ptr == addr

    result = run_events(alloc, _events(trace), blocks, placed)
    result.same_address = same
    return result


def _events(trace: Trace) -> Iterator[TraceEvent]:
    """The trace's events as `run_events` takes them, keyed by address; a run of segment_free events is one
    empty_cache."""
    previous = None
    for event in trace.events:
        action = event["action"]
        if action == ALLOC:
            yield TraceEvent.alloc(event["addr"], event["size"], event.get("stream", DEFAULT_STREAM))
        elif action in (FREE, "free"):
            yield TraceEvent.free(event["addr"])
        elif action == SEGMENT_FREE and previous != SEGMENT_FREE:
            yield TraceEvent("empty_cache")
        previous = action


@dataclasses.dataclass
class Comparison:
    matched: int  # segment allocations equal in position, size and the allocation that caused them
    total: int  # segment allocations recorded
    first_difference: int | None  # index of the first segment allocation that differs
    exact: bool  # all segment allocations matched, no extra ones, and the peak reserved equal to the byte


def compare(actual: Actual, simulated: SimulationResult) -> Comparison:
    a, s = actual.segment_allocations, simulated.segment_allocations
    matched = sum(x == y for x, y in zip(a, s))
    first = next((i for i, (x, y) in enumerate(zip(a, s)) if x != y), None)
    if first is None and len(a) != len(s):
        first = min(len(a), len(s))
    exact = first is None and actual.peak_reserved_bytes == simulated.peak_reserved_bytes and not simulated.oom
    return Comparison(matched, len(a), first, exact)


@dataclasses.dataclass
class SegmentAt:
    at_alloc: int  # how many allocations had started when the segment was allocated (the causing one included)
    size_bytes: int


@dataclasses.dataclass
class SegmentDifference:
    index: int  # position in the order of segment allocations
    actual: SegmentAt | None  # None: the real allocator made fewer
    simulated: SegmentAt | None


@dataclasses.dataclass
class ActualRow:
    """What the real allocator did, from the trace."""

    peak_reserved_bytes: int
    initial_reserved_bytes: int
    segment_allocations: int
    segment_frees: int
    allocs: int
    frees: int


@dataclasses.dataclass
class SettingsRow:
    """One replay of the trace under one set of allocator settings."""

    settings: str
    peak_reserved_bytes: int
    peak_allocated_bytes: int
    fragmentation_at_peak_bytes: int
    segment_allocations: int
    segment_frees: int
    oom: bool
    num_alloc_retries: int
    seconds: float  # how long this replay took


@dataclasses.dataclass
class SimulatedRow(SettingsRow):
    """The replay under the recorded settings, compared with the real allocator."""

    segment_allocations_matched: int
    exact: bool
    allocations_at_recorded_address: int
    allocations: int
    segment_allocation_differences: list[SegmentDifference]


@dataclasses.dataclass
class WhatIfRow(SettingsRow):
    saved_bytes: int  # peak reserved under the recorded settings minus under these (negative: these cost more)


@dataclasses.dataclass
class ReplayReport:
    """`membench replay`'s answer. Bytes throughout; `to_dict` is what --json prints."""

    file: str
    device: int
    events: int
    recorded_settings: str
    capacity_bytes: int | None
    memory_fraction: float | None
    initial_segments: int
    inferred_block_sizes: int
    actual: ActualRow
    simulated: SimulatedRow
    what_if: list[WhatIfRow]
    seconds: float

    def to_dict(self) -> dict:
        return to_plain(self)


def _difference(actual: Actual, simulated: SimulationResult, limit: int = 20) -> list[SegmentDifference]:
    """The segment allocations that differ, position by position (at most `limit`)."""
    a, s = actual.segment_allocations, simulated.segment_allocations
    out = []
    for i in range(max(len(a), len(s))):
        x = a[i] if i < len(a) else None
        y = s[i] if i < len(s) else None
        if x != y:
            out.append(SegmentDifference(i, None if x is None else SegmentAt(*x), None if y is None else SegmentAt(*y)))
            if len(out) == limit:
                break
    return out


def _row(result: SimulationResult, seconds: float) -> dict:
    """The fields of a SettingsRow."""
    return dict(settings=result.settings.label(), peak_reserved_bytes=result.peak_reserved_bytes,
                peak_allocated_bytes=result.peak_allocated_bytes,
                fragmentation_at_peak_bytes=result.fragmentation_at_peak_bytes,
                segment_allocations=len(result.segment_allocations), segment_frees=result.segments_released,
                oom=result.oom, num_alloc_retries=result.num_alloc_retries, seconds=round(seconds, 4))


def report(path, alloc_confs: list[str] = (), capacity: int | None = None, device: int | None = None,
           memory_fraction: float | None = None) -> ReplayReport:
    """`membench replay`'s answer. Raises UserError on bad input."""
    from membench.allocator.settings import parse_alloc_conf
    from membench.allocator.snapshot import initial_state, load_snapshot
    from membench.common.errors import UserError

    if memory_fraction is not None and (capacity is None or not 0 < memory_fraction <= 1):
        raise UserError(f"--memory-fraction {memory_fraction} needs --capacity (the device's memory) and must lie "
                        "in (0, 1]")

    what_ifs = [parse_alloc_conf(text) for text in alloc_confs]  # bad settings fail before the file is read
    started = time.perf_counter()
    trace = initial_state(load_snapshot(path), device)
    actual = actual_of(trace)
    simulated, seconds = _timed(lambda: replay(trace, capacity=capacity, memory_fraction=memory_fraction))
    comparison = compare(actual, simulated)
    sim = SimulatedRow(**_row(simulated, seconds), segment_allocations_matched=comparison.matched,
                       exact=comparison.exact, allocations_at_recorded_address=simulated.same_address,
                       allocations=simulated.allocations,
                       segment_allocation_differences=_difference(actual, simulated))
    what_if = []
    for settings in what_ifs:
        result, took = _timed(lambda s=settings: replay(trace, s, capacity, memory_fraction=memory_fraction))
        what_if.append(WhatIfRow(**_row(result, took),
                                 saved_bytes=simulated.peak_reserved_bytes - result.peak_reserved_bytes))
    return ReplayReport(
        file=str(path), device=trace.device, events=len(trace.events), recorded_settings=trace.settings.label(),
        capacity_bytes=capacity, memory_fraction=memory_fraction, initial_segments=len(trace.segments),
        inferred_block_sizes=trace.guessed_sizes,
        actual=ActualRow(peak_reserved_bytes=actual.peak_reserved_bytes,
                         initial_reserved_bytes=actual.initial_reserved_bytes,
                         segment_allocations=len(actual.segment_allocations), segment_frees=actual.segment_frees,
                         allocs=actual.allocs, frees=actual.frees),
        simulated=sim, what_if=what_if, seconds=round(time.perf_counter() - started, 4))


def _timed(call):
    """(call(), the seconds it took): how long a replay of the trace takes, shown in the report."""
    started = time.perf_counter()
    return call(), time.perf_counter() - started


def format_report(r: ReplayReport) -> str:
    from tabulate import tabulate

    from membench.common.units import fmt_bytes

    def size(n):
        return f"{fmt_bytes(n)} ({n} B)"

    a, s = r.actual, r.simulated
    lines = [f"{r.file}: device {r.device}, {r.events} events ({a.allocs} alloc, {a.frees} "
             f"free_completed, {a.segment_allocations} segment_alloc, {a.segment_frees} segment_free), "
             f"recorded with {r.recorded_settings} allocator settings",
             f"state at the first event rebuilt from the final one: {r.initial_segments} segments, "
             f"{fmt_bytes(a.initial_reserved_bytes)} reserved"
             + (f"; {r.inferred_block_sizes} block sizes inferred" if r.inferred_block_sizes else "")]
    if r.capacity_bytes is not None:
        fraction = r.memory_fraction
        lines.append(f"simulated device: {size(r.capacity_bytes)}" + (
            f", memory fraction {fraction} ({fmt_bytes(int(fraction * r.capacity_bytes))} allowed)"
            if fraction is not None else ""))
    lines.append("")
    matched = f"{s.segment_allocations} ({s.segment_allocations_matched} of {a.segment_allocations} " \
              "the same size at the same allocation)"
    rows = [["peak reserved", size(a.peak_reserved_bytes), size(s.peak_reserved_bytes)],
            ["segment allocations", a.segment_allocations, matched],
            ["segments freed", a.segment_frees, s.segment_frees],
            ["peak allocated", "-", size(s.peak_allocated_bytes)],
            ["reserved - allocated at the peak", "-", size(s.fragmentation_at_peak_bytes)],
            ["allocations at the recorded address", "-", f"{s.allocations_at_recorded_address} of {a.allocs}"]]
    if r.capacity_bytes is not None:
        rows.append(["out of memory under the capacity", "-", "yes" if s.oom else "no"])
    lines.append(tabulate(rows, headers=["", "actual (recorded)", f"simulated ({s.settings} settings)"],
                          tablefmt="simple", disable_numparse=True))
    if s.exact:
        lines.append("\nexact: the same segment allocations in the same order, and the same peak reserved to the byte")
    else:
        lines.append(f"\nNOT exact: simulated peak reserved minus actual: "
                     f"{s.peak_reserved_bytes - a.peak_reserved_bytes} B"
                     + (" (the simulation ran out of memory under the capacity)" if s.oom else ""))
        if s.segment_allocation_differences:
            lines.append("segment allocations that differ (index: actual -> simulated, as (alloc event, size)):")
        else:
            lines.append("the segment allocations are the same; segments freed differ "
                         f"({a.segment_frees} actual, {s.segment_frees} simulated)")
        for d in s.segment_allocation_differences:
            fmt = lambda x: "none" if x is None else f"(alloc {x.at_alloc}, {fmt_bytes(x.size_bytes)})"
            lines.append(f"  {d.index}: {fmt(d.actual)} -> {fmt(d.simulated)}")
    if r.what_if:
        base = s.peak_reserved_bytes
        rows = [[f"as recorded ({s.settings})", size(base), fmt_bytes(s.fragmentation_at_peak_bytes), "-",
                 s.segment_allocations]]
        for w in r.what_if:
            saved = w.saved_bytes
            if w.oom:
                change = "OOM"
            else:
                change = f"{'saves' if saved >= 0 else 'costs'} {fmt_bytes(abs(saved))}"
                change += f" ({abs(saved) / base:.1%})" if base else ""
            rows.append([w.settings, size(w.peak_reserved_bytes), fmt_bytes(w.fragmentation_at_peak_bytes),
                         change, w.segment_allocations])
        headers = ["settings", "peak reserved (simulated)", "reserved - allocated at peak", "vs as recorded",
                   "segment allocations"]
        if r.capacity_bytes is not None:
            headers.append("alloc retries")
            rows[0].append(s.num_alloc_retries)
            for row, w in zip(rows[1:], r.what_if):
                row.append(w.num_alloc_retries)
        start = f"; each starts from the state at the first event, its {r.initial_segments} segments as recorded" \
            if r.initial_segments else ""
        lines += ["", f"what if, on this exact trace (GiB = 2**30{start}):",
                  tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)]
    lines.append(f"\n({r.seconds:.2f} s)")
    return "\n".join(lines)
