"""Which kernel `scaled_dot_product_attention` runs on a CUDA GPU: torch's own choice, followed rule for rule.

On CUDA, at::scaled_dot_product_attention asks `select_sdp_backend` (aten/src/ATen/native/transformers/cuda/
sdp_utils.cpp) for a backend: it walks torch's priority order and takes the first backend whose constraints all
pass. The constraints read the inputs (dims, dtype, head size, strides, storage offsets, mask, dropout, causal
masking, whether a gradient is needed), the GPU (compute capability) and the process (the enable flags that
`torch.backends.cuda.enable_*_sdp` and `torch.nn.attention.sdpa_kernel` set, deterministic algorithms, the cuDNN
version). On an sm90 or sm100 GPU with a cuDNN newer than 9.15 torch puts cuDNN attention first
(`check_prefer_cudnn_attention`); elsewhere the order is flash, memory-efficient, math. This module is that walk for
dense (not nested) inputs, on the layouts a prediction's fake tensors have; `choose` returns the backend and, for
each backend tried before it, the first constraint that refused it.

Checked against torch 2.14.1's sources and its binary (libtorch_cuda.so holds each constraint's warning text and,
unstripped, each constraint's symbol): sdp_utils.cpp, sdp_utils_cpp.h; the cuDNN version is the one the installed wheel
loads (torch.backends.cudnn), the CUDA version the one torch was built with. The rules follow `Settings.torch_release`
(the installed torch's by default). Torch 2.11's and 2.12's binaries (the constraint lists in can_use_*_attention,
the thresholds in check_cudnn_tensor_shapes) and headers differ from 2.14's in five rules (`_Rules`); a torch 2.11.0
on an NVIDIA H200 (cuDNN 9.19) chose as this module does for 108 calls (results/gpu-acceptance/). Any other release
gets 2.14's rules (predict/emulate/versions.py says so). Not followed: nested tensors, ROCm, FlashAttention-3
(opt-in, fp8), the `overrideable` backend of other devices, and 2.14's multi-query broadcast (key and value with one
head each, without enable_gqa: check_batch_size_and_num_heads_dense's supports_mqa), which 2.11 and 2.12 lack.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Literal

import torch

from membench import private
from membench.predict.emulate import versions

Backend = Literal["cudnn", "flash", "efficient", "math"]
BACKENDS: tuple[Backend, ...] = ("cudnn", "flash", "efficient", "math")
# at::SDPBackend's values, as torch._C._get_sdp_priority_order() reports the order (4 is `overrideable`).
_BY_VALUE: dict[int, Backend] = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn"}
DEFAULT_ORDER: tuple[Backend, ...] = ("flash", "efficient", "math", "cudnn")  # at::Context's, before any CUDA call
CUDNN_ORDER: tuple[Backend, ...] = ("cudnn", "flash", "efficient", "math")  # set by check_prefer_cudnn_attention
HALF = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Operand:
    """What the constraints read of one input."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    dtype: torch.dtype
    requires_grad: bool

    @classmethod
    def of(cls, t: torch.Tensor) -> Operand:
        return cls(tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.dtype, t.requires_grad)


@dataclass(frozen=True)
class Call:
    """One scaled_dot_product_attention call (sdp_params), with whether autograd records it."""

    query: Operand
    key: Operand
    value: Operand
    mask: Operand | None
    dropout: float
    is_causal: bool
    enable_gqa: bool
    grad_enabled: bool

    @property
    def requires_grad(self) -> bool:  # input_requires_grad
        return self.grad_enabled and (self.query.requires_grad or self.key.requires_grad or self.value.requires_grad)


