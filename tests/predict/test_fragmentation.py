"""Fragmentation named (predict/fragmentation.py): peak allocated fits, reserved does not; how much is
fragmentation, and whether expandable segments or max_split_size_mb make it fit."""

from __future__ import annotations

from types import SimpleNamespace

from membench.allocator import TraceEvent
from membench.allocator.account import RESET
from membench.allocator.settings import AllocatorSettings
from membench.predict import fragmentation
from membench.predict.run import predict
from membench.spec import Job, RunSpec

MiB = 2**20


def test_a_split_segment_pinned_by_a_live_block_is_named_and_expandable_segments_fit():
    """By hand, from c10's rules as the simulator follows them (50 MiB for the allocator):
    X (30 MiB) gets a 30 MiB segment (requests over 10 MiB: their size rounded up to 2 MiB) and is freed;
    x1 (10 MiB) splits that free block (the 20 MiB left is over 1 MiB), pinning the segment; Z (25 MiB) finds
    only the 20 MiB left, so it needs a 26 MiB segment: 56 MiB reserved, over 50, and the only cached block
    cannot be released (x1 lives in its segment): out of memory in the step, with x1's 10 MiB allocated.
    Peak allocated: x1's 10 MiB block + Z's 26 MiB (its 1 MiB remainder is not over 1 MiB: kept unsplit) = 36 MiB.
    With expandable_segments:True the 30 MiB maps two 20 MiB pages (40 MiB); x1 and Z (35 MiB) share them: it fits,
    reserving 40 MiB."""
    events = [TraceEvent.alloc("X", 30 * MiB), TraceEvent.free("X"), TraceEvent.alloc("x1", 10 * MiB), RESET,
              TraceEvent.alloc("Z", 25 * MiB)]
    memory = SimpleNamespace(allocator_peak_allocated_bytes=36 * MiB, peak_reserved_bytes=56 * MiB)
    f = fragmentation.named(events, AllocatorSettings(), 50 * MiB, memory, budget=False, placement="top-down")
    assert (f.peak_allocated_bytes, f.peak_reserved_bytes, f.fragmentation_bytes) == (36 * MiB, 56 * MiB, 20 * MiB)
    assert not f.oom_before_step and f.allocated_at_oom_bytes == 10 * MiB
    assert [(t.settings, t.peak_reserved_bytes, t.oom) for t in f.tried] == [("expandable_segments:True", 40 * MiB,
                                                                               False)]
    said = fragmentation.line("run", f)
    assert "20.00 MiB of it is fragmentation" in said and "expandable_segments:True makes it fit" in said
    # Where the step's allocated alone does not fit, or reserved fits, nothing is named.
    assert fragmentation.named(events, AllocatorSettings(), 30 * MiB, memory, False, "top-down") is None
    assert fragmentation.named(events, AllocatorSettings(), 60 * MiB, memory, False, "top-down") is None


def test_what_is_tried_is_what_the_run_does_not_set():
    tried = [s.label() for s in fragmentation.alternatives(AllocatorSettings())]
    assert tried == ["expandable_segments:True", "max_split_size_mb:512", "max_split_size_mb:128"]
    assert fragmentation.alternatives(AllocatorSettings(expandable_segments=True, max_split_size=64 * MiB)) == []


def test_a_small_model_under_a_small_budget_says_so_with_the_expandable_figure():
    """gpt-mini at batch 8 under --memory-budget 180MiB: the measured step's peak allocated is under the budget, its
    reserved memory over it (predicted unbounded), and the line names the difference as fragmentation and says
    what expandable segments reserve under the same budget."""
    budget = 180 * MiB
    record = predict(Job(RunSpec("gpt-mini", 8, (), device="cuda", gpu="H100", memory_budget=budget)))
    f = record.memory.fragmented
    assert record.memory.reserved_oom and f is not None
    assert f.peak_allocated_bytes <= budget < f.peak_reserved_bytes
    assert f.fragmentation_bytes == f.peak_reserved_bytes - f.peak_allocated_bytes
    assert f.tried[0].settings == "expandable_segments:True"
    lines = fragmentation.lines([record])
    assert any(line.startswith("FRAGMENTATION") for line in lines)
    assert any("of it is fragmentation" in line and "expandable_segments:True:" in line for line in lines)


def test_construction_that_overflows_is_named_before_the_step():
    """As the 70B shape under fsdp: construction holds more than the card (60 MiB at once against 50) and frees it
    before the measured step, whose own peak is 10 MiB. Unbounded, reserved stays at 60 MiB (the 60 MiB segment is
    cached, and the step's 10 MiB request splits it); under 50 MiB the first request already fails, before the
    step, with nothing allocated, and no allocator setting changes that (no setting makes 60 MiB fit in 50)."""
    events = [TraceEvent.alloc("model", 60 * MiB), TraceEvent.free("model"), RESET, TraceEvent.alloc("act", 10 * MiB)]
    memory = SimpleNamespace(allocator_peak_allocated_bytes=10 * MiB, peak_reserved_bytes=60 * MiB)
    f = fragmentation.named(events, AllocatorSettings(), 50 * MiB, memory, budget=False, placement="top-down")
    assert f.oom_before_step and f.allocated_at_oom_bytes == 0 and f.fragmentation_bytes == 50 * MiB
    assert [t.oom for t in f.tried] == [True, True, True]
    assert "runs out before the measured step" in fragmentation.line("fsdp", f)
    assert fragmentation.line("fsdp", f).endswith("no setting tried makes it fit")
