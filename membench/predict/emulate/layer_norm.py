"""The contiguous copies CUDA's LayerNorm makes of what it reads, on CPU fake tensors.

CUDA's LayerNorm kernels read their tensors as dense rows, so ATen's CUDA entry points make each one contiguous
first (aten/src/ATen/native/cuda/layer_norm_kernel.cu, torch 2.11 to 2.14):

- `layer_norm_cuda` (native_layer_norm): `X = input.expect_contiguous()`, then `weight`'s and `bias`'s, before it
  allocates its outputs (Y, mean, rstd); the copies are its locals, destroyed as it returns (bias's, weight's,
  input's).
- `layer_norm_backward_cuda` (native_layer_norm_backward): the same three copies before its outputs (dX, dgamma,
  dbeta); then `LayerNormBackwardKernelImpl` passes `dY.contiguous()`, a temporary of that call, freed as it
  returns, before the function's own copies.

`expect_contiguous` copies only a tensor that is not contiguous, and makes nothing for a fake tensor's meta
kernel, so a prediction misses these. They arise where LayerNorm reads a permuted tensor: a residual sum whose
first operand is nn.MultiheadAttention's batch-first output (a transposed view) keeps that layout
(TensorIterator follows its first operand's strides), so torchvision's ViT gives every LayerNorm after the first a
non-contiguous input. The vit_b_16 traces in results/gpu-traces/ (torch 2.11) allocate an input-sized copy before
each such LayerNorm's output and free it after rstd, forward and backward.
"""

from __future__ import annotations

import torch

from membench.common.vocab import OTHER
from membench.predict.emulate.registry import Emulation, emulation

aten = torch.ops.aten
COPY_MODULE = "(layer_norm contiguous copy)"


def _needs_copy(t) -> bool:
    return isinstance(t, torch.Tensor) and not t.is_contiguous()


def _copy(t: torch.Tensor, tracker) -> torch.Tensor:
    copy = torch.empty(t.numel() * t.element_size(), dtype=torch.uint8)
    tracker.track(copy, OTHER, COPY_MODULE)
    return copy


@emulation
class LayerNormCopies(Emulation):
    """After a CUDA prediction's native_layer_norm or its backward: its copies allocated before its outputs (which
    this counts), and freed in the kernel's order."""

    ops = frozenset({aten.native_layer_norm.default, aten.native_layer_norm_backward.default})
    order = 60

    def after(self, func, args, kwargs, out, tracker) -> None:
        layer_norm_copies(func, args, kwargs, out, tracker)


def layer_norm_copies(func, args, kwargs, out, tracker) -> None:
    """The copies of one call (see LayerNormCopies)."""
    if func is aten.native_layer_norm.default:
        read = [_arg(args, kwargs, i, name) for i, name in ((0, "input"), (2, "weight"), (3, "bias"))]
        grad_out = None
    elif func is aten.native_layer_norm_backward.default:
        read = [_arg(args, kwargs, i, name) for i, name in ((1, "input"), (5, "weight"), (6, "bias"))]
        grad_out = _arg(args, kwargs, 0, "grad_out")
    else:
        return
    if not any(map(_needs_copy, (*read, grad_out))):
        return
    copies = [_copy(t, tracker) for t in read if _needs_copy(t)]
    tracker.track_outputs(out)  # allocated after the copies
    if _needs_copy(grad_out):
        temporary = _copy(grad_out, tracker)
        del temporary  # dY.contiguous(), freed as LayerNormBackwardKernelImpl returns
    while copies:
        copies.pop()  # the function's locals, destroyed last declared first


def _arg(args, kwargs, index: int, name: str):
    return args[index] if len(args) > index else (kwargs or {}).get(name)
