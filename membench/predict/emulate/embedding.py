"""What nn.Embedding's backward takes from the caching allocator on CUDA besides its gradient, in order.

`embedding_dense_backward_cuda` (aten/src/ATen/native/cuda/Embedding.cu) makes its indices and output gradient
contiguous, and for more than 3,072 indices (or with `scale_grad_by_freq`) sorts the indices: `sorted_indices`
and `orig_indices` (index-sized), an `arange` of positions and cub's radix-sort storage (over all the index type's
bits: torch passes no end bit there), the last two freed as the sort returns. Only then does
`embedding_backward_cuda_kernel` (EmbeddingBackwardKernel.cu) make the gradient, `zeros([num_weights, dim])`,
and split the sorted indices into segments of equal index and those into partial segments of at most
`NROWS_PER_THREAD` rows:

- `segment_offsets` (index-sized) and a one-element int64 count; cub's `unique_by_key`, to which torch's wrapper
  gives a keys-out buffer of its own (index-sized) besides cub's storage, both freed as it returns;
- `partials_per_segment` and `partials_per_segment_offset` (`max_segments = min(indices, num_weights)` each), cub's
  exclusive sum's storage (freed at once), a second int64 count, `partial_segment_offset` of
  `indices // 10 + max_segments`, and `grad_weight_per_segment`, that many rows of the gradient's width in its
  accumulate type (float for 16-bit gradients); or, where summing per segment would launch fewer than 4 blocks
  per multiprocessor (few distinct rows, a narrow table: `use_fused_kernel`), a partial-to-segment map of
  `partial_segment_offset`'s size and, for a 16-bit gradient, an fp32 gradient to add into atomically;
- freed as each scope closes: those last in reverse, then the first count and `segment_offsets`, then (back in
  Embedding.cu) `orig_indices` and `sorted_indices`, then the contiguous copies.

At up to 3,072 indices without `scale_grad_by_freq` a kernel over features adds into the zeroed gradient with no
other allocation. The H200's traces of torch 2.11 (results/gpu-traces/: gpt-small at 8,192 indices, the Llama
shape at 4,096; two passes) show these allocations, sizes and order, to the byte; the fused pass follows the
source (its kernels are in the 2.11 and 2.14 binaries; no trace shows it). Not modelled: `scale_grad_by_freq`'s counts
and scans (a prediction then makes only the gradient) and embedding_bag's backward.
"""

from __future__ import annotations

import torch

from membench.allocator.events import TraceEvent
from membench.predict.emulate.cub import (
    cub_exclusive_sum_temp_bytes,
    cub_sort_pairs_temp_bytes,
    cub_unique_by_key_temp_bytes,
)
from membench.predict.emulate.registry import OUTPUTS, Emulation, emulation

EMBEDDING_BACKWARD = frozenset({torch.ops.aten.embedding_dense_backward.default})
SORT_ABOVE = 3072  # Embedding.cu: up to this many indices, the feature kernel needs no sort
NROWS_PER_THREAD = 10  # EmbeddingBackwardKernel.cu: rows one partial segment sums at most
MAX_ATOMIC_ACCUM_BLOCKS_PER_SM = 4  # EmbeddingBackwardKernel.cu: the fused pass below this many blocks per SM
MAX_BLOCK_SIZE, WARP_SIZE = 1024, 32  # SortingCommon.cuh (CUDA), NVIDIA's warp


