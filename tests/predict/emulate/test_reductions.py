"""The scratch CUDA kernels take from the caching allocator inside the kernel (predict/emulate/reductions.py), with
sizes worked out by hand from ATen's setReduceConfig / ReduceConfig (aten/src/ATen/native/cuda/Reduce.cuh),
index_put_with_sort_kernel (Indexing.cu) and cub's radix sort (temp storage of its single-tile and onesweep
paths), and the order in which a prediction's trace sees them."""

from __future__ import annotations

import torch

from membench.predict import gpus
from membench.predict.emulate import fake
from membench.predict.emulate.cub import cub_sort_pairs_temp_bytes
from membench.predict.emulate.kernels import CudaKernels
from membench.predict.emulate.reductions import SCRATCH_MODULE, KernelScratch, reduction_scratch
from membench.trackers.storage import StorageTracker
from tests.helpers import cuda_trace

aten = torch.ops.aten
H100, A100, T4 = gpus.gpu("H100"), gpus.gpu("A100"), gpus.gpu("T4")


def _sum_scratch(shape, dims, gpu, dtype=torch.float32, out_dtype=None):
    x = torch.empty(shape, dtype=dtype, device="meta")
    out = x.sum(dims, dtype=out_dtype)
    return reduction_scratch(aten.sum.dim_IntList, (x, dims), {"dtype": out_dtype}, out, gpu)


def test_sum_over_dim0_of_n_by_d_takes_a_staging_buffer_and_semaphores():
    # x [4096, 1024] fp32, sum(0). The iterator puts the reduced dim first: shape [4096, 1024], input strides
    # [4096 B, 4 B]; the reduction is not on the fastest dim, so each lane owns outputs, 4 at a time
    # (output_vec_size 4: 1024 and the 1024-element stride are multiples of 4): dim0 = 1024 / 4 = 256, dim1 = 4096.
    # Block: 512 / 4 = 128 threads at most: width min(128, warp 32) = 32, height min(128, 128 / 32) = 4.
    # Lanes split outputs (step_output 32); 4096 values per thread >= min(4 x 16, 256): warps split inputs
    # (step_input 4), 1024 values per thread. H100: 2048 / 128 = 16 blocks per SM x 132 SMs = 2112 target blocks;
    # grid = ceil(1024 / 4 / 32) = 8; ctas_per_output = max(min(ceil(2112 / 8), ceil(1024 / 16)), ceil(1024 / 256))
    # = max(min(264, 64), 4) = 64. Buffer: 4 B x 1024 outputs x 64 ctas x (32 lanes x 4) = 33,554,432 B;
    # semaphores: 4 B x 8 blocks = 32 B.
    assert _sum_scratch((4096, 1024), [0], H100) == [33_554_432, 32]
    # The CS336 RMSNorm weight's gradient (batch 4, ctx 512, d 1024; sum over dims 0 and 1, coalesced to one):
    # 2048 values, 512 per thread, 32 ctas: 16 MiB and 32 B, as the real GPU trace shows.
    assert _sum_scratch((4, 512, 1024), [0, 1], A100) == [16_777_216, 32]
    # Too few values per thread (128 rows: 32 per thread after the warp split): one block per output, no scratch.
    assert _sum_scratch((128, 1024), [0], H100) == []


def test_the_gpu_decides_how_many_blocks_share_an_output():
    # x [4096, 65536] fp32, sum(0): as above up to the grid, now ceil(65536 / 4 / 32) = 512 blocks.
    # H100: ctas = max(min(ceil(2112 / 512), 64), 4) = max(5, 4) = 5 -> 4 x 65536 x 5 x 128 = 167,772,160 B.
    # A100: 16 x 108 = 1728 target: ceil(1728 / 512) = 4 -> 134,217,728 B. Semaphores: 4 x 512 = 2048 B.
    # T4: 1024 / 128 = 8 blocks per SM x 40 = 320 < 512 blocks already: no split, no scratch.
    assert _sum_scratch((4096, 65536), [0], H100) == [167_772_160, 2048]
    assert _sum_scratch((4096, 65536), [0], A100) == [134_217_728, 2048]
    assert _sum_scratch((4096, 65536), [0], T4) == []


def test_a_full_sum_reduces_across_lanes_and_keeps_one_value_per_block():
    # x [2**20] fp32, sum(): the reduction is on the fastest dim and vectorized by 4 (dim0 = 2**18), one output:
    # block 512 x 1, lanes split inputs (step 512), 2048 values per thread >= min(1 x 16, 256): the warp split is by
    # 1. H100: 2048 / 512 = 4 blocks per SM x 132 = 528; ctas = max(min(528, 2048 / 16), 2048 / 256) = 128.
    # The lanes reduce among themselves (block_x), so the buffer is 4 B x 1 output x 128 ctas = 512 B;
    # semaphores 4 B x 1 block. T4: 1024 / 512 = 2 x 40 = 80 target -> 80 ctas, 320 B.
    x = torch.empty(2**20, device="meta")
    assert reduction_scratch(aten.sum.default, (x,), {}, x.sum(), H100) == [512, 4]
    assert reduction_scratch(aten.sum.default, (x,), {}, x.sum(), T4) == [320, 4]
    # bf16 summed into fp32 is read as bf16 (8 at a time) and accumulated in fp32: the same buffer here.
    assert _sum_scratch((2**20,), [0], H100, torch.bfloat16, torch.float32) == [512, 4]


