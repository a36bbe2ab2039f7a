"""Where CUDA kernels change a step's allocations from what fake tensors on CPU make: the storage tracker's one hook
for a CUDA prediction (`CudaKernels`, called around every op), of three parts.

- cuBLAS workspaces (`CublasWorkspaces`, here): torch gives each cuBLAS handle a workspace from the caching
  allocator the first time the handle runs a matmul (aten/src/ATen/cuda/CublasHandlePool.cpp), and keeps it for the
  life of the process. Handles are per thread: the main thread's comes with the first matmul of the forward; the
  autograd engine runs backward on a thread of its own on CUDA, whose handle (and workspace) comes with the first
  matmul of the first backward. ATen's matmuls are structured kernels, so the output exists before the kernel asks
  for its handle: the workspace comes after the first matmul's output. Fake tensors on CPU run backward on the
  calling thread and take no workspace at all. Counted as `other` memory.
- Kernel scratch (predict/emulate/reductions.py): what reductions and accumulating index_put_ take and free inside
  the kernel.
- Backward's in-place paths (predict/emulate/inplace_backward.py): where the storage tracker, being a dispatch
  mode, makes torch go out of place, a plain run takes the in-place path. A GPU run is measured from the allocator's
  statistics with no dispatch mode, while a CPU run is measured by the tracker itself, whose numbers a CPU prediction
  reproduces, so only a CUDA prediction undoes them.
- Host tensors (predict/emulate/host.py): what a CUDA run keeps on the CPU (optimizers' step counts) is not counted.
- Output dtypes (predict/emulate/dtypes.py): LayerNorm's and BatchNorm's statistics in fp32 under 16-bit input.
- Output order (predict/emulate/dropout.py): CUDA's fused dropout allocates its mask before its output.
"""

from __future__ import annotations

import torch

from membench.common.vocab import OTHER
from membench.predict.emulate.attention_kernels import AttentionKernels
from membench.predict.emulate.cublas_operands import operand_copies
from membench.predict.emulate.dropout import count_mask_first
from membench.predict.emulate.dtypes import CudaDtypes
from membench.predict.emulate.host import HostTensors
from membench.predict.emulate.inplace_backward import BackwardPaths
from membench.predict.emulate.reductions import KernelScratch
from membench.private import in_backward

# The aten ops that run through cuBLAS on CUDA (matmuls; linear and matmul reach these), float types only.
CUBLAS_OPS = frozenset(getattr(torch.ops.aten, name).default for name in (
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "_addmm_activation"))
CUBLAS_MODULE = "(cuBLAS workspace)"


class CublasWorkspaces:
    """A workspace of `nbytes` per thread that runs a matmul (main, autograd), made at its first matmul."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.handles: dict[str, torch.Tensor] = {}
        self.first_use: dict[str, int] = {}  # thread -> the trace's length where its workspace is made (since cleared)

    def matmul_ran(self, tracker) -> None:
        thread = "autograd" if in_backward() else "main"
        if tracker.trace is not None and thread not in self.first_use:
            self.first_use[thread] = len(tracker.trace)
        self.make(thread, tracker)

    def make(self, thread: str, tracker) -> None:
        """The thread's workspace, if it has none yet (a prediction may make both before its first step)."""
        if thread not in self.handles:
            workspace = torch.empty(self.nbytes, dtype=torch.uint8)
            self.handles[thread] = workspace  # kept for the life of the process, as torch keeps it
            tracker.track(workspace, OTHER, CUBLAS_MODULE)

    @property
    def allocated_bytes(self) -> int:
        return self.nbytes * len(self.handles)


class CudaKernels:
    """The storage tracker's hook for a CUDA prediction on `gpu`: `rewrite` before each op, `after` it."""

    def __init__(self, gpu, workspace_bytes: int | None = None):
        self.workspaces = CublasWorkspaces(gpu.cublas_workspace_bytes if workspace_bytes is None else workspace_bytes)
        self.scratch = KernelScratch(gpu)
        self.paths = BackwardPaths()
        self.attention = AttentionKernels(gpu)
        self.host = HostTensors()
        self.dtypes = CudaDtypes()

    def rewrite(self, func, args, kwargs):
        """The op to run instead (in-place where a plain run is; CUDA's outputs for fused attention; with CUDA's
        output dtypes)."""
        return self.attention.rewrite(func) or self.dtypes.rewrite(self.paths.rewrite(func, args, kwargs), args)

    def after(self, func, args, kwargs, out, tracker) -> None:
        self.paths.made(func, out)
        count_mask_first(func, args, out, tracker)
        if func in CUBLAS_OPS:
            tracker.track_outputs(out)  # before the workspace, as a GPU allocates them
            copies = operand_copies(func, args, out, tracker)  # cuBLAS's operands, before it asks for a handle
            self.workspaces.matmul_ran(tracker)
            del copies  # let go as the matmul returns
        self.attention.run(func, args, kwargs, out, tracker)
        self.scratch.run(func, args, kwargs, out, tracker)
        self.host.made(func, args, out, tracker)