def embedding_backward_scratch(args, kwargs, gpu) -> tuple[list[TraceEvent], list[TraceEvent]]:
    """The allocations and frees of embedding_dense_backward on CUDA, keyed by name: (those before its gradient is
    made, those after)."""
    grad, indices, num_weights = args[:3]
    scale_grad_by_freq = args[4] if len(args) > 4 else kwargs.get("scale_grad_by_freq", False)
    alloc, free = TraceEvent.alloc, TraceEvent.free
    before: list[TraceEvent] = []
    if not indices.is_contiguous():
        before.append(alloc("indices", indices.numel() * indices.element_size()))
    if not grad.is_contiguous():
        before.append(alloc("grad", grad.numel() * grad.element_size()))
    copies = [free(e.key) for e in reversed(before)]  # destroyed last, in reverse
    n, size = indices.numel(), indices.element_size()
    if scale_grad_by_freq or n <= SORT_ABOVE:
        return before, copies  # scale_grad_by_freq's counts and scans: not modelled
    dim = grad.shape[-1]
    sixteen_bit = grad.dtype in (torch.float16, torch.bfloat16)
    accumulate_size = 4 if sixteen_bit else grad.element_size()  # its opmath type
    segments = min(n, num_weights)
    partial_segments = n // NROWS_PER_THREAD + segments
    before += [alloc("sorted_indices", n * size), alloc("orig_indices", n * size), alloc("range", n * size),
               alloc("sort_temp", cub_sort_pairs_temp_bytes(n, 8 * size, gpu, size, size)), free("sort_temp"),
               free("range")]
    after = [alloc("segment_offsets", n * size), alloc("num_of_segments", 8),
             alloc("unique_keys_out", n * size), alloc("unique_temp", cub_unique_by_key_temp_bytes(n, gpu)),
             free("unique_temp"), free("unique_keys_out"),
             alloc("partials_per_segment", segments * size), alloc("partials_per_segment_offset", segments * size),
             alloc("scan_temp", cub_exclusive_sum_temp_bytes(segments)), free("scan_temp"),
             alloc("num_of_partial_segments", 8), alloc("partial_segment_offset", partial_segments * size),
             *_sums(segments, partial_segments, num_weights, dim, size, sixteen_bit, accumulate_size, gpu),
             free("partial_segment_offset"), free("num_of_partial_segments"),
             free("partials_per_segment_offset"), free("partials_per_segment"), free("num_of_segments"),
             free("segment_offsets"), free("orig_indices"), free("sorted_indices"), *copies]
    return before, after


def _sums(segments: int, partial_segments: int, num_weights: int, dim: int, size: int, sixteen_bit: bool,
          accumulate_size: int, gpu) -> list[TraceEvent]:
    """How the partial segments are summed into the gradient. Two passes (each partial segment's sum, then each
    segment's), unless the second would have too few blocks for the GPU: then one pass of atomic adds, with a map
    from partial segment to segment and, for a 16-bit gradient, an fp32 copy of the whole gradient to add into
    (`use_fused_kernel`, pytorch#172454, in the 2.11 and 2.14 binaries; never with deterministic algorithms)."""
    alloc, free = TraceEvent.alloc, TraceEvent.free
    warped = -(-dim // WARP_SIZE) * WARP_SIZE
    sum_and_scatter_blocks = -(-(segments * warped) // min(warped, MAX_BLOCK_SIZE))
    if (sum_and_scatter_blocks < gpu.sm_count * MAX_ATOMIC_ACCUM_BLOCKS_PER_SM
            and partial_segments > 4 * sum_and_scatter_blocks and not torch.are_deterministic_algorithms_enabled()):
        accumulator = [alloc("grad_weight_acc", num_weights * dim * 4), free("grad_weight_acc")] if sixteen_bit else []
        return [alloc("partial_to_segment_idx", partial_segments * size), *accumulator,
                free("partial_to_segment_idx")]
    return [alloc("grad_weight_per_segment", partial_segments * dim * accumulate_size),
            free("grad_weight_per_segment")]


@emulation
class EmbeddingBackward(Emulation):
    """embedding_dense_backward's sort and segments, on both sides of its gradient's allocation."""

    ops = EMBEDDING_BACKWARD
    order = 80
    outputs_amid = True

    def scratch(self, func, args, kwargs, out) -> list[TraceEvent]:
        before, after = embedding_backward_scratch(args, kwargs, self.gpu)
        return [*before, OUTPUTS, *after]
