"""The process group of a run that torchrun started: set up from torchrun's environment, torn down at the end.

torchrun does the launching and the rendezvous; this module only joins the group it describes (gloo on CPU,
nccl on CUDA) and gathers per-rank results on rank 0.
"""

from __future__ import annotations

import contextlib
import datetime
import os

import torch
import torch.distributed as dist


def launched_by_torchrun() -> bool:
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


@contextlib.contextmanager
def process_group(device: str):
    """Join torchrun's process group for the duration of one run; a no-op for a plain process."""
    if not launched_by_torchrun() or dist.is_initialized():
        yield
        return
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if device == "cuda" else "gloo", timeout=datetime.timedelta(minutes=10))
    try:
        yield
    finally:
        dist.destroy_process_group()


def rank_world() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def gather(obj) -> list:
    """Every rank's `obj`, in rank order, on every rank (all ranks must call it)."""
    if not dist.is_initialized():
        return [obj]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
