"""A CUDA GPU as a prediction on CPU sees it: the registered emulations (predict/emulate/registry.py) put together.

`CudaKernels` is the storage tracker's one hook for a CUDA prediction (trackers/storage.py calls `rewrite` before
every op and `after` it): each registered emulation made once for the target GPU, and an op table built from their
`ops`, so that an op no emulation names costs one dict lookup and the all-ops emulations (backward's in-place
paths, host tensors). `cuda_gpu` is the rest of the device: while it is active the emulations' composite kernels
run in place of torch's (attention, dropout, linear) and torch.autocast("cpu") applies CUDA's policy
(predict/emulate/autocast.py).
"""

from __future__ import annotations

import contextlib

from membench.predict import gpus
from membench.predict.emulate.autocast import cuda_policy
from membench.predict.emulate.cublas import Cublas
from membench.predict.emulate.registry import ALL_OPS, Emulation, load_all
from membench.private import composite_kernel_replaced, is_aten_op


class CudaKernels:
    """The storage tracker's hook for a CUDA prediction on `gpu`: `rewrite` before each op, `after` it.
    workspace_bytes, lt_workspace_bytes: cuBLAS's and cuBLASLt's workspace sizes, where not the GPU's and torch's
    (tests)."""

    def __init__(self, gpu, workspace_bytes: int | None = None, lt_workspace_bytes: int | None = None):
        self.gpu = gpu
        self.emulations = [cls(gpu) for cls in load_all()]
        self._before, self._before_all = _table(self.emulations, "rewrite", lambda e: e.acts_before())
        self._after, self._after_all = _table(self.emulations, "after", lambda e: e.acts_after())
        workspaces = self.find(Cublas).workspaces
        if workspace_bytes is not None:
            workspaces.nbytes = workspace_bytes
        if lt_workspace_bytes is not None:
            workspaces.lt_nbytes = lt_workspace_bytes

    def find(self, kind: type[Emulation]):
        """This prediction's instance of a registered emulation."""
        return next(e for e in self.emulations if type(e) is kind)

    @property
    def workspaces(self):
        """cuBLAS's workspaces (predict/steady.py makes and places them)."""
        return self.find(Cublas).workspaces

    def rewrite(self, func, args, kwargs):
        """The op to run instead: each of its emulations' rewrite in turn, until one gives a kernel of its own."""
        for rewrite in self._before.get(func, self._before_all):
            func = rewrite(func, args, kwargs)
            if not is_aten_op(func):
                break
        return func

    def after(self, func, args, kwargs, out, tracker) -> None:
        for after in self._after.get(func, self._after_all):
            after(func, args, kwargs, out, tracker)

    @contextlib.contextmanager
    def composites(self):
        """While active, each emulation's composite kernel replaces torch's."""
        with contextlib.ExitStack() as stack:
            for e in self.emulations:
                if e.composite is not None:
                    stack.enter_context(composite_kernel_replaced(e.composite, e.kernel))
            yield self


def _table(emulations: list[Emulation], hook: str, acts) -> tuple[dict, tuple]:
    """op -> the bound hooks of the emulations that act on it, in order; and those of the all-ops ones (any other
    op)."""
    acting = [e for e in emulations if acts(e)]
    ops = {op for e in acting if e.ops is not ALL_OPS for op in e.ops}
    table = {op: tuple(getattr(e, hook) for e in acting if e.ops is ALL_OPS or op in e.ops) for op in ops}
    return table, tuple(getattr(e, hook) for e in acting if e.ops is ALL_OPS)


@contextlib.contextmanager
def cuda_gpu(gpu=None, workspace_bytes: int | None = None, lt_workspace_bytes: int | None = None):
    """While active, fake tensors on CPU run as on `gpu` (default: the default --gpu) where the emulations' composite
    kernels and CUDA's autocast policy decide; yields the CudaKernels for the storage tracker (`tracker.kernels`)."""
    kernels = CudaKernels(gpus.GPUS[gpus.DEFAULT_GPU] if gpu is None else gpu, workspace_bytes, lt_workspace_bytes)
    with kernels.composites(), cuda_policy():
        yield kernels
