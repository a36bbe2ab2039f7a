"""bitsandbytes' 4-bit matmul (qlora's base weights) as its CUDA kernel runs it, on CPU fake tensors.

Every op of a 4-bit layer's step but one allocates on fake tensors what it allocates on CUDA: bitsandbytes registers
a fake implementation of each (bitsandbytes/_ops.py, 0.50.2), and its CUDA kernels (backends/cuda/ops.py) make
exactly those outputs: `quantize_4bit` the packed weight and the absmax, `quantize_blockwise` the nested absmax,
`dequantize_4bit` and `dequantize_blockwise` (backward's `F.dequantize_4bit`: the nested absmax in fp32, then the
[N, K] weight in the dtype it was quantized from, freed after the input gradient's matmul).

The one that differs is `gemm_4bit`, the forward's matmul (`MatMul4Bit.forward`, and `matmul_4bit` where no
gradient is needed). Its fake makes the output only. Its CUDA kernel (the `bitsandbytes::gemm_4bit` CUDA kernel,
backends/cuda/ops.py, 0.50.2) runs bitsandbytes' fused kernel only for M = A.numel() / K of at most 1536 rows, K a
multiple of the block size, and where `_gemm_4bit_use_custom_cuda` (per architecture and SM count, M, N and K)
says the fused kernel wins; otherwise `_dequant_linear_fallback`, which allocates in this order:

1. with double quantization, the absmax dequantized to fp32 (`empty_like(absmax_8bit, float32)`), then that plus
   the offset (a second fp32 tensor of the same size);
2. the whole weight dequantized, [N, K] in the input's dtype (`B_dq`);
3. `F.linear(A, B_dq, bias)`: its output, and the cuBLAS handle's workspace on the thread's first matmul;

and frees them as the function returns, in the order of its local variables: the offset sum, the fp32 absmax, the
dequantized weight. The fused kernel makes a contiguous copy of a non-contiguous input first (`A.contiguous()`),
held until it returns.

So every forward 4-bit matmul of a training step at more than 1536 tokens holds one dequantized weight for a moment,
and each backward one holds its own (the fake ops above). The choice is bitsandbytes' own function, called with the
target GPU's SM count and compute capability in place of the device it would ask.
"""

from __future__ import annotations

import contextlib
import math

import torch

from membench.predict.emulate.registry import ALL_OPS, Emulation, emulation

DEQUANT_MODULE = "(bitsandbytes dequantized weight)"
CUSTOM_MAX_M = 1536  # _gemm_4bit_custom_max_m on CUDA (not ROCm), bitsandbytes 0.50.2


def is_gemm_4bit(func) -> bool:
    """The op this module acts on (bitsandbytes need not be installed: matched by name)."""
    return getattr(func, "namespace", None) == "bitsandbytes" and func.__name__.startswith("gemm_4bit")


@contextlib.contextmanager
def _dispatch_props(ops, gpu):
    """bitsandbytes' per-device properties (SMs, compute capability) answered for the target GPU."""
    asked = ops._gpu_dispatch_props
    major, minor = gpu.compute_capability
    ops._gpu_dispatch_props = lambda index: (gpu.sm_count, major, minor)
    try:
        yield
    finally:
        ops._gpu_dispatch_props = asked


def fused_kernel(gpu, dtype: torch.dtype, m: int, n: int, k: int, blocksize: int) -> bool:
    """Whether the CUDA kernel runs bitsandbytes' fused 4-bit GEMM (True) or dequantizes the weight and calls
    F.linear (False), as its dispatch decides on `gpu`."""
    if m > CUSTOM_MAX_M or k % blocksize != 0:
        return False
    from bitsandbytes.backends.cuda import ops  # its heuristic, uncached (the cache is keyed by device index)

    with _dispatch_props(ops, gpu):
        return bool(ops._gemm_4bit_use_custom_cuda.__wrapped__(0, dtype, m, n, k))


@emulation
class Bnb4bitKernels(Emulation):
    """bitsandbytes' gemm_4bit as its CUDA kernel runs it. Its ops exist only once bitsandbytes is imported (a qlora
    stack imports it), so it acts on every op and matches them by name."""

    ops = ALL_OPS

    def after(self, func, args, kwargs, out, tracker) -> None:
        if not is_gemm_4bit(func):
            return
        a, _, shape_b, absmax, blocksize = args[:5]
        kwargs = kwargs or {}
        absmax_8bit = kwargs.get("absmax_8bit", args[7] if len(args) > 7 else None)
        k = a.shape[-1]
        m, n = a.numel() // k, shape_b[0]
        live: list[torch.Tensor] = []
        if fused_kernel(self.gpu, a.dtype, m, n, k, blocksize):
            if not a.is_contiguous():
                live.append(self._scratch(a.numel() * a.element_size(), tracker))
            tracker.track_outputs(out)
        else:
            if absmax_8bit is not None:
                nested = absmax_8bit.numel() * 4  # fp32
                live += [self._scratch(nested, tracker), self._scratch(nested, tracker)]
            weight = self._scratch(math.prod(shape_b) * a.element_size(), tracker)
            tracker.track_outputs(out)
            kernels = getattr(tracker, "kernels", None)  # the fallback's F.linear is a cuBLAS matmul
            if kernels is not None:
                kernels.workspaces.matmul_ran(tracker)
            live = [*live[1:], *live[:1], weight]  # freed as the function's locals are: the sum, the fp32 absmax
        while live:
            del live[0]  # its storage's last reference: the tracker sees it freed now

    @staticmethod
    def _scratch(nbytes: int, tracker) -> torch.Tensor:
        t = torch.empty(nbytes, dtype=torch.uint8)
        tracker.track(t, None, DEQUANT_MODULE)  # the phase's category, as the backward's dequantized weight
        return t
