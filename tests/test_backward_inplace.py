"""Backward formulas that go out of place under a dispatch mode (trackers/subclass_like.py): the storage tracker
counts what a plain run allocates, derived by hand from torch's formulas (FunctionsManual.cpp)."""

from __future__ import annotations

import torch

from membench.trackers import fake
from membench.trackers.storage import StorageTracker

N, V = 64, 1000
FULL = N * V * 4  # one fp32 (64, 1000) tensor: 256,000 bytes


def _backward_peak(reduce) -> tuple[int, int]:
    """(peak live bytes during backward, live bytes just before it) of reduce(x).sum().backward() on fake x."""
    with fake.fake_tensors():
        tracker = StorageTracker()
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
