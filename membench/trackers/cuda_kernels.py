"""What CUDA kernels take from the caching allocator that CPU kernels do not: cuBLAS workspaces.

torch gives each cuBLAS handle a workspace from the caching allocator the first time the handle runs a matmul
(aten/src/ATen/cuda/CublasHandlePool.cpp), and keeps it for the life of the process. Handles are per thread: the
main thread's comes with the first matmul of the forward; the autograd engine runs backward on a thread of its
own on CUDA, whose handle (and workspace) comes with the first matmul of the first backward. On CPU, fake tensors
run backward on the calling thread and take no workspace at all, so a CUDA prediction adds them here, in the
order a GPU would allocate them. Counted as `other` memory.

The same hook makes backward take the in-place paths a plain run takes where the storage tracker, being a dispatch
mode, makes torch go out of place (trackers/subclass_like.py): a GPU run is measured from the allocator's
statistics with no dispatch mode, while a CPU run is measured by the tracker itself, whose numbers a CPU prediction
reproduces, so only a CUDA prediction undoes them.
"""

from __future__ import annotations

import torch

from membench.trackers.private import in_backward
from membench.trackers.subclass_like import BackwardPaths
from membench.vocab import OTHER

# The aten ops that run through cuBLAS on CUDA (matmuls; linear and matmul reach these), float types only.
CUBLAS_OPS = frozenset(getattr(torch.ops.aten, name).default for name in (
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "_addmm_activation"))
CUBLAS_MODULE = "(cuBLAS workspace)"


class CublasWorkspaces:
    """The StorageTracker's dispatch hook: a workspace of `nbytes` per thread that runs a matmul (main, autograd)."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.handles: dict[str, torch.Tensor] = {}
        self.paths = BackwardPaths()
        self.rewrite = self.paths.rewrite  # the op to run instead (in-place where a plain run is)
        self.after = self.paths.made

    def before(self, func, tracker) -> None:
        if func not in CUBLAS_OPS:
            return
        thread = "autograd" if in_backward() else "main"
        if thread not in self.handles:
            workspace = torch.empty(self.nbytes, dtype=torch.uint8)
            self.handles[thread] = workspace  # kept for the life of the process, as torch keeps it
            tracker.track(workspace, OTHER, CUBLAS_MODULE)

    @property
    def allocated_bytes(self) -> int:
        return self.nbytes * len(self.handles)
