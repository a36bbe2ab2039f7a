"""Dropout as a CUDA GPU runs it, on CPU fake tensors.

What dropout keeps for backward depends on the device (aten/src/ATen/native/Dropout.cpp): on CUDA (and XPU) a
training dropout with 0 < p < 1 runs the fused `native_dropout`, which keeps a boolean mask, one byte per element.
On CPU it runs `_dropout_impl`: a noise tensor of the input's size and dtype (bernoulli_, then divided by 1 - p),
multiplied into the input and kept for backward, four bytes per element in fp32, two in fp16. A prediction for a
CUDA GPU runs on CPU fake tensors, so without this it keeps the CPU's noise: for an attention dropout (batch x heads
x queries x keys) that is three extra bytes per element, in every layer.

While `cuda_dropout()` is active, a training dropout that CUDA would fuse runs `native_dropout` on the fake CPU
tensors (whose CPU kernel also returns a boolean mask), so it keeps what CUDA keeps. In-place dropout, dropout out
of training or with p of 0 or 1, and the feature dropouts (dropout2d, ...) run as before: CUDA runs those through
the same unfused path as the CPU.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

# F.dropout(input, p, training, inplace) (what nn.Dropout calls) and torch.dropout(input, p, train): the names of
# their arguments after the input, as (p, training, inplace), with their defaults.
_DROPOUTS = {F.dropout: (("p", 0.5), ("training", True), ("inplace", False)),
             torch.dropout: (("p", None), ("train", None), (None, False))}


class _FusedDropout(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        names = _DROPOUTS.get(func)
        if names is not None and args:
            input, *rest = args
            given = {name: default for name, default in names} | dict(zip([n for n, _ in names], rest)) | kwargs
            p, train, inplace = (given[name] for name, _ in names)
            # Dropout.cpp's is_fused_kernel_acceptable, for a CUDA tensor; and not in place (dropout_ is unfused).
            if train and 0 < p < 1 and not inplace and input.numel() > 0:
                return torch.native_dropout(input, p, True)[0]
        return func(*args, **kwargs)


@contextlib.contextmanager
def cuda_dropout():
    """While active, a training dropout keeps a boolean mask, as CUDA's fused dropout does."""
    with _FusedDropout():
        yield
