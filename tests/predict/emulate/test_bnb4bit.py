"""bitsandbytes' gemm_4bit as its CUDA kernel allocates (predict/emulate/bnb4bit.py), derived by hand from
bitsandbytes 0.50.2's backends/cuda/ops.py."""

from __future__ import annotations

import pytest
import torch

from membench.predict.gpus import gpu
from tests.helpers import cuda_trace

pytest.importorskip("bitsandbytes")

N, K = 128, 64  # an [out, in] weight
BLOCKS = N * K // 64  # absmax blocks of 64 weights
NESTED = -(-BLOCKS // 256)  # double quantization: one fp32 absmax per 256 blocks
INPUTS = 6  # the call's tensors, made first: A, the packed weight, the nested absmax, the 8-bit absmax, the offset,
# the 8-bit code


def gemm(m: int):
    import bitsandbytes  # noqa: F401 - registers bitsandbytes::gemm_4bit

    def run():
        a = torch.empty(m, K, dtype=torch.bfloat16)
        packed = torch.empty((N * K + 1) // 2, 1, dtype=torch.uint8)
        nested_absmax = torch.empty(NESTED, dtype=torch.float32)
        absmax_8bit = torch.empty(BLOCKS, dtype=torch.uint8)
        offset = torch.empty((), dtype=torch.float32)
        code = torch.empty(256, dtype=torch.float32)
        torch.ops.bitsandbytes.gemm_4bit.default(a, packed, [N, K], nested_absmax, 64, "nf4", absmax_8bit=absmax_8bit,
                                                 absmax_code=code, absmax_offset=offset)
    return run


def test_past_1536_rows_the_weight_is_dequantized_for_the_matmul():
    # _gemm_4bit_custom_max_m = 1536: past it, _dequant_linear_fallback: the 8-bit absmax dequantized to fp32 and
    # the offset added (two fp32 tensors of BLOCKS), the [N, K] weight in the input's dtype, then F.linear's
    # [M, N] output; the function's locals freed in their order: the sum, the fp32 absmax, the weight.
    m = 2048
    events = cuda_trace(gemm(m), gpu("A10G"))[INPUTS:]
    absmax = 4 * BLOCKS
    assert events[:7] == [("alloc", absmax), ("alloc", absmax), ("alloc", 2 * N * K), ("alloc", 2 * m * N),
                          ("free", absmax), ("free", absmax), ("free", 2 * N * K)]


def test_a_few_rows_run_the_fused_kernel_without_a_dequantized_weight():
    # M <= _GEMM_4BIT_CUSTOM_FLOOR_M (4): the fused kernel on every GPU; a contiguous input is not copied.
    events = cuda_trace(gemm(4), gpu("A10G"))[INPUTS:]
    assert events[:1] == [("alloc", 2 * 4 * N)] and ("alloc", 2 * N * K) not in events
