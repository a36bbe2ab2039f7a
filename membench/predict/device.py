"""What nvidia-smi would show per rank: the caching allocator's reserved memory (simulated) plus what the process
holds outside it, each part labelled with how it is known and where from.

Outside the caching allocator a training process holds the CUDA context (driver, runtime, loaded kernels) and, when
it communicates, NCCL's buffers: each communicator keeps, per channel and per peer it receives from, one buffer per
protocol. cuBLAS and cuBLASLt workspaces are not among them: torch takes both from the caching allocator
(aten/src/ATen/cuda/CublasHandlePool.cpp), so they are in reserved already (predict/emulate/kernels.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from membench.results.schema import OnCard
from membench.spec.gpu import CUDA_CONTEXT_BYTES, CUDA_CONTEXT_SOURCE
from membench.spec.mesh import Mesh

How = Literal["simulated", "estimated", "measured"]

# Where a prediction's simulated driver puts each new segment (membench.allocator.simulator.CachingAllocator):
# below the earlier ones, as the driver of the H200 runs did (results/gpu-runs/: driver 580.159.04, segments near
# the top of the process's address space, each new one below the last; so did the six public snapshots' drivers).
# The allocator's best fit takes the lowest address among equal-size free blocks, so this decides which of them a
# request splits: "ascending" (the gpu-truth traces' older layout) left gpt-small under amp-bf16 + ckpt one
# 1.65 GB segment short there. docs/predict.md, "Where the driver puts segments", has the figures.
SEGMENT_PLACEMENT = "top-down"

# The CUDA context (CUDA_CONTEXT_BYTES, where measured: CUDA_CONTEXT_SOURCE) is the GPU table's figure.

# NCCL's per-protocol buffer of one connection on one channel (src/init.cc, DEFAULT_*_BUFFSIZE): Simple 4 MiB,
# LL 8 lines x 512 threads x 8 steps x 16 B, LL128 120 elements x 640 threads x 8 steps x 8 B.
NCCL_BUFFER_BYTES = {"Simple": 1 << 22, "LL": 8 * 512 * 8 * 16, "LL128": 120 * 640 * 8 * 8}
# Assumed, not derived: the channels NCCL opens (it picks them from the topology; 16 is typical of NVLink nodes
# and NCCL_MAX_NCHANNELS caps them) and the peers each rank receives from per channel (the ring's previous rank;
# the tree's parent and children add up to 2 more).
NCCL_CHANNELS = 16
NCCL_RECV_PEERS = 1
NCCL_SOURCE = (f"NCCL src/init.cc buffer sizes (Simple + LL + LL128 per channel and peer), {NCCL_CHANNELS} channels "
               f"and {NCCL_RECV_PEERS} ring peer assumed")


@dataclass(frozen=True)
class DevicePart:
    name: str
    bytes: int
    how: How
    source: str


@dataclass(frozen=True)
class DeviceEstimate:
    """One rank's whole-device memory at its peak of reserved memory."""

    parts: tuple[DevicePart, ...]

    @property
    def total(self) -> int:
        return sum(p.bytes for p in self.parts)


def communicators(mesh: Mesh) -> int:
    """The NCCL communicators a rank of this mesh holds: the default group's (every rank), and one for each mesh
    dimension of several ranks that is not the whole world (DeviceMesh's subgroups)."""
    sizes = [size for size in (mesh.dp_replicate, mesh.dp_shard, mesh.tp) if size > 1]
    if not sizes:
        return 0  # one rank: no communication
    return 1 + sum(1 for size in sizes if size < mesh.size)


def nccl_bytes(mesh: Mesh) -> int:
    per_communicator = NCCL_CHANNELS * NCCL_RECV_PEERS * sum(NCCL_BUFFER_BYTES.values())
    return communicators(mesh) * per_communicator


def whole_device(peak_reserved_bytes: int, mesh: Mesh) -> DeviceEstimate:
    """Reserved (simulated by the caching-allocator simulator) + the CUDA context + NCCL's buffers."""
    parts = [DevicePart("reserved", peak_reserved_bytes, "simulated",
                        "caching-allocator simulator; cuBLAS/cuBLASLt workspaces are in it"),
             DevicePart("CUDA context", CUDA_CONTEXT_BYTES, "estimated", CUDA_CONTEXT_SOURCE)]
    if communicators(mesh):
        count = communicators(mesh)
        parts.append(DevicePart(f"NCCL buffers ({count} communicator{'s' if count > 1 else ''})", nccl_bytes(mesh),
                                "estimated", NCCL_SOURCE))
    return DeviceEstimate(tuple(parts))


