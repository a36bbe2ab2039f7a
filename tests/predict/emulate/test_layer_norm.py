"""CUDA LayerNorm's contiguous copies (predict/emulate/layer_norm.py), worked out by hand from layer_norm_cuda and
layer_norm_backward_cuda (aten/src/ATen/native/cuda/layer_norm_kernel.cu): `expect_contiguous()` of the input
(and weight, bias) before the outputs, freed as the function returns; backward's `dY.contiguous()` after them."""

from __future__ import annotations

import torch
from torch import nn

from membench.predict.emulate import fake
from membench.predict.emulate.kernels import CudaKernels
from membench.predict.gpus import gpu
from membench.trackers.storage import StorageTracker
from tests.helpers import sized_events

aten = torch.ops.aten
X = 4 * 8 * 16 * 4  # an fp32 [4, 8, 16] input (or output, or gradient): 2,048 B
STAT = 4 * 8 * 4  # mean, rstd: one fp32 per row, 32 rows
W = 16 * 4  # weight, bias


def _events(run):
    tracker = StorageTracker(trace=True)
    tracker.kernels = CudaKernels(gpu("H100"))
    with fake.fake_tensors():
        x = torch.empty(8, 4, 16).transpose(0, 1)  # [4, 8, 16], not contiguous
        w = torch.empty(16)
        op, args = run(x, w)
        with tracker:
            out = op(*args)
        del out
    return sized_events(tracker.trace)


def test_a_non_contiguous_input_is_copied_before_the_outputs_and_freed_after_them():
    order = _events(lambda x, w: (aten.native_layer_norm.default, (x, [16], w, w, 1e-5)))
    assert order[:5] == [("alloc", X), ("alloc", X), ("alloc", STAT), ("alloc", STAT), ("free", X)]


def test_a_contiguous_input_is_not_copied():
    order = _events(lambda x, w: (aten.native_layer_norm.default, (x.contiguous(), [16], w, w, 1e-5)))
    assert [e for e in order if e[0] == "alloc"] == [("alloc", X), ("alloc", STAT), ("alloc", STAT)]


def test_backward_copies_the_input_then_the_output_gradient_after_its_outputs():
    """Input's copy, dX, dgamma, dbeta, the output gradient's copy (freed at once), then the input's copy freed."""
    def run(x, w):
        mean, rstd = torch.empty(4, 8, 1), torch.empty(4, 8, 1)
        grad = torch.empty(8, 4, 16).transpose(0, 1)
        return aten.native_layer_norm_backward.default, (grad, x, [16], mean, rstd, w, w, [True, True, True])
    order = _events(run)
    assert order[:7] == [("alloc", X), ("alloc", X), ("alloc", W), ("alloc", W), ("alloc", X), ("free", X),
                          ("free", X)]


def test_a_residual_sum_after_batch_first_attention_reaches_layer_norm_permuted():
    """Why ViT's LayerNorms copy: the sum's output follows its first operand's (transposed) strides, on fake tensors
    as on CUDA."""
    with fake.fake_tensors():
        mha = nn.MultiheadAttention(16, 2, batch_first=True)
        x = torch.randn(4, 8, 16)
        y, _ = mha(x, x, x, need_weights=False)
        assert not (y + x).is_contiguous()
