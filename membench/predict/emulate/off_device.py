"""Memory a CUDA run holds outside the caching allocator, which a prediction sees made as fake CPU tensors.

A prediction runs every tensor as a fake tensor on the CPU, so a host copy looks like the device tensor it copies. A
CUDA run keeps three kinds of memory that neither `memory_allocated` nor `memory_reserved` counts; this ledger
excludes them from the storage tracker's device count and sums them apart:

- Pinned host memory: what offloading copies to the host. torch's `save_on_cpu(pin_memory=True)` (act-offload)
  packs each saved tensor into `torch.empty(size, pin_memory=True)` and unpacks it with `.to(device)`
  (torch/autograd/graph.py); opt-offload keeps pinned host copies of the parameters, and a gradient moved with
  `.to("cpu", non_blocking=True)` lands in pinned memory (ATen's _to_copy pins the destination of a non-blocking
  device-to-host copy). torch's CachingHostAllocator rounds each pinned block up to a power of two
  (aten/src/ATen/core/CachingHostAllocator.h, `c10::llvm::PowerOf2Ceil`, below pinned_max_round_threshold, which
  is unbounded by default); the sum of those blocks in use at its peak is reported. Freed blocks stay cached for
  reuse, which is not modelled: the process's pinned footprint is at least this.
- Pageable host memory: what an op makes from host tensors alone is on the host (a CUDA op runs where its inputs
  are): opt-offload's optimizer state and its step's temporaries, made from the host parameters.
- Unified memory: bitsandbytes' paged optimizer state (`F.get_paged`: cudaMallocManaged), resident on the GPU
  while the step uses it and paged out by the driver under memory pressure.
"""

from __future__ import annotations

import contextlib
import weakref

import torch

from membench.private import tree_flatten
from membench.results.schema import OffDevice


def pinned_block(nbytes: int) -> int:
    """The CachingHostAllocator's block for a request: the next power of two (0 stays 0)."""
    return 0 if nbytes <= 0 else 1 << (nbytes - 1).bit_length()


class OffDeviceLedger:
    """Called by the storage tracker after each op of a CUDA prediction (`made`), and by the techniques that move
    memory to the host (TrainState.host_memory). `tracker` is the prediction's StorageTracker."""

    def __init__(self, tracker):
        self.tracker = tracker
        self.live = {"pinned": 0, "pageable": 0}
        self.peak = {"pinned": 0, "pageable": 0}
        self.unified = 0
        self._host: dict[int, weakref.ref] = {}  # id(storage) of each live host storage, to tell inputs apart

    # --- what the techniques call ------------------------------------------------------------------------
    def pinned_copy(self, tensor: torch.Tensor) -> torch.Tensor:
        """A pinned host copy of `tensor` (torch.empty(size, pin_memory=True) then copy_, as save_on_cpu packs)."""
        with self._paused():
            packed = torch.empty(tensor.size(), dtype=tensor.dtype, layout=tensor.layout)
        self.add(packed, "pinned")
        packed.copy_(tensor)
        return packed

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor.to(device)` from the host: a new device tensor (on fake CPU tensors `.to` would return `tensor`)."""
        out = torch.empty(tensor.size(), dtype=tensor.dtype, layout=tensor.layout)
        out.copy_(tensor)
        return out

    def save_on_cpu(self):
        """torch.autograd.graph.save_on_cpu(pin_memory=True) as its source does it, the host copies told apart."""
        return torch.autograd.graph.saved_tensors_hooks(lambda t: self.pinned_copy(t), self.to_device)

    def paged(self, like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """bitsandbytes' paged buffer of `like`'s shape (F.get_paged): unified memory for the life of the optimizer,
        made out of the tracker's sight."""
        with self._paused():
            buffer = torch.zeros_like(like, dtype=dtype)
        self.tracker.exclude(buffer)
        self.unified += buffer.untyped_storage().nbytes()
        return buffer

    # --- what the tracker calls --------------------------------------------------------------------------
    def made(self, args, out) -> None:
        """An op's outputs are host memory where every tensor input is (a CUDA op runs on its inputs' device)."""
        if not self._host:
            return
        seen = False
        for a in tree_flatten(args)[0]:  # a foreach op's lists too
            if isinstance(a, torch.Tensor):
                if id(a.untyped_storage()) not in self._host and not self.tracker.excluded(a):
                    return
                seen = True
        if not seen:
            return
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and id(t.untyped_storage()) not in self._host:
                self.add(t, "pageable")

    def add(self, tensor: torch.Tensor, kind: str) -> None:
        storage = tensor.untyped_storage()
        ident = id(storage)
        if ident in self._host:
            return
        self.tracker.exclude(tensor)
        nbytes = storage.nbytes()
        size = pinned_block(nbytes) if kind == "pinned" else nbytes
        self.live[kind] += size
        self.peak[kind] = max(self.peak[kind], self.live[kind])
        live, host = self.live, self._host

        def gone(_, ident=ident, kind=kind, size=size):
            host.pop(ident, None)
            live[kind] -= size

        host[ident] = weakref.ref(storage, gone)

    @contextlib.contextmanager
    def _paused(self):
        """Within, the tracker's dispatch does not count what is made (it is host memory, excluded next)."""
        unseen, self.tracker.unseen = self.tracker.unseen, True
        try:
            yield
        finally:
            self.tracker.unseen = unseen

    def result(self) -> OffDevice | None:
        if not (self.peak["pinned"] or self.peak["pageable"] or self.unified):
            return None
        return OffDevice(pinned_host_peak_bytes=self.peak["pinned"], pageable_host_peak_bytes=self.peak["pageable"],
                         unified_bytes=self.unified)
