"""Where CUDA kernels change a step's allocations from what fake tensors on CPU make: the storage tracker's one hook
for a CUDA prediction (`CudaKernels`, called around every op), of three parts.

- cuBLAS workspaces (`CublasWorkspaces`, here): torch gives each cuBLAS handle a workspace from the caching
  allocator the first time the handle runs a matmul (aten/src/ATen/cuda/CublasHandlePool.cpp), and keeps it for the
  life of the process. Handles are per thread: the main thread's comes with the first matmul of the forward; the
  autograd engine runs backward on a thread of its own on CUDA, whose handle (and workspace) comes with the first
  matmul of the first backward. ATen's matmuls are structured kernels, so the output exists before the kernel asks
  for its handle: the workspace comes after the first matmul's output. Fake tensors on CPU run backward on the
  calling thread and take no workspace at all. Counted as `other` memory.
- cuBLASLt workspaces (here): under a torch whose cuBLASLt does not share the handle's workspace (before 2.13,
  gpus.cublaslt_workspace_bytes), the first addmm on a thread that takes ATen's cuBLASLt path (a 1-D bias, beta 1:
  `isInputCompliesAddmmCudaLt` in cuda/Blas.cpp; nn.Linear with a bias) makes a second, smaller workspace for that
  handle, after the handle's cuBLAS one, and it too is kept for the life of the process.
- Kernel scratch (predict/emulate/reductions.py): what reductions, accumulating index_put_ and _safe_softmax take
  and free inside the kernel.
- Backward's in-place paths (predict/emulate/inplace_backward.py): where the storage tracker, being a dispatch
  mode, makes torch go out of place, a plain run takes the in-place path. A GPU run is measured from the allocator's
  statistics with no dispatch mode, while a CPU run is measured by the tracker itself, whose numbers a CPU prediction
  reproduces, so only a CUDA prediction undoes them.
- Host tensors (predict/emulate/host.py): what a CUDA run keeps on the CPU (optimizers' step counts) is not counted.
- Output dtypes (predict/emulate/dtypes.py): LayerNorm's and BatchNorm's statistics in fp32 under 16-bit input.
- Output order (predict/emulate/dropout.py): CUDA's fused dropout allocates its mask before its output.
- LayerNorm's copies (predict/emulate/layer_norm.py): CUDA's LayerNorm, forward and backward, copies a
  non-contiguous input (and weight, bias, output gradient) to a contiguous tensor, freed as it returns.
- The math attention path's mask add (predict/emulate/sdpa.py, `math_mask_add`): in place, as a plain run adds it.
"""

from __future__ import annotations

import os

import torch

from membench.common.vocab import OTHER
from membench.predict.emulate import attention_kernels, dtypes, reductions
from membench.predict.emulate.attention_kernels import AttentionKernels
from membench.predict.emulate.cublas_operands import operand_copies
from membench.predict.emulate.dropout import count_mask_first
from membench.predict.emulate.dtypes import CudaDtypes
from membench.predict.emulate.host import HostTensors
from membench.predict.emulate.inplace_backward import BackwardPaths
from membench.predict.emulate.layer_norm import layer_norm_copies
from membench.predict.emulate.reductions import KernelScratch
from membench.predict.emulate.sdpa import math_mask_add
from membench.predict.emulate.versions import release
from membench.predict.gpus import cublas_workspace_bytes, cublaslt_workspace_bytes
from membench.private import in_backward

# The aten ops that run through cuBLAS on CUDA (matmuls; linear and matmul reach these), float types only.
CUBLAS_OPS = frozenset(getattr(torch.ops.aten, name).default for name in (
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "_addmm_activation"))
CUBLAS_MODULE = "(cuBLAS workspace)"
_LT_OPS = frozenset((torch.ops.aten.addmm.default, torch.ops.aten._addmm_activation.default))


class CublasWorkspaces:
    """A workspace of `nbytes` per thread that runs a matmul (main, autograd), made at its first matmul; and where
    cuBLASLt has its own (`lt_nbytes` > 0), one more per thread at its first addmm on the cuBLASLt path."""

    def __init__(self, nbytes: int, lt_nbytes: int = 0):
        self.nbytes, self.lt_nbytes = nbytes, lt_nbytes
        self.handles: dict[str, torch.Tensor] = {}
        self.lt: dict[str, torch.Tensor] = {}
        self.first_use: dict[str, int] = {}  # thread -> the trace's length where its workspace is made (since cleared)

    def matmul_ran(self, tracker, cublaslt: bool = False) -> None:
        thread = "autograd" if in_backward() else "main"
        if tracker.trace is not None and thread not in self.first_use:
            self.first_use[thread] = len(tracker.trace)
        self.make(thread, tracker)
        if cublaslt and self.lt_nbytes and thread not in self.lt:
            self.lt[thread] = self._kept(self.lt_nbytes, tracker)

    def make(self, thread: str, tracker) -> None:
        """The thread's workspace, if it has none yet (a prediction may make both before its first step)."""
        if thread not in self.handles:
            self.handles[thread] = self._kept(self.nbytes, tracker)

    @staticmethod
    def _kept(nbytes: int, tracker) -> torch.Tensor:
        workspace = torch.empty(nbytes, dtype=torch.uint8)  # kept for the life of the process, as torch keeps it
        tracker.track(workspace, OTHER, CUBLAS_MODULE)
        return workspace

    @property
    def allocated_bytes(self) -> int:
        return self.nbytes * len(self.handles) + self.lt_nbytes * len(self.lt)


