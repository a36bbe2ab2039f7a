"""What CUDA's fused attention kernels allocate, on CPU fake tensors.

Fake tensors run each op's meta kernel, which makes its outputs and nothing else, and not always with the layout the
CUDA kernel gives them. For the three fused backends a CUDA prediction can choose (predict/emulate/sdpa_choice.py)
this module makes the outputs as the CUDA kernels do (`AttentionKernels.rewrite`) and, around them, the
allocations and frees each kernel makes through the caching allocator, in its order (`AttentionKernels.after`):

- **flash** (`_scaled_dot_product_flash_attention[_backward]`, attention.cu / attention_backward.cu and
  flash_attn/flash_api.cpp's `mha_fwd` / `mha_bwd`): forward, the output, a fp32 log-sum-exp [B, H, Lq], a 16-byte
  RNG state and an 8-byte spare (made again when there is dropout), and, when the split-KV heuristic splits the
  keys (no dropout, few query blocks for the GPU's multiprocessors), fp32 accumulators freed at once. Backward,
  contiguous copies of the output gradient and output where they are not, the three gradients, a fp32 `softmax_d`
  [B, H, Lq rounded up to 128] and a fp32 `dq_accum` [B, Lq rounded up to 128, H, D rounded up to 32 (64 over
  128)], both freed before the kernel returns.
- **memory-efficient** (`_scaled_dot_product_efficient_attention[_backward]`, attention.cu's
  `_efficient_attention_forward`, attention_backward.cu's `_efficient_attention_backward`, mem_eff_attention/
  kernel_forward.h and kernel_backward.h, the kernel lists of kernels/generate_kernels.py): forward, the output and
  a fp32 log-sum-exp padded to a multiple of 32 queries; its seed and offset are host tensors (not GPU memory); a
  fp32 output accumulator for head sizes over 128 in 16-bit. Backward, a contiguous copy of the output gradient
  where it is not, the gradients, a fp32 `delta` [B, H, Lq] (or, where the kernel does not compute it, the fp32
  products and sum that make it), and the kernel's fp32 workspace (dQ accumulation tiles, dK/dV where they do not
  fit in registers), sized by the first kernel of torch's list that takes the call.
- **cuDNN** (`_scaled_dot_product_cudnn_attention[_backward]`, attention.cu's `_cudnn_attention_forward`,
  attention_backward.cu, native/cudnn/MHA.cpp, and the cuDNN frontend's `CompositeSDPABackwardNode` that torch
  2.14 bundles): forward, a seed and an offset (8 bytes each, on the GPU), the output in the query's layout, a fp32
  log-sum-exp [B, H, Lq, 1]; backward, the gradients, a copy of the output gradient when its last dimension is not
  unit-strided, and the graph's workspace from the caching allocator: the frontend's fp32 dQ accumulator
  [B, H, Lq, D] and softmax sum [B, H, Lq] (cuDNN 9's backward always takes them, unless deterministic).

Sizes are worked out by hand in tests/predict/emulate/test_attention_kernels.py. The cuDNN engine's own workspace
beyond the frontend's is not derivable from source: it is what an H200 took (CUDNN_ENGINE_WORKSPACE_BYTES, and the
grouped-query backward's per-query-head dK and dV, `cudnn_engine_backward_bytes`). Not followed (and said by
`predict`): which of two memory-efficient backward kernels fits the GPU's shared memory (the first of torch's list
is taken), grouped-query attention's expanded gradients, and the reductions' scratch inside these kernels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from membench.common.vocab import OTHER
from membench.predict.emulate.registry import SCRATCH_MODULE, Emulation, emulation

aten = torch.ops.aten
FLASH_FWD = aten._scaled_dot_product_flash_attention.default
FLASH_BWD = aten._scaled_dot_product_flash_attention_backward.default
EFFICIENT_FWD = aten._scaled_dot_product_efficient_attention.default
EFFICIENT_BWD = aten._scaled_dot_product_efficient_attention_backward.default
CUDNN_FWD = aten._scaled_dot_product_cudnn_attention.default
# The cuDNN engine's own workspace beyond the frontend's: 256 B in every forward call of four models' traces on an
# H200 (torch 2.11.0, cuDNN 9.19.0; results/gpu-traces/: [16, 12, 197, 64] non-causal, [4, 12, 512, 64],
# [8, 12, 1024, 64] and [4, 16, 1024, 64] causal, bf16), and 256 B more than the frontend's in every backward call,
# in the one workspace torch allocates for the graph.
CUDNN_ENGINE_WORKSPACE_BYTES = 256
CUDNN_BWD = aten._scaled_dot_product_cudnn_attention_backward.default


@dataclass(frozen=True)
class Alloc:
    """A buffer the kernel takes from the caching allocator (raw bytes, before the 512-byte rounding)."""

    name: str
    nbytes: int


@dataclass(frozen=True)
class Free:
    name: str


@dataclass(frozen=True)
class Output:
    """The op's output at this index is allocated here."""

    index: int


