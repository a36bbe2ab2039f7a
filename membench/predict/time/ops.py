"""Every op of a predicted training step, as a CUDA GPU would run it: what kind of kernel, its FLOPs (torch's FLOP
counter's formulas), the bytes it reads and writes, its shape where the shape sets its speed, and when it ran.

`OpRecorder` is the storage tracker's `on_op` hook for the measured step only (predict/run.py): it sees every op
of the real step on fake tensors as the tracker does (the attention backend CUDA would choose included,
predict/emulate/sdpa.py) and keeps an `OpCall`. Fake tensors cost nothing to run, so recording adds only Python.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

from membench.trackers import recompute

aten = torch.ops.aten

GEMM_OPS = {aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten._addmm_activation}
CONV_OPS = {aten.convolution, aten._convolution, aten.convolution_backward, aten.cudnn_convolution,
            aten._slow_conv2d_forward, aten.convolution_overrideable}
MATVEC_OPS = {aten.mv, aten.addmv, aten.dot, aten.vdot}  # memory-bound on any GPU
ATTENTION_BACKENDS = {
    aten._scaled_dot_product_flash_attention: "flash", aten._scaled_dot_product_flash_attention_backward: "flash",
    aten._flash_attention_forward: "flash", aten._flash_attention_backward: "flash",
    aten._scaled_dot_product_efficient_attention: "efficient",
    aten._scaled_dot_product_efficient_attention_backward: "efficient",
    aten._efficient_attention_forward: "efficient", aten._efficient_attention_backward: "efficient",
    aten._scaled_dot_product_cudnn_attention: "cudnn", aten._scaled_dot_product_cudnn_attention_backward: "cudnn",
}
# Ops that launch no kernel: they make a tensor's metadata, or memory the caching allocator hands out uninitialised.
NO_KERNEL = {aten.detach, aten.empty, aten.empty_strided, aten.empty_like, aten.new_empty, aten.new_empty_strided,
             aten.lift_fresh, aten.set_, aten.resize_, aten.alias, aten._unsafe_view, aten._reshape_alias,
             aten.is_same_size, aten.sym_size, aten.sym_stride, aten.sym_numel, aten.sym_storage_offset}
SYNC_OPS = {aten._local_scalar_dense, aten.is_nonzero, aten.equal}  # the host waits for the GPU (.item())
HOST_OPS = {torch.ops.profiler._record_function_enter_new, torch.ops.profiler._record_function_exit}  # host only
# Reads only the rows its indices pick, not the whole weight.
GATHERS = {aten.embedding, aten.index_select, aten.gather, aten.index}
# Write their output without reading it (a fill, random numbers).
WRITE_ONLY = {aten.zero_, aten.fill_, aten.zeros_like, aten.ones_like, aten.full_like, aten.normal_, aten.uniform_,
              aten.bernoulli_, aten.random_}

# multi_tensor_apply (aten/src/ATen/native/cuda/MultiTensorApply.cuh), the kernels of foreach ops and fused
# optimizers: a launch takes at most depth_to_max_tensors[depth - 1] tensors and depth_to_max_blocks chunks of
# kChunkSize elements. The large-kernel-argument configuration (DepthToMaxConfig<true>: CUDA 12.1+ on Volta and
# later, as torch 2.14's CUDA 13 wheels run) is taken.
MTA_CHUNK = 65536
MTA_MAX_TENSORS = (770, 448, 336, 252, 210)
MTA_MAX_BLOCKS = 2240


@dataclass(frozen=True)
class OpCall:
    """One op as the time model needs it. kind: gemm, conv, attention, memory (elementwise, reductions, copies,
    matrix-vector), sync (reads a value back to the host), host (runs on the host), none (no kernel)."""

    op: str
    kind: str
    phase: str
    recomputed: bool
    dtype: str  # the op's floating input dtype ("float32", ...), or "" where it has none
    flops: int = 0
    bytes: int = 0
    gemm: tuple[int, int, int, int] | None = None  # (batch, M, N, K)
    backend: str = ""  # attention
    kernels: int = 1


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _nbytes(t: torch.Tensor) -> int:
    """The bytes a kernel touches of `t`: its elements, but no more than its storage holds (an expanded tensor
    reads its few elements again from cache, not from memory)."""
    elements = t.numel() * t.element_size()
    try:
        return min(elements, t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):
        return elements


def _dtype(tensors: list[torch.Tensor]) -> str:
    return next((str(t.dtype).removeprefix("torch.") for t in tensors if t.is_floating_point()), "")


def gemm_dims(func, args) -> tuple[int, int, int, int] | None:
    """(batch, M, N, K) of a matmul op from its operands' shapes."""
    packet = func.overloadpacket
    if packet in (aten.addmm, aten.baddbmm, aten._addmm_activation):
        args = args[1:]
    a, b = args[0], args[1]
    if a.dim() == 3:
        return a.shape[0], a.shape[1], b.shape[2], a.shape[2]
    return 1, a.shape[0], b.shape[1], a.shape[1]


