"""CUDA's autocast policy on CPU fake tensors: a prediction for a CUDA GPU casts what CUDA's autocast casts.

Predictions run on fake tensors on device cpu, so `torch.autocast` there runs CPU's policy, which differs from
CUDA's where memory is concerned: CPU runs softmax, layer_norm, exp, sum, log and vector norms in the low
precision (CUDA: fp32), casts einsum's operands only inside its matmuls (CUDA: einsum as a whole), and leaves out
ops CUDA casts (addmv, addr, rms_norm, ...). While `cuda_policy()` is active, the AutocastCPU dispatch key runs
CUDA's policy instead: the op lists below are CUDA's, and each kernel does what ATen's autocast kernels do
(aten/src/ATen/autocast_mode.h and .cpp, torch 2.14): `cached_cast` of every eligible floating-point argument
(not float64) to the op's type, the lower-precision casts of fp32 leaf tensors that require grad (the weights)
kept in a cache until the outermost autocast region ends, `fp32_set_opt_dtype` ops given `dtype=float32`,
`promote` ops cast to the widest floating type among their arguments. Ops CPU autocasts and CUDA does not run
uncast. The lists are read from the installed torch's `autocast_mode.h` (the wheel ships it; they change between
releases), else the copies below (torch 2.14's); `tests/predict/emulate/test_autocast.py` checks both.
"""

from __future__ import annotations

import contextlib
import functools
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from membench.private import AUTOCAST_CPU_KEYS, destroy_library, exclude_dispatch_keys, ops_with_kernel_for

LOWER_PRECISION_FP = (
    "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
    "conv_transpose2d.input", "conv_transpose3d.input", "convolution", "prelu", "addmm", "addmv", "addr", "matmul",
    "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul",
    "linalg_multi_dot", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell",
    "rnn_relu_cell", "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
)
FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt", "sinh",
    "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus", "layer_norm", "native_layer_norm",
    "rms_norm", "group_norm", "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim", "cosine_similarity",
    "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div",
    "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss", "multilabel_margin_loss",
    "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits", "dist",
    "pdist", "cdist", "renorm", "logsumexp", "upsample_nearest1d", "_upsample_nearest_exact1d",
    "upsample_nearest2d", "_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d",
    "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa", "upsample_trilinear3d",
    "upsample_bicubic2d", "_upsample_bicubic2d_aa",
)
FP32_SET_OPT_DTYPE = (
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum", "linalg_vector_norm",
    "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum", "sum.dim_IntList",
)
# CUDA's softmax and log_softmax read a float16 input directly when asked for float32 (at::softmax calls
# _softmax(input, dim, half_to_float=true) for a CUDA Half input, aten/src/ATen/native/SoftMax.cpp); on any other
# device, and for bfloat16, they copy the input to float32 first, a transient copy a GPU never makes.
HALF_TO_FLOAT = {"softmax.int": "_softmax", "log_softmax.int": "_log_softmax"}
# norm without a dtype is redispatched to its overload with one (fp32_append_dtype).
FP32_APPEND_DTYPE = {"norm.Scalar": "norm.ScalarOpt_dtype", "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype"}
PROMOTE = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put",
           "tensordot", "scatter_add")


@dataclass(frozen=True)
class CudaLists:
    """ATen's CUDA autocast op lists, and where they were read."""

    lower_precision_fp: tuple[str, ...]
    fp32: tuple[str, ...]
    fp32_set_opt_dtype: tuple[str, ...]
    promote: tuple[str, ...]
    source: str


COPIED = CudaLists(LOWER_PRECISION_FP, FP32, FP32_SET_OPT_DTYPE, PROMOTE, "copied from torch 2.14's autocast_mode.h")
_MACROS = ("AT_FORALL_LOWER_PRECISION_FP", "AT_FORALL_FP32", "AT_FORALL_FP32_SET_OPT_DTYPE", "AT_FORALL_PROMOTE")


@functools.cache
def cuda_lists() -> CudaLists:
    """The installed torch's lists, read from the ATen header its wheel ships (they change between releases: 2.9's
    FP32 list has no rms_norm, 2.14's has); the copies above where it ships none or it cannot be read."""
    header = Path(torch.__file__).parent / "include" / "ATen" / "autocast_mode.h"
    try:
        return lists_from_header(header.read_text(), f"read from {header}")
    except (OSError, ValueError):
        return COPIED


