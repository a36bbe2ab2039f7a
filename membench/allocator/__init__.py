"""Reserved CUDA memory without a GPU: a simulator of PyTorch's CUDA caching allocator.

- settings.parse_alloc_conf: PYTORCH_CUDA_ALLOC_CONF text -> AllocatorSettings (the one parser)
- simulator.CachingAllocator: the allocator's rules (rounding, pools, best fit, splitting, coalescing,
  max_split_size, garbage collection, roundup_power2_divisions, expandable segments, empty_cache, OOM retries)
- snapshot: a restricted unpickler for snapshots and the backwards rebuild of the state at a trace's first event
- replay: a recorded trace through the simulator, compared with what the real allocator did
- events.TraceEvent: one event of an allocation trace (the storage tracker's, a recorded one's), read by name
- simulate(): the entry point for an allocation trace of one's own (membench predict's)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Iterable

from membench.allocator.account import AccountMismatch, Tracked, check
from membench.allocator.events import DEFAULT_STREAM, KINDS, TraceEvent
from membench.allocator.settings import AllocatorSettings, parse_alloc_conf, settings_from_env
from membench.allocator.simulator import MIN_BLOCK, CachingAllocator, OutOfMemory, get_allocation_size, round_size

__all__ = ["DEFAULT_STREAM", "AccountMismatch", "AllocatorSettings", "CachingAllocator", "OutOfMemory",
           "ReservedSummary", "SimulationResult", "TraceEvent", "Tracked", "get_allocation_size", "parse_alloc_conf",
           "reserved_summary", "round_size", "run_events", "settings_from_env", "simulate"]


@dataclasses.dataclass
class SimulationResult:
    """What the caching allocator would have held, for a trace of one's own (`simulate`) or a recorded one
    (`replay.replay`). Bytes throughout."""

    settings: AllocatorSettings
    peak_reserved_bytes: int  # the most memory held from the driver (what CUDA OOM is decided on)
    peak_allocated_bytes: int  # the most in blocks handed out (requests rounded up to the allocator's blocks)
    reserved_at_peak_allocated: int  # reserved when allocated peaked
    allocated_at_peak_reserved: int  # allocated when reserved peaked (just after the allocation that raised it)
    # Segments allocated (cudaMalloc, or pages mapped when expandable), in order: (how many allocations had started
    # when it happened, the one causing it included; its size).
    segment_allocations: list[tuple[int, int]]
    segments_released: int  # segments freed (empty_cache, OOM retries, garbage collection) or ranges unmapped
    num_alloc_retries: int  # times the cache was emptied to retry a failed cudaMalloc (needs a capacity)
    oom: bool  # an allocation did not fit under the capacity or fraction: the simulation stopped there
    oom_at_event: int | None  # index in the events of the allocation that failed
    final_reserved_bytes: int
    final_allocated_bytes: int
    allocations: int  # allocations made (up to an OOM)
    same_address: int | None = None  # a recorded trace's allocations the simulator placed at the recorded address
    # Reserved at the peak of reserved, by the stream whose pool held it (0: the default stream).
    reserved_by_stream_at_peak: dict[int, int] = dataclasses.field(default_factory=dict)
    # The live requests, each rounded up to 512 B (what a storage tracker counts), at their peak (since the last
    # reset_peak) and at the end: account.py holds them against the tracker's.
    peak_requested_bytes: int = 0
    final_requested_bytes: int = 0

    @property
    def segments(self) -> list[int]:
        """The sizes of the segments allocated, in order."""
        return [size for _, size in self.segment_allocations]

    @property
    def fragmentation_at_peak_bytes(self) -> int:
        """Reserved minus allocated at the peak of reserved memory."""
        return self.peak_reserved_bytes - self.allocated_at_peak_reserved


def simulate(events: Iterable[TraceEvent | tuple], settings: AllocatorSettings | str | None = None,
             capacity: int | None = None, memory_fraction: float | None = None,
             placement: str = "ascending") -> SimulationResult:
    """Run an allocation trace through the caching allocator simulator.

    events: in program order, TraceEvents (membench.allocator.events), or tuples, each one of
        ("alloc", key, size_bytes)  a storage of size_bytes is allocated (the raw requested size: the simulator
                                    rounds it as the allocator does); key is any hashable that names it
        ("alloc", key, size, stream) the same, on a stream other than the default one (0): its block serves only
                                    requests on that stream, before and after it is freed (c10's pools are keyed by
                                    stream: get_free_block takes a block of the request's stream only)
        ("free", key)               that storage is freed, its block back in its own stream's pool at once (what a
                                    free is when no record_stream delays it; FSDP2 calls none, and the collectives
                                    it calls record none: see membench/predict/streams.py)
        ("empty_cache",)            torch.cuda.empty_cache()
        ("reset_peak",)             torch.cuda.reset_peak_memory_stats(): peaks count from here
    settings: AllocatorSettings, or PYTORCH_CUDA_ALLOC_CONF text such as "expandable_segments:True"
              (default: PyTorch's defaults).
    capacity: the device's memory in bytes; None = unlimited. With it, a cudaMalloc that would exceed it fails,
              the allocator's release-and-retry path runs, and then the allocation is an OOM.
    memory_fraction: torch.cuda.set_per_process_memory_fraction's value (needs a capacity): the allocator keeps
              reserved memory within fraction x capacity; garbage_collection_threshold acts only with it, as in
              PyTorch.
    placement: where the driver puts a new segment, "ascending" (after the earlier ones) or "top-down" (below
              them): it decides which of several equal-size free blocks a request takes (CachingAllocator).

    Raises ValueError for a malformed event, a free of an unknown key or an alloc of a key in use.
    """
    if not isinstance(settings, AllocatorSettings):
        settings = parse_alloc_conf(settings)
    return run_events(CachingAllocator(settings, capacity, memory_fraction=memory_fraction, placement=placement),
                      events)


def run_events(alloc: CachingAllocator, events: Iterable[TraceEvent | tuple],
               live: dict[Hashable, object] | None = None,
               on_malloc: Callable[[Hashable, object], None] | None = None) -> SimulationResult:
    """The one replay loop: `events` (TraceEvents, or the tuples `simulate` takes) through `alloc`, until the end or
    the first allocation that does not fit. live: blocks allocated before the first event, by key (a recorded
    trace's initial state); on_malloc(key, block) is called for each allocation.

    After each event the simulator's live requests (each rounded up to 512 B) must equal the events' running count:
    account.AccountMismatch where an allocation or free did not reach the simulator's blocks as the trace has it."""
    live = {} if live is None else live
    oom_at = None
    allocations = 0
    counted = alloc.requested  # the blocks live before the first event (a recorded trace's)
    for index, event in enumerate(events):
        if type(event) is not TraceEvent:
            try:
                event = TraceEvent.of(event)
            except ValueError as exc:
                raise ValueError(f"event {index}: {exc}") from None
        kind, key = event.kind, event.key
        if kind == "alloc":
            if key in live:
                raise ValueError(f"event {index}: {key!r} is allocated twice without a free")
            if not isinstance(event.size, int) or event.size < 0:
                raise ValueError(f"event {index}: size must be a non-negative int, got {event.size!r}")
            if event.size == 0:  # c10's allocate() asks the allocator for nothing (a null pointer), and frees nothing
                live[key] = None
                continue
            try:
                block = alloc.malloc(event.size, event.stream)
            except OutOfMemory:
                oom_at = index
                break
            allocations += 1
            live[key] = block
            counted += -(-event.size // MIN_BLOCK) * MIN_BLOCK
            if on_malloc is not None:
                on_malloc(key, block)
        elif kind == "free":
            if key not in live:
                raise ValueError(f"event {index}: free of {key!r}, which is not allocated")
            block = live.pop(key)
            if block is not None:
                counted -= -(-block.requested // MIN_BLOCK) * MIN_BLOCK
                alloc.free(block)
        elif kind == "empty_cache":
            alloc.empty_cache()
        elif kind == "reset_peak":
            alloc.reset_peak()
        else:
            raise ValueError(f"event {index}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
        if alloc.requested != counted:
            raise AccountMismatch(f"event {index} ({kind} {key!r}): the simulator holds {alloc.requested:,} B of "
                                  f"live requests, the trace {counted:,} B")
    return SimulationResult(
        settings=alloc.settings, peak_reserved_bytes=alloc.peak_reserved, peak_allocated_bytes=alloc.peak_allocated,
        reserved_at_peak_allocated=alloc.reserved_at_peak_allocated,
        allocated_at_peak_reserved=alloc.allocated_at_peak_reserved,
        segment_allocations=[(e.at_malloc, e.size) for e in alloc.segment_log if e.action in ("alloc", "map")],
        segments_released=sum(e.action in ("free", "unmap") for e in alloc.segment_log),
        num_alloc_retries=alloc.num_alloc_retries, oom=oom_at is not None, oom_at_event=oom_at,
        final_reserved_bytes=alloc.reserved, final_allocated_bytes=alloc.allocated, allocations=allocations,
        reserved_by_stream_at_peak={s: b for s, b in alloc.reserved_by_stream_at_peak.items() if b},
        peak_requested_bytes=alloc.peak_requested, final_requested_bytes=alloc.requested)


@dataclasses.dataclass
class ReservedSummary:
    """simulate()'s answer as the fields a predicted Memory record carries, under the same names (bytes)."""

    peak_reserved_bytes: int
    allocator_peak_allocated_bytes: int
    reserved_at_peak_allocated_bytes: int
    fragmentation_at_peak_bytes: int
    segments_allocated: int
    allocator_settings: str  # the settings' PYTORCH_CUDA_ALLOC_CONF text ("default" for none)
    reserved_oom: bool
    reserved_method: str
    reserved_by_stream_at_peak: dict[int, int] = dataclasses.field(default_factory=dict)  # stream -> bytes


def reserved_summary(events: Iterable[TraceEvent | tuple], settings: AllocatorSettings | str | None = None,
                     capacity: int | None = None, memory_fraction: float | None = None,
                     placement: str = "ascending", tracked: Tracked | None = None) -> ReservedSummary:
    """simulate(), as the fields a (predicted) memory result carries. Bytes throughout.

    `allocator_peak_allocated_bytes` is what torch.cuda.max_memory_allocated() would report: block sizes, which
    include the remainders of 1 MiB or less that a large block keeps unsplit, so it can exceed the sum of the
    requests rounded to 512 B.

    tracked: the storage tracker's count behind the trace (account.py): AccountMismatch where the simulator's live
    requests do not reach its peak and final bytes (an OOM stops the simulation early: then not checked).
    """
    if not isinstance(settings, AllocatorSettings):
        settings = parse_alloc_conf(settings)
    r = simulate(events, settings, capacity, memory_fraction, placement)
    if tracked is not None and not r.oom:
        check(r.peak_requested_bytes, r.final_requested_bytes, tracked)
    return ReservedSummary(
        peak_reserved_bytes=r.peak_reserved_bytes, allocator_peak_allocated_bytes=r.peak_allocated_bytes,
        reserved_at_peak_allocated_bytes=r.reserved_at_peak_allocated,
        fragmentation_at_peak_bytes=r.fragmentation_at_peak_bytes, segments_allocated=len(r.segments),
        allocator_settings=settings.label(), reserved_oom=r.oom,
        reserved_method="simulated CUDA caching allocator (membench.allocator)" + (
            "; backend:cudaMallocAsync (CUDA's own pool) is not modelled: simulated as the native allocator"
            if settings.backend != "native" else ""),
        reserved_by_stream_at_peak=r.reserved_by_stream_at_peak)