def test_cub_radix_sort_storage():
    # Pairs of 8-byte keys and values: cub scales its 4-byte tunings by 4 / 8. Single tile: 256 threads x
    # (19 x 4 / 8 = 9) = 2304 items: 2048 items fit it, and cub asks for 1 byte.
    assert cub_sort_pairs_temp_bytes(2048, 14, A100) == 1
    # 4096 items on sm80: onesweep, 384 threads x (21 x 4 / 8 = 10) = 3840 items a tile -> 2 blocks; 14 key bits
    # at 8 bits a pass -> 2 passes. Bins 1 x 2 x 256 x 8 B = 4096; lookback 2 x 256 x 4 B = 2048; a second key
    # buffer and value buffer 4096 x 8 B each = 32768 + 32768; counters 2 x 4 B -> 256 once aligned. Sum 71,936 B
    # + 255 for alignment = 72,191 B (what the real ctx1024 trace shows).
    assert cub_sort_pairs_temp_bytes(4096, 14, A100) == 72_191
    # sm90 tunes 64-bit keys with 8-byte values to 384 x (24 x 4 / 8 = 12) = 4608 items: one block, lookback 1024.
    assert cub_sort_pairs_temp_bytes(4096, 14, H100) == 71_167
    # 8 key bits: one pass, so bins 1 x 1 x 256 x 8 B = 2048 and no extra key and value buffers:
    # 2048 + 2048 + 256 (counters) + 255.
    assert cub_sort_pairs_temp_bytes(4096, 8, A100) == 4_607


def _trace(fn, gpu=A100):
    return cuda_trace(fn, gpu)


def test_reduction_scratch_is_allocated_after_the_output_and_freed_before_the_op_returns():
    kept = []
    events = _trace(lambda: kept.append(torch.empty(4, 512, 1024).sum((0, 1))))
    assert events == [("alloc", 8_388_608), ("alloc", 4096), ("alloc", 16_777_216), ("alloc", 32),
                      ("free", 32), ("free", 16_777_216), ("free", 8_388_608)]


def test_embedding_by_indexing_backward_sorts_its_indices():
    # weight[token_ids] backward on CUDA: the gradient's zeros (1000 x 64 x 4 B), then index_put_ with accumulate,
    # through index_put_with_sort_kernel. For 2048 int64 indices: remainder, then * stride (the linear index; the
    # remainder freed), sorted and original positions, an arange, cub's storage (1 byte: one tile), then all
    # freed, the arange first and the linear index last.
    def step():
        weight = torch.zeros(1000, 64, requires_grad=True)
        tokens = torch.zeros(4, 512, dtype=torch.long)
        weight[tokens].sum().backward()

    events = _trace(step)
    i = events.index(("alloc", 256_000), 1)  # the first is the weight
    assert events[i:i + 13] == [("alloc", 256_000), ("alloc", 16384), ("alloc", 16384), ("free", 16384),
                                ("alloc", 16384), ("alloc", 16384), ("alloc", 16384), ("alloc", 1), ("free", 1),
                                ("free", 16384), ("free", 16384), ("free", 16384), ("free", 16384)]


def test_scratch_is_counted_as_other_memory_and_only_while_the_op_runs():
    with fake.fake_tensors():
        tracker = StorageTracker()
        tracker.kernels = CudaKernels(H100, workspace_bytes=0)
        with tracker:
            x = torch.empty(4096, 1024)
            before = tracker.current
            total = x.sum(0)
        assert tracker.peak.bytes == before + 4096 + 33_554_432 + 32
        assert tracker.current == before + 4096
        assert not any(module == SCRATCH_MODULE for _, _, module in tracker.live.values())
        del total
    assert KernelScratch(H100).events(aten.add.Tensor, (), {}, None) == []


def test_a_threads_cublas_workspace_comes_after_its_first_matmuls_output():
    # mm's output is allocated before its kernel asks for the thread's cuBLAS handle, which allocates the workspace.
    with fake.fake_tensors():
        tracker = StorageTracker(trace=True)
        tracker.kernels = CudaKernels(A100, workspace_bytes=1000)
        with tracker:
            a, b = torch.empty(8, 16), torch.empty(16, 32)
            kept = [a @ b, a @ b]
    assert [e.size for e in tracker.trace if e.kind == "alloc"] == [512, 2048, 1024, 1000, 1024]
    assert len(kept) == 2