def lists_from_header(text: str, source: str) -> CudaLists:
    """The four lists from the header's `#define AT_FORALL_...(_)` macros: `_(op)` or `_(op, overload)` entries up
    to the first line without a continuation backslash. ValueError where a macro is missing."""
    found = []
    for name in _MACROS:
        match = re.search(rf"#define {name}\(_\)((?:[^\n]*\\\n)*[^\n]*)", text)
        if match is None:
            raise ValueError(f"{name} not in the header")
        found.append(tuple(".".join(filter(None, (op.strip(), overload.strip())))
                           for op, overload in re.findall(r"_\((\w+)(?:,\s*(\w+))?\)", match.group(1))))
    return CudaLists(*found, source=source)


def _op(name: str):
    """The op of that name in the installed torch, None where it has none (a header's list may name one)."""
    base, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, base, None), overload or "default", None)


class _Casts:
    """The autocast weight cache: one low-precision copy per fp32 leaf tensor that requires grad, kept until the
    outermost autocast region ends (torch.autocast's exit calls torch.clear_autocast_cache). Not under
    torch.inference_mode: a real GPU's trace of a bf16 inference forward (benchmarks/validate_predictions.py,
    medium ctx512) holds no cast weights, and predicting it so is exact to the byte."""

    def __init__(self):
        self.cached: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def cast(self, value, to_type: torch.dtype, lower: torch.dtype):
        if isinstance(value, (list, tuple)):
            return type(value)(self.cast(v, to_type, lower) for v in value)
        if not _eligible(value) or value.dtype == to_type:
            return value
        if (to_type == lower and value.dtype == torch.float32 and value.requires_grad and value.is_leaf
                and value._base is None and torch.is_autocast_cache_enabled()
                and not torch.is_inference_mode_enabled()):
            hit = self.cached.get(id(value))
            if hit is not None and hit[0] is value:
                return hit[1]
            casted = value.to(to_type)
            self.cached[id(value)] = (value, casted)
            return casted
        return value.to(to_type)

    def clear(self) -> None:
        self.cached.clear()


def _eligible(value) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != torch.float64


def _tensors(values):
    for value in values:
        if isinstance(value, (list, tuple)):
            yield from _tensors(value)
        elif isinstance(value, torch.Tensor):
            yield value


def _cast_call(casts: _Casts, op, args, kwargs, to_type: torch.dtype, lower: torch.dtype):
    """op called with its arguments cast as ATen's autocast kernel casts them, then the casts let go as it lets go of
    them (aten/src/ATen/autocast_mode.h, `WrapFunction_`: `(*F)(cached_cast(to_type, args, device_type)...)`).

    - The casts are made last argument first: the pack expands into the arguments of one function call, whose
      evaluation order C++ leaves to the compiler, and GCC (torch's Linux wheels) evaluates them right to left; the
      traces in results/gpu-traces/ (torch 2.11) show it for every nn.Linear under autocast: bias, weight, input.
    - A tensor list argument (einsum's operands) is cast first to last, by the loop inside its `cached_cast`.
    - The casts are temporaries of that call, destroyed at its end in the reverse of the order they were made: the
      first argument's first; a list's vector destroys its elements first to last (a real GPU trace of a bf16
      einsum frees the input's copy before the weight's). CPython would free a tuple's or list's items last to
      first, so each is let go here explicitly, in that order.

    Arguments are taken in the op's schema order: the positional ones, then the keyword ones."""
    names = [a.name for a in op._schema.arguments]
    keys = sorted(kwargs, key=lambda k: names.index(k) if k in names else len(names))
    values = [*args, *(kwargs[k] for k in keys)]
    for i in reversed(range(len(values))):
        values[i] = casts.cast(values[i], to_type, lower)
        if isinstance(values[i], tuple):
            values[i] = list(values[i])
    out = op(*values[:len(args)], **dict(zip(keys, values[len(args):])))
    for i in range(len(values)):
        if isinstance(values[i], list):
            for j in range(len(values[i])):
                values[i][j] = None
        values[i] = None
    return out