@dataclass(frozen=True)
class Settings:
    """What of the process decides the choice."""

    enabled: frozenset[Backend]
    order: tuple[Backend, ...]  # torch's priority order as the process has it (before the cuDNN preference)
    deterministic: bool  # torch.use_deterministic_algorithms(True) without warn_only
    cudnn_version: int  # cuDNN's runtime version as an integer (9.24.0 -> 92400); 0 without cuDNN
    cuda_version: int  # the CUDA torch was built with (13.0 -> 13000)
    cudnn_preferred: bool = True  # TORCH_CUDNN_SDPA_DEPRIORITIZED not set
    torch_release: str = field(default_factory=versions.release)  # whose sdp_utils.cpp rules apply ("2.14")

    @classmethod
    def of_process(cls) -> Settings:
        """The settings as they are now: the flags `sdpa_kernel` and `torch.backends.cuda` set are global."""
        cuda = torch.backends.cuda
        flags = {"flash": cuda.flash_sdp_enabled(), "efficient": cuda.mem_efficient_sdp_enabled(),
                 "math": cuda.math_sdp_enabled(), "cudnn": cuda.cudnn_sdp_enabled()}
        ranked = private.sdp_priority_order()
        order = DEFAULT_ORDER if ranked is None else tuple(_BY_VALUE[v] for v in ranked if v in _BY_VALUE)
        major, minor = (int(p) for p in (torch.version.cuda or "0.0").split(".")[:2])
        return cls(frozenset(b for b, on in flags.items() if on), order,
                   torch.are_deterministic_algorithms_enabled()
                   and not torch.is_deterministic_algorithms_warn_only_enabled(),
                   torch.backends.cudnn.version() or 0 if torch.backends.cudnn.is_available() else 0,
                   major * 1000 + minor * 10,
                   os.environ.get("TORCH_CUDNN_SDPA_DEPRIORITIZED", "").lower() not in ("1", "true", "on", "yes"))


@dataclass(frozen=True)
class _Rules:
    """The constraints that differ between the torch releases checked (each present in 2.14, absent in 2.11)."""

    dropout_sixteenths: bool  # check_cudnn_dropout: cuDNN refuses a dropout not a multiple of 1/16 (from 2.12)
    late_d256: bool  # cuDNN head sizes over 128 on sm90/sm10x from cuDNN 9.23 (frontend 1.24), with a check of
    # the backward's head sizes (check_cudnn_d256_bprop_head_dim); before, 256 on sm90 alone from cuDNN 9.10 and
    # 192/128 on sm10x from 9.11, forward and backward alike
    cudnn_dims_65535: bool  # check_cudnn_tensor_shapes: batch and heads at most 65535
    efficient_offsets: bool  # check_data_ptr_alignment_mem_efficient
    efficient_gqa: bool  # memory-efficient attention's check_batch_size_and_num_heads_dense<true, ...> (before:
    # <false, true>: enable_gqa or not, query, key and value need the same head count)


_RULES_2_14 = _Rules(True, True, True, True, True)
_RULES_2_11 = _Rules(False, False, False, False, False)
# libtorch_cuda.so of 2.11.0+cu130 and 2.12.0+cu130 (sdp:: symbols, the constants compared in
# check_cudnn_tensor_shapes), sdp_utils_cpp.h of both wheels; 2.13 was not checked and gets 2.14's.
_RULES_BY_RELEASE = {"2.11": _RULES_2_11, "2.12": _Rules(True, False, False, False, False)}


def _rules(s: Settings) -> _Rules:
    return _RULES_BY_RELEASE.get(s.torch_release, _RULES_2_14)


def rules_release(s: Settings) -> str:
    """The release whose rules the choice follows: the settings' own where known, else 2.14's."""
    return s.torch_release if s.torch_release in _RULES_BY_RELEASE else "2.14"


@dataclass(frozen=True)
class Choice:
    backend: Backend
    refused: tuple[tuple[Backend, str], ...]  # each backend tried before it, with the constraint that refused it


