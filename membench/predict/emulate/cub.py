"""The temporary storage cub's device-wide algorithms ask torch's caching allocator for (aten/src/ATen/cuda/cub.cuh
hands them `c10::cuda::CUDACachingAllocator`), worked out from cub's own code: the parts each dispatch aliases into
one allocation (cub's `AliasTemporaries`: each part rounded up to 256 bytes, plus 255 for the base's alignment) and
the tile sizes of the tuning policy it picks for the GPU. Used by kernel scratch that sorts (accumulating
index_put_ in reductions.py, nn.Embedding's backward in embedding.py). The look-back passes' sizes were checked by
compiling torch's calls against the headers of CCCL 3.0.1 (CUDA 13.0), 2.8.2 and 2.5.0, and against the traces in
results/gpu-traces/ (torch 2.11.0+cu130); CCCL before 2.4 (CUDA 12.4 and older) is not followed.
"""

from __future__ import annotations

import torch

CUB_ALIGN = 256  # cub's AliasTemporaries: each part aligned to 256 bytes, plus 255 for the base's alignment
CUB_MAX_SMEM = 48 * 1024  # cub's max_smem_per_block, which bounds a register-scaled policy's threads


def _reg_bound(threads: int, items: int, size: int) -> int:
    """Tile items of a cub policy given for 4-byte types, scaled to `size`-byte ones (cub's RegBoundScaling)."""
    items = max(1, items * 4 // max(4, size))
    threads = min(threads, -(-(CUB_MAX_SMEM // (size * items)) // 32) * 32)
    return threads * items


def _cub_policy(compute_capability: tuple[int, int], key_size: int, value_size: int) -> tuple[int, int]:
    """(single-tile items, onesweep tile items) of cub's DeviceRadixSortPolicy for pairs (CCCL 2.x,
    cub/device/dispatch/tuning/tuning_radix_sort.cuh): the single tile is <256 threads, 19 items> on every
    architecture here; onesweep <256, 23> for sm70/sm75 (Policy700), <384, 21> for sm80/86/89 (Policy800),
    <384, 24 for 8-byte values, else 30> for 64-bit keys on sm90 (Policy900); each scaled to the larger of the key
    and value types."""
    dominant = max(key_size, value_size)
    single = _reg_bound(256, 19, dominant)
    if compute_capability >= (9, 0):
        onesweep = _reg_bound(384, 24 if value_size >= 8 else 30, dominant)
    elif compute_capability >= (8, 0):
        onesweep = _reg_bound(384, 21, dominant)
    else:
        onesweep = _reg_bound(256, 46 if key_size == 4 and value_size == 4 else 23, dominant)
    return single, onesweep


def cub_sort_pairs_temp_bytes(num_items: int, end_bit: int, gpu, key_size: int = 8, value_size: int = 8) -> int:
    """cub::DeviceRadixSort::SortPairs's temp_storage_bytes (keys in != keys out, as torch's radix_sort_pairs
    calls it; its item count is an int64_t, so cub's offsets are 8 bytes, its atomic counters 4): 1 byte when the
    items fit one tile, else onesweep's bins, lookback, extra key and value buffers and counters."""
    single, tile = _cub_policy(gpu.compute_capability, key_size, value_size)
    if num_items <= single:
        return 1
    radix_bits, digits = 8, 256
    portion = ((1 << 28) - 1) // tile * tile
    passes = -(-end_bit // radix_bits)
    portions = -(-num_items // portion)
    blocks = -(-min(num_items, portion) // tile)
    parts = [portions * passes * digits * 8,  # bins (OffsetT)
             blocks * digits * 4,  # lookback (AtomicOffsetT)
             0 if passes <= 1 else num_items * key_size,  # the extra key buffer
             0 if passes <= 1 else num_items * value_size,  # and value buffer
             portions * passes * 4]  # counters
    return sum(-(-p // CUB_ALIGN) * CUB_ALIGN for p in parts) + CUB_ALIGN - 1


def num_bits(max_key: int) -> int:
    """torch's cuda::cub::get_num_bits."""
    bits = 1
    while max_key > 1:
        max_key >>= 1
        bits += 1
    return bits


# --- decoupled look-back (DeviceScan, DeviceSelect::UniqueByKey) ---------------------------------------------------

TILE_STATUS_PADDING = 32  # cub's warp_threads: look-back tile states past the last tile
SCAN_TILE = 128 * 7  # DeviceScan's DefaultPolicy <128, 15> scaled to 8-byte values (MemBoundScaling), every arch:
# torch's SumOp is not an op cub's tunings recognise (cub.cu's exclusive_sum)


def _cccl3() -> bool:
    """Whether torch's CUDA ships CCCL 3 (CUDA 13; a CPU-only torch: the pinned release's CUDA 13 wheel's)."""
    return int((torch.version.cuda or "13").split(".")[0]) >= 13


def _lookback_temp_bytes(num_items: int, tile: int, descriptor: int) -> int:
    """A look-back pass's temp_storage_bytes: one tile state (`descriptor` bytes: a status word and an 8-byte value
    or offset) per tile and TILE_STATUS_PADDING more, aliased once by the dispatch (CCCL 2.x) or twice (CCCL 3: its
    tile_state_allocation_size aliases them too, so 256 bytes more)."""
    states = -(-(descriptor * (TILE_STATUS_PADDING + -(-num_items // tile))) // CUB_ALIGN) * CUB_ALIGN
    return states + (2 if _cccl3() else 1) * CUB_ALIGN - 1


def cub_exclusive_sum_temp_bytes(num_items: int) -> int:
    """cub::DeviceScan::ExclusiveScan's temp_storage_bytes for torch's exclusive_sum of int64 values (up to 2**30
    items, torch's one call; cub/device/dispatch/dispatch_scan.cuh, single_pass_scan_operators.cuh)."""
    return _lookback_temp_bytes(num_items, SCAN_TILE, 16)


def cub_unique_by_key_temp_bytes(num_items: int, gpu) -> int:
    """cub::DeviceSelect::UniqueByKey's temp_storage_bytes for torch's unique_by_key of int64 keys with int values
    (64-bit offsets: 16-byte tile states), tiles of its tuning for 8-byte keys and 4-byte values
    (tuning_unique_by_key.cuh): sm90 640 x 7, sm80 256 x 7, sm100 and later 384 x 10 (CCCL 3; CCCL 2 takes sm90's),
    else the default <64 threads, 11 nominal 4-byte items> (5 of 8 bytes)."""
    cc = gpu.compute_capability
    if cc >= (10, 0):
        tile = 384 * 10 if _cccl3() else 640 * 7
    elif cc >= (9, 0):
        tile = 640 * 7
    elif cc == (8, 0):
        tile = 256 * 7
    else:
        tile = 64 * 5
    return _lookback_temp_bytes(num_items, tile, 16)
