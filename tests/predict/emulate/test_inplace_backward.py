"""Backward paths that go out of place under a dispatch mode (predict/emulate/inplace_backward.py): in a CUDA
prediction the storage tracker counts what a plain run allocates, derived by hand from torch's formulas
(FunctionsManual.cpp) and the autograd engine's gradient sums (input_buffer.cpp)."""

from __future__ import annotations

import torch

from membench.predict import gpus
from membench.predict.emulate import fake
from membench.predict.emulate.kernels import CudaKernels
from membench.trackers.storage import StorageTracker

N, V = 64, 1000
FULL = N * V * 4  # one fp32 (64, 1000) tensor: 256,000 bytes


def _backward_peak(reduce, cuda: bool = True) -> tuple[int, int]:
    """(peak live bytes during backward, live bytes just before it) of reduce(x).sum().backward() on fake x, in a
    CUDA prediction (the tracker's CUDA hook, here with no cuBLAS workspace) or a CPU one."""
    with fake.fake_tensors():
        tracker = StorageTracker()
        if cuda:
            tracker.kernels = CudaKernels(gpus.gpu("H100"), workspace_bytes=0)
        with tracker:
            x = torch.randn(N, V, requires_grad=True)
            loss = reduce(x).sum()
            before = tracker.current
            tracker.reset_peak()
            loss.backward()
        assert x.grad.shape == (N, V)
        return tracker.peak.bytes, before


def test_gather_backward_scatters_into_its_zeros_in_place():
    index = None

    def gather(x):
        nonlocal index
        index = torch.zeros(N, 1, dtype=torch.long)  # 512 bytes, made before the loss
        return x.gather(-1, index)

    peak, before = _backward_peak(gather)
    # gather_backward: zeros of x's size (the gradient, kept as x.grad by AccumulateGrad), scattered into in place;
    # plus the loss's gradient (4 bytes). Out of place (what the dispatch mode made torch run) would hold a
    # second FULL while the zeros are alive.
    assert peak == before + FULL + 4


def test_max_along_a_dim_backward_scatters_into_its_zeros_in_place():
    peak, before = _backward_peak(lambda x: x.max(-1, keepdim=True).values)
    # value_selecting_reduction_backward: zeros of x's size, scatter_ in place; the loss's gradient (4 bytes).
    assert peak == before + FULL + 4


def test_the_engine_sums_two_gradients_of_one_tensor_in_place():
    # y feeds two nodes (y * 3, y * 5): their gradients (each FULL) meet in y's input buffer, which a plain run
    # sums into the first in place. Out of place (what the dispatch mode made the engine do) would hold a third
    # FULL for a moment.
    peak, before = _backward_peak(lambda x: (lambda y: y * 3 + y * 5)(x.exp()))
    # While the second gradient is made: both gradients, and the loss's gradient (4 bytes) its input expands.
    assert peak == before + 2 * FULL + 4


def test_a_permuted_gradient_is_summed_in_place_too():
    # The gradients reaching y are y's size in permuted order (grad * w follows w's layout): dense, not contiguous,
    # not views, which the engine sums in place as well.
    kept = []

    def mul_twice(x):
        y = x.exp()
        w3, w5 = torch.randn(V, N).t(), torch.randn(V, N).t()  # no gradient: (64, 1000) in (1, 64) strides
        kept.extend((w3, w5))  # alive through backward (counted before it), so only gradients come and go
        return y * w3 + y * w5

    peak, before = _backward_peak(mul_twice)
    # Both gradients, the loss's gradient; then x's gradient (grad * exp(x), permuted too) copied into x's own
    # layout (AccumulateGrad's layout contract) while the summed one is alive: 2 FULL again, not more.
    assert peak == before + 2 * FULL + 4


def test_a_gradient_from_a_formula_of_several_outputs_is_summed_in_place_too():
    # y feeds y * 5 and layer_norm(y) * 3; the second branch was made last, so backward runs it first: y's buffer
    # first holds LayerNorm's input gradient, one of the three tensors native_layer_norm_backward returns, then y * 5's
    # gradient arrives and the engine sums into the first in place (it holds the only reference). Peak: LayerNorm's
    # output gradient and input gradient (FULL each) while its backward runs, then y's two gradients, and the
    # loss's 4 B gradient. Summed out of place (the prediction did, not counting a several-output formula's gradient
    # as the engine's) it held a third FULL for a moment, where an H200's vit_b_16 trace shows none.
    peak, before = _backward_peak(lambda x: (lambda y: y * 5 + torch.nn.functional.layer_norm(y, (V,)) * 3)(x.exp()))
    assert peak == before + 2 * FULL + 4


def test_a_gradient_that_is_a_view_is_summed_out_of_place_as_the_engine_does():
    # Through y.t(): the gradient reaching y is a view whose base keeps the storage shared (storage use count 2),
    # which the engine does not steal: the sum is a new tensor, a third FULL while both are alive.
    peak, before = _backward_peak(lambda x: (lambda y: y.t() * 3 + y.t() * 5)(x.exp()))
    assert peak == before + 3 * FULL + 4


def test_a_cpu_prediction_keeps_the_paths_the_cpu_tracker_measures():
    # `membench run --device cpu` measures with the tracker on, which takes the out-of-place paths: a CPU
    # prediction reproduces that measurement, so it keeps them (one FULL more in each case above).
    peak, before = _backward_peak(lambda x: x.max(-1, keepdim=True).values, cuda=False)
    assert peak == before + 2 * FULL + 4
    peak, before = _backward_peak(lambda x: (lambda y: y * 3 + y * 5)(x.exp()), cuda=False)
    assert peak == before + 3 * FULL + 4
