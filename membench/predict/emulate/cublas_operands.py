"""The operand copies CUDA's matmuls make before calling cuBLAS, on CPU fake tensors.

cuBLAS reads a matrix in column-major order with a leading dimension, so ATen hands it a tensor that is dense, or
unit-strided in one dimension with a valid leading dimension in the other; any other operand is first copied to
a contiguous tensor (aten/src/ATen/native/cuda/Blas.cpp, torch 2.14):

- `mm`, `addmm`, `_addmm_activation` (cublasCommonArgs): the result decides the order (a fresh, contiguous result
  has the product computed transposed, so mat2 is prepared first, then mat1); `prepare_matrix_for_cublas` keeps an
  operand that is non-overlapping and dense, or has stride 1 in one dimension and a stride of at least
  max(1, the other dimension's size) in the other, and otherwise clones it (`MemoryFormat::Contiguous`).
- `bmm`, `baddbmm` (baddbmm_out_cuda_impl): `prepare_batch_matrix_for_cublas` keeps an operand unit-strided in the
  fast dimension with a leading stride of at least max(1, its rows), or the transposed case, or a contiguous one
  with non-zero row and column strides; otherwise it clones it.

The copies are allocated after the output (a structured op's output exists before its kernel runs) and before
cuBLAS asks for its handle (so before a thread's first workspace), and freed when the matmul returns. For example
the gradient `logits.sum()` sends back is a zero-stride expansion: the LM head's backward then copies it twice, a
logits-sized tensor each time, once for the input's gradient and once for the weight's. A CPU prediction never sees
them: fake tensors run meta kernels, which make outputs only. Tested by hand in
tests/predict/emulate/test_cublas_operands.py.
"""

from __future__ import annotations

import torch

from membench.common.vocab import OTHER

aten = torch.ops.aten
COPY_MODULE = "(cuBLAS operand copy)"
MATRIX_OPS = frozenset({aten.mm.default, aten.addmm.default, aten._addmm_activation.default})
BATCH_OPS = frozenset({aten.bmm.default, aten.baddbmm.default})


def is_non_overlapping_and_dense(shape, stride) -> bool:
    """c10's compute_non_overlapping_and_dense: some order of the dimensions (size-1 ones aside) is contiguous."""
    if len(shape) == 1:
        return shape[0] < 2 or stride[0] == 1
    order = sorted((d for d in range(len(shape)) if shape[d] >= 2), key=lambda d: stride[d])
    expected = 1
    for d in order:
        if stride[d] != expected:
            return False
        expected *= shape[d]
    return True


def _matrix_copied(t: torch.Tensor) -> bool:
    """prepare_matrix_for_cublas: whether a 2-D operand is cloned."""
    if is_non_overlapping_and_dense(t.shape, t.stride()):
        return False
    (rows, cols), (s0, s1) = t.shape, t.stride()
    return not ((s0 == 1 and s1 >= max(1, rows)) or (s1 == 1 and s0 >= max(1, cols)))


def _batch_copied(t: torch.Tensor, transpose_result: bool, m: int, n: int) -> bool:
    """prepare_batch_matrix_for_cublas: whether a 3-D operand is cloned."""
    fast, lead = (2, 1) if transpose_result else (1, 2)
    s = t.stride()
    if (s[fast] == 1 and s[lead] >= max(1, m)) or (s[lead] == 1 and s[fast] >= max(1, n)):
        return False
    return not (t.is_contiguous() and s[1] != 0 and s[2] != 0)


def copied_operands(func, args, out) -> list[torch.Tensor]:
    """The operands `func` clones before cuBLAS runs, in the order it clones them."""
    if func in MATRIX_OPS:
        mat1, mat2 = (args[0], args[1]) if func is aten.mm.default else (args[1], args[2])
        transpose_result = out.is_contiguous()  # prepare_matrix_for_cublas(result): a fresh result is dense
        first, second = (mat2, mat1) if transpose_result else (mat1, mat2)
        return [t for t in (first, second) if _matrix_copied(t)]
    if func in BATCH_OPS:
        batch1, batch2 = (args[0], args[1]) if func is aten.bmm.default else (args[1], args[2])
        sizes, strides = out.shape, out.stride()
        transpose_result = not (strides[1] == 1 and (sizes[2] == 1 or strides[2] >= max(1, sizes[1])))
        lead = 1 if transpose_result else 2
        m, n = sizes[2 if transpose_result else 1], sizes[lead]
        k = (batch2 if transpose_result else batch1).shape[lead]
        first, second = (batch2, batch1) if transpose_result else (batch1, batch2)
        operands = ((first, m, k), (second, k, n))
        return [t for t, rows, cols in operands if _batch_copied(t, transpose_result, rows, cols)]
    return []


def operand_copies(func, args, out, tracker) -> list[torch.Tensor]:
    """Allocates the clones through the tracker; the caller lets go of the list when the matmul returns."""
    if func not in MATRIX_OPS and func not in BATCH_OPS:
        return []
    copies = []
    for t in copied_operands(func, args, out):
        copy = torch.empty(t.numel() * t.element_size(), dtype=torch.uint8)
        tracker.track(copy, OTHER, COPY_MODULE)
        copies.append(copy)
    return copies
