"""Grouped-query attention's FLOPs where torch's formula asserts equal heads (torch before 2.12: sdpa_flop_count):
the key's and value's heads broadcast to the query's, as the kernel computes them, instead of an error that would
end the whole prediction (the accuracy gate caught it on the H200's Llama-shape runs under torch 2.11)."""

from __future__ import annotations

import torch
from torch.utils.flop_counter import sdpa_flop_count

from membench.predict.time import ops


def test_key_and_value_heads_are_broadcast_to_the_querys(monkeypatch):
    packet = torch.ops.aten._scaled_dot_product_efficient_attention

    def strict(query, key, value, *args, out_val=None, **kwargs):  # torch 2.11's formula: heads must be equal
        return sdpa_flop_count(torch.Size(query.shape if isinstance(query, torch.Tensor) else query),
                               torch.Size(key.shape if isinstance(key, torch.Tensor) else key),
                               torch.Size(value.shape if isinstance(value, torch.Tensor) else value))

    monkeypatch.setitem(ops.flop_registry, packet, strict)
    q, k, v = torch.empty(2, 8, 16, 4), torch.empty(2, 2, 16, 4), torch.empty(2, 2, 16, 4)
    # by hand: two bmm of [b*h, 16, 4] x [b*h, 4, 16] and [b*h, 16, 16] x [b*h, 16, 4], 2 FLOPs a multiply-add
    assert ops._flops(packet, (q, k, v), {}, None) == 2 * (2 * 2 * 8 * 16 * 4 * 16)