def test_a_full_sum_with_a_dtype_argument_reduces_every_dim():
    x = torch.empty(2**20, dtype=torch.bfloat16, device="meta")
    out = x.sum(dtype=torch.float32)
    assert reduction_scratch(aten.sum.default, (x, torch.float32), {}, out, H100) == [512, 4]
    assert reduction_scratch(aten.mean.default, (x.float(),), {}, out, H100) == [512, 4]


def test_every_gpu_has_the_threads_per_multiprocessor_of_its_compute_capability():
    threads = {(7, 0): 2048, (7, 5): 1024, (8, 0): 2048, (8, 6): 1536, (8, 9): 1536, (9, 0): 2048, (10, 0): 2048,
               (12, 0): 1536}  # the CUDA C++ Programming Guide, technical specifications per compute capability
    for gpu in gpus.GPUS.values():
        assert gpu.max_threads_per_sm == threads[gpu.compute_capability], gpu.name
        assert gpu.sm_count > 0 and gpu.warp_size == 32
    assert (gpus.gpu("H100").sm_count, gpus.gpu("h100 pcie").sm_count) == (132, 114)


def test_safe_softmax_makes_a_mask_a_row_mask_and_a_zero_after_its_output():
    # _safe_softmax (attention.cpp): out = softmax(self) (the op's output), masked = self.isneginf() (bool, 1 B per
    # element), masked_rows = all(masked, -1, keepdim) (1 B per row), zero = scalar_tensor(0) (one element of out's
    # dtype), where(masked_rows, zero, out) written into out; the three freed as it returns, newest first.
    # [4, 16, 1024, 1024] fp32 (the Llama shape's math attention on the H200): 67,108,864 B, 65,536 rows, 4 B.
    # all() over 1024 bools per row for 65,536 rows does not split a row across blocks: no buffer. Then the input
    # (a temporary here) goes.
    kept = []
    events = _trace(lambda: kept.append(torch._safe_softmax(torch.empty(4, 16, 1024, 1024), -1)), H100)
    assert events == [("alloc", 268_435_456), ("alloc", 268_435_456), ("alloc", 67_108_864), ("alloc", 65_536),
                      ("alloc", 4), ("free", 4), ("free", 65_536), ("free", 67_108_864), ("free", 268_435_456)]


def test_safe_softmax_of_two_long_rows_splits_alls_reduction():
    # all() over [2, 1048576] bools, on the last dim: 2 outputs of 1,048,576 inputs, read 4 at a time (dim0
    # 262,144). Block: width 32, height min(2, 16) = 2, then width min(512, 256) = 256: 512 threads. Lanes split the
    # inputs (step 256), 4096 values per thread >= min(32, 256): warps too (step 512), 2048 per thread. H100: 132 SMs
    # x 2048 / 512 = 528 target blocks, grid 2: ctas_per_output = max(min(264, 2048 / 16), 2048 / 256) = 128.
    # Buffer: 1 B (bool) x 2 outputs x 128 = 256 B; semaphores 4 B x 2 blocks = 8 B; after the row mask (2 B),
    # before the zero (fp16 here: 2 B).
    x = torch.empty(2, 1 << 20, dtype=torch.float16, device="meta")
    events = KernelScratch(H100).events(aten._safe_softmax.default, (x, -1), {}, torch.empty_like(x))
    assert [(e.kind, e.key, e.size) for e in events if e.kind == "alloc"] == [
        ("alloc", "masked", 2 << 20), ("alloc", "masked_rows", 2), ("alloc", "buffer", 256),
        ("alloc", "semaphores", 8), ("alloc", "zero", 2)]
    assert [e.key for e in events if e.kind == "free"] == ["semaphores", "buffer", "zero", "masked_rows", "masked"]
    # A dtype other than the input's (softmax's converted copy) is not modelled.
    assert KernelScratch(H100).events(aten._safe_softmax.default, (x, -1, torch.float32), {}, x.float()) == []


def test_a_bool_masks_cumsum_scans_an_int64_copy_as_transformers_packed_sequence_check_makes():
    kept = []

    def check():
        positions = torch.zeros(4, 1024, dtype=torch.long)  # 32,768 B
        mask = positions != 1  # 4,096 B
        kept.append(mask.cumsum(-1))  # the int64 result, then self.to(int64) scanned, freed as it returns

    # then the function's locals go: positions, mask
    assert _trace(check) == [("alloc", 32_768), ("alloc", 4096), ("alloc", 32_768), ("alloc", 32_768),
                             ("free", 32_768), ("free", 32_768), ("free", 4096)]
    # of the same dtype: no copy (the input, then the result; the input let go)
    assert _trace(lambda: kept.append(torch.zeros(4, 1024).cumsum(-1))) == [("alloc", 16_384), ("alloc", 16_384),
                                                                              ("free", 16_384)]
