"""The operands CUDA's matmuls copy before cuBLAS (predict/emulate/cublas_operands.py), worked out by hand from
prepare_matrix_for_cublas and prepare_batch_matrix_for_cublas (aten/src/ATen/native/cuda/Blas.cpp, torch 2.14)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from membench.predict import gpus
from membench.predict.emulate import fake
from membench.predict.emulate.cublas_operands import copied_operands, is_non_overlapping_and_dense
from membench.predict.emulate.kernels import CudaKernels
from membench.trackers.storage import StorageTracker

aten = torch.ops.aten


def copied(func, args, out) -> list[int]:
    """Which arguments (by position) func copies, in the order it copies them."""
    return [next(i for i, a in enumerate(args) if a is t) for t in copied_operands(func, args, out)]


def meta(shape, stride=None):
    t = torch.empty(shape, device="meta")
    return t if stride is None else t.as_strided(shape, stride)


def test_which_layouts_are_dense():
    assert is_non_overlapping_and_dense((4, 8), (8, 1)) and is_non_overlapping_and_dense((4, 8), (1, 4))
    assert is_non_overlapping_and_dense((1, 8), (0, 1))  # a size-1 dimension's stride does not matter
    assert not is_non_overlapping_and_dense((4, 8), (0, 0)) and not is_non_overlapping_and_dense((4, 8), (16, 1))


def test_matrix_operands():
    out = meta((8, 32))
    w = meta((32, 16))
    # Dense operands, transposed or not: kept.
    assert copied(aten.mm.default, (meta((8, 16)), w.t()), out) == []
    # A slice of a wider matrix (row stride 64 >= 16 columns, unit column stride): a valid leading dimension.
    assert copied(aten.mm.default, (meta((8, 16), (64, 1)), w.t()), out) == []
    # Every other column (stride 2): not unit-strided in either dimension: copied.
    strided = meta((8, 16), (32, 2))
    assert copied(aten.mm.default, (strided, w.t()), out) == [0]
    # A zero-stride expansion, as the gradient of a sum: copied.
    assert copied(aten.mm.default, (meta(()).expand(8, 32), w), meta((8, 16))) == [0]
    # addmm (a linear layer with bias): mat1 and mat2 are its second and third arguments; a fresh result is
    # contiguous, so the product is computed transposed: mat2 is prepared (and copied) before mat1.
    assert copied(aten.addmm.default, (meta((8,)), strided, strided.t()), meta((8, 8))) == [2, 1]


def test_batched_operands():
    # bmm [b, m, k] x [b, k, n] into a fresh [b, m, n]: computed transposed; a batch dimension of stride 0 is fine
    # (each matrix is unit-strided with a valid leading dimension), a zero-stride matrix is not.
    out = meta((4, 8, 32))
    assert copied(aten.bmm.default, (meta((4, 8, 16)), meta((1, 16, 32)).expand(4, 16, 32)), out) == []
    assert copied(aten.bmm.default, (meta(()).expand(4, 8, 16), meta((4, 16, 32))), out) == [0]
    assert copied(aten.bmm.default, (meta((4, 8, 16)), meta((4, 16, 32), (1024, 64, 2))), out) == [1]


def test_the_lm_heads_backward_copies_a_sum_gradient_twice():
    # logits = x @ W.T ([8, 16] x [16, 32]), loss = logits.sum(): the gradient is a [8, 32] expansion of one
    # number (strides 0, 0). Backward (autograd takes the weight's first): W's gradient mm(grad^T, x) (2,048 B)
    # copies grad^T (8 x 32 x 4 = 1,024 B) and lets it go when it returns; x's, mm(grad, W) (512 B), copies grad
    # again. The cuBLAS workspace is 0 B here, so none appears.
    gpu = gpus.gpu("H100")
    with fake.fake_tensors():
        for kernels, copies in ((CudaKernels(gpu, workspace_bytes=0), 2), (None, 0)):
            tracker = StorageTracker(trace=True)
            tracker.kernels = kernels
            with tracker:
                x = torch.empty(8, 16, requires_grad=True)
                w = torch.empty(32, 16, requires_grad=True)
                F.linear(x, w).sum().backward()
            sizes = {}
            events = []
            for e in tracker.trace:
                if e[0] == "alloc":
                    sizes[e[1]] = e[2]
                events.append(f"+{e[2]}" if e[0] == "alloc" else f"-{sizes.get(e[1], '?')}")
            # x, W, the logits, the sum (4 B; the logits, which nothing saves, let go), its gradient (4 B), then the
            # two matmuls
            after = ["+2048", "+1024", "-1024", "+512", "+1024", "-1024"] if copies else ["+2048", "+512"]
            assert events[:6 + len(after)] == ["+512", "+2048", "+1024", "+4", "-1024", "+4"] + after
