"""scaled_dot_product_attention and nn.MultiheadAttention as a CUDA GPU runs them, on CPU fake tensors.

On CPU, scaled_dot_product_attention runs the CPU's fused kernel or the math path, chosen by CPU rules; what a GPU
keeps depends on the kernel CUDA would choose for it. While `cuda_sdpa(gpu)` is active, `aten::scaled_dot_product_
attention` (what F.scaled_dot_product_attention, Hugging Face's SDPA attention and nn.MultiheadAttention reach)
runs attention.cpp's CUDA branch instead: the backend torch would choose on `gpu` (predict/emulate/sdpa_choice.py),
then that backend's op, with the preparation attention.cpp gives it (a boolean mask made additive, -65504 for cuDNN
and -inf for the others; flash's head size padded to a multiple of 8 and the output sliced back; memory-efficient
attention's mask padded to a multiple of 8 keys in memory and expanded). The fused ops' outputs and scratch are
then CUDA's (predict/emulate/attention_kernels.py, through the storage tracker's kernel hook); the math path
(`_scaled_dot_product_attention_math`, composite) runs op by op as on any device, keeping the fp32 attention
weights of 16-bit inputs and, with dropout, CUDA's one-byte dropout mask (predict/emulate/dropout.py).

It is registered at the dispatcher (the op's CompositeImplicitAutograd kernel), not as a torch function mode, so
it also holds where a mode would be off: in backward, where checkpointing recomputes a forward. Each call's choice
is kept (`Sites`), for the prediction's record and output.

nn.MultiheadAttention reaches scaled_dot_product_attention in training and whenever its inference fast path is not
taken. Not followed: that fast path (`torch._native_multi_head_attention`, taken without autograd, outside
autocast), one op to a fake tensor, whose meta kernel makes only the output, where native_multi_head_attention_cuda
(attention.cu) also holds a packed in-projection and the fused kernel's output, or the B x H x T x T scores.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch

from membench.predict import gpus
from membench.predict.emulate import versions
from membench.predict.emulate.sdpa_choice import Call, Choice, Operand, Settings, choose, rules_release
from membench.private import composite_kernel_replaced, no_dispatch_modes
from membench.results.schema import Attention, AttentionSite

aten = torch.ops.aten


@dataclass
class Site:
    """One kind of attention call: the query's shape and dtype, its flags, and the backend chosen for it (each
    distinct kind once, however many calls: the written and the run warm-up step give the same record)."""

    backend: str
    query_shape: tuple[int, ...]
    dtype: str
    is_causal: bool
    dropout: float
    mask: bool
    refused: tuple[str, ...]  # "flash: a mask" for each backend tried before the chosen one


@dataclass
class Sites:
    """The attention calls a prediction ran, grouped by kind, and what the choice followed."""

    gpu: object
    settings: Settings | None = None
    by_key: dict[tuple, Site] = field(default_factory=dict)

    def record(self, call: Call, choice: Choice) -> None:
        q = call.query
        refused = tuple(f"{b}: {reason}" for b, reason in choice.refused)
        key = (choice.backend, q.shape, q.dtype, call.is_causal, call.dropout, call.mask is not None, refused)
        if key not in self.by_key:
            self.by_key[key] = Site(choice.backend, q.shape, str(q.dtype).removeprefix("torch."), call.is_causal,
                                    call.dropout, call.mask is not None, refused)

    def summary(self):
        """The record's Attention (None when the prediction ran no attention)."""
        if not self.by_key:
            return None
        sites = [AttentionSite(s.backend, list(s.query_shape), s.dtype, s.is_causal, s.dropout, s.mask,
                               list(s.refused)) for s in self.by_key.values()]
        return Attention(self.rule(), sites)

    def rule(self) -> str:
        """What the choice followed: torch's rules, the cuDNN and CUDA versions, the GPU's compute capability."""
        s = self.settings or Settings.of_process()
        cudnn = s.cudnn_version
        cudnn_text = f"cuDNN {cudnn // 10000}.{cudnn // 100 % 100}.{cudnn % 100}" if cudnn else "no cuDNN"
        major, minor = self.gpu.compute_capability
        follows = rules_release(s)
        installed = torch.__version__.split("+")[0]
        rules = f"torch {installed}" if versions.release(installed) == follows else \
            f"torch {follows}'s rules (installed {installed})"
        return (f"{rules} sdp_utils.cpp on sm{major}{minor}, {cudnn_text}, "
                f"CUDA {s.cuda_version // 1000}.{s.cuda_version % 1000 // 10}")