def priority(settings: Settings, cc: tuple[int, int]) -> tuple[Backend, ...]:
    """priority_order(): torch's order, with cuDNN first on sm90 / sm10x when check_prefer_cudnn_attention holds.
    The preference replaces the order the first time a CUDA call asks for it; a user's `sdpa_kernel(...,
    set_priority=True)` sets its order after that, so an order other than the default is the user's and kept."""
    major, minor = cc
    prefer = settings.cudnn_preferred and settings.cudnn_version > 91500 and major in (9, 10)
    if settings.cuda_version < 13000:  # wheels before CUDA 13: only sm90, sm100 and sm103
        prefer = prefer and minor in (0, 3)
    return CUDNN_ORDER if prefer and settings.order == DEFAULT_ORDER else settings.order


def choose(call: Call, cc: tuple[int, int], settings: Settings) -> Choice:
    """select_sdp_backend: the first backend in priority order whose constraints pass; RuntimeError if none does
    (torch's "No available kernel")."""
    refused = []
    for backend in priority(settings, cc):
        reason = (_math if backend == "math" else _REFUSALS[backend])(call, cc, settings)
        if reason is None:
            return Choice(backend, tuple(refused))
        refused.append((backend, reason))
    raise RuntimeError("No available kernel for scaled_dot_product_attention on this GPU: "
                       + "; ".join(f"{b}: {r}" for b, r in refused))


def _math(call: Call, cc, settings: Settings) -> str | None:
    return None if "math" in settings.enabled else "disabled"


# --- constraints shared by the fused kernels (sdp_utils_cpp.h) -----------------------------------------------------

def _four_dims(call: Call) -> str | None:  # check_tensor_shapes
    if not len(call.query.shape) == len(call.key.shape) == len(call.value.shape) == 4:
        return "inputs not 4-dimensional"
    return None


def _mask_shape(call: Call) -> str | None:  # check_attn_mask_shape
    m = call.mask
    if m is None:
        return None
    if m.requires_grad:
        return "the mask requires a gradient"
    b, h, lq = call.query.shape[0], call.query.shape[1], call.query.shape[2]
    lk = call.key.shape[2]
    if m.shape[-2] not in (lq, 1) or m.shape[-1] not in (lk, 1):
        return "mask shape"
    if len(m.shape) == 2 or (len(m.shape) == 4 and m.shape[0] in (1, b) and m.shape[1] in (1, h)):
        return None
    return "mask shape"


def _heads(call: Call, same_kv_heads: bool, gqa: bool = True) -> str | None:  # check_batch_size_and_num_heads_dense
    q, k, v = call.query.shape, call.key.shape, call.value.shape
    if not q[0] == k[0] == v[0]:
        return "batch sizes differ"
    if call.enable_gqa and gqa:  # check_grouped_query_attention
        if same_kv_heads and k[-3] != v[-3]:
            return "key and value heads differ"
        if q[-3] % k[-3] or q[-3] % v[-3]:
            return "key/value heads do not divide query heads"
        return None
    return None if q[-3] == k[-3] == v[-3] else "head counts differ"


def _nonzero_lengths(call: Call) -> str | None:  # check_nonzero_sequence_lengths_dense
    return "a zero sequence length" if call.query.shape[-2] == 0 or call.key.shape[-2] == 0 else None


def _unit_last_stride(call: Call, ignore_singleton: bool) -> str | None:  # check_last_dim_stride_equals_1_dense
    ones = all(t.stride[-1] == 1 for t in (call.query, call.key, call.value))
    if ignore_singleton:
        ones = ones or call.query.shape[-1] == 1
    if not ones or (call.mask is not None and call.mask.stride[-1] != 1):  # a GPU needs the mask's too
        return "last dimension not of stride 1"
    return None


def _first(*reasons) -> str | None:
    return next((r for r in reasons if r is not None), None)


# --- cuDNN attention (can_use_cudnn_attention) ---------------------------------------------------------------------

