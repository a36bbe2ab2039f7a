"""Outputs whose dtype CUDA's kernel picks differently from the CPU's: a CUDA prediction makes them as CUDA does.

With 16-bit input, LayerNorm's CUDA kernel keeps the statistics it saves for backward (`mean`, `rstd`) in fp32, its
accumulation type (aten/src/ATen/native/cuda/layer_norm_kernel.cu, `layer_norm_cuda`: `at::empty({M},
X->options().dtype(acc_type))`, acc_type = `toAccumulateType(input, /*is_cuda=*/true)`); the CPU kernel, real or
fake, keeps them in the input's dtype: 4 bytes per token per LayerNorm missing from a prediction of a 16-bit model
before. BatchNorm's CUDA kernels likewise keep `save_mean` and `save_invstd` in fp32 (`batch_norm_cuda` in
Normalization.cu; cuDNN's path takes an fp32 weight with 16-bit input and keeps its statistics in the weight's
dtype).

Found by running every op of torch's OpInfo database (torch.testing._internal.common_methods_invocations.op_db, each
sample input in float16, bfloat16 and float32) under FakeTensorMode on device "cpu" and on device "cuda", which gives
CUDA's meta answer without a GPU, and comparing output dtypes and shapes (benchmarks/cuda_dtypes.py): with torch
2.14.1 only these ops differ. tests/test_cuda_dtypes.py checks each rewrite against torch's own CUDA fake kernel.
"""

from __future__ import annotations

import torch

from membench.predict.emulate.registry import Emulation, emulation
from membench.private import per_op

aten = torch.ops.aten
HALF = (torch.float16, torch.bfloat16)
# op -> the positions of its outputs that CUDA keeps in fp32 under 16-bit input (its statistics)
FP32_STATS = {
    "native_layer_norm.default": (1, 2),
    "native_batch_norm.default": (1, 2),
    "_native_batch_norm_legit.default": (1, 2),
    "_native_batch_norm_legit.no_stats": (1, 2),
    "_batch_norm_with_update.default": (1, 2),
}


def _op(name: str):
    base, _, overload = name.partition(".")
    packet = getattr(aten, base, None)
    return getattr(packet, overload, None) if packet is not None else None


_BY_OP = {op: positions for name, positions in FP32_STATS.items() if (op := _op(name)) is not None}
FP32_OPS = frozenset(_BY_OP)  # the ops CudaDtypes.rewrite may replace


@per_op
def _fp32_outputs(op) -> tuple[int, ...]:
    return _BY_OP.get(op, ())


@emulation
class CudaDtypes(Emulation):
    """The op a CUDA prediction runs instead of one whose outputs CUDA makes in another dtype."""

    ops = FP32_OPS
    order = 40

    def __init__(self, gpu):
        super().__init__(gpu)
        self._wrapped: dict = {}

    def rewrite(self, func, args, kwargs):
        positions = _fp32_outputs(func)
        if not positions or not args or not isinstance(args[0], torch.Tensor) or args[0].dtype not in HALF:
            return func
        wrapped = self._wrapped.get(func)
        if wrapped is None:
            wrapped = self._wrapped[func] = _with_fp32_outputs(func, positions)
        return wrapped


def _with_fp32_outputs(func, positions: tuple[int, ...]):
    """func, with the outputs at `positions` made again in fp32 (same shape and strides): the CPU kernel's are
    dropped before anything counts them."""

    def run(*args, **kwargs):
        out = list(func(*args, **kwargs))
        for i in positions:
            t = out[i]
            out[i] = torch.empty_strided(t.shape, t.stride(), dtype=torch.float32, device=t.device)
        return tuple(out)

    run.__name__ = f"{func}_cuda_fp32_stats"
    return run