def describe(attentions: list[Attention]) -> str | None:
    """`predict`'s line for the attention kernels its records assumed, folded: each backend once, with the kinds
    of call it ran and why the backends before it refused them; None when no record ran attention."""
    by_backend: dict[str, list[str]] = {}
    for attention in attentions:
        for s in attention.sites:
            flags = [f for f in ("causal" if s.is_causal else "", "mask" if s.mask else "",
                                 f"dropout {s.dropout:g}" if s.dropout else "") if f]
            text = f"q {list(s.query_shape)} {s.dtype}" + (f" {' '.join(flags)}" if flags else "")
            text += f" ({'; '.join(s.refused)})" if s.refused else ""
            if text not in by_backend.setdefault(s.backend, []):
                by_backend[s.backend].append(text)
    if not by_backend:
        return None
    rules = "; ".join(sorted({a.rule for a in attentions}))
    return (f"attention kernels assumed ({rules}): "
            + "; ".join(f"{backend} for {', '.join(texts)}" for backend, texts in by_backend.items()))


_ACTIVE: list[Sites] = []  # the innermost cuda_sdpa's sites


def _operand(t: torch.Tensor | None) -> Operand | None:
    return None if t is None else Operand.of(t)


def _boolean_to_additive(mask: torch.Tensor, dtype: torch.dtype, cudnn: bool) -> torch.Tensor:
    """convert_boolean_attn_mask(_cudnn): where(~mask, fill, scalar_tensor(0)). The fill (-65504 for cuDNN, -inf
    otherwise) is a C++ Scalar, wrapped on the host; cuDNN's zero is a host tensor too (no device given), the
    others' a one-element tensor on the mask's device. GCC evaluates the arguments last to first: the zero is made
    before the inverted mask."""
    with no_dispatch_modes():  # real host tensors: no GPU block, and nothing the tracker sees
        fill = torch.scalar_tensor(-65504.0 if cudnn else float("-inf"), dtype=dtype)
        host_zero = torch.scalar_tensor(0.0, dtype=dtype)
    zero = host_zero if cudnn else torch.scalar_tensor(0.0, dtype=dtype)
    return torch.where(mask.logical_not(), fill, zero)


def _pad_last_dim(t: torch.Tensor, multiple: int) -> torch.Tensor:
    extra = -t.shape[-1] % multiple
    return t if not extra else torch.nn.functional.pad(t, (0, extra))


