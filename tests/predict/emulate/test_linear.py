"""nn.Linear's bias added as a plain CUDA run adds it (predict/emulate/linear.py), worked out by hand from `linear`
in aten/src/ATen/native/Linear.cpp (torch 2.14)."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

from membench.predict import gpus
from membench.predict.emulate import fake
from membench.predict.emulate.kernels import CudaKernels
from membench.predict.emulate.linear import CudaLinear
from membench.private import composite_kernel_replaced
from membench.trackers.storage import StorageTracker

L, B, E = 65, 4, 384  # vit-small's in-projection: [L, B, E] in, packed q, k, v [L, B, 3E] out


def events(step, plain: bool) -> list[str]:
    """The allocations (+bytes) and frees (-bytes) `step` makes on fake tensors, as a CUDA prediction sees them (no
    cuBLAS workspace), with or without the plain run's linear."""
    plain_linear = composite_kernel_replaced("linear", CudaLinear(None).kernel) if plain else contextlib.nullcontext()
    with fake.fake_tensors(), plain_linear:
        tracker = StorageTracker(trace=True)
        tracker.kernels = CudaKernels(gpus.gpu("H200"), workspace_bytes=0, lt_workspace_bytes=0)
        with tracker:
            x = torch.empty(B, L, E)
            w = torch.empty(3 * E, E, requires_grad=True)
            b = torch.empty(3 * E, requires_grad=True)
            out = step(x, w, b)
            made = len(tracker.trace)  # what the step made, to its return
            del out
    sizes, seen = {}, []
    for e in tracker.trace[:made]:
        if e[0] == "alloc":
            sizes[e[1]] = e[2]
        seen.append(f"+{e[2]}" if e[0] == "alloc" else f"-{sizes[e[1]]}")
    assert seen[:3] == [f"+{B * L * E * 4}", f"+{3 * E * E * 4}", f"+{3 * E * 4}"]  # x, the weight, the bias
    return seen[3:]


def test_the_transposed_in_projection_adds_its_bias_in_place():
    # nn.MultiheadAttention's in-projection gets the query as [L, B, E] (a transpose of the batch-first input): not
    # contiguous, so linear goes through matmul, which folds it to [L * B, E] (a copy: 399,360 B, as weight needs
    # a gradient) and multiplies (the [L * B, 3E] product: 1,198,080 B). A plain run then adds the bias in place;
    # under a dispatch mode `add` is out of place: a second 1,198,080 B, the product let go as it returns.
    transposed = lambda x, w, b: F.linear(x.transpose(1, 0), w, b)  # noqa: E731
    assert events(transposed, plain=True) == ["+399360", "+1198080"]
    assert events(transposed, plain=False) == ["+399360", "+1198080", "+1198080", "-1198080"]


@pytest.mark.parametrize("step", [
    lambda x, w, b: F.linear(x, w, b),  # contiguous 3-D: flattened, addmm: the output alone
    lambda x, w, b: F.linear(x[0], w, b),  # 2-D: addmm
    lambda x, w, b: F.linear(x.transpose(1, 0), w),  # no bias: matmul (the fold's copy, the product)
], ids=["contiguous-3d", "2d", "no-bias"])
def test_the_other_paths_are_torchs_own(step):
    assert events(step, plain=True) == events(step, plain=False)


def test_values_and_gradients_are_torchs():
    # On real tensors the replacement computes what torch's linear does, on every path, gradients included.
    torch.manual_seed(0)
    x = torch.randn(B, 5, 8)
    w, b = torch.randn(6, 8, requires_grad=True), torch.randn(6, requires_grad=True)
    for args in ((x.transpose(1, 0), w, b), (x, w, b), (x[0], w, b), (x.transpose(1, 0), w, None),
                 (x.transpose(1, 0)[..., None, :], w, b)):
        expected = F.linear(*args)
        grads = torch.autograd.grad(expected.sum(), [w])
        with composite_kernel_replaced("linear", CudaLinear(None).kernel):
            got = F.linear(*args)
            got_grads = torch.autograd.grad(got.sum(), [w])
        assert torch.allclose(got, expected) and torch.allclose(got_grads[0], grads[0])