def _cudnn(call: Call, cc: tuple[int, int], s: Settings) -> str | None:
    if s.cudnn_version < 90000:
        return "cuDNN older than 9.0 or absent"
    if call.dropout > 0 and 91100 < s.cudnn_version < 91400:
        return "dropout on cuDNN 9.11-9.13"
    general = _first(
        None if "cudnn" in s.enabled else "disabled",
        _four_dims(call),
        "deterministic algorithms" if s.deterministic else None,
        _dtype(call, HALF if cc >= (8, 0) else (torch.float16,)),
        _mask_shape(call),
        None if (8, 0) <= cc <= (12, 1) else "needs sm80-sm121",
        None if not _rules(s).dropout_sixteenths or call.dropout * 16 == math.floor(call.dropout * 16)
        else "dropout not a multiple of 1/16")
    if general:
        return general
    return _first(_nonzero_lengths(call), _unit_last_stride(call, True), _heads(call, same_kv_heads=False),
                  _cudnn_shapes(call, cc, s), _cudnn_backward_head_dims(call, cc, s))


def _supports_d256(cc: tuple[int, int], s: Settings) -> bool:
    """sm90 / sm10x with cuDNN > 9.22 (and a cuDNN frontend >= 1.24, which torch 2.14 bundles); sm107 from 9.25.1.
    Torch 2.11 and 2.12 have no such rule (see _cudnn_head_limit)."""
    sm90_or_10x = cc == (9, 0) or cc[0] == 10
    return (_rules(s).late_d256 and sm90_or_10x and not (cc == (10, 7) and s.cudnn_version <= 92500)
            and s.cudnn_version > 92200)


def _cudnn_head_limit(call: Call, cc: tuple[int, int], s: Settings) -> int:
    """check_cudnn_tensor_shapes' head_dim_limit."""
    d_qk, d_v = call.query.shape[3], call.value.shape[3]
    if not _rules(s).late_d256:  # 2.11, 2.12: 256 on sm90 from cuDNN 9.10; 192/128 on sm10x from 9.11
        if cc == (9, 0) and s.cudnn_version >= 91000:
            return 256
        return 192 if cc[0] == 10 and s.cudnn_version >= 91100 and (d_qk, d_v) == (192, 128) else 128
    if _supports_d256(cc, s):
        return 256
    if (cc == (9, 0) or cc[0] == 10) and s.cudnn_version >= 91100 and (d_qk, d_v) == (192, 128):
        return 192
    return 128


def _cudnn_shapes(call: Call, cc: tuple[int, int], s: Settings) -> str | None:  # check_cudnn_tensor_shapes
    b, h, s_q, d_qk = call.query.shape
    s_kv, d_v = call.key.shape[2], call.value.shape[3]
    if _rules(s).cudnn_dims_65535 and (b > 65535 or h > 65535):
        return "batch or heads over 65535"
    if s.cudnn_version < 8903:
        return "cuDNN older than 8.9.3"
    limit = _cudnn_head_limit(call, cc, s)
    if d_qk > limit or d_v > limit:
        return f"head size over {limit}"
    if d_qk % 8 or d_v % 8:
        return "head size not a multiple of 8"
    if s_kv == 1:
        return "key length 1"
    if call.dropout != 0 and s_q == 1:
        return "query length 1 with dropout"
    return None


def _cudnn_backward_head_dims(call: Call, cc: tuple[int, int], s: Settings) -> str | None:
    if not call.requires_grad or not _supports_d256(cc, s):
        return None
    d_qk, d_v = call.query.shape[3], call.value.shape[3]
    if (d_qk <= 128 and d_v <= 128) or (d_qk, d_v) in ((192, 128), (256, 256)):
        return None
    return "no cuDNN backward for these head sizes"


# --- flash attention (can_use_flash_attention) ---------------------------------------------------------------------