def _efficient_mask(mask: torch.Tensor, query, key) -> torch.Tensor:
    """preprocess_mask: a mask whose strides are not multiples of 8 elements is padded to 8 more keys and sliced
    back (aligned memory), then expanded to [B, H, Lq, Lk]."""
    aligned = all(s % 8 == 0 for s in mask.stride()[:-1]) and mask.stride(-1) == 1
    if not aligned:
        last = mask.shape[-1]
        mask = torch.nn.functional.pad(mask, (0, 8 - last % 8))[..., :last]
    return mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """at::scaled_dot_product_attention as it runs on the target GPU (attention.cpp, CUDA)."""
    sites = _ACTIVE[-1]
    call = Call(Operand.of(query), Operand.of(key), Operand.of(value), _operand(attn_mask), float(dropout_p),
                bool(is_causal), bool(enable_gqa), torch.is_grad_enabled())
    settings = sites.settings = Settings.of_process()
    choice = choose(call, sites.gpu.compute_capability, settings)
    sites.record(call, choice)
    requires_grad = call.requires_grad
    boolean = attn_mask is not None and attn_mask.dtype == torch.bool
    if choice.backend == "cudnn":
        mask = _boolean_to_additive(attn_mask, query.dtype, cudnn=True) if boolean else attn_mask
        return _first(aten._scaled_dot_product_cudnn_attention, query, key, value, mask, requires_grad, dropout_p,
                      is_causal, False, scale=scale)
    mask = _boolean_to_additive(attn_mask, query.dtype, cudnn=False) if boolean else attn_mask
    if choice.backend == "flash":
        size = query.shape[-1]
        padded = [_pad_last_dim(t, 8) for t in (query, key, value)]
        og_scale = scale if scale is not None else 1.0 / math.sqrt(size)  # the scale of the head size before padding
        out = _first(aten._scaled_dot_product_flash_attention, *padded, dropout_p, is_causal, False, scale=og_scale)
        return out if out.shape[-1] == size else out[..., :size]
    if choice.backend == "efficient":
        if mask is not None:
            mask = _efficient_mask(mask, query, key)
        return _first(aten._scaled_dot_product_efficient_attention, query, key, value, mask, requires_grad,
                      dropout_p, is_causal, scale=scale)
    _MATH_FORWARD[0] += 1
    try:
        gqa = {"enable_gqa": True} if enable_gqa else {}  # torch < 2.5's op has no such argument
        return _first(aten._scaled_dot_product_attention_math, query, key, value, mask, dropout_p, is_causal, None,
                      scale=scale, **gqa)
    finally:
        _MATH_FORWARD[0] -= 1


def _first(op, *args, **kwargs) -> torch.Tensor:
    """op's first output, the others let go first to last, as ATen's std::tuple of them is destroyed (a Python tuple
    lets go of its items last to first): where nothing saves them (no grad, a checkpoint's first forward), cuDNN's
    log-sum-exp is freed before its seed and offset, as on the H200."""
    items = list(op(*args, **kwargs))  # the tuple goes at once; the list holds them
    for i in range(1, len(items)):
        items[i] = None
    return items[0]


_MATH_FORWARD = [0]  # math-path calls running now (their forward's ops; checkpoint's recomputation included)


def math_mask_add(func, args, kwargs):
    """The op a plain CUDA run calls for `func` inside the math path: itself, or `add_` for the mask's add.

    `_scaled_dot_product_attention_math` (attention.cpp) adds the mask (the caller's, or the causal one it makes) to
    the scores in place, `attn.add_(*attn_mask)`, unless `at::areAnyTensorSubclassLike({attn, *attn_mask})`, when
    it calls the out-of-place `attn.add(*attn_mask)`; every tensor is subclass-like while a dispatch mode is active
    (fake tensors', the storage tracker's), so a prediction would hold a second B x H x L x S scores tensor, and
    take a block of its own for the softmax's input, where a plain run does not. Its forward has no other
    `add.Tensor` (torch 2.11, 2.14)."""
    if (func is aten.add.Tensor and _MATH_FORWARD[0] and len(args) == 2 and not kwargs
            and all(isinstance(a, torch.Tensor) for a in args)
            and torch.broadcast_shapes(args[0].shape, args[1].shape) == args[0].shape):
        return aten.add_.Tensor
    return func


@contextlib.contextmanager
def cuda_sdpa(gpu=None):
    """While active, attention runs as it would on `gpu` (default: the default --gpu); yields the Sites seen."""
    sites = Sites(gpus.GPUS[gpus.DEFAULT_GPU] if gpu is None else gpu)
    _ACTIVE.append(sites)
    try:
        with composite_kernel_replaced("scaled_dot_product_attention", _sdpa):
            yield sites
    finally:
        _ACTIVE.remove(sites)
