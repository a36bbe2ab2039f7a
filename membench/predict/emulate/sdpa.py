"""scaled_dot_product_attention as a CUDA GPU runs it, on CPU fake tensors.

Which kernel SDPA runs decides what it keeps for backward. On CPU (sdp_utils_cpp.cpp) it is the fused
`_scaled_dot_product_flash_attention_for_cpu`, which keeps the output and a log-sum-exp (batch x heads x queries,
fp32), except with dropout, which that kernel does not support: then the math path runs, and keeps the attention
weights (batch x heads x queries x keys) and the dropout mask, for every layer. On CUDA (cuda/sdp_utils.cpp,
in its priority order) cuDNN attention (sm90 and newer with a recent cuDNN), flash attention (fp16/bf16, sm80 and
newer, head size up to 256) and memory-efficient attention (any of fp32/fp16/bf16 from sm50, V100 included; head
size a multiple of 4 or 8) all support dropout and masks, and each keeps the output and a log-sum-exp (plus a
seed and offset for the dropout): never a queries x keys matrix.

So a CUDA prediction runs SDPA with dropout as the CPU's fused kernel, which keeps what CUDA's keep, instead of
the math path. What is left over is small and said by `predict` (predict.CANNOT_SEE): memory-efficient attention
pads its log-sum-exp to a multiple of 32 queries (at most 31 x batch x heads x 4 bytes), and the dropout's seed
and offset; and the rare shapes where CUDA falls back to math too (a head size no fused CUDA kernel takes, 3-D
inputs), which the prediction keeps as the CPU runs them.
"""

from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode

from membench.private import saved_tensor_hooks_active

SDPA = torch.nn.functional.scaled_dot_product_attention


class _FusedWithDropout(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is SDPA:
            routed = _fused(*args, **kwargs)
            if routed is not None:
                return routed
        return func(*args, **kwargs)


def _fused(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """The CPU's fused kernel for a call the CPU would run as math only because of its dropout; None otherwise."""
    if not dropout_p or enable_gqa or query.dim() != 4 or not (query.size(-1) == key.size(-1) == value.size(-1)):
        return None
    if attn_mask is not None and attn_mask.requires_grad:  # the CPU kernel has no gradient for a mask: keep math
        return None
    if saved_tensor_hooks_active():
        # Under checkpointing, backward recomputes this forward with the mode off (a torch function mode does not
        # reach the autograd engine's thread), on the math path: routing the first pass would make the recomputed
        # tensors differ and torch.utils.checkpoint refuse them. Inside a checkpointed region nothing is kept
        # past the forward anyway; only the recomputation's transient weights are over-counted.
        return None
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        # As at::scaled_dot_product_attention does before any kernel (convert_boolean_attn_mask): -inf where False.
        attn_mask = torch.zeros_like(attn_mask, dtype=query.dtype).masked_fill_(~attn_mask, float("-inf"))
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]


@contextlib.contextmanager
def cuda_sdpa():
    """While active, scaled_dot_product_attention with dropout keeps what CUDA's fused kernels keep."""
    with _FusedWithDropout():
        yield