def kernel_launches(func, args) -> int:
    """How many kernels a foreach op or fused optimizer launches through multi_tensor_apply: one per
    MTA_MAX_TENSORS[depth - 1] tensors or MTA_MAX_BLOCKS chunks, whichever runs out first; 1 for other ops."""
    lists = [a for a in args if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor)]
    name = func.overloadpacket.__name__
    if not lists or not (name.startswith("_foreach_") or name.startswith("_fused_")):
        return 1
    depth = min(len(lists), len(MTA_MAX_TENSORS))
    tensors = len(lists[0])
    chunks = sum(math.ceil(t.numel() / MTA_CHUNK) for t in lists[0])
    return max(1, math.ceil(tensors / MTA_MAX_TENSORS[depth - 1]), math.ceil(chunks / MTA_MAX_BLOCKS))


def _mutated(func, args) -> list[torch.Tensor]:
    """The tensors an op writes in place by its schema (`Tensor(a!)`, `Tensor(a!)[]`): what a foreach op or a
    fused optimizer, which return nothing, writes."""
    arguments = func._schema.arguments
    return [t for arg, value in zip(arguments, args)
            if arg.alias_info is not None and arg.alias_info.is_write for t in _tensors(value)]


def op_bytes(func, args, out) -> int:
    """Bytes read and written: every input tensor and every output once (an in-place op's output is its input,
    written back; an op that returns nothing writes the arguments its schema marks as written); an index op reads
    only the rows its output holds."""
    outs = _tensors(out) or _mutated(func, args)
    written = sum(_nbytes(t) for t in outs)
    if func.overloadpacket in GATHERS:
        indices = sum(_nbytes(t) for t in _tensors(args) if not t.is_floating_point())
        return 2 * written + indices
    if func.overloadpacket in WRITE_ONLY:
        return written
    return sum(_nbytes(t) for t in _tensors(args)) + written


def classify(func, args, kwargs, out, phase: str) -> OpCall:
    packet = func.overloadpacket
    inputs = _tensors((args, kwargs))
    common = dict(op=packet.__name__, phase=phase, recomputed=recompute.active(), dtype=_dtype(inputs))
    if func.is_view or packet in NO_KERNEL:
        return OpCall(kind="none", **common)
    if packet in SYNC_OPS:
        return OpCall(kind="sync", **common)
    if packet in HOST_OPS:
        return OpCall(kind="host", **common)
    flops = _flops(packet, args, kwargs, out)
    nbytes = op_bytes(func, args, out)
    if packet in GEMM_OPS:
        return OpCall(kind="gemm", flops=flops, bytes=nbytes, gemm=gemm_dims(func, args), **common)
    if packet in CONV_OPS:
        return OpCall(kind="conv", flops=flops, bytes=nbytes, **common)
    if packet in ATTENTION_BACKENDS:
        return OpCall(kind="attention", flops=flops, bytes=nbytes, backend=ATTENTION_BACKENDS[packet], **common)
    return OpCall(kind="memory", bytes=nbytes, kernels=kernel_launches(func, args), **common)


def _flops(packet, args, kwargs, out) -> int:
    """torch's FLOP formula for the op (torch.utils.flop_counter), 0 where it has none. Before torch 2.12 its
    attention formulas assert that query, key and value have as many heads (sdpa_flop_count), which grouped-query
    attention (enable_gqa) does not: there the key's and value's heads are broadcast to the query's, as the kernel
    computes them, and the formula is asked again."""
    if packet not in flop_registry:
        return 0
    try:
        return flop_registry[packet](*args, **kwargs, out_val=out)
    except AssertionError:
        heads = max((a.shape[1] for a in args if isinstance(a, torch.Tensor) and a.dim() == 4), default=0)
        # the formulas read shapes only (flop_counter.shape_wrapper passes a torch.Size through as one)
        broadcast = [torch.Size((a.shape[0], heads, *a.shape[2:])) if isinstance(a, torch.Tensor) and a.dim() == 4
                     and a.shape[1] != heads and heads % a.shape[1] == 0 else a for a in args]
        return flop_registry[packet](*broadcast, **kwargs, out_val=out)


class OpRecorder:
    """Keeps an OpCall for every op the storage tracker runs while active (its `on_op` hook, the op as the model
    called it, before the tracker's CUDA rewrites): the phase is the tracker's; an op whose tensors are all ones a
    CUDA run keeps on the host (predict/emulate/host.py: optimizers' step counts) runs on the host."""

    def __init__(self, tracker):
        self.tracker = tracker
        self.calls: list[OpCall] = []

    def __call__(self, func, args, kwargs, out) -> None:
        if self.tracker.phase == "setup":  # the batch made on the host before the step (not timed by a run either)
            return
        call = classify(func, args, kwargs, out, self.tracker.phase)
        if call.kind != "none" and self._on_host(args):
            call = dataclasses.replace(call, kind="host", flops=0, bytes=0)
        self.calls.append(call)

    def _on_host(self, args) -> bool:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        excluded = getattr(self.tracker, "excluded", None)
        return bool(tensors) and excluded is not None and all(excluded(t) for t in tensors)

    def __enter__(self) -> OpRecorder:
        self.previous, self.tracker.on_op = self.tracker.on_op, self
        return self

    def __exit__(self, *exc) -> None:
        self.tracker.on_op = self.previous
