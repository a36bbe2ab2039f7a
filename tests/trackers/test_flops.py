"""Counting a step's FLOPs: torch's counter, and a counter that cannot count an op leaves the run standing (torch
2.11's attention formula asserted on grouped-query attention through cuDNN and ended a Llama run on an H200)."""

from __future__ import annotations

import torch
from torch.utils import flop_counter

from membench.trackers.timing import count_flops


def test_a_matmul_is_counted():
    a, b = torch.randn(4, 8), torch.randn(8, 16)
    assert count_flops(lambda: a @ b) == (2 * 4 * 8 * 16, None)


def test_a_counter_that_raises_gives_no_count_and_says_why(monkeypatch):
    def refuses(*args, **kwargs):
        raise AssertionError("sdpa_flop_count: query/key/value shapes are incompatible")

    monkeypatch.setitem(flop_counter.flop_registry, torch.ops.aten.mm, refuses)
    a, b = torch.randn(4, 8), torch.randn(8, 16)
    flops, why = count_flops(lambda: a @ b)
    assert flops is None
    assert why == "torch's FLOP counter raised AssertionError: sdpa_flop_count: query/key/value shapes are incompatible"
