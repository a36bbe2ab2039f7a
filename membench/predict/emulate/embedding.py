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
  accumulate type (float for 16-bit gradients);
- freed as each scope closes: those last five in reverse, then the first count and `segment_offsets`, then (back
  in Embedding.cu) `orig_indices` and `sorted_indices`, then the contiguous copies.

At up to 3,072 indices without `scale_grad_by_freq` a kernel over features adds into the zeroed gradient with no
other allocation. The H200's traces of torch 2.11 (results/gpu-traces/: gpt-small at 8,192 indices, the Llama
shape at 4,096) show these allocations, sizes and order, to the byte. Not modelled: `scale_grad_by_freq`'s counts
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

EMBEDDING_BACKWARD = frozenset({torch.ops.aten.embedding_dense_backward.default})
SORT_ABOVE = 3072  # Embedding.cu: up to this many indices, the feature kernel needs no sort
NROWS_PER_THREAD = 10  # EmbeddingBackwardKernel.cu: rows one partial segment sums at most


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
    accumulate_size = 4 if grad.dtype in (torch.float16, torch.bfloat16) else grad.element_size()
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
             alloc("grad_weight_per_segment", partial_segments * dim * accumulate_size),
             free("grad_weight_per_segment"), free("partial_segment_offset"), free("num_of_partial_segments"),
             free("partials_per_segment_offset"), free("partials_per_segment"), free("num_of_segments"),
             free("segment_offsets"), free("orig_indices"), free("sorted_indices"), *copies]
    return before, after
