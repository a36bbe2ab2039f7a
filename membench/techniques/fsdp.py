"""FSDP2: parameters, gradients and optimizer state sharded across the ranks that torchrun starts."""

import torch
import torch.distributed as dist

from membench.errors import UserError
from membench.techniques.base import Technique
from membench.trackers.private import fsdp_api

CPUOffloadPolicy, OffloadPolicy, fully_shard = fsdp_api()


class Fsdp(Technique):
    """Trades communication for memory: FSDP2 (`fully_shard`) on each block and the root gives every rank 1/N
    of the parameters, gradients and optimizer state; a block's full parameters exist only while it computes
    (all-gather before, reduce-scatter of gradients after).

    Runs through torchrun (--nproc-per-node N; gloo on CPU, nccl on CUDA); --batch-size is per rank, and rank r
    trains on the r-th slice of a batch of N x batch-size, so the check compares against one process at that
    batch. Stacks with ckpt/sac (the checkpoint sits inside FSDP's hooks), amp-bf16, bf16 and opt-in-bwd.
    """

    name = "fsdp"
    summary = "FSDP2 fully_shard over torchrun ranks: 1/N of params, grads and optimizer state per rank"
    distributed = True
    conflicts = ("fsdp-offload",)
    conflict_reason = "fsdp-offload is fsdp with CPU offload: choose one"
    order = 35  # after ckpt/sac have wrapped the blocks, before any optimizer is made

    def offload_policy(self):
        return OffloadPolicy()

    def configure(self, state) -> None:
        if not dist.is_initialized():
            raise UserError(f"technique {self.name} runs under torchrun: use `membench run` (it launches torchrun)")
        blocks = state.workload.blocks(state.model) if state.workload.blocks else []
        for block in blocks:
            fully_shard(block, offload_policy=self.offload_policy())
        fully_shard(state.model, offload_policy=self.offload_policy())
        if state.on_model is not None:
            state.on_model(state.model)  # the sharded parameters are new tensors: let the meter see them


class FsdpOffload(Fsdp):
    """Like fsdp, and trades host<->device copies and a host-speed optimizer step for device memory: the
    sharded parameters, gradients and optimizer state live in host memory (CPUOffloadPolicy); a block's
    parameters are copied to the device only to compute. Conflicts with opt-offload (offloads the optimizer
    already). Host memory is pinned only when there is a GPU.
    """

    name = "fsdp-offload"
    summary = "fsdp with sharded params, grads and optimizer state in host memory: least device memory"
    conflicts = ("fsdp", "opt-offload")
    conflict_reason = "fsdp-offload already keeps the optimizer state in host memory"
    devices = ("cuda",)
    predictable = False  # on CPU, host and device memory are one

    def offload_policy(self):
        return CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