@dataclass(frozen=True)
class Fits:
    fits: bool
    margin_bytes: int  # device memory less the estimate (negative: short by that much)
    device_bytes: int


def fits_on(estimate: DeviceEstimate, memory_bytes: int) -> Fits:
    """Against the GPU's memory (the table's: nominal, in GB of 10**9 B, at most what the card reports, so a "yes"
    is not optimistic)."""
    device = memory_bytes
    return Fits(estimate.total <= device, device - estimate.total, device)


def run_mesh(run) -> Mesh:
    """The mesh a RunSpec's ranks form: one rank where no technique is distributed."""
    from membench.techniques import REGISTRY

    distributed = any(REGISTRY[n].distributed for n in run.techniques if n in REGISTRY)
    return run.mesh_of(run.nproc_per_node) if distributed else Mesh()


def outside_allocator(run) -> int:
    """Bytes a rank of this RunSpec holds outside the caching allocator (the estimated parts of whole_device):
    what `fit --by device` takes from the budget before it searches on reserved memory."""
    return whole_device(0, run_mesh(run)).total


def card_capacity(memory_bytes: int, mesh: Mesh) -> int:
    """What the caching allocator can get on the card: its nominal memory less the context and NCCL's buffers."""
    return memory_bytes - whole_device(0, mesh).total


def on_card(events: list, settings, peak_reserved_bytes: int, memory_bytes: int, mesh: Mesh) -> OnCard | None:
    """Where the unbounded simulation reserves more than the card's capacity: the trace replayed under it, as the
    caching allocator meets a failing cudaMalloc (it releases cached blocks and retries, then raises out of
    memory). None where it fits unbounded: no cudaMalloc fails, so the replay under the capacity is the same."""
    from membench.allocator import reserved_summary

    capacity = card_capacity(memory_bytes, mesh)
    if peak_reserved_bytes <= capacity:
        return None
    r = reserved_summary(events, settings, capacity=capacity, placement=SEGMENT_PLACEMENT)
    return OnCard(capacity_bytes=capacity, peak_reserved_bytes=r.peak_reserved_bytes, oom=r.reserved_oom)


def device_lines(results: list, gpu) -> list[str]:
    """predict's lines for CUDA predictions: each run's whole-device estimate per rank and whether it fits `gpu`
    (a membench.predict.gpus.Gpu), one line per distinct rank where shards differ (predict/ranks.py), then where
    each estimated part comes from."""
    lines, sources = [], {}
    for r in results:
        if r.memory is None or r.memory.peak_reserved_bytes is None:
            continue
        mesh = run_mesh(r.spec.run)
        ranks = [(f"{r.name}", r.memory.peak_reserved_bytes, r.memory.on_card)]
        if r.ranks and len(r.ranks) > 1:  # the replay under the card is rank 0's
            ranks = [(f"{r.name} rank {k.rank}", k.peak_reserved_bytes, r.memory.on_card if k.rank == 0 else None)
                     for k in r.ranks]
        for name, reserved, card in ranks:
            line, estimate = _device_line(name, reserved, card, mesh, gpu)
            lines.append(line)
            sources.update({p.name.split(" (")[0]: p.source for p in estimate.parts if p.how == "estimated"})
    if not lines:
        return []
    head = "WHOLE DEVICE per rank at the peak of reserved, as nvidia-smi would show it (a prediction):"
    return [head, *lines, *(f"  {name}: {source}" for name, source in sources.items())]


def _device_line(name: str, reserved: int, card: OnCard | None, mesh: Mesh, gpu) -> tuple[str, DeviceEstimate]:
    """One rank's line: its estimate's parts and whether it fits; `card`: its replay under the card, if any."""
    from membench.common.units import fmt_bytes

    estimate = whole_device(card.peak_reserved_bytes if card and not card.oom else reserved, mesh)
    fit = fits_on(estimate, gpu.memory_bytes)
    parts = " + ".join(f"{p.name} {fmt_bytes(p.bytes)} ({p.how})" for p in estimate.parts)
    answer = f"yes, margin {fmt_bytes(fit.margin_bytes)}" if fit.fits and not (card and card.oom) else (
        f"no, margin -{fmt_bytes(abs(fit.margin_bytes))}")
    if card is not None:
        answer = (f"no, out of memory even after the allocator releases its cached blocks (simulated under "
                  f"{fmt_bytes(card.capacity_bytes)})" if card.oom else
                  f"{answer}, releasing cached blocks (unbounded it would reserve {fmt_bytes(reserved)})")
    line = f"  {name}: {fmt_bytes(estimate.total)} = {parts}; fits on {gpu.name} ({gpu.memory_label}): {answer}"
    return line, estimate
