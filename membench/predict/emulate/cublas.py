"""What a matmul takes on CUDA besides its output: cuBLAS's workspaces and its operands' copies.

- cuBLAS workspaces (`CublasWorkspaces`): torch gives each cuBLAS handle a workspace from the caching
  allocator the first time the handle runs a matmul (aten/src/ATen/cuda/CublasHandlePool.cpp), and keeps it for the
  life of the process. Handles are per thread: the main thread's comes with the first matmul of the forward; the
  autograd engine runs backward on a thread of its own on CUDA, whose handle (and workspace) comes with the first
  matmul of the first backward. ATen's matmuls are structured kernels, so the output exists before the kernel asks
  for its handle: the workspace comes after the first matmul's output. Fake tensors on CPU run backward on the
  calling thread and take no workspace at all. Counted as `other` memory.
- cuBLASLt workspaces: under a torch whose cuBLASLt does not share the handle's workspace (before 2.13,
  gpus.cublaslt_workspace_bytes), the first addmm on a thread that takes ATen's cuBLASLt path (a 1-D bias, beta 1:
  `isInputCompliesAddmmCudaLt` in cuda/Blas.cpp; nn.Linear with a bias) makes a second, smaller workspace for that
  handle, after the handle's cuBLAS one, and it too is kept for the life of the process.
- Operand copies (predict/emulate/cublas_operands.py): operands cuBLAS cannot read as they are, copied after the
  output and before the handle is asked for, freed as the matmul returns.
"""

from __future__ import annotations

import os

import torch

from membench.common.vocab import OTHER
from membench.predict.emulate.cublas_operands import operand_copies
from membench.predict.emulate.registry import Emulation, emulation
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


@emulation
class Cublas(Emulation):
    """A matmul's operand copies and its thread's workspaces (`workspaces`: a prediction may make both before its
    first step, and sizes them for a test)."""

    ops = CUBLAS_OPS
    order = 70

    def __init__(self, gpu):
        super().__init__(gpu)
        self.workspaces = CublasWorkspaces(cublas_workspace_bytes(gpu.compute_capability),
                                           cublaslt_workspace_bytes(release()))

    def after(self, func, args, kwargs, out, tracker) -> None:
        tracker.track_outputs(out)  # before the workspace, as a GPU allocates them
        copies = operand_copies(func, args, out, tracker)  # cuBLAS's operands, before it asks for a handle
        # whether cuBLASLt runs matters only where it has a workspace of its own (torch before 2.13)
        cublaslt = bool(self.workspaces.lt_nbytes) and takes_cublaslt(func, args, kwargs, out)
        self.workspaces.matmul_ran(tracker, cublaslt)
        del copies  # let go as the matmul returns
