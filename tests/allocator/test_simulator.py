"""The caching-allocator simulator, rule by rule, on small traces whose outcome is worked out here by hand.

Each expected number is derived in the comments from the allocator's rules (c10/cuda/CUDACachingAllocator.cpp),
not copied from a run of the simulator. MiB = 2**20.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from membench.allocator import CachingAllocator, OutOfMemory, parse_alloc_conf, round_size, simulate
from membench.allocator.settings import AllocatorSettings, settings_from_snapshot
from membench.allocator.simulator import get_allocation_size
from membench.allocator.snapshot import initial_state, load_snapshot
from membench.common.errors import UserError

MiB = 2**20
ROOT = Path(__file__).resolve().parents[2]
SNAPSHOTS = ROOT.parent / "shared" / "cuda-snapshots"


def addresses(*bases):
    """A segment_address chooser that hands out the given addresses in order (the driver's choice, made ours)."""
    it = iter(bases)
    return lambda size: next(it)


# --- rounding and segment sizes ----------------------------------------------------------------------------------

def test_requests_round_up_to_512_byte_blocks():
    default = AllocatorSettings()
    assert round_size(1, default) == 512  # below the minimum block
    assert round_size(512, default) == 512
    assert round_size(513, default) == 1024
    assert round_size(3 * MiB + 1, default) == 3 * MiB + 512


def test_segment_sizes_small_2mib_medium_20mib_large_rounded_to_2mib():
    assert get_allocation_size(512) == 2 * MiB  # small pool: up to 1 MiB, in 2 MiB segments
    assert get_allocation_size(1 * MiB) == 2 * MiB
    assert get_allocation_size(1 * MiB + 512) == 20 * MiB  # 1-10 MiB share 20 MiB segments
    assert get_allocation_size(10 * MiB - 512) == 20 * MiB
    assert get_allocation_size(10 * MiB) == 10 * MiB  # 10 MiB and up: own segment, rounded to 2 MiB
    assert get_allocation_size(11 * MiB + 512) == 12 * MiB
    # through simulate: one request each, so each needs its own segment
    result = simulate([("alloc", 0, 1000), ("alloc", 1, 3 * MiB), ("alloc", 2, 10 * MiB - 1), ("alloc", 3, 11 * MiB)])
    # 1000 B -> a small 2 MiB segment. 3 MiB -> a 20 MiB segment, split (17 MiB left). 10 MiB - 1 rounds to
    # 10 MiB and fits the 17 MiB block (split, 7 MiB left): no new segment. 11 MiB fits nowhere: its own segment,
    # 11 MiB rounded up to 2 MiB = 12 MiB.
    assert result.segments == [2 * MiB, 20 * MiB, 12 * MiB]
    assert result.peak_reserved_bytes == 34 * MiB


def test_roundup_power2_divisions():
    four = parse_alloc_conf("roundup_power2_divisions:4")
    # 5 MiB + 1 lies in [4, 8) MiB, split in 4 divisions of 1 MiB: the next one is 6 MiB
    assert round_size(5 * MiB + 1, four) == 6 * MiB
    assert round_size(4 * MiB, four) == 4 * MiB  # a power of two stays
    assert round_size(1200, four) == 1536  # 1200 <= 512 * 4: the 512-byte rule applies
    two = parse_alloc_conf("roundup_power2_divisions:2")
    assert round_size(2100, two) == 3072  # [2048, 4096) in 2 divisions: 3072 (512-byte rounding: 2560)
    result = simulate([("alloc", "a", 5 * MiB + 1)], four)
    assert result.peak_allocated_bytes == 6 * MiB


# --- pools, best fit, splitting, coalescing ---------------------------------------------------------------------

def test_small_and_large_pools_do_not_share_segments():
    # 1 MiB is small (2 MiB segment, 1 MiB left); a 1 MiB + 512 request is large and cannot use that remainder
    result = simulate([("alloc", "s", MiB), ("alloc", "l", MiB + 512)])
    assert result.segments == [2 * MiB, 20 * MiB]


def test_best_fit_is_smallest_size_then_lowest_address():
    lo, mid, hi = 0x10000000, 0x20000000, 0x30000000
    alloc = CachingAllocator(segment_address=addresses(hi, mid, lo))
    # three segments of exactly their request (>= 10 MiB, multiples of 2 MiB): 12 MiB at hi, 14 at mid, 12 at lo
    blocks = [alloc.malloc(12 * MiB), alloc.malloc(14 * MiB), alloc.malloc(12 * MiB)]
    assert [b.ptr for b in blocks] == [hi, mid, lo]
    for b in blocks:
        alloc.free(b)
    # 11 MiB fits all three; the smallest are the two 12 MiB ones, and of those the lower address wins (not the
    # one cached first). 1 MiB would remain: not more than 1 MiB, so the block is not split.
    block = alloc.malloc(11 * MiB)
    assert (block.ptr, block.size) == (lo, 12 * MiB)


def test_large_pool_splits_only_remainders_above_1mib():
    # 2 MiB opens a 20 MiB segment and splits (18 MiB left); 17 MiB then takes the 18 MiB block whole (1 MiB left
    # is not > 1 MiB): 2 + 18 = 20 MiB allocated.
    whole = simulate([("alloc", "a", 2 * MiB), ("alloc", "b", 17 * MiB)])
    assert whole.segments == [20 * MiB] and whole.peak_allocated_bytes == 20 * MiB
    # 16 MiB leaves 2 MiB (> 1 MiB): split, 18 MiB allocated; a further 2 MiB request fits the remainder.
    split = simulate([("alloc", "a", 2 * MiB), ("alloc", "b", 16 * MiB), ("alloc", "c", 2 * MiB)])
    assert split.segments == [20 * MiB] and split.peak_allocated_bytes == 20 * MiB
    assert split.allocated_at_peak_reserved == 2 * MiB  # reserved peaked with the first request


def test_small_pool_splits_any_remainder_of_512_bytes():
    # 1 MiB in a 2 MiB segment leaves 1 MiB; 1 MiB - 512 leaves 512 B, split off; a 512 B request takes it.
    result = simulate([("alloc", 0, MiB), ("alloc", 1, MiB - 512), ("alloc", 2, 512)])
    assert result.segments == [2 * MiB]
    assert result.peak_allocated_bytes == 2 * MiB


def test_free_neighbours_coalesce():
    # 8 + 8 MiB in one 20 MiB segment (4 MiB left at its end). Freed, the three pieces merge into 20 MiB again,
    # which a 19 MiB request takes whole (1 MiB left, no split): no second segment.
    for order in (("a", "b"), ("b", "a")):
        events = [("alloc", "a", 8 * MiB), ("alloc", "b", 8 * MiB), *[("free", k) for k in order],
                  ("alloc", "c", 19 * MiB)]
        result = simulate(events)
        assert result.segments == [20 * MiB], order
        assert result.final_allocated_bytes == 20 * MiB
    # and a merged, whole segment can be released by empty_cache
    result = simulate([("alloc", "a", 8 * MiB), ("alloc", "b", 8 * MiB), ("free", "b"), ("free", "a"),
                       ("empty_cache",)])
    assert result.final_reserved_bytes == 0 and result.segments_released == 1


# --- settings ------------------------------------------------------------------------------------------------------

def test_max_split_size_keeps_oversize_blocks_for_oversize_requests():
    # Default: a cached 50 MiB segment serves a 12 MiB request (split, 38 MiB left): one segment.
    events = [("alloc", "a", 50 * MiB), ("free", "a"), ("alloc", "b", 12 * MiB)]
    assert simulate(events).segments == [50 * MiB]
    # max_split_size_mb:40: 50 MiB is oversize, 12 MiB is not -> not served from it: a new 12 MiB segment.
    assert simulate(events, "max_split_size_mb:40").segments == [50 * MiB, 12 * MiB]
    # an oversize request takes an oversize block whole (no split) when it wastes less than 20 MiB ...
    reuse = simulate([("alloc", "a", 50 * MiB), ("free", "a"), ("alloc", "b", 45 * MiB)], "max_split_size_mb:40")
    assert reuse.segments == [50 * MiB] and reuse.peak_allocated_bytes == 50 * MiB
    # ... and not when the block is 20 MiB (max_non_split_rounding) or more above it: 70 >= 45 + 20
    far = simulate([("alloc", "a", 70 * MiB), ("free", "a"), ("alloc", "b", 45 * MiB)], "max_split_size_mb:40")
    assert far.segments == [70 * MiB, 46 * MiB]  # 45 MiB rounds up to 46 MiB (2 MiB)


def test_max_split_size_releases_oversize_cached_blocks_when_capacity_is_short():
    # capacity 70 MiB: 50 MiB cached + a new 30 MiB segment = 80 > 70 fails; with max_split_size the allocator
    # first frees an oversize cached block of at least max(30, 40) MiB (the 50 MiB one) and retries: it fits.
    events = [("alloc", "a", 50 * MiB), ("free", "a"), ("alloc", "b", 30 * MiB)]
    result = simulate(events, "max_split_size_mb:40", capacity=70 * MiB)
    assert result.segments == [50 * MiB, 30 * MiB] and result.segments_released == 1
    assert result.final_reserved_bytes == 30 * MiB and not result.oom
    assert result.num_alloc_retries == 0  # the counted retry is the last, empty-everything one


def test_capacity_empties_the_cache_then_retries_then_ooms():
    # capacity 60 MiB: 40 + 12 MiB segments; the 40 MiB is freed and cached. 44 MiB does not fit in it and
    # 52 + 44 > 60: the allocator frees every whole cached segment (the 40 MiB) and retries: 12 + 44 = 56 fits.
    events = [("alloc", "a", 40 * MiB), ("alloc", "b", 12 * MiB), ("free", "a"), ("alloc", "c", 44 * MiB)]
    result = simulate(events, capacity=60 * MiB)
    assert result.segments == [40 * MiB, 12 * MiB, 44 * MiB]
    assert result.num_alloc_retries == 1 and result.segments_released == 1 and not result.oom
    assert result.peak_reserved_bytes == 56 * MiB
    # Without a capacity nothing is released: 40 + 12 + 44 = 96 MiB.
    assert simulate(events).peak_reserved_bytes == 96 * MiB
    # 10 MiB more: 56 + 10 > 60 and nothing cached is free: out of memory at that event.
    oom = simulate([*events, ("alloc", "d", 10 * MiB), ("free", "b")], capacity=60 * MiB)
    assert oom.oom and oom.oom_at_event == 4 and oom.num_alloc_retries == 2
    with pytest.raises(OutOfMemory):
        alloc = CachingAllocator(capacity=10 * MiB)
        alloc.malloc(12 * MiB)


def test_garbage_collection_frees_the_oldest_cached_segments_above_the_threshold():
    # capacity 100 MiB, threshold 0.5: collect when reserved > 50 MiB. Large-pool lookups tick a clock.
    # A(30) tick 1, B(30) tick 2; free B (age base 2), free A (base 2); A'(30) tick 3 reuses A (lower address,
    # exact fit); free A' (base 3). C(34) tick 4 finds no block: reserved 60 > 50, ages B 2, A 1, average 1.5:
    # only B is at least that old -> released (30 >= the 10 MiB over). Then a new 34 MiB segment: 30 + 34.
    events = [("alloc", "A", 30 * MiB), ("alloc", "B", 30 * MiB), ("free", "B"), ("free", "A"),
              ("alloc", "A2", 30 * MiB), ("free", "A2"), ("alloc", "C", 34 * MiB)]
    gc = dict(capacity=100 * MiB, memory_fraction=1.0)
    result = simulate(events, "garbage_collection_threshold:0.5", **gc)
    assert result.segments == [30 * MiB, 30 * MiB, 34 * MiB] and result.segments_released == 1
    assert result.final_reserved_bytes == 64 * MiB
    # Blocks as old as the average are collected too: A and B both freed at tick 2, C at tick 3: ages 1 and 1,
    # average 1 -> both go, and the collection does not stop at the 10 MiB it needed.
    same_age = [("alloc", "A", 30 * MiB), ("alloc", "B", 30 * MiB), ("free", "A"), ("free", "B"),
                ("alloc", "C", 34 * MiB)]
    result = simulate(same_age, "garbage_collection_threshold:0.5", **gc)
    assert result.segments_released == 2 and result.final_reserved_bytes == 34 * MiB
    # Without it nothing is freed; nor without a memory fraction: PyTorch collects only under one
    # (torch.cuda.set_per_process_memory_fraction), whatever the device's size.
    assert simulate(events, **gc).final_reserved_bytes == 94 * MiB
    assert simulate(events, "garbage_collection_threshold:0.5", capacity=100 * MiB).final_reserved_bytes == 94 * MiB
    # The threshold is a share of the allowed memory: fraction 0.8 of 100 MiB allows 80, collect above 40 MiB.
    # Then at C: reserved 60 > 40 (target 20): B (age 2 >= 1.5) goes, 30 MiB; 30 + 34 = 64 <= 80 fits.
    frac = simulate(events, "garbage_collection_threshold:0.5", capacity=100 * MiB, memory_fraction=0.8)
    assert frac.final_reserved_bytes == 64 * MiB


def test_memory_fraction_limits_reserved_memory():
    # 0.5 of 100 MiB: 50 MiB allowed. 30 MiB fits; another 30 MiB would make 60: nothing cached to release: OOM.
    result = simulate([("alloc", "a", 30 * MiB), ("alloc", "b", 30 * MiB)], capacity=100 * MiB, memory_fraction=0.5)
    assert result.oom and result.oom_at_event == 1 and result.peak_reserved_bytes == 30 * MiB
    assert not simulate([("alloc", "a", 30 * MiB), ("alloc", "b", 30 * MiB)], capacity=100 * MiB).oom
    with pytest.raises(ValueError, match="needs a capacity"):
        simulate([], memory_fraction=0.5)


def test_expandable_segments_grow_one_segment_by_pages():
    # Default: 5 MiB -> 20 MiB segment (15 MiB left), 30 MiB -> its own 30 MiB segment: 50 MiB reserved.
    events = [("alloc", "a", 5 * MiB), ("alloc", "b", 30 * MiB)]
    assert simulate(events).peak_reserved_bytes == 50 * MiB
    # Expandable: one segment mapped in 20 MiB pages. 5 MiB maps one page (15 MiB free after it); 30 MiB uses
    # those 15 MiB plus one more page (15 + 20 >= 30): 40 MiB reserved, 5 MiB of it free.
    result = simulate(events, "expandable_segments:True")
    assert result.segments == [20 * MiB, 20 * MiB] and result.peak_reserved_bytes == 40 * MiB
    assert result.fragmentation_at_peak_bytes == 5 * MiB
    # Freed and emptied, every page is unmapped again.
    emptied = simulate([*events, ("free", "a"), ("free", "b"), ("empty_cache",)], "expandable_segments:True")
    assert emptied.final_reserved_bytes == 0
    # Small requests map 2 MiB pages of their own segment.
    assert simulate([("alloc", "s", 1000)], "expandable_segments:True").segments == [2 * MiB]


def test_expandable_segments_split_any_remainder():
    # With expandable segments the large pool also splits remainders of >= 512 B: 14.5 MiB in the 15 MiB left
    # after 5 MiB leaves 0.5 MiB, split off -> 19.5 MiB allocated (without expandable: not split, 20 MiB).
    events = [("alloc", "a", 5 * MiB), ("alloc", "b", 14 * MiB + 512 * 1024)]
    assert simulate(events, "expandable_segments:True").peak_allocated_bytes == 19 * MiB + 512 * 1024
    assert simulate(events).peak_allocated_bytes == 20 * MiB


def test_empty_cache_releases_only_whole_free_segments():
    # a (2 MiB) keeps its 20 MiB segment in use (18 MiB free in it); b (30 MiB) does not fit there and gets a
    # segment of its own, whole and free once b is freed: only that one goes.
    result = simulate([("alloc", "a", 2 * MiB), ("alloc", "b", 30 * MiB), ("free", "b"), ("empty_cache",)])
    assert result.final_reserved_bytes == 20 * MiB and result.segments_released == 1
    # a free block that is part of a segment still in use stays cached
    result = simulate([("alloc", "x", 1000), ("alloc", "y", 1000), ("free", "x"), ("empty_cache",)])
    assert result.final_reserved_bytes == 2 * MiB and result.segments_released == 0


# --- where new segments lie: the driver's address-ordered first fit (docs/predict.md) -----------------------------

def test_new_segments_go_to_the_lowest_released_range_that_holds_them():
    alloc = CachingAllocator()
    # a and b (20 MiB each, >= 10 MiB: a segment of their own) and c (12 MiB) lie one after another
    a, b, c = alloc.malloc(20 * MiB), alloc.malloc(20 * MiB), alloc.malloc(12 * MiB)
    base = a.ptr
    assert (b.ptr, c.ptr) == (base + 20 * MiB, base + 40 * MiB)
    alloc.free(a)
    alloc.free(b)
    alloc.empty_cache()  # a's and b's segments go back: [base, base + 40 MiB) is free again, one range
    # d (36 MiB) fits neither 20 MiB segment's range alone, but the two together: it lies at base
    d = alloc.malloc(36 * MiB)
    assert d.ptr == base
    # e (20 MiB) does not fit the 4 MiB left at base + 36 MiB: after the end of the used space (c's end)
    e = alloc.malloc(20 * MiB)
    assert e.ptr == base + 52 * MiB
    # 1 MiB requests take 2 MiB small segments, two requests each: the first two segments fill the 4 MiB left
    # below c (as the traces' 2 MiB segments filled what 20 MiB ones left), the third goes after e.
    small = [alloc.malloc(MiB) for _ in range(6)]
    assert [s.ptr for s in small] == [base + 36 * MiB, base + 37 * MiB, base + 38 * MiB, base + 39 * MiB,
                                      base + 72 * MiB, base + 73 * MiB]


def test_a_chosen_address_inside_a_released_range_is_taken_out_of_it():
    chosen = iter([None, None, 2**40 + 4 * MiB])  # the third segment: at base + 4 MiB (a recorded address)
    alloc = CachingAllocator(segment_address=lambda size: next(chosen, None))
    a, b = alloc.malloc(20 * MiB), alloc.malloc(12 * MiB)  # base, base + 20 MiB
    base = a.ptr
    assert base == 2**40 and b.ptr == base + 20 * MiB
    alloc.free(a)
    alloc.empty_cache()  # [base, base + 20 MiB) is free again
    c = alloc.malloc(12 * MiB)  # at the chosen base + 4 MiB: [base, +4) and [base + 16, +20) stay free
    assert c.ptr == base + 4 * MiB
    # 1 MiB requests, two to a 2 MiB small segment: segments at base, base + 2, base + 16, base + 18 MiB, then
    # after b's end (base + 32 MiB)
    small = [alloc.malloc(MiB).ptr for _ in range(10)][::2]
    assert small == [base, base + 2 * MiB, base + 16 * MiB, base + 18 * MiB, base + 32 * MiB]


def test_released_range_reused_first_decides_which_equal_block_is_taken():
    """The address order decides between equal-size free blocks; here it decides what empty_cache can release."""
    alloc = CachingAllocator()
    r = alloc.malloc(20 * MiB)  # R: [base, base + 20 MiB)
    base = r.ptr
    h = alloc.malloc(12 * MiB)  # H: base + 20 MiB, kept to the end
    y = alloc.malloc(12 * MiB)  # Y: base + 32 MiB, a whole 12 MiB segment
    alloc.free(r)
    alloc.empty_cache()  # R goes back: [base, base + 20 MiB) is free
    # x1 (8 MiB: a 20 MiB segment X) reuses R's range at base; it is split, leaving a 12 MiB block at base + 8 MiB,
    # which x2 (12 MiB) takes whole.
    x1 = alloc.malloc(8 * MiB)
    x2 = alloc.malloc(12 * MiB)
    assert (x1.ptr, x2.ptr, h.ptr, y.ptr) == (base, base + 8 * MiB, base + 20 * MiB, base + 32 * MiB)
    alloc.free(x2)
    alloc.free(y)
    # Two free 12 MiB blocks: X's piece at base + 8 MiB and Y at base + 32 MiB. Best fit takes the lower address,
    # X's piece; Y, whole and free, is released by empty_cache: H 12 + X 20 = 32 MiB stay reserved.
    # (Were X laid after Y, at base + 44 MiB, z would take Y and empty_cache release nothing: 44 MiB.)
    z = alloc.malloc(12 * MiB)
    assert z.ptr == base + 8 * MiB
    alloc.empty_cache()
    assert alloc.reserved == 32 * MiB and sorted(alloc.live_segments) == [base, base + 20 * MiB]


def test_top_down_placement_takes_the_newest_of_equal_free_blocks():
    """Where the driver puts new segments decides which of two equal free blocks best fit takes, and so whether a
    later request finds a whole block (gpt-small's missing 1.65 GB segment on the H200, in miniature)."""
    trace = [("alloc", "a", 40 * MiB),  # S1, a 40 MiB segment of its own (>= 10 MiB, a multiple of 2 MiB)
             ("alloc", "b", 60 * MiB),  # S2, 60 MiB
             ("free", "b"),
             ("alloc", "d", 20 * MiB),  # the only free block is S2's 60: split, d at its start, 40 MiB left after
             ("free", "a"),             # two free 40 MiB blocks: S1 whole, and S2's remainder at S2 + 20 MiB
             ("alloc", "e", 40 * MiB),  # equal sizes: the lower address wins (exact fit: no split)
             ("free", "d"),
             ("alloc", "f", 60 * MiB)]
    # Ascending: S1 lies below S2, so e takes S1; freeing d merges it with S2's free remainder into 60 MiB, which f
    # takes: 40 + 60 = 100 MiB reserved.
    # Top-down: S2 lies below S1 (S2 = S1 - 60 MiB, its remainder at S1 - 40 MiB), so e takes S2's remainder; d
    # freed is a 20 MiB block before e, S1's 40 MiB is free, and no block holds 60 MiB: a third segment,
    # 40 + 60 + 60 = 160 MiB.
    assert simulate(trace).peak_reserved_bytes == 100 * MiB
    assert simulate(trace, placement="top-down").peak_reserved_bytes == 160 * MiB
    alloc = CachingAllocator(placement="top-down")
    first, second, third = alloc.malloc(40 * MiB), alloc.malloc(60 * MiB), alloc.malloc(12 * MiB)
    # each below the one before, by its size in 2 MiB granules
    assert (first.ptr - second.ptr, second.ptr - third.ptr) == (60 * MiB, 12 * MiB)
    with pytest.raises(ValueError, match="placement"):
        CachingAllocator(placement="sideways")


def test_reserved_summary_for_a_predicted_result():
    from membench.allocator import reserved_summary, settings_from_env

    # 17 MiB after 2 MiB takes the rest of the 20 MiB segment whole: the allocator counts 20 MiB allocated, more
    # than the 19 MiB the requests round to; reserved 20 MiB, nothing free at the peak.
    events = [("alloc", "a", 2 * MiB), ("alloc", "b", 17 * MiB)]
    summary = reserved_summary(events, settings_from_env({}))
    assert summary.peak_reserved_bytes == 20 * MiB and summary.allocator_peak_allocated_bytes == 20 * MiB
    assert summary.fragmentation_at_peak_bytes == 18 * MiB  # reserved peaked with a, 2 MiB allocated
    assert summary.allocator_settings == "default" and summary.segments_allocated == 1
    # the expandable-segments technique's environment: one 20 MiB page covers both as well
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    summary = reserved_summary(events, settings_from_env(env))
    assert summary.allocator_settings == "expandable_segments:True"
    assert summary.peak_reserved_bytes == 20 * MiB and summary.allocator_peak_allocated_bytes == 19 * MiB


def test_simulate_rejects_malformed_events():
    with pytest.raises(ValueError, match="not allocated"):
        simulate([("free", "nope")])
    with pytest.raises(ValueError, match="allocated twice"):
        simulate([("alloc", 1, 10), ("alloc", 1, 10)])
    with pytest.raises(ValueError, match="expected"):
        simulate([("malloc", 1, 10)])


def test_twenty_thousand_events_of_a_training_like_pattern_balance():
    """A training-like pattern: 100 live activations of varied sizes, freed and reallocated in waves. Every block
    is at least its request rounded to 512 B (round_size), so the peak allocated is at least the largest live sum
    of those; once everything is freed and the cache emptied, nothing is allocated or reserved."""
    events, live = [], []
    for i in range(10_000):
        if len(live) >= 100:
            events.append(("free", live.pop(i * 7919 % len(live))))
        size = (i * 2654435761) % (64 * MiB) + 1
        events.append(("alloc", i, size))
        live.append(i)
    events = events[:20_000]
    sizes, held, most = {}, 0, 0
    for event in events:
        if event[0] == "alloc":
            sizes[event[1]] = -(-event[2] // 512) * 512
            held += sizes[event[1]]
            most = max(most, held)
        else:
            held -= sizes.pop(event[1])
    result = simulate([*events, *(("free", key) for key in sizes), ("empty_cache",)])
    assert result.allocations == sum(e[0] == "alloc" for e in events) == 10_000
    assert result.peak_allocated_bytes >= most and not result.oom
    assert result.final_allocated_bytes == 0 and result.final_reserved_bytes == 0


# --- the settings parser ------------------------------------------------------------------------------------------

def test_parse_alloc_conf():
    s = parse_alloc_conf(" expandable_segments:True, max_split_size_mb:128 ,garbage_collection_threshold:0.6")
    assert s.expandable_segments and s.max_split_size == 128 * MiB and s.garbage_collection_threshold == 0.6
    assert parse_alloc_conf("") == AllocatorSettings()
    assert parse_alloc_conf("backend:native,pinned_use_cuda_host_register:True").max_split_size is None
    assert parse_alloc_conf("max_non_split_rounding_mb:64").max_non_split_rounding == 64 * MiB
    # list form: the first entry also covers every smaller interval (index = log2 of the size in MiB); '>' sets
    # every interval after the entry before it (c10's parseRoundUpPower2Divisions, torch >= 2.8: last_index + 1)
    d = parse_alloc_conf("roundup_power2_divisions:[64:8,256:4,>:2]").roundup_power2_divisions
    assert d == (8,) * 7 + (0, 4) + (2,) * 7
    assert parse_alloc_conf("roundup_power2_divisions:2").roundup_power2_divisions == (2,) * 16


@pytest.mark.parametrize("text,message", [
    ("foo:1", "unknown option 'foo'"),
    ("max_split_size_mb:10", "must be >= 20"),
    ("max_split_size_mb:lots", "must be a whole number"),
    ("garbage_collection_threshold:1.5", "between 0.0 and 1.0"),
    ("expandable_segments:yes", "takes True or False"),
    ("roundup_power2_divisions:3", "power of 2"),
    ("roundup_power2_divisions:[100:2]", "powers of 2"),
    ("roundup_power2_divisions:[64:2", "no closing"),
    ("backend:cudaMalloc", "native or cudaMallocAsync"),
    ("max_split_size_mb:64:128", "expected ','"),
    ("expandable_segments", "expected ':'"),
])
def test_bad_alloc_conf_is_one_clear_error(text, message):
    with pytest.raises(UserError, match=message):
        parse_alloc_conf(text)


def test_settings_recorded_in_a_snapshot():
    recorded = {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1, "garbage_collection_threshold": 0.0,
                "expandable_segments": False, "roundup_power2_divisions": {str(2**k): 0 for k in range(16)}}
    assert settings_from_snapshot(recorded) == AllocatorSettings()
    assert settings_from_snapshot({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"}).max_split_size == 64 * MiB
    assert settings_from_snapshot(None) == AllocatorSettings()
    # settings known only from the parsed fields are labelled in PYTORCH_CUDA_ALLOC_CONF syntax, which reads back
    fields = dict(recorded, max_split_size=256 * MiB, expandable_segments=True,
                  roundup_power2_divisions={**recorded["roundup_power2_divisions"], "64": 4})
    settings = settings_from_snapshot(fields)
    again = parse_alloc_conf(settings.label())
    assert dataclasses.replace(again, text="") == settings and settings.max_split_size == 256 * MiB
    assert again.roundup_power2_divisions[6] == 4 and sum(again.roundup_power2_divisions) == 4


# --- snapshots: safe loading, the backwards rebuild, replay ------------------------------------------------------

S1, S2 = 0x7F0000000000, 0x7F0004000000


def hand_made_snapshot() -> dict:
    """A snapshot whose ring buffer dropped the start: block X (4 MiB at S1) was allocated before the trace.

    Forward, from the state before the first event (S1: 20 MiB segment, X in use at its start, 16 MiB free):
      alloc Y 8 MiB   -> best fit: the 16 MiB free block at S1 + 4 MiB; 8 MiB left (> 1 MiB): split
      alloc Z 12 MiB  -> no free block of 12 MiB: a new 12 MiB segment S2 (reserved 20 -> 32 MiB, the peak)
      free X          -> S1 + 0: a 4 MiB free block (Y in use after it)
      alloc W 3 MiB   -> free blocks: 4 MiB at S1, 8 MiB at S1 + 12 MiB; best fit the 4 MiB one; 1 MiB left:
                         not split, so W's block is 4 MiB at S1
      free Z; empty_cache -> S2 is whole and free: released (reserved 20 MiB)
    """
    def ev(action, addr, size):
        return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": []}

    trace = [ev("alloc", S1 + 4 * MiB, 8 * MiB), ev("segment_alloc", S2, 12 * MiB), ev("alloc", S2, 12 * MiB),
             ev("free_requested", S1, 4 * MiB), ev("free_completed", S1, 4 * MiB), ev("alloc", S1, 3 * MiB),
             ev("free_requested", S2, 12 * MiB), ev("free_completed", S2, 12 * MiB),
             ev("segment_free", S2, 12 * MiB), {"action": "snapshot", "addr": 0, "size": 0, "stream": 0}]
    blocks = [{"address": S1, "size": 4 * MiB, "requested_size": 3 * MiB, "state": "active_allocated", "frames": []},
              {"address": S1 + 4 * MiB, "size": 8 * MiB, "requested_size": 8 * MiB, "state": "active_allocated",
               "frames": []},
              {"address": S1 + 12 * MiB, "size": 8 * MiB, "requested_size": 0, "state": "inactive", "frames": []}]
    segment = {"device": 0, "address": S1, "total_size": 20 * MiB, "allocated_size": 12 * MiB,
               "active_size": 12 * MiB, "requested_size": 11 * MiB, "stream": 0, "segment_type": "large",
               "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks}
    return {"segments": [segment], "device_traces": [trace]}


@pytest.fixture
def snapshot_file(tmp_path):
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(hand_made_snapshot()))
    return path


def test_state_is_rebuilt_backwards_from_the_final_segments(snapshot_file):
    trace = initial_state(load_snapshot(snapshot_file))
    assert len(trace.segments) == 1  # S2 was allocated and freed inside the trace
    seg = trace.segments[0]
    assert (seg.address, seg.size, seg.is_small) == (S1, 20 * MiB, False)
    # only X was in use: known from its free (4 MiB requested); 16 MiB free after it (> 1 MiB): its own block
    assert seg.allocated == [(S1, 4 * MiB, 4 * MiB)]
    assert trace.guessed_sizes == 1


def test_blocks_described_by_booleans_as_torch_2_0_did(tmp_path):
    snap = hand_made_snapshot()
    for b in snap["segments"][0]["blocks"]:
        in_use = b.pop("state") != "inactive"
        b.update(allocated=in_use, active=in_use)
    path = tmp_path / "old.pickle"
    path.write_bytes(pickle.dumps(snap))
    assert initial_state(load_snapshot(path)).segments[0].allocated == [(S1, 4 * MiB, 4 * MiB)]


def test_a_block_size_is_inferred_from_a_small_gap(tmp_path):
    # Final state: a 20 MiB segment wholly free. Trace: free_completed of a 19.5 MiB request at its start. So the
    # block was allocated before the trace; after its rounded 19.5 MiB, 0.5 MiB to the segment's end: a large-pool
    # free block is never that small, so it was part of the block (taken whole when 0.5 MiB was left).
    snap = {"segments": [{"device": 0, "address": S1, "total_size": 20 * MiB, "stream": 0, "segment_type": "large",
                          "blocks": [{"address": S1, "size": 20 * MiB, "requested_size": 0, "state": "inactive"}]}],
            "device_traces": [[{"action": "free_completed", "addr": S1, "size": 19 * MiB + MiB // 2, "stream": 0}]]}
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(snap))
    trace = initial_state(load_snapshot(path))
    assert trace.segments[0].allocated == [(S1, 20 * MiB, 19 * MiB + MiB // 2)]


def test_replay_of_a_hand_made_snapshot_is_exact(snapshot_file):
    from membench.allocator.replay import report

    r = report(snapshot_file, ["expandable_segments:True"])
    assert r.actual.peak_reserved_bytes == 32 * MiB  # 20 + 12 MiB, from the docstring's walk
    assert r.simulated.peak_reserved_bytes == 32 * MiB
    assert r.simulated.exact and r.simulated.segment_allocations_matched == 1
    assert r.simulated.allocations_at_recorded_address == 3  # Y, Z and W where the trace put them
    assert r.simulated.peak_allocated_bytes == 4 * MiB + 8 * MiB + 12 * MiB
    # What if expandable? S1 stays as it was (a cudaMalloc segment); Y splits it as before; Z (12 MiB) finds
    # 8 MiB free there, too small: a new expandable segment maps one 20 MiB page -> 40 MiB reserved at the peak.
    assert r.what_if[0].peak_reserved_bytes == 40 * MiB
    assert r.what_if[0].saved_bytes == -8 * MiB


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "membench", "replay", *map(str, args)], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


def test_replay_cli_json(snapshot_file):
    proc = run_cli(snapshot_file, "--json", "--alloc-conf", "expandable_segments:True", "--capacity", "1GiB")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["actual"]["peak_reserved_bytes"] == out["simulated"]["peak_reserved_bytes"] == 32 * MiB
    assert out["capacity_bytes"] == 2**30 and out["what_if"][0]["settings"] == "expandable_segments:True"


def test_replay_cli_table(snapshot_file):
    proc = run_cli(snapshot_file, "--alloc-conf", "max_split_size_mb:64")
    assert proc.returncode == 0, proc.stderr
    assert "exact" in proc.stdout and "33554432 B" in proc.stdout and "max_split_size_mb:64" in proc.stdout


@pytest.mark.parametrize("content,message", [
    (b"hello, not a pickle", "is not a CUDA memory snapshot"),
    (pickle.dumps({"a": 1}), "expected a dict with 'segments' and 'device_traces'"),
    (pickle.dumps([1, 2, 3]), "got list"),
])
def test_replay_cli_not_a_snapshot_is_one_line_and_exit_2(tmp_path, content, message):
    path = tmp_path / "x.pickle"
    path.write_bytes(content)
    proc = run_cli(path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr


def test_replay_cli_memory_fraction_needs_a_capacity(snapshot_file):
    proc = run_cli(snapshot_file, "--memory-fraction", "0.5")
    assert proc.returncode == 2 and "needs --capacity" in proc.stderr and len(proc.stderr.splitlines()) == 1
    proc = run_cli(snapshot_file, "--memory-fraction", "0.5", "--capacity", "64MiB", "--json")
    # 0.5 of 64 MiB allows 32 MiB, exactly the trace's peak (20 + 12 MiB): it still fits
    assert proc.returncode == 0 and not json.loads(proc.stdout)["simulated"]["oom"]


def test_replay_cli_bad_settings_and_missing_file(snapshot_file, tmp_path):
    proc = run_cli(snapshot_file, "--alloc-conf", "max_split_size_mb:5")
    assert proc.returncode == 2 and "must be >= 20" in proc.stderr and len(proc.stderr.splitlines()) == 1
    proc = run_cli(tmp_path / "missing.pickle")
    assert proc.returncode == 2 and "does not exist" in proc.stderr


class _RunsCode:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        # unpickling this with pickle.load would create the file
        return (Path.touch, (self.path,))


def test_a_malicious_pickle_is_refused_not_run(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [], "x": _RunsCode(marker)}))
    with pytest.raises(UserError, match="refused without running it"):
        load_snapshot(path)
    assert not marker.exists()
    proc = run_cli(path)
    assert proc.returncode == 2 and "refused" in proc.stderr and not marker.exists()
    # any class at all is refused, harmless or not
    import collections
    path.write_bytes(pickle.dumps(collections.OrderedDict(segments=[], device_traces=[])))
    with pytest.raises(UserError, match="collections.OrderedDict"):
        load_snapshot(path)


def test_a_trace_that_contradicts_the_final_state_is_a_clear_error(tmp_path):
    snap = hand_made_snapshot()
    snap["device_traces"][0].insert(0, {"action": "alloc", "addr": S1 + 18 * MiB, "size": MiB, "stream": 0})
    path = tmp_path / "bad.pickle"
    path.write_bytes(pickle.dumps(snap))
    with pytest.raises(UserError, match="does not agree with the snapshot's final state"):
        initial_state(load_snapshot(path))


# --- the real snapshots (development data beside the repository; skipped without it) ----------------------------

@pytest.mark.skipif(not SNAPSHOTS.is_dir(), reason=f"no real snapshots at {SNAPSHOTS} (development data)")
def test_validation_on_real_snapshots_is_exact():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "validate_allocator.py"), str(SNAPSHOTS)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "NO" not in proc.stdout.replace("NOT", "")


def test_validation_script_without_the_data_checks_nothing_and_says_so_with_exit_3(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "validate_allocator.py"), str(tmp_path / "no")],
                          capture_output=True, text=True, timeout=120)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert proc.returncode == 3 and len(lines) == 1 and lines[0].startswith("validate_allocator: no snapshots at")
    assert "nothing checked, exit 3" in lines[0]


# --- invariants under random traces (seeded; no outcome is asserted here, only that the state stays sound) ---------

def check_invariants(alloc: CachingAllocator, live: list) -> None:
    """Segments are contiguous chains of blocks; free neighbours are merged; pools and counters agree."""
    pooled = [b for pool in (alloc.small, alloc.large) for b in (*pool.blocks.values(), *pool.unmapped.values())]
    for pool in (alloc.small, alloc.large):
        assert pool.keys == sorted(pool.blocks) and len(pool.keys) == len(pool.blocks)
        for (stream, size, ptr), b in pool.blocks.items():
            assert (b.stream, b.size, b.ptr) == (stream, size, ptr) and b.mapped and not b.allocated
            assert b.pool is pool
    heads = {}
    for b in [*pooled, *live]:
        while b.prev is not None:
            b = b.prev
        heads[id(b)] = b
    reserved = allocated = 0
    for head in heads.values():
        b, chain = head, 0
        while b is not None:
            assert b.size > 0
            if b.next is not None:
                assert b.ptr + b.size == b.next.ptr and b.next.prev is b
                # the coalescing invariant: two free neighbours in the same (mapped) state never both exist
                assert b.allocated or b.next.allocated or b.mapped != b.next.mapped, (b, b.next)
            if b.mapped:
                reserved += b.size
            allocated += b.size if b.allocated else 0
            chain += b.size
            b = b.next
        if head.segment is None:
            assert alloc.live_segments[head.ptr] == chain
    assert reserved == alloc.reserved and allocated == alloc.allocated
    assert len([h for h in heads.values() if h.segment is None]) == len(alloc.live_segments)


@pytest.mark.parametrize("conf,capacity,fraction", [
    ("", None, None), ("expandable_segments:True", None, None), ("max_split_size_mb:40", None, None),
    ("roundup_power2_divisions:[1:4,64:8,>:2]", None, None), ("", 600 * MiB, None),
    ("max_split_size_mb:40,garbage_collection_threshold:0.5", 600 * MiB, 0.8),
    ("expandable_segments:True", 600 * MiB, None),
])
def test_random_traces_keep_the_allocator_state_sound(conf, capacity, fraction):
    import random

    rng = random.Random(13)
    alloc = CachingAllocator(parse_alloc_conf(conf), capacity, memory_fraction=fraction)
    live = []
    for step in range(3000):
        r = rng.random()
        if r < 0.45 or not live:
            size = rng.choice([rng.randint(1, 4096), rng.randint(1, MiB), rng.randint(MiB, 12 * MiB),
                               rng.randint(10 * MiB, 90 * MiB)])
            try:
                live.append(alloc.malloc(size))
            except OutOfMemory:
                pass
        elif r < 0.98:
            alloc.free(live.pop(rng.randrange(len(live))))
        else:
            alloc.empty_cache()
        if step % 50 == 0:
            check_invariants(alloc, live)
    for b in live:
        alloc.free(b)
    alloc.empty_cache()
    check_invariants(alloc, [])
    assert alloc.allocated == 0 and alloc.reserved == 0  # everything free and released: nothing held
