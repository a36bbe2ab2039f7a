"""PYTORCH_CUDA_ALLOC_CONF as torch 2.14 reads it: every key it accepts, large_segment_size_mb, and the simulator's
segment size following it. Hand-derived, and checked against c10's own parser where torch has one (a CUDA build of
torch parses the settings string without a GPU)."""

import pytest
import torch

from membench.allocator import parse_alloc_conf, simulate
from membench.allocator.settings import LARGE_BUFFER, AllocatorSettings
from membench.allocator.simulator import get_allocation_size
from membench.common.errors import UserError

MiB = 2**20

# Every key torch 2.14 reads (c10/core/AllocatorConfig.cpp's and c10/cuda/CUDAAllocatorConfig.h's key lists), each
# with a value it accepts.
VALID_214 = [
    "large_segment_size_mb:64", "max_split_size_mb:128", "max_non_split_rounding_mb:32",
    "garbage_collection_threshold:0.6", "roundup_power2_divisions:[256:4,>:2]", "roundup_power2_divisions:4",
    "expandable_segments:True", "expandable_segments:False", "pinned_use_background_threads:True",
    "pinned_max_cached_size_mb:64", "pinned_max_round_threshold_mb:32", "backend:native",
    "backend:cudaMallocAsync", "release_lock_on_cudamalloc:True", "release_lock_on_hipmalloc:False",
    "pinned_use_cuda_host_register:True", "pinned_use_hip_host_register:False",
    "graph_capture_record_stream_reuse:True", "pinned_reserve_segment_size_mb:8", "pinned_num_register_threads:8",
    "per_process_memory_fraction:0.5", "per_process_memory_fraction:1", "pinned_free_catch_all:True",
    "throw_on_cudamalloc_oom:True", " large_segment_size_mb : 40 ,\texpandable_segments:True",
    "max_split_size_mb:40,large_segment_size_mb:40",  # large_segment_size_mb is read first, wherever it is
]
INVALID_214 = [
    "expandable_segments_handle_type:posix_fd",  # named in torch 2.14's error message, refused by its parser
    "large_segment_size_mb:10",  # must exceed 10 MiB (kMinLargeAlloc)
    "max_split_size_mb:30,large_segment_size_mb:40",  # below the large segment, read first
    "large_segment_size_mb:40,max_non_split_rounding_mb:30",
    "per_process_memory_fraction:1.5", "expandable_segments:true", "pinned_num_register_threads:3",
    "pinned_num_register_threads:256", "pinned_reserve_segment_size_mb:0", "backend:cudaMalloc", "bogus:1",
    "garbage_collection_threshold:1.0",
]


@pytest.mark.parametrize("text", VALID_214)
def test_every_key_torch_2_14_reads_is_accepted(text):
    parse_alloc_conf(text)


@pytest.mark.parametrize("text", INVALID_214)
def test_what_torch_2_14_refuses_is_one_line(text):
    with pytest.raises(UserError) as info:
        parse_alloc_conf(text)
    assert "\n" not in str(info.value) and len(str(info.value)) < 600


def _c10_accepts(text: str) -> bool:
    """torch's own parser (generic, then CUDA's hook), as a running process applies the string. Its
    large_segment_size is kept from one call to the next (parseArgs resets only some fields): reset it first."""
    torch._C._accelerator_setAllocatorSettings("large_segment_size_mb:20")
    try:
        torch._C._accelerator_setAllocatorSettings(text)
    except ValueError:
        return False
    except RuntimeError as exc:  # backend:cudaMallocAsync parses, then differs from the backend loaded at start
        return "parsed at load time" in str(exc)
    return True


@pytest.mark.skipif(not hasattr(torch._C, "_accelerator_setAllocatorSettings"), reason="torch < 2.9")
def test_accepts_and_refuses_what_c10_does():
    try:
        cuda_keys = _c10_accepts("backend:native")
    finally:
        torch._C._accelerator_setAllocatorSettings("")
    if not cuda_keys:
        pytest.skip("this torch build registers no CUDA allocator config (a CPU-only wheel)")
    try:
        for text in VALID_214:
            assert _c10_accepts(text), text
        for text in INVALID_214:
            assert not _c10_accepts(text), text
    finally:
        torch._C._accelerator_setAllocatorSettings("large_segment_size_mb:20")
        torch._C._accelerator_setAllocatorSettings("")


def test_large_segment_size_sets_the_segment_and_the_bounds():
    s = parse_alloc_conf("max_split_size_mb:64,large_segment_size_mb:40")
    assert s.large_segment_size == 40 * MiB and s.max_split_size == 64 * MiB
    assert s.max_non_split_rounding == 40 * MiB  # its default follows the large segment
    assert parse_alloc_conf("").large_segment_size == LARGE_BUFFER
    assert parse_alloc_conf("large_segment_size_mb:64,max_non_split_rounding_mb:80").max_non_split_rounding == 80 * MiB
    assert get_allocation_size(3 * MiB, 64 * MiB) == 64 * MiB and get_allocation_size(3 * MiB) == 20 * MiB
    assert get_allocation_size(10 * MiB, 64 * MiB) == 10 * MiB  # 10 MiB and more: a segment of their own
    # the label reads back as the same settings
    again = parse_alloc_conf(AllocatorSettings(large_segment_size=64 * MiB, max_non_split_rounding=64 * MiB,
                                               per_process_memory_fraction=0.5).label())
    assert again.large_segment_size == 64 * MiB and again.per_process_memory_fraction == 0.5


def _three_mib_requests(n: int) -> list[tuple]:
    return [("alloc", k, 3 * MiB) for k in range(n)]


def test_the_simulator_follows_large_segment_size():
    """21 requests of 3 MiB, derived by hand. Default: a 20 MiB segment takes six (5 x 3 MiB, then the sixth splits
    the 5 MiB left, keeping 2 MiB; the seventh fits nowhere): 4 segments, 80 MiB. With large_segment_size_mb:64
    one segment takes all 21 (the 21st gets the last 4 MiB whole: a 1 MiB remainder is not split off), and a 22nd
    needs a second 64 MiB segment."""
    default = simulate(_three_mib_requests(21))
    assert default.peak_reserved_bytes == 80 * MiB and len(default.segment_allocations) == 4
    large = simulate(_three_mib_requests(21), "large_segment_size_mb:64")
    assert large.peak_reserved_bytes == 64 * MiB and large.peak_allocated_bytes == 20 * 3 * MiB + 4 * MiB
    assert simulate(_three_mib_requests(22), "large_segment_size_mb:64").peak_reserved_bytes == 128 * MiB
    # expandable segments map pages of the large segment's size in the large pool
    expandable = simulate(_three_mib_requests(1), "expandable_segments:True,large_segment_size_mb:64")
    assert expandable.peak_reserved_bytes == 64 * MiB


def test_cuda_malloc_async_is_read_and_said_not_modelled():
    from membench.allocator import reserved_summary

    assert parse_alloc_conf("backend:cudaMallocAsync").backend == "cudaMallocAsync"
    summary = reserved_summary([("alloc", 0, 512)], "backend:cudaMallocAsync")
    assert "cudaMallocAsync" in summary.reserved_method and "not modelled" in summary.reserved_method
    assert "cudaMallocAsync" not in reserved_summary([("alloc", 0, 512)]).reserved_method