Event = Alloc | Free | Output


def _round(x: int, m: int) -> int:
    return -(-x // m) * m


def _is_contiguous(t: torch.Tensor) -> bool:
    return t.is_contiguous()


def _dense_like(t: torch.Tensor) -> torch.Tensor:
    """empty_like(t): t's strides when t is dense and non-overlapping, else contiguous (preserve_format)."""
    return torch.empty_like(t)


# --- flash attention ------------------------------------------------------------------------------------------------

def flash_forward(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    """_scaled_dot_product_flash_attention_cuda's outputs: the output is mha_fwd's empty_like of the [B, L, H, D]
    query, transposed back (the meta kernel makes it like the [B, H, L, D] one, which differs when q is a view)."""
    b, h, lq, _ = query.shape
    out = _dense_like(query.transpose(1, 2)).transpose(1, 2)
    lse = torch.empty(b, h, lq, dtype=torch.float32)
    rng_state = torch.empty(2, dtype=torch.uint64)
    unused = torch.empty((), dtype=torch.uint64)
    debug = torch.empty(0, dtype=query.dtype)
    return out, lse, None, None, lq, key.shape[2], rng_state, unused, debug


def flash_split_kv(b: int, h: int, lq: int, lk: int, d: int, sm_count: int) -> int:
    """flash_api.cpp's set_params_splitkv / num_splits_heuristic (no dropout): how many key splits the forward
    runs, 1 for none. d is the head size rounded up to 8."""
    block_n = 256 if d <= 64 else (128 if d <= 128 else 64)
    n_blocks = -(-lk // block_n)
    work = b * h * -(-lq // 64)
    sms = sm_count * 2  # "multiply number of SMs by 2 to hard-code the fact that we're using 128 threads per block"
    if work >= 0.8 * sms:
        return 1
    max_splits = min(128, sms, n_blocks)

    def eligible(s: int) -> bool:
        return s == 1 or -(-n_blocks // s) != -(-n_blocks // (s - 1))

    efficiency = []
    for s in range(1, max_splits + 1):
        waves = work * s / sms
        efficiency.append(waves / math.ceil(waves) if eligible(s) else 0.0)
    best = max(efficiency, default=0.0)
    return next((s for s in range(1, max_splits + 1) if eligible(s) and efficiency[s - 1] >= 0.85 * best), 1)


def _flash_head_rounded(d: int) -> int:
    return _round(d, 32 if d <= 128 else 64)


def flash_forward_events(a: dict, out, gpu) -> list[Event]:
    query, dropout_p = a["query"], a["dropout_p"]
    b, h, lq, d = query.shape
    lk = a["key"].shape[2]
    events: list[Event] = [Output(0), Output(1)]  # mha_fwd: out = empty_like(q), softmax_lse
    splits = flash_split_kv(b, h, lq, lk, _round(d, 8), gpu.sm_count) if dropout_p == 0 else 1
    if splits > 1:
        events += [Alloc("softmax_lse_accum", splits * b * h * lq * 4),
                   Alloc("out_accum", splits * b * h * lq * _flash_head_rounded(_round(d, 8)) * 4)]
    if dropout_p > 0:  # rng_state made, then made again for the dropout's philox state: the first is let go
        events += [Alloc("rng_state", 16), Output(7), Output(6), Free("rng_state")]
    else:
        events += [Output(6), Output(7)]
    if splits > 1:  # a tuple's elements are destroyed first to last (libstdc++)
        events += [Free("softmax_lse_accum"), Free("out_accum")]
    return events


def flash_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                   is_causal, philox_seed, philox_offset, *, scale=None):
    """mha_bwd's dq, dk, dv: empty_like of the [B, L, H, D] inputs, transposed back."""
    return tuple(_dense_like(t.transpose(1, 2)).transpose(1, 2) for t in (query, key, value))


def flash_backward_events(a: dict, out, gpu) -> list[Event]:
    grad_out, query, o = a["grad_out"], a["query"], a["out"]
    b, h, lq, d = query.shape
    events: list[Event] = []
    copies = []
    for name, t in (("grad_out_copy", grad_out), ("out_copy", o)):  # _flash_attention_backward: .contiguous()
        if not _is_contiguous(t.transpose(1, 2)):
            events.append(Alloc(name, t.numel() * t.element_size()))
            copies.append(name)
    events += [Output(0), Output(1), Output(2)]
    lq_rounded = _round(lq, 128)
    events.append(Alloc("softmax_d", b * h * lq_rounded * 4))
    accum = b * lq_rounded * h * _flash_head_rounded(d) * 4
    if torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled():
        accum *= -(-(gpu.sm_count + b * h - 1) // (b * h)) if b * h else 1
    events.append(Alloc("dq_accum", accum))
    events += [Free("dq_accum"), Free("softmax_d")]  # mha_bwd's locals, then the dropped dSoftmax
    events += [Free(name) for name in reversed(copies)]  # contiguous_out, then contiguous_grad_out
    return events


# --- cuDNN attention ------------------------------------------------------------------------------------------------

def _matching_layout(query: torch.Tensor, shape: tuple[int, ...], dtype) -> torch.Tensor:
    """alloc_with_matching_layout: `shape` with query's dimension order."""
    if tuple(query.shape) == tuple(shape) and dtype == query.dtype:
        return torch.empty_like(query)
    order = sorted(range(len(shape)), key=lambda i: query.stride()[i], reverse=True)
    strides = [0] * len(shape)
    step = 1
    for i in reversed(order):
        strides[i] = step
        step *= shape[i]
    return torch.empty_strided(shape, strides, dtype=dtype)


def cudnn_forward(query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False,
                  return_debug_mask=False, *, scale=None):
    b, h, lq, _ = query.shape
    seed = torch.empty((), dtype=torch.int64)
    offset = torch.empty((), dtype=torch.int64)
    out = _matching_layout(query, (b, h, lq, value.shape[-1]), query.dtype)
    lse = torch.empty(b, h, lq, 1, dtype=torch.float32) if compute_log_sumexp else torch.empty(0)
    return out, lse, None, None, lq, key.shape[2], seed, offset, None


def cudnn_forward_events(a: dict, out, gpu) -> list[Event]:
    compute = a["compute_log_sumexp"]
    # _cudnn_attention_forward: seed and offset first; run_cudnn_SDP_fprop: o, the stats, the graph's workspace
    # (the frontend's is empty for these graphs; the engine's, not derivable from source, as measured).
    return [Output(6), Output(7), Output(0)] + ([Output(1)] if compute else []) + [
        Alloc("workspace", CUDNN_ENGINE_WORKSPACE_BYTES), Free("workspace")]


def cudnn_backward(grad_out, query, key, value, out, logsumexp, philox_seed, philox_offset, attn_bias, cum_seq_q,
                   cum_seq_k, max_q, max_k, dropout_p, is_causal, *, scale=None):
    return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)


def cudnn_workspace_bytes(b: int, h: int, lq: int, d_qk: int, deterministic: bool) -> int:
    """The cuDNN frontend's CompositeSDPABackwardNode::get_fe_workspace_size_node for dense inputs, no bias, no
    alibi (cuDNN >= 9.0; the padding-mask workaround is for cuDNN <= 9.15.0): the non-virtual softmax sum
    [B, H, Lq] fp32, and the dQ accumulator [B, H, Lq, D] fp32 unless the dP-workspace implementation is used
    (forced by deterministic algorithms; its own buffer is the engine's, not counted)."""
    softmax_sum = b * h * lq * 4
    return softmax_sum + (0 if deterministic else b * h * lq * d_qk * 4)


def cudnn_engine_backward_bytes(query, key, value) -> int:
    """The engine's part of the backward workspace: CUDNN_ENGINE_WORKSPACE_BYTES, and under grouped-query attention
    (fewer key/value heads than query heads) the frontend's dK and dV of every query head before they are summed
    per key/value head (`dK_fullhead`, `dV_fullhead`: [B, Hq, Skv, D] in the inputs' dtype, virtual in the
    frontend's graph for dense inputs, so the engine's to hold), as the Llama shape's grouped-query trace in
    results/gpu-traces/ (torch 2.11, cuDNN 9.19) holds them."""
    b, h, _, d = query.shape
    s_kv, h_kv, d_v = key.shape[2], key.shape[1], value.shape[3]
    fullhead = b * h * s_kv * (d + d_v) * query.element_size() if h_kv != h else 0
    return CUDNN_ENGINE_WORKSPACE_BYTES + fullhead


def cudnn_backward_events(a: dict, out, gpu) -> list[Event]:
    grad_out, query = a["grad_out"], a["query"]
    b, h, lq, d = query.shape
    events: list[Event] = [Output(0), Output(1), Output(2)]  # _cudnn_attention_backward: dq, dk, dv
    copy = grad_out.stride(-1) != 1  # cuDNN >= 9.5.1: permute_to_matching_layout only for a strided last dim
    if copy:
        events.append(Alloc("grad_out_copy", grad_out.numel() * grad_out.element_size()))
    deterministic = torch.are_deterministic_algorithms_enabled()
    workspace = cudnn_workspace_bytes(b, h, lq, d, deterministic) + cudnn_engine_backward_bytes(query, a["key"],
                                                                                                a["value"])
    events += [Alloc("workspace", workspace), Free("workspace")]
    if copy:
        events.append(Free("grad_out_copy"))
    return events


# --- memory-efficient attention -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BackwardKernel:
    """One entry of generate_kernels.py's BwdKernel list."""

    block_i: int
    block_j: int
    max_k: int
    dropout: bool
    seq_aligned: bool
    half: bool
    min_sm: int

    @property
    def output_in_rf(self) -> bool:
        return self.half and self.max_k <= self.block_i

    @property
    def split_keys(self) -> bool:  # kEnableSplitKeys
        return self.min_sm >= 70

    @property
    def accum_grad_q(self) -> bool:  # kNeedsAccumGradQ: split keys, or a 16-bit output
        return self.split_keys or self.half

    @property
    def accum_grad_kv(self) -> bool:  # kNeedsAccumGradK / V
        return not self.output_in_rf and self.half

    @property
    def computes_delta(self) -> bool:  # kKernelComputesDelta
        return self.half and (self.output_in_rf or self.min_sm != 70)


_SM = (50, 70, 75, 80, 100)


def _sm_range(cc: tuple[int, int]) -> int:
    """The first SM of the kernel family that serves compute capability cc (sm80 kernels up to sm100)."""
    value = cc[0] * 10 + cc[1]
    for lo, hi in zip(_SM, _SM[1:]):
        if lo <= value < hi:
            return lo
    return _SM[-2]


def backward_kernels(dtype: torch.dtype, cc: tuple[int, int]) -> list[BackwardKernel]:
    """generate_kernels.py's aligned backward kernels of one family, in dispatch order (sort_index)."""
    sm = _sm_range(cc)
    half = dtype in (torch.float16, torch.bfloat16)
    kernels = []
    for dropout in (False, True):
        for max_k in (32, 64, 128, 2**16):
            block_is = [64] + ([128] if (sm >= 80 or (sm >= 70 and half)) and max_k > 64 else [])
            for bi in block_is:
                preload = half and sm >= 80 and max_k <= bi
                bj = 128 if preload and max_k > 64 else 64
                kernels.append(BackwardKernel(bi, bj, max_k, dropout, False, half, sm))
                if not dropout and max_k <= 128 and half and sm in (70, 80):
                    kernels.append(BackwardKernel(bi, bj, max_k, dropout, True, half, sm))
    if half and sm == 80 and cc in ((8, 6), (8, 9)):  # the stable-diffusion kernel: 128 x 64, max_k 96, sm86/89
        kernels.append(BackwardKernel(128, 64, 96, False, False, half, sm))
    # sort_index: no dropout first, then the smallest max_k, the largest block_i, sequence-aligned first
    return sorted(kernels, key=lambda k: (k.dropout, k.max_k, -k.block_i, 0 if k.seq_aligned else 1))


def backward_kernel(dtype, cc, max_head: int, dropout: bool, m: int, n: int) -> BackwardKernel:
    """The first kernel of the list that takes the call (shared-memory fit not checked)."""
    for k in backward_kernels(dtype, cc):
        if k.max_k < max_head or (dropout and not k.dropout):
            continue
        if k.seq_aligned and (m % k.block_i or n % k.block_j):
            continue
        return k
    raise RuntimeError("cutlassB: no kernel found to launch")


def efficient_workspace_bytes(k: BackwardKernel, b: int, h: int, m: int, n: int, d: int, dv: int) -> int:
    """kernel_backward.h's Params::workspace_size() after attention_backward.cu's num_splits_key heuristic."""
    splits = -(-n // k.block_j)
    if b * h >= 256 and n <= 2 * k.block_j:  # parallelism without splitting the keys: blocks (1, H, B)
        splits = 1
    if k.accum_grad_kv:
        splits = min(splits, 200 // (b * h))
    if not k.split_keys or splits < 1:
        splits = 1
    if torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled():
        splits = 1
    gk = splits * k.block_j * _round(d, k.block_i) if k.accum_grad_kv else 0
    gv = splits * k.block_j * _round(dv, k.block_i) if k.accum_grad_kv else 0
    # GradQTempStorage: a lock, a counter and 2 pads (16 bytes), then block_i x block_j fp32 accumulators
    gq = -(-m // k.block_i) * -(-d // k.block_j) * (4 + k.block_i * k.block_j) if k.accum_grad_q else 0
    return b * h * _round(gk + gv + gq, 4) * 4


def efficient_forward(query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, *,
                      scale=None):
    b, h, m, _ = query.shape
    res = torch.empty(b, m, h, value.shape[-1], dtype=query.dtype).transpose(1, 2)
    lse = torch.empty(b, h, _round(m, 32) if compute_log_sumexp else 0, dtype=torch.float32)
    seed = torch.empty((), dtype=torch.int64)  # host tensors (marked so in run)
    offset = torch.empty((), dtype=torch.int64)
    return res, lse, seed, offset


def efficient_forward_events(a: dict, out, gpu) -> list[Event]:
    query, value = a["query"], a["value"]
    b, h, m, d = query.shape
    events: list[Event] = [Output(0), Output(1)]
    if query.dtype in (torch.float16, torch.bfloat16) and max(d, value.shape[-1]) > 128:
        # the 32 x 128 kernel for head sizes up to 65536 does not keep the output in registers
        events += [Alloc("output_accum", b * m * h * value.shape[-1] * 4), Free("output_accum")]
    return events


def efficient_backward(grad_out, query, key, value, attn_bias, out, logsumexp, philox_seed, philox_offset,
                       dropout_p, grad_input_mask, is_causal=False, *, scale=None):
    grads = tuple(torch.empty(t.shape[0], t.shape[2], t.shape[1], t.shape[3], dtype=t.dtype).transpose(1, 2)
                  for t in (query, key, value))
    grad_bias = None
    if attn_bias is not None and grad_input_mask[3]:
        shape = list(attn_bias.shape)
        last = shape[-1]
        shape[-1] = _round(last, 16)
        grad_bias = torch.empty(shape, dtype=attn_bias.dtype)[..., :last]
    return (*grads, grad_bias)


def efficient_backward_events(a: dict, out, gpu) -> list[Event]:
    grad_out, query, key, value, dropout_p = a["grad_out_"], a["query"], a["key"], a["value"], a["dropout_p"]
    b, h, m, d = query.shape
    n, dv = key.shape[2], value.shape[3]
    events: list[Event] = []
    copy = not _is_contiguous(grad_out.transpose(1, 2))  # grad_out_.contiguous() of the [B, M, H, K] view
    if copy:
        events.append(Alloc("grad_out_copy", grad_out.numel() * grad_out.element_size()))
    events += [Output(0), Output(1), Output(2)] + ([Output(3)] if out[3] is not None else [])
    kernel = backward_kernel(query.dtype, gpu.compute_capability, max(d, dv), dropout_p != 0, m, n)
    if kernel.computes_delta:
        events.append(Alloc("delta", b * h * m * 4))
    else:  # (grad_out.float() * out.float()).sum(-1).transpose(-2, -1).contiguous(): the expression's temporaries
        # go when it ends, the last made first (H200 traces: vit-small's, vit_l_16's)
        events += [Alloc("product", b * m * h * dv * 4), Alloc("row_sums", b * m * h * 4),
                   Alloc("delta", b * h * m * 4), Free("row_sums"), Free("product")]
    workspace = efficient_workspace_bytes(kernel, b, h, m, n, d, dv)
    if workspace:
        events.append(Alloc("workspace", workspace))
    # delta is let go before the workspace (the same traces)
    events += [Free("delta")] + ([Free("workspace")] if workspace else [])
    if copy:
        events.append(Free("grad_out_copy"))
    return events


def bound(func, args, kwargs) -> dict:
    """The op's arguments by name, defaults filled in, as its schema declares them."""
    values = {}
    for i, arg in enumerate(func._schema.arguments):
        if i < len(args):
            values[arg.name] = args[i]
        elif arg.name in kwargs:
            values[arg.name] = kwargs[arg.name]
        else:
            values[arg.name] = arg.default_value if arg.has_default_value() else None
    return values


# --- the hook -------------------------------------------------------------------------------------------------------

IMPLEMENTATIONS = {FLASH_FWD: flash_forward, FLASH_BWD: flash_backward, CUDNN_FWD: cudnn_forward,
                   CUDNN_BWD: cudnn_backward, EFFICIENT_FWD: efficient_forward, EFFICIENT_BWD: efficient_backward}
EVENTS = {FLASH_FWD: flash_forward_events, FLASH_BWD: flash_backward_events, CUDNN_FWD: cudnn_forward_events,
          CUDNN_BWD: cudnn_backward_events, EFFICIENT_FWD: efficient_forward_events,
          EFFICIENT_BWD: efficient_backward_events}
HOST_OUTPUTS = {EFFICIENT_FWD: (2, 3)}  # the memory-efficient forward's seed and offset stay on the CPU
OP_OF = {impl: op for op, impl in IMPLEMENTATIONS.items()}  # the storage tracker calls `run` with the replacement


@emulation
class AttentionKernels(Emulation):
    """The fused attention ops of a CUDA prediction on `gpu`: their CUDA outputs, allocations and frees."""

    ops = frozenset({*IMPLEMENTATIONS, *OP_OF})  # the ops, and the implementations `rewrite` runs for them
    order = 20

    def rewrite(self, func, args, kwargs):
        """The op's CUDA implementation on fake tensors."""
        return IMPLEMENTATIONS.get(func, func)

    def after(self, func, args, kwargs, out, tracker) -> None:
        """Tracks the op's outputs and its scratch in the kernel's order (the tracker counts the rest after)."""
        func = OP_OF.get(func, func)
        events = EVENTS.get(func)
        if events is None:
            return
        for index in HOST_OUTPUTS.get(func, ()):
            tracker.exclude(out[index])
        live: dict[str, torch.Tensor] = {}
        for event in events(bound(func, args, kwargs or {}), out, self.gpu):
            if isinstance(event, Output):
                if isinstance(out[event.index], torch.Tensor):
                    tracker.track(out[event.index])
            elif isinstance(event, Alloc):  # held only in `live`, so that deleting it there frees it
                live[event.name] = torch.empty(event.nbytes, dtype=torch.uint8)
                tracker.track(live[event.name], OTHER, SCRATCH_MODULE)
            else:
                del live[event.name]
