"""What CUDA kernels take from the caching allocator inside the kernel, besides their outputs, and free at once.

Fake tensors run no kernel, so a CUDA prediction adds these (each a registered emulation's `scratch`,
predict/emulate/registry.py), in the order a GPU allocates and frees them. They raise
the peak only by their own size for a moment, but they change which cached blocks the allocator splits, and so the
unsplit remainders `max_memory_allocated()` counts and the segments it reserves. Five kinds, as torch 2.11 runs
them (the version of the real traces benchmarks/validate_predictions.py checks, whose recorded steps show exactly
these allocations):

- **Reductions** (sum, mean; e.g. the sum that reduces a broadcast weight's gradient, RMSNorm's or a bias's, in
  backward): ATen's `gpu_reduce_kernel` (aten/src/ATen/native/cuda/Reduce.cuh) picks a launch configuration in
  `setReduceConfig` from the TensorIterator's shape and strides and from the GPU (multiprocessor count, threads
  per multiprocessor, warp size). When it splits each output's inputs across several blocks
  (`ctas_per_output > 1`), it takes a staging buffer (`ReduceConfig::global_memory_size()`) and a semaphore per
  output block (`semaphore_size()`) from the caching allocator, after the output, and frees them (semaphores first)
  when the launch returns.
- **Accumulating `index_put_`** (indexing's backward, `weight[token_ids]` as an embedding; `index_put_(...,
  accumulate=True)`): `index_put_with_sort_kernel` (aten/src/ATen/native/cuda/Indexing.cu) computes a linear
  index per indexing tensor (`remainder`, then `* stride`), sorts it with cub's radix sort (`sorted_indices`,
  `orig_indices`, an `arange` of positions, and cub's temporary storage, aten/src/ATen/cuda/cub.cu), and frees
  them when it returns.
- **`_safe_softmax`** (the math attention path's softmax): a composite whose CUDA run makes a bool mask of its
  input, a row mask and a zero scalar after its output (`safe_softmax_scratch`; the input-sized mask per layer
  decides which segments a run reserves).
- **cumsum and cumprod of another dtype** (a bool mask's cumsum, as transformers' packed-sequence check makes):
  `impl_func_cum_ops` (ReduceOps.cpp) scans `self.to(result.scalar_type())`, a copy after the result, freed as it
  returns; fake tensors run only the op's meta function.
- **nn.Embedding's backward** (`embedding_dense_backward`, predict/emulate/embedding.py): past 3,072 indices it
  sorts them and sums each index's rows in partial segments, with buffers on both sides of its gradient's
  allocation (`OUTPUTS` marks where; fit keeps the two parts apart).

Sizes are derived from that code, not fitted; tests/predict/emulate/test_reductions.py works small cases out by hand.
Not modelled: the other reductions (max/min, norms, var/std, argmax: their own accumulator types), reductions past
32-bit indexing (split into sub-iterators, each with its own buffers), the `self.to(dtype)` copy a reduction
makes of an input whose dtype it does not read (an integer sum, a `dtype=` wider than the input), the range check
of a direct `index_put_(..., accumulate=True)` (two one-element reductions; backward's skips it), and
index_put_ on a non-contiguous tensor (the contiguous copy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from membench.allocator.events import TraceEvent
from membench.predict.emulate.cub import cub_sort_pairs_temp_bytes, num_bits
from membench.predict.emulate.registry import Emulation, emulation

aten = torch.ops.aten

# --- reductions: Reduce.cuh ---------------------------------------------------------------------------------------

SUMS = frozenset({aten.sum.default, aten.sum.dim_IntList})
MEANS = frozenset({aten.mean.default, aten.mean.dim})
CUMULATIVE = frozenset({aten.cumsum.default, aten.cumprod.default})
MIN_VALUES_PER_THREAD, MAX_VALUES_PER_THREAD = 16, 256  # setReduceConfig's constants (CUDA; ROCm differs)


@dataclass
class ReduceConfig:
    """The part of ATen's ReduceConfig that decides its buffers."""

    element_size_bytes: int  # sizeof(arg_t), the accumulator
    num_outputs: int
    num_inputs: int  # inputs per output
    block_width: int = 0
    block_height: int = 0
    num_threads: int = 0
    step_input: int = 1
    step_output: int = 1
    ctas_per_output: int = 1
    input_mult: tuple[int, int, int] = (0, 0, 0)
    output_vec_size: int = 1

    def split_input(self, parallelism: int) -> int:
        step, self.step_input = self.step_input, self.step_input * parallelism
        return step

    def split_output(self, parallelism: int) -> int:
        step, self.step_output = self.step_output, self.step_output * parallelism
        return step

    def values_per_thread(self) -> int:
        return -(-self.num_inputs // self.step_input)

    def grid_x(self) -> int:
        return -(-(self.num_outputs // self.output_vec_size) // self.step_output)

    def global_memory_size(self) -> int:
        if not self.input_mult[2]:
            return 0
        size = self.element_size_bytes * self.num_outputs * self.ctas_per_output
        if not self.input_mult[0]:  # no block_x reduction: each lane of a block keeps its own partial outputs
            size *= self.block_width * self.output_vec_size
        return size

    def semaphore_size(self) -> int:
        return 4 * self.grid_x() if self.input_mult[2] else 0  # sizeof(int) per output block


def reduction_iterator(shape, in_strides, out_strides, in_itemsize: int):
    """TensorIterator's dims for a reduction (TensorIteratorBase::reorder_dimensions, then coalesce_dimensions):
    strides in bytes, fastest first, reduced dims (output stride 0) first. Returns (shape, input strides, output
    strides); `out_strides` has 0 at the reduced dims and is in elements like `in_strides`."""
    ndim = len(shape)
    # The output first, as in the iterator's operands; any itemsize does for it (only which strides are zero and
    # how they compare matter).
    strides = [[s * 8 for s in out_strides], [s * in_itemsize for s in in_strides]]
    perm = list(range(ndim - 1, -1, -1))  # the iterator starts from the last dim

    def should_swap(d0: int, d1: int) -> int:
        for arg, st in enumerate(strides):
            s0, s1 = st[d0], st[d1]
            if arg == 0 and (s0 == 0) != (s1 == 0):  # the output of a reduction: reduced dims to the front
                return 1 if s1 == 0 else -1
            if s0 == 0 or s1 == 0:
                continue
            if s0 < s1:
                return -1
            if s0 > s1:
                return 1
            if shape[d0] > shape[d1]:
                return 1
        return 0

    for i in range(1, ndim):  # insertion sort with ambiguous comparisons, as torch's
        dim1 = i
        for dim0 in range(i - 1, -1, -1):
            cmp = should_swap(perm[dim0], perm[dim1])
            if cmp > 0:
                perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
                dim1 = dim0
            elif cmp < 0:
                break
    shape = [shape[d] for d in perm]
    strides = [[st[d] for d in perm] for st in strides]
    if ndim <= 1:
        return shape, strides[1], strides[0]
    prev = 0
    for dim in range(1, ndim):
        if shape[prev] == 1 or shape[dim] == 1 or all(shape[prev] * st[prev] == st[dim] for st in strides):
            if shape[prev] == 1:
                for st in strides:
                    st[prev] = st[dim]
            shape[prev] *= shape[dim]
        else:
            prev += 1
            if prev != dim:
                for st in strides:
                    st[prev] = st[dim]
                shape[prev] = shape[dim]
    n = prev + 1
    return shape[:n], strides[1][:n], strides[0][:n]


def _last_pow2(n: int) -> int:
    return max(1, 1 << (n.bit_length() - 1)) if n > 0 else 1


def set_reduce_config(shape, in_strides, out_strides, scalar_size: int, arg_size: int, input_vec_size: int,
                      gpu, input_offset_bytes: int = 0, max_num_threads: int = 512) -> ReduceConfig:
    """ATen's setReduceConfig<arg_t, scalar_t, vt0=4, input_vec_size> on the iterator `reduction_iterator` makes.

    shape / strides: the iterator's (strides in bytes; the reduced dims first). `input_offset_bytes`: where the
    input starts in its allocation (allocations are 512-byte aligned), for the vectorized loads' alignment."""
    reduced = sum(1 for s in out_strides if s == 0)
    ndim = len(shape)
    numel = math.prod(shape)
    num_outputs = math.prod(n for n, s in zip(shape, out_strides) if s != 0)
    config = ReduceConfig(arg_size, num_outputs, numel // num_outputs)
    if ndim > 0:
        on_fastest = reduced == ndim or in_strides[0] < in_strides[reduced]
        if on_fastest:
            dim0, dim1, fastest_stride = config.num_inputs, num_outputs, in_strides[0]
        else:
            dim0, dim1, fastest_stride = num_outputs, config.num_inputs, in_strides[reduced]
    else:
        on_fastest, dim0, dim1, fastest_stride = True, 1, 1, scalar_size
    if fastest_stride == scalar_size:
        if on_fastest and dim0 >= 128 and reduced == 1:  # "vectorize along input"
            dim0 //= input_vec_size
        elif not on_fastest:  # "vectorize along output": get_output_vec_size
            vec = 4
            for n in [input_offset_bytes // scalar_size, shape[reduced],
                      *(s // scalar_size for j, s in enumerate(in_strides) if j != reduced)]:
                while n % vec:
                    vec //= 2
            config.output_vec_size = vec
            dim0 //= vec
    # set_block_dimension
    most = max_num_threads // config.output_vec_size
    dim0_pow2 = _last_pow2(dim0) if dim0 < most else most
    dim1_pow2 = _last_pow2(dim1) if dim1 < most else most
    width = min(dim0_pow2, gpu.warp_size)
    height = min(dim1_pow2, most // width)
    width = min(dim0_pow2, most // height)
    config.block_width, config.block_height, config.num_threads = width, height, width * height
    mult = [0, 0, 0]
    if ndim == 0 or on_fastest:
        mult[0] = config.split_input(width)
    else:
        config.split_output(width)
    if config.values_per_thread() >= min(height * 16, MAX_VALUES_PER_THREAD):
        mult[1] = config.split_input(height)
    else:
        config.split_output(height)
    target_grid_size = gpu.sm_count * (gpu.max_threads_per_sm // config.num_threads)
    grid = config.grid_x()
    if mult[1] and config.values_per_thread() >= MAX_VALUES_PER_THREAD and grid <= target_grid_size:
        ctas1 = -(-target_grid_size // grid)
        ctas2 = -(-config.values_per_thread() // MIN_VALUES_PER_THREAD)
        ctas3 = -(-config.values_per_thread() // MAX_VALUES_PER_THREAD)
        config.ctas_per_output = max(min(ctas1, ctas2), ctas3)
        if config.ctas_per_output > 1:
            mult[2] = config.split_input(config.ctas_per_output)
    config.input_mult = tuple(mult)
    return config


def _accumulator(dtype: torch.dtype) -> torch.dtype:
    """at::opmath / acc type of sum and mean on CUDA: float for half and bfloat16, the dtype itself otherwise."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def reduction_scratch(func, args, kwargs, out, gpu) -> list[int]:
    """[staging buffer, semaphores] bytes that `func` (a sum or mean) takes on `gpu`, or []."""
    x = args[0] if args else None
    if not isinstance(x, torch.Tensor) or not isinstance(out, torch.Tensor) or x.numel() == 0 or out.numel() == 0:
        return []
    if x.is_complex() or x.dtype == torch.bool or not x.is_floating_point():
        return []  # integer sums reduce a converted copy (not modelled); complex: other accumulators
    ndim = x.dim()
    dims = None  # sum.default and mean.default (whose second argument is a dtype) reduce every dim
    if func in (aten.sum.dim_IntList, aten.mean.dim):
        dims = args[1] if len(args) > 1 else kwargs.get("dim")
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        dims = list(range(ndim))
    elif isinstance(dims, int):
        dims = [dims]
    dims = {d % ndim for d in dims} if ndim else set()
    if x.numel() > 2**31 - 1 or x.untyped_storage().nbytes() > 2**31 - 1:
        return []  # past 32-bit indexing the kernel runs per sub-iterator (not modelled)
    # The (keepdim) output's strides: 0 at the reduced dims, the real output's elsewhere.
    kept = [d for d in range(ndim) if d not in dims]
    out_strides_kept = list(out.stride()) if out.dim() == len(kept) else None
    if out_strides_kept is None:  # keepdim=True: the output has every dim
        out_strides_kept = [out.stride()[d] for d in kept]
    out_strides = [0] * ndim
    for d, s in zip(kept, out_strides_kept):
        out_strides[d] = s if x.shape[d] != 1 else 1
    # Which dtype the kernel reads: the output's, except half / bfloat16 summed into float (read as they are).
    out_dtype = out.dtype
    lowp_to_f32 = x.dtype in (torch.float16, torch.bfloat16) and out_dtype == torch.float32
    scalar = x.dtype if lowp_to_f32 else out_dtype
    if scalar != x.dtype:
        return []  # the input is first converted (`self.to(dtype)`): not modelled
    scalar_size = x.element_size()
    arg_size = _accumulator(scalar).itemsize
    # sum_functor reads 16-bit inputs 8 at a time (vt0 4, input_vec_size 8); mean and the rest 4 (the default).
    input_vec_size = 8 if func in SUMS and scalar_size == 2 else 4
    shape, in_st, out_st = reduction_iterator(list(x.shape), list(x.stride()), out_strides, scalar_size)
    config = set_reduce_config(shape, in_st, out_st, scalar_size, arg_size, input_vec_size, gpu,
                               x.storage_offset() * scalar_size)
    if not config.input_mult[2]:
        return []
    return [config.global_memory_size(), config.semaphore_size()]


# --- accumulating index_put_: Indexing.cu and cub's radix sort ---------------------------------------------------

INDEX_PUTS = frozenset({aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default})
def index_put_scratch(func, args, kwargs, gpu) -> list[TraceEvent]:
    """The allocations and frees of index_put_with_sort_kernel, in order, keyed by name; or []."""
    self, indices = args[0], args[1]
    accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
    if not accumulate and not torch.are_deterministic_algorithms_enabled():
        return []  # the plain index_put_ kernel: no temporaries
    defined = [(d, i) for d, i in enumerate(indices) if i is not None]
    if not defined or any(i.dtype in (torch.bool, torch.uint8) for _, i in defined):
        return []  # a mask's nonzero() depends on values
    index_shape = torch.broadcast_shapes(*(i.shape for _, i in defined))
    num_indices = math.prod(index_shape)
    if not self.is_contiguous():
        return []  # the kernel works on a contiguous copy (not modelled)
    # makeLinearIndex: the indexed dims are a block (moved to the front first when they are not adjacent); the
    # slice each index addresses is the product of the dims after them.
    first, last = defined[0][0], defined[-1][0]
    indexed = {d for d, _ in defined}
    if last - first + 1 == len(defined):
        slice_size = math.prod(self.shape[last + 1:])
    else:
        slice_size = math.prod(n for d, n in enumerate(self.shape) if d not in indexed)
    alloc, free = TraceEvent.alloc, TraceEvent.free
    events: list[TraceEvent] = []
    for n, (_, index) in enumerate(defined):  # computeLinearIndex: remainder, then * stride, then +=
        events += [alloc(f"remainder{n}", num_indices * index.element_size()),
                   alloc(f"linear{n}", num_indices * index.element_size()), free(f"remainder{n}")]
        if n:
            events.append(free(f"linear{n}"))  # summed into the first one in place
    if num_indices == 0 or slice_size == 0:
        return events + [free("linear0")]
    largest = sum((n - 1) * s for n, s in zip(self.shape, self.stride()))  # largestIndex(self)
    temp = cub_sort_pairs_temp_bytes(num_indices, num_bits(largest // slice_size), gpu)
    return events + [alloc("sorted_indices", num_indices * 8), alloc("orig_indices", num_indices * 8),
                     alloc("range", num_indices * 8), alloc("cub_temp", temp), free("cub_temp"),
                     free("range"), free("orig_indices"), free("sorted_indices"), free("linear0")]


# --- _safe_softmax: SoftMax.cpp ----------------------------------------------------------------------------------

# torch < 2.5 has no _safe_softmax: its math attention calls plain softmax
SAFE_SOFTMAX = frozenset({aten._safe_softmax.default}) if hasattr(aten, "_safe_softmax") else frozenset()


def safe_softmax_scratch(args, kwargs, out, gpu) -> list[TraceEvent]:
    """The temporaries of `_safe_softmax` (the math attention path's softmax) on CUDA, in order, keyed by name; or [].

    Its CUDA kernel is a composite (aten/src/ATen/native/transformers/attention.cpp, torch 2.11 and 2.14): after
    `out = at::softmax(self, dim)` (the op's output) it makes `masked = self.isneginf()` (bool, self's shape),
    `masked_rows = all(masked, dim, keepdim=true)` (bool, one per row; a reduction, with Reduce.cuh's staging
    buffer and semaphores when it splits a row across blocks) and `zero = at::scalar_tensor(0.0)` (one element of
    out's dtype, on the device), writes `where(masked_rows, zero, out)` into `out` itself, and frees the three as it
    returns, in reverse order. Fake tensors run its meta function (the output only). Not modelled: a `dtype`
    other than self's (softmax's converted copy of the input)."""
    self = args[0] if args else None
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    dtype = args[2] if len(args) > 2 else kwargs.get("dtype")
    if (not isinstance(self, torch.Tensor) or not isinstance(out, torch.Tensor) or self.numel() == 0
            or (dtype is not None and dtype != self.dtype)):
        return []
    dim %= max(self.dim(), 1)
    rows = self.numel() // self.shape[dim] if self.dim() else 1
    alloc, free = TraceEvent.alloc, TraceEvent.free
    events = [alloc("masked", self.numel()), alloc("masked_rows", rows)]
    if self.dim():  # all(): bool in, bool accumulated (and_kernel_cuda's gpu_reduce_kernel<bool, bool>)
        shape = list(self.shape)
        strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]  # isneginf's output: contiguous
        # masked_rows' strides (contiguous, keepdim): 0 at the reduced dim, 1 at other size-1 dims, as for sums
        out_strides = [0 if d == dim else 1 if shape[d] == 1 else strides[d] // shape[dim] if d < dim else strides[d]
                       for d in range(len(shape))]
        config = set_reduce_config(*reduction_iterator(shape, strides, out_strides, 1), 1, 1, 4, gpu)
        if config.input_mult[2]:
            events += [alloc("buffer", config.global_memory_size()), alloc("semaphores", config.semaphore_size()),
                       free("semaphores"), free("buffer")]
    return events + [alloc("zero", out.element_size()), free("zero"), free("masked_rows"), free("masked")]


# --- the emulations -----------------------------------------------------------------------------------------------


@emulation
class SplitReductions(Emulation):
    """Sums' and means' staging buffer and semaphores (Reduce.cuh)."""

    ops = SUMS | MEANS
    order = 80

    def scratch(self, func, args, kwargs, out) -> list[TraceEvent]:
        sizes = reduction_scratch(func, args, kwargs, out, self.gpu)
        if not sizes:
            return []
        return [TraceEvent.alloc("buffer", sizes[0]), TraceEvent.alloc("semaphores", sizes[1]),
                TraceEvent.free("semaphores"), TraceEvent.free("buffer")]


@emulation
class IndexPutSort(Emulation):
    """Accumulating index_put_'s linear index and sort (Indexing.cu)."""

    ops = INDEX_PUTS
    order = 80

    def scratch(self, func, args, kwargs, out) -> list[TraceEvent]:
        return index_put_scratch(func, args, kwargs, self.gpu)


@emulation
class CumulativeCast(Emulation):
    """cumsum's and cumprod's copy of an input of another dtype: impl_func_cum_ops (ReduceOps.cpp) scans
    self.to(result's dtype)."""

    ops = CUMULATIVE
    order = 80

    def scratch(self, func, args, kwargs, out) -> list[TraceEvent]:
        scanned = args[0]
        if scanned.dim() and scanned.numel() and scanned.dtype != out.dtype:
            return [TraceEvent.alloc("cast", scanned.numel() * out.element_size()), TraceEvent.free("cast")]
        return []


@emulation
class SafeSoftmaxMasks(Emulation):
    """The math attention path's _safe_softmax: its masks and zero (attention.cpp)."""

    ops = SAFE_SOFTMAX
    order = 80

    def scratch(self, func, args, kwargs, out) -> list[TraceEvent]:
        return safe_softmax_scratch(args, kwargs, out, self.gpu)