_LT_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def takes_cublaslt(func, args, kwargs, out) -> bool:
    """Whether ATen's addmm runs this call through cuBLASLt's bias epilogue (isInputCompliesAddmmCudaLt, CUDA 12.1
    and later, as torch's CUDA 12/13 wheels are built; not with DISABLE_ADDMM_CUDA_LT=1): an out-of-place addmm
    whose `self` is a contiguous 1-D bias of the output's width, beta 1, a contiguous 2-D output, a floating dtype,
    both operands at least 2 x 2."""
    if func not in _LT_OPS or os.environ.get("DISABLE_ADDMM_CUDA_LT") == "1":
        return False
    bias, mat1, mat2 = args[:3]
    return (kwargs.get("beta", 1) == 1 and bias.dim() == 1 and bias.shape[0] == mat2.shape[1] and bias.is_contiguous()
            and isinstance(out, torch.Tensor) and out.dim() == 2 and out.is_contiguous()
            and mat1.dtype in _LT_DTYPES and min(*mat1.shape, *mat2.shape) > 1)


class CudaKernels:
    """The storage tracker's hook for a CUDA prediction on `gpu`: `rewrite` before each op, `after` it."""

    def __init__(self, gpu, workspace_bytes: int | None = None, lt_workspace_bytes: int | None = None):
        self.workspaces = CublasWorkspaces(
            cublas_workspace_bytes(gpu.compute_capability) if workspace_bytes is None else workspace_bytes,
            cublaslt_workspace_bytes(release()) if lt_workspace_bytes is None else lt_workspace_bytes)
        self.scratch = KernelScratch(gpu)
        self.paths = BackwardPaths()
        self.attention = AttentionKernels(gpu)
        self.host = HostTensors()
        self.dtypes = CudaDtypes()

    def rewrite(self, func, args, kwargs):
        """The op to run instead (in-place where a plain run is; CUDA's outputs for fused attention; with CUDA's
        output dtypes)."""
        if func in _REWRITTEN:
            func = math_mask_add(func, args, kwargs)  # the math attention path's in-place mask add
            replaced = self.attention.rewrite(func)
            if replaced is not None:
                return replaced
            return self.dtypes.rewrite(self.paths.rewrite(func, args, kwargs), args)
        return self.paths.rewrite(func, args, kwargs)  # the only one that may rewrite any op (to its in-place form)

    def after(self, func, args, kwargs, out, tracker) -> None:
        self.paths.made(func, out)
        if func in _SPECIAL:  # the hooks below act on these ops only; most ops of a step are none of them
            self._special(func, args, kwargs, out, tracker)
        self.host.made(func, args, out, tracker)

    def _special(self, func, args, kwargs, out, tracker) -> None:
        count_mask_first(func, args, out, tracker)
        layer_norm_copies(func, args, kwargs, out, tracker)
        if func in CUBLAS_OPS:
            tracker.track_outputs(out)  # before the workspace, as a GPU allocates them
            copies = operand_copies(func, args, out, tracker)  # cuBLAS's operands, before it asks for a handle
            # whether cuBLASLt runs matters only where it has a workspace of its own (torch before 2.13)
            cublaslt = bool(self.workspaces.lt_nbytes) and takes_cublaslt(func, args, kwargs, out)
            self.workspaces.matmul_ran(tracker, cublaslt)
            del copies  # let go as the matmul returns
        self.attention.run(func, args, kwargs, out, tracker)
        self.scratch.run(func, args, kwargs, out, tracker)


# The ops CudaKernels.rewrite's hooks other than the backward's in-place paths rewrite (each checks again): the math
# attention path's mask add, the fused attention kernels, the ops whose statistics CUDA keeps in fp32.
_REWRITTEN = frozenset({torch.ops.aten.add.Tensor, *attention_kernels.IMPLEMENTATIONS, *dtypes.FP32_OPS})

# The ops CudaKernels._special's hooks act on (each hook checks again): dropout's, LayerNorm's, the cuBLAS matmuls, the
# fused attention kernels (and the replacements the tracker runs for them), those that take kernel scratch. Asking
# each hook about every op was a tenth of the tracker's own time.
_SPECIAL = frozenset({torch.ops.aten.native_dropout.default, torch.ops.aten.native_layer_norm.default,
                      torch.ops.aten.native_layer_norm_backward.default, *CUBLAS_OPS, *attention_kernels.EVENTS,
                      *attention_kernels.OP_OF, *reductions.CANDIDATES})
