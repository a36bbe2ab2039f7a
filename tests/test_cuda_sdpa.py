"""scaled_dot_product_attention in a CUDA prediction keeps what CUDA's fused kernels keep (trackers/cuda_sdpa.py),
derived by hand: the output and a fp32 log-sum-exp, never the queries x keys weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from membench.trackers import fake
from membench.trackers.cuda_autocast import cuda_policy
from membench.trackers.storage import StorageTracker

B, H, L, D = 2, 4, 128, 64
OUT = B * H * L * D * 4  # the fp32 output: 262,144 bytes
LSE = B * H * L * 4  # the log-sum-exp, fp32: 4,096 bytes
WEIGHTS = B * H * L * L * 4  # one queries x keys fp32 matrix: 524,288 bytes


def _kept_after_forward(cuda: bool, **kwargs) -> int:
    """Bytes an SDPA forward leaves alive (its output and what it saved for backward), q, k, v made before."""
    policy = cuda_policy() if cuda else torch.enable_grad()
    with policy, fake.fake_tensors():
        q, k, v = (torch.randn(B, H, L, D, requires_grad=True) for _ in range(3))
        if kwargs.get("attn_mask") == "bool":
            kwargs["attn_mask"] = torch.ones(L, L, dtype=torch.bool)
        tracker = StorageTracker()
        with tracker:
            out = F.scaled_dot_product_attention(q, k, v, **kwargs)
            kept = tracker.current
            out.sum().backward()
        assert q.grad.shape == q.shape
        return kept


@pytest.mark.parametrize("kwargs", [{"dropout_p": 0.1}, {"dropout_p": 0.1, "is_causal": True},
                                    {"dropout_p": 0.1, "attn_mask": "bool"}, {}])
def test_attention_with_or_without_dropout_keeps_the_output_and_a_log_sum_exp(kwargs):
    # A boolean mask is turned into a float one before any kernel, on CUDA as on CPU (L x L fp32, kept for
    # backward as the kernel's input): 65,536 bytes more.
    mask = L * L * 4 if kwargs.get("attn_mask") == "bool" else 0
    assert _kept_after_forward(True, **kwargs) == OUT + LSE + mask


def test_a_cpu_prediction_keeps_the_math_paths_weights_with_dropout():
    # The CPU has no fused kernel with dropout: its math path keeps queries x keys matrices besides the output.
    assert _kept_after_forward(False, dropout_p=0.1) > OUT + WEIGHTS
