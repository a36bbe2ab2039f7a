"""The device mesh sharded techniques share (fsdp, fsdp-offload), named as torchtitan names its dimensions.

`--mesh dp_replicate=2,dp_shard=4,tp=2`: 16 ranks, laid out as torchtitan's `init_device_mesh` lays them, row-major
over (dp_replicate, dp_shard, tp), tensor parallelism innermost (the ranks of one node). FSDP shards over dp_shard
and, with dp_replicate, is HSDP (replicated across dp_replicate); the tp technique shards each block over tp.
Without --mesh every rank is one dp_shard dimension. The mesh is parsed in membench/spec/mesh.py and built here.
"""

from __future__ import annotations

from membench.common.errors import UserError
from membench.spec.mesh import DIMS, Mesh, check_reshard_after_forward, parse_mesh

__all__ = ["Mesh", "check_reshard_after_forward", "parse_mesh"]  # the spec's, read here by earlier code and tests

FSDP_DIMS = ("dp_replicate", "dp_shard")


def device_mesh(state):
    """The run's DeviceMesh, built once per training state (fsdp and tp share it), on the run's device type: the
    dimensions of size above 1 plus dp_shard, by name. Checks the mesh against the process group's size."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    built = getattr(state, "device_mesh", None)
    if built is not None:
        return built
    mesh = state.spec.mesh_of(dist.get_world_size())
    names = [d for d in DIMS if getattr(mesh, d) > 1 or d == "dp_shard"]
    state.device_mesh = init_device_mesh(state.device.type, tuple(getattr(mesh, d) for d in names),
                                         mesh_dim_names=tuple(names))
    return state.device_mesh


def fsdp_submesh(state):
    """What FSDP shards over: dp_shard, or (dp_replicate, dp_shard) for HSDP."""
    built = device_mesh(state)
    names = tuple(d for d in FSDP_DIMS if d in built.mesh_dim_names)
    return built[names] if len(names) > 1 else built[names[0]]


def check_tp(mesh: Mesh, techniques: tuple[str, ...]) -> None:
    """A tp dimension is the tp technique's: without it, the ranks along tp would train as more FSDP ranks."""
    if mesh.tp > 1 and "tp" not in techniques:
        raise UserError(f"--mesh {mesh.text} has a tp dimension, which only the tp technique shards over: use "
                        f"{'+'.join((*techniques, 'tp'))}, or a mesh without tp")
