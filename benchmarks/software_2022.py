"""What the Hugging Face performance doc's run kept that today's torch and transformers do not, to check predictions
against its published rows (benchmarks/validate_predictions.py).

The doc (transformers v4.18, "Performance and Scalability") shows its machine's `nvidia-smi`, dated 11 January
2022 (driver 460.91.03, CUDA 11.2, a V100): the torch of that day was 1.10 or older (1.11 came out on 10 March
2022). Two differences from the software a prediction follows change what BERT's training step keeps:

- torch before 1.11 saved softmax's input for backward as well as its output: derivatives.yaml's formula was
  `_softmax_backward_data(grad, result, dim, self)`; from 1.11 it takes `self.scalar_type()` (pytorch#66018; the
  transformers of 2022 called `_softmax_backward_data` with the input tensor or its dtype by `torch < 1.11`). So
  each attention layer kept its scores until backward reached it: one batch x heads x seq x seq matrix per layer.
- transformers v4.18's BertModel made an all-ones attention mask when given none, and every layer added it to the
  scores as an fp32 [batch, 1, 1, seq] tensor of zeros: under fp16 autocast the sum, softmax's input, is fp32.
  Today's BERT adds no mask when given none.

- torch before pytorch#88339 (November 2022, after both releases below) summed two dense gradients that meet at
  one input out of place: InputBuffer::accumulate (torch/csrc/autograd/input_buffer.cpp) reused the first one's
  memory only when one of them was sparse. So at every fork in the graph (a residual stream, the query, key and
  value projections of one input) a third gradient-sized tensor was alive for a moment, where today's engine adds
  the second into the first.
- torch before 2.0 clipped gradients one at a time: clip_grad_norm_ took one norm per gradient, stacked them and
  took their norm (its foreach path, one _foreach_norm per device and dtype with its partial norms on CUDA, came
  with pytorch#91846, January 2023); 1.10 then scaled every gradient by the clamped coefficient (pytorch#61042).

Which torch it was is not printed: the date allows 1.9 as well as 1.10. They differ in one thing that matters
here: 1.9's CUDA autocast ran gelu in float32 (dropped from its fp32 list in June 2021, pytorch#59639; 1.10's
sources do not list it), so under fp16 each layer kept a float32 copy of gelu's input, where 1.10 keeps the
float16 one.

`early_2022(torch)` makes predictions in this process do what that software did: `torch.nn.functional.softmax`
becomes an autograd function that saves its input and output (for float32 and float16 inputs, the doc's; a bfloat16
input under autocast was copied to float32 first, which this does not do), BERT's eager attention adds that mask, a
CUDA prediction sums gradients out of place (it does not emulate today's in-place sums,
membench/predict/emulate/inplace_backward.py), `torch.nn.utils.clip_grad_norm_` is torch 1.10's (1.9's, before
pytorch#61042, also read comparisons back on the host, 0-dim bools freed at once: not emulated), and with torch="1.9"
the CUDA autocast policy of membench's predictions runs gelu in float32. Nothing else of that software is emulated;
tests/benchmarks/test_software_2022.py checks each on CPU against what is expected by hand.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch
import torch.nn.functional as F

_softmax = F.softmax


class _SoftmaxKeepsInput(torch.autograd.Function):
    """torch 1.10's softmax autograd: input and output saved; the backward kernel (which reads only the output and
    the input's dtype) is today's."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, dim: int) -> torch.Tensor:
        out = _softmax(x, dim=dim)
        ctx.save_for_backward(x, out)
        ctx.dim = dim
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, out = ctx.saved_tensors
        # The private kernel SoftmaxBackward0 runs (one output, no temporaries), not a formula of public ops whose
        # intermediates a real backward never makes.
        return torch._softmax_backward_data(grad, out, ctx.dim, x.dtype), None


def _softmax_keeping_input(input: torch.Tensor, dim: int | None = None, _stacklevel: int = 3,
                           dtype: torch.dtype | None = None) -> torch.Tensor:
    if dtype is None and dim is not None and input.requires_grad and torch.is_grad_enabled():
        return _SoftmaxKeepsInput.apply(input, dim)
    return _softmax(input, dim=dim, _stacklevel=_stacklevel, dtype=dtype)


def _with_v4_18_mask(eager_attention_forward):
    def attention(module, query, key, value, attention_mask, *args, **kwargs):
        if attention_mask is None:
            # BertModel.get_extended_attention_mask of v4.18: (1.0 - ones[:, None, None, :]) * -10000.0, in the
            # parameters' dtype (float32 under autocast). v4.18 made it once per forward, this once per layer: a
            # batch x seq float32 temporary (8 KiB at batch 4), freed after the addition.
            ones = torch.ones((query.shape[0], key.shape[2]), device=query.device)
            attention_mask = (1.0 - ones[:, None, None, :]) * -10000.0
        return eager_attention_forward(module, query, key, value, attention_mask, *args, **kwargs)
    return attention


def _clip_grad_norm_1_10(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """torch 1.10's clip_grad_norm_ (torch/nn/utils/clip_grad.py) as the Trainer calls it: a norm per gradient,
    their stack's norm, every gradient scaled in place by the coefficient clamped to 1. Today's foreach and the
    non-finite check (the Trainer passes False) are ignored."""
    parameters = [p for p in parameters if p.grad is not None]
    device = parameters[0].grad.device
    total_norm = torch.norm(torch.stack([torch.norm(p.grad.detach(), norm_type).to(device) for p in parameters]),
                            norm_type)
    clip_coef = float(max_norm) / (total_norm + 1e-6)
    clip_coef_clamped = torch.clamp(clip_coef, max=1.0)
    for p in parameters:
        p.grad.detach().mul_(clip_coef_clamped.to(p.grad.device))
    return total_norm


TORCH_VERSIONS = ("1.9", "1.10")


@contextlib.contextmanager
def early_2022(torch_version: str = "1.10"):
    """Softmax saving its input (torch < 1.11), BERT's all-zeros fp32 mask (transformers v4.18), the engine's
    gradient sums out of place (torch before pytorch#88339), clipping one gradient at a time (torch before 2.0)
    and, for torch 1.9, gelu in float32 under CUDA autocast, while inside (membench's CUDA policy reads its op lists
    on entering)."""
    from transformers.models.bert import modeling_bert

    from membench.predict.emulate import autocast
    from membench.predict.emulate.inplace_backward import BackwardPaths

    if torch_version not in TORCH_VERSIONS:
        raise ValueError(f"torch_version {torch_version!r}: one of {', '.join(TORCH_VERSIONS)}")
    eager, lists = modeling_bert.eager_attention_forward, autocast.cuda_lists
    engine_sums_in_place = BackwardPaths.engine_sums_in_place
    clip = torch.nn.utils.clip_grad_norm_
    F.softmax = _softmax_keeping_input
    torch.nn.utils.clip_grad_norm_ = _clip_grad_norm_1_10
    BackwardPaths.engine_sums_in_place = False
    modeling_bert.eager_attention_forward = _with_v4_18_mask(eager)
    if torch_version == "1.9":
        with_gelu = dataclasses.replace(lists(), fp32=(*lists().fp32, "gelu"), source="torch 1.9's, gelu added")
        autocast.cuda_lists = lambda: with_gelu
    try:
        yield
    finally:
        F.softmax = _softmax
        torch.nn.utils.clip_grad_norm_ = clip
        modeling_bert.eager_attention_forward = eager
        autocast.cuda_lists = lists
        BackwardPaths.engine_sums_in_place = engine_sums_in_place
