"""Dropout as a CUDA GPU runs it, on CPU fake tensors.

What dropout keeps for backward depends on the device (aten/src/ATen/native/Dropout.cpp): on CUDA (and XPU) a
training dropout with 0 < p < 1 runs the fused `native_dropout`, which keeps a boolean mask, one byte per element.
On CPU it runs `_dropout_impl`: a noise tensor of the input's size and dtype (bernoulli_, then divided by 1 - p),
multiplied into the input and kept for backward, four bytes per element in fp32, two in fp16. A prediction for a
CUDA GPU runs on CPU fake tensors, so without this it keeps the CPU's noise: for an attention dropout (batch x heads
x queries x keys) that is three extra bytes per element, in every layer.

While a CUDA prediction runs (`CudaDropout`), `aten::dropout` (what nn.Dropout, F.dropout and torch.dropout reach) runs
Dropout.cpp's `dropout` as it runs for a CUDA tensor: `native_dropout` where the fused kernel is acceptable (whose
CPU kernel also returns a boolean mask), the unfused path otherwise. It is registered at the dispatcher (replacing
the op's CompositeImplicitAutograd kernel), not as a torch function mode, so it also holds where a mode would be
off: in backward, where checkpointing recomputes the forward. In-place dropout (`dropout_`, unfused on CUDA too)
and the feature dropouts (dropout2d, ...) are left as they are.

CUDA's `native_dropout` allocates its mask before its output (aten/src/ATen/native/cuda/Dropout.cu, `dropout_cuda`:
`mask = at::empty_like(self, ...bool)`, then `ret = at::empty_like(self)`), where the fake kernel makes the output
first; a CUDA prediction counts them in CUDA's order (`CudaDropout.after`), which decides which
cached blocks each one takes (the hf:gpt2 trace in results/gpu-traces/ shows each dropout's mask before its output).
Only in training with p < 1: the shortcuts for train=False (a clone, then a mask of ones) and p == 1 (zeros, then a
mask of zeros) make the output first, as the fake kernel does.
"""

from __future__ import annotations

import torch

from membench.predict.emulate.registry import Emulation, emulation


def _dropout(input: torch.Tensor, p: float, train: bool) -> torch.Tensor:
    # Dropout.cpp, torch 2.14: is_fused_kernel_acceptable (for a CUDA tensor), else _dropout_impl.
    if train and 0 < p < 1 and input.numel() > 0:
        return torch.native_dropout(input, p, True)[0]
    if p == 0 or not train or input.numel() == 0:
        return input
    return input * torch.zeros((), dtype=input.dtype, device=input.device)  # p == 1


@emulation
class CudaDropout(Emulation):
    """aten::dropout as CUDA runs it (the fused kernel's one-byte mask), and native_dropout's mask counted before
    its output, as Dropout.cu allocates them."""

    ops = frozenset({torch.ops.aten.native_dropout.default})
    order = 50
    composite = "dropout"

    def kernel(self, input: torch.Tensor, p: float, train: bool) -> torch.Tensor:
        return _dropout(input, p, train)

    def after(self, func, args, kwargs, out, tracker) -> None:
        if not isinstance(out, tuple) or len(out) != 2:
            return
        p = args[1] if len(args) > 1 else None
        train = args[2] if len(args) > 2 else None
        if train is False or p == 1:
            return
        tracker.track(out[1])
