"""torch._foreach_norm's scratch on CUDA: what gradient clipping (torch.nn.utils.clip_grad_norm_, which takes one
_foreach_norm per device and dtype of the gradients) allocates that the CPU's kernel does not.

torch 2.14's fast path (aten/src/ATen/native/cuda/ForeachReduceOp.cu, foreach_tensor_norm_cuda_internal) takes
`output_per_tensor = at::zeros({ntensors * max_chunks_per_tensor}, opmath dtype)` from the caching allocator, one
partial norm per 65536-element chunk (kChunkSize, MultiTensorApply.cuh) of the longest tensor, before it makes the
0-dim outputs, and frees it when it returns. It is taken when every tensor is floating point (no integer, bool or
complex one), the order is 1, 2 or inf, and the list can use the fast route (one device and dtype, dense, not
overlapping); otherwise the slow path norms each tensor on its own (each a reduction, as on the CPU).
"""

from __future__ import annotations

import math

import torch

from membench.allocator.events import TraceEvent
from membench.predict.emulate.registry import OUTPUTS, Emulation, emulation

aten = torch.ops.aten
FOREACH_NORMS = frozenset({aten._foreach_norm.Scalar})
CHUNK = 65536  # kChunkSize


def _order(args, kwargs) -> float:
    ord_ = args[1] if len(args) > 1 else kwargs.get("ord", 2)
    return float(ord_)


def _dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense (c10's is_non_overlapping_and_dense): its strides, sorted, are those of a
    contiguous tensor of some permutation of its dims."""
    expected = 1
    for stride, size in sorted((st, n) for st, n in zip(t.stride(), t.shape, strict=True) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def foreach_norm_scratch(func, args, kwargs) -> int:
    """Bytes of `output_per_tensor` that this _foreach_norm call takes on CUDA; 0 where it takes none."""
    tensors = list(args[0]) if args else []
    if func not in FOREACH_NORMS or not tensors or not all(isinstance(t, torch.Tensor) for t in tensors):
        return 0
    if _order(args, kwargs) not in (1.0, 2.0, math.inf):
        return 0
    first = tensors[0]
    if any(t.dtype != first.dtype or t.device != first.device or not t.is_floating_point()
           or t.layout != torch.strided or not _dense(t) for t in tensors):
        return 0  # the slow path: one norm per tensor
    dtype = kwargs.get("dtype") or (args[2] if len(args) > 2 else None) or first.dtype
    opmath = torch.float64 if dtype == torch.float64 else torch.float32  # at::opmath_type: half and bf16 -> float
    chunks = max(-(-t.numel() // CHUNK) for t in tensors)
    return len(tensors) * chunks * opmath.itemsize


@emulation
class ForeachNorm(Emulation):
    """_foreach_norm's `output_per_tensor`, taken before its outputs are made and freed as it returns."""

    ops = FOREACH_NORMS
    order = 80
    outputs_amid = True

    def scratch(self, func, args, kwargs, out) -> list[TraceEvent]:
        size = foreach_norm_scratch(func, args, kwargs)
        if not size:
            return [OUTPUTS]
        return [TraceEvent.alloc("output_per_tensor", size), OUTPUTS, TraceEvent.free("output_per_tensor")]
