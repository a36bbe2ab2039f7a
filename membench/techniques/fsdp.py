"""FSDP2: parameters, gradients and optimizer state sharded across the ranks that torchrun starts."""

from membench.common.errors import UserError
from membench.techniques.base import Technique
from membench.techniques.mesh import check_tp, fsdp_submesh


def _dtype(name: str | None):
    """A --param-dtype / --reduce-dtype name as torch's dtype (None: FSDP2's default); torch only where it runs."""
    import torch

    return None if name is None else {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


class Fsdp(Technique):
    """Trades communication for memory: FSDP2 (`fully_shard`) on each block and the root gives every rank 1/N
    of the parameters, gradients and optimizer state; a block's full parameters exist only while it computes
    (all-gather before, reduce-scatter of gradients after).

    Runs through torchrun (--nproc-per-node N; gloo on CPU, nccl on CUDA); --batch-size is per rank, and rank r
    trains on the r-th slice of a batch of N x batch-size, so the check compares against one process at that
    batch. Stacks with ckpt/sac (the checkpoint sits inside FSDP's hooks), amp-bf16, bf16 and opt-in-bwd.
    --mesh picks the ranks it shards over (dp_shard; with dp_replicate, HSDP: sharded within a group, replicated
    across groups), --param-dtype / --reduce-dtype its MixedPrecisionPolicy, --reshard-after-forward the blocks'.
    """

    name = "fsdp"
    summary = "FSDP2 fully_shard over torchrun ranks: 1/N of params, grads and optimizer state per rank"
    cost = "low"
    min_torch = "2.9"  # 2.6's FSDP2 (the first public one) fails on CPU: its CPU streams have no record_event
    min_torch_for = "FSDP2 as membench drives it, checked on 2.9.1, 2.11 and 2.14"
    min_torch_predicted = "2.11"
    min_torch_predicted_for = "checked on 2.11 and 2.14; under torch 2.9.1 FSDP2 fails on fake tensors"
    distributed = True
    conflicts = ("fsdp-offload",)
    conflict_reason = "fsdp-offload is fsdp with CPU offload: choose one"
    order = 35  # after ckpt/sac (and tp) have wrapped the blocks, before any optimizer is made
    options = ("mesh", "param_dtype", "reduce_dtype", "reshard_after_forward")

    def __init__(self, *args, **kwargs):
        from membench.private import fsdp_api

        super().__init__(*args, **kwargs)
        # Importing FSDP takes most of a second, so only a run that uses it does; and before any tracker starts,
        # which sees FSDP's storage resizes only if FSDP is imported when it starts (storage.py).
        self._cpu_offload_policy, self._offload_policy, self._fully_shard = fsdp_api()

    def offload_policy(self, device: str):
        return self._offload_policy()

    def validate(self, spec, workload) -> None:
        check_tp(spec.mesh_of(), spec.techniques)

    def configure(self, state) -> None:
        import torch.distributed as dist

        from membench.private import fsdp_mixed_precision

        if not dist.is_initialized():
            raise UserError(f"technique {self.name} runs under torchrun: use `membench run` (it launches torchrun)")
        # The mesh of the run's device: without one, fully_shard builds its default mesh on the machine's
        # accelerator (torch._C._get_accelerator(), torch/distributed/fsdp/_fully_shard/_fsdp_init.py), so a
        # --device cpu run on a GPU machine would shard onto CUDA while its batches stay on the CPU.
        spec = self.spec
        options = dict(mesh=fsdp_submesh(state), offload_policy=self.offload_policy(state.device.type),
                       mp_policy=fsdp_mixed_precision(_dtype(spec.param_dtype), _dtype(spec.reduce_dtype)))
        blocks = state.workload.blocks(state.model) if state.workload.blocks else []
        # None: fully_shard's own default (torch 2.6's takes a bool or an int only, and defaults to True)
        reshard = {} if spec.reshard_after_forward is None else {"reshard_after_forward": spec.reshard_after_forward}
        for block in blocks:
            self._fully_shard(block, **reshard, **options)
        self._fully_shard(state.model, **options)  # the root: fully_shard's default (not resharded after forward)
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
    cost = "high"
    conflicts = ("fsdp", "opt-offload")
    conflict_reason = "fsdp-offload already keeps the optimizer state in host memory"
    devices = ("cuda",)
    predictable = False  # on CPU, host and device memory are one

    def offload_policy(self, device: str):
        return self._cpu_offload_policy(pin_memory=device == "cuda")