def _flash(call: Call, cc: tuple[int, int], s: Settings) -> str | None:
    general = _first(
        None if "flash" in s.enabled else "disabled",
        _four_dims(call),
        "a mask" if call.mask is not None else None,
        _flash_head_size(call),
        None if (8, 0) <= cc <= (12, 1) else "needs sm80-sm121",
        _flash_large_heads_in_training(call, cc),
        "causal with different query and key lengths" if call.is_causal and call.query.shape[2] != call.key.shape[2]
        else None,
        _dtype(call, HALF if cc >= (8, 0) else (torch.float16,)))
    if general:
        return general
    return _first(_heads(call, same_kv_heads=True), _nonzero_lengths(call), _unit_last_stride(call, True))


def _flash_head_size(call: Call) -> str | None:  # check_head_dim_size_flash: equal, at most 256 (padded to 8 later)
    d = call.query.shape[-1]
    return None if d == call.key.shape[-1] == call.value.shape[-1] and d <= 256 else "head sizes differ or over 256"


def _flash_large_heads_in_training(call: Call, cc: tuple[int, int]) -> str | None:
    """check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120: no backward kernel there for head
    sizes in (192, 224], or in (224, 256] with dropout."""
    if not call.requires_grad or not ((8, 6) <= cc <= (8, 9) or (12, 0) <= cc <= (12, 1)):
        return None
    d = call.query.shape[-1]
    return None if d <= 192 or (call.dropout == 0 and d > 224) else "training with this head size on sm86-sm89"


# --- memory-efficient attention (can_use_mem_efficient_attention) ------------------------------------------------

def gemm_alignment(dtype: torch.dtype, cc: tuple[int, int]) -> int:
    """minimum_gemm_alignment: elements a head size (and, on sm80+, a storage offset) must be a multiple of."""
    half = dtype in HALF
    tensor_cores = cc[0] >= 8 or (cc[0] >= 7 and half)
    alignment = 4 if cc[0] >= 8 else 1
    return max(alignment, 128 // (16 if half else 32)) if tensor_cores else alignment


def _efficient(call: Call, cc: tuple[int, int], s: Settings) -> str | None:
    general = _first(
        None if "efficient" in s.enabled else "disabled",
        None if (5, 0) <= cc <= (12, 1) else "needs sm50-sm121",
        _four_dims(call),
        _efficient_head_size(call, cc),
        _efficient_offsets(call, cc) if _rules(s).efficient_offsets else None)
    if general:
        return general
    dense = _first(_nonzero_lengths(call), _unit_last_stride(call, False),
                   _heads(call, same_kv_heads=True, gqa=_rules(s).efficient_gqa))
    if dense:
        return dense
    allowed = (torch.float16, torch.float32, torch.bfloat16) if cc >= (8, 0) else (torch.float16, torch.float32)
    return _dtype(call, allowed)


def _efficient_head_size(call: Call, cc: tuple[int, int]) -> str | None:  # check_head_dim_size_mem_efficient
    align = gemm_alignment(call.query.dtype, cc)
    dq, dk, dv = call.query.shape[-1], call.key.shape[-1], call.value.shape[-1]
    if dq == dk and dq % align == 0 and dq > 0 and dv % align == 0 and dv > 0:
        return None
    return f"head size not a multiple of {align}"


def _efficient_offsets(call: Call, cc: tuple[int, int]) -> str | None:  # check_data_ptr_alignment_mem_efficient
    if cc[0] < 8:
        return None
    align_bytes = gemm_alignment(call.query.dtype, cc) * call.query.dtype.itemsize
    for t in (call.query, call.key, call.value):
        if math.prod(t.shape) and (t.storage_offset * t.dtype.itemsize) % align_bytes:
            return f"a storage offset not aligned to {align_bytes} bytes"
    return None


def _dtype(call: Call, allowed) -> str | None:  # check_tensor_dtype
    q = call.query.dtype
    if q == call.key.dtype == call.value.dtype and q in allowed:
        return None
    return f"dtype {str(q).removeprefix('torch.')}"


_REFUSALS = {"cudnn": _cudnn, "flash": _flash, "efficient": _efficient}