def _kernels(casts: _Casts) -> dict[str, object]:
    """One AutocastCPU kernel per op CUDA autocasts, doing what CUDA's kernel for that op does."""

    def lower_precision(op):
        def kernel(*args, **kwargs):
            lower = torch.get_autocast_dtype("cpu")
            with exclude_dispatch_keys(AUTOCAST_CPU_KEYS):
                return _cast_call(casts, op, args, kwargs, lower, lower)
        return kernel

    def fp32(op):
        def kernel(*args, **kwargs):
            lower = torch.get_autocast_dtype("cpu")
            with exclude_dispatch_keys(AUTOCAST_CPU_KEYS):
                return _cast_call(casts, op, args, kwargs, torch.float32, lower)
        return kernel

    def set_opt_dtype(op, half_to_float=None):
        names = [a.name for a in op._schema.arguments]
        where = names.index("dtype")

        def kernel(*args, **kwargs):
            with exclude_dispatch_keys(AUTOCAST_CPU_KEYS):
                given = args[where] if len(args) > where else kwargs.get("dtype")
                if args and _eligible(args[0]) and given is None:
                    given = torch.float32
                    if len(args) > where:
                        args = (*args[:where], torch.float32, *args[where + 1:])
                    else:
                        kwargs = {**kwargs, "dtype": torch.float32}
                if half_to_float is not None and given == torch.float32 and args[0].dtype == torch.float16:
                    dim = args[1] if len(args) > 1 else kwargs["dim"]
                    return half_to_float(args[0], dim, True)
                return op(*args, **kwargs)
        return kernel

    def append_dtype(op, with_dtype):
        def kernel(*args, **kwargs):
            lower = torch.get_autocast_dtype("cpu")
            with exclude_dispatch_keys(AUTOCAST_CPU_KEYS):
                if args and _eligible(args[0]):
                    args = casts.cast(args, torch.float32, lower)
                    return with_dtype(*args, **kwargs, dtype=torch.float32)
                return op(*args, **kwargs)
        return kernel

    def promote(op):
        def kernel(*args, **kwargs):
            lower = torch.get_autocast_dtype("cpu")
            widest = lower
            for t in _tensors((*args, *kwargs.values())):
                if _eligible(t) and (widest == torch.float32 or t.dtype == torch.float32):
                    widest = torch.float32
            with exclude_dispatch_keys(AUTOCAST_CPU_KEYS):
                return _cast_call(casts, op, args, kwargs, widest, lower)
        return kernel

    lists = cuda_lists()
    here = lambda names: [name for name in names if _op(name) is not None]  # noqa: E731
    kernels = {}
    for name in here(lists.lower_precision_fp):
        kernels[name] = lower_precision(_op(name))
    for name in here(lists.fp32):
        kernels[name] = fp32(_op(name))
    for name in here(lists.fp32_set_opt_dtype):
        kernels[name] = set_opt_dtype(_op(name), _op(HALF_TO_FLOAT[name]) if name in HALF_TO_FLOAT else None)
    for name, target in FP32_APPEND_DTYPE.items():
        kernels[name] = append_dtype(_op(name), _op(target))
    for name in here(lists.promote):
        kernels[name] = promote(_op(name))
    return kernels


@contextlib.contextmanager
def cuda_policy():
    """While active, torch.autocast("cpu", ...) applies CUDA's autocast policy (see the module's docstring)."""
    casts = _Casts()
    kernels = _kernels(casts)
    library = torch.library.Library("aten", "IMPL")
    clear = torch.clear_autocast_cache

    def clear_both():
        casts.clear()
        clear()

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Overriding a previously registered kernel": that is the point
            for name in ops_with_kernel_for("AutocastCPU"):
                if name.removesuffix(".default") not in kernels:  # CPU casts it, CUDA does not
                    library.impl(name, torch.library.fallthrough_kernel, "AutocastCPU")
            for name, kernel in kernels.items():
                library.impl(name, kernel, "AutocastCPU")
        torch.clear_autocast_cache = clear_both
        yield
    finally:
        torch.clear_autocast_cache = clear
        casts.clear()
        destroy_library(library)
