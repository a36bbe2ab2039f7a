"""Which ranks of a sharded run hold different memory, so that each is predicted and not only rank 0.

FSDP2 shards every parameter on its first dimension with torch.chunk over the dp_shard ranks
(_fsdp_param.py: FSDPParam._init_sharded_param; with tp, the TP-local tensor's): chunks of ceil(rows / ranks)
rows, so where the rows do not divide, the last ranks hold fewer rows, or none (their shard is padding). The
all-gather buffers are padded to the same size on every rank; what differs is the sharded parameters, their
gradients and the optimizer state. Ranks along dp_replicate (HSDP) hold what their dp_shard coordinate holds, and
the ranks along tp what tp gives each (the sizes it shards divide by tp: techniques/tp.py checks).
"""

from __future__ import annotations

from collections.abc import Iterable

from membench.techniques.mesh import Mesh


def rows_held(rows: int, ranks: int, shard_rank: int) -> int:
    """torch.chunk's share of `rows` for one of `ranks` (0 where the chunks run out first)."""
    chunk = -(-rows // ranks) if rows else 0
    return max(0, min(chunk, rows - shard_rank * chunk))


def distinct_ranks(first_dims: Iterable[int], mesh: Mesh) -> list[int]:
    """The first rank of each group of ranks that hold the same rows of every parameter (`first_dims`: each
    parameter's first dimension; 1 for a scalar), in rank order: [0] where every shard is the same size."""
    dims = list(first_dims)
    seen: dict[tuple[int, ...], int] = {}
    for rank in range(mesh.size):
        shard_rank = mesh.coordinates(rank)["dp_shard"]
        seen.setdefault(tuple(rows_held(d, mesh.dp_shard, shard_rank) for d in dims), rank)
    return sorted(seen.values())


def model_first_dims(model, tp: int = 1) -> list[int]:
    """Each parameter's first dimension on a rank, as FSDP2 chunks it (1 for a 0-d parameter, which it shards as one
    row): with tp, the TP-local tensor's (techniques/tp.py: rows_sharded)."""
    from membench.techniques.tp import rows_sharded

    return [(p.shape[0] if p.dim() else 1) // (tp if tp > 1 and rows_sharded(name) else 1)
            for name, p in model.named_parameters()]


def predict_ranks(job, round_to: int | None, rank0, predict_memory) -> list:
    """A RankSummary for each distinct rank of a distributed prediction: rank 0's from its Memory `rank0`, each
    other by `predict_memory(job, round_to, rank)` (membench.predict.run's, passed in)."""
    from membench.predict.emulate import fake
    from membench.results.schema import RankSummary
    from membench.workloads import load_workload

    spec = job.run
    model = fake.build_on_meta(load_workload(spec.workload, spec.seq_len).build_model)
    mesh = spec.mesh_of(spec.nproc_per_node)
    ranks = distinct_ranks(model_first_dims(model, mesh.tp), mesh)
    memories = {0: rank0, **{r: predict_memory(job, round_to, rank=r) for r in ranks if r}}
    return [RankSummary(rank=r, peak_allocated_bytes=m.peak_allocated_bytes, peak_reserved_bytes=m.peak_reserved_bytes,
                        peak_phase=m.peak_phase, breakdown_at_peak=m.breakdown_at_peak)
            for r, m in sorted(memories.items())]
