"""Tensors a CUDA run keeps in host memory: a CUDA prediction does not count them as GPU blocks.

A prediction runs every tensor as a fake tensor on the CPU, so a tensor a CUDA run keeps on the host looks like the
ones it keeps on the GPU, and was counted as one more 512-byte block of GPU memory. The ones that training makes:

- Adam, AdamW and Adafactor keep each parameter's step count, `state["step"]`, on the CPU unless the optimizer is
  fused or capturable (torch/optim/adam.py `_init_group`: `torch.tensor(0.0, dtype=_get_scalar_dtype(),
  device="cpu")`; _adafactor.py: `torch.tensor(0.0, dtype=_get_scalar_dtype())`); fused and capturable ones make
  it with `torch.zeros((), device=p.device)`, on the GPU: one 512-byte block per parameter would be counted too
  many.
- Their foreach step makes `torch.tensor(1.0, device="cpu")` each step, to add to those counts.

The rule: a 0-dim tensor made from Python data (`torch.tensor`, `torch.as_tensor`: ATen's `lift_fresh`) is a host
tensor, as it is in a CUDA run unless the code gives it a GPU `device=`, which a prediction cannot see (the CPU stands
for the GPU there, so `device=p.device` and `device="cpu"` arrive alike); so is a 0-dim result of ops whose tensor
inputs are all host tensors. Larger tensors made from data (a batch from a list) are counted: code moves those to the
GPU, and that move is a no-op in a prediction. What is left: a 0-dim tensor made from data on the GPU is one block
not counted; one made by a factory on the host (`torch.zeros(())`, `torch.rand([])`) one block counted.
"""

from __future__ import annotations

import torch

from membench.predict.emulate.registry import ALL_OPS, Emulation, emulation
from membench.private import LIFT_FRESH


@emulation
class HostTensors(Emulation):
    """After each op of a CUDA prediction: excludes from the tracker's count the host tensors the op made."""

    ops = ALL_OPS
    order = 90  # after every other: what they counted of the op's outputs is excluded here

    def after(self, func, args, kwargs, out, tracker) -> None:
        if not isinstance(out, torch.Tensor) or out.dim() != 0:
            return
        if func is LIFT_FRESH or _all_host(args, tracker):
            tracker.exclude(out)


def _all_host(args, tracker) -> bool:
    seen = False
    for a in args:
        if isinstance(a, torch.Tensor):
            if not tracker.excluded(a):
                return False
            seen = True
    return seen
