"""A prediction makes only the chunks FSDP2 uses of each parameter (private.fsdp_chunks_on_demand): the same trace
as torch.chunk's whole list, but for the empty padding chunks FSDP2 never asks for (allocations of 0 bytes)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from membench import private
from membench.predict.run import predict_traced
from membench.spec import Job, RunSpec


def _nonempty(events) -> list[tuple]:
    """(kind, bytes, stream) of each allocation of some bytes and of each free of one; keys differ between runs."""
    sizes, kept = {}, []
    for e in events:
        if e.kind == "alloc":
            sizes[e.key] = e.size
        if e.kind != "alloc" or e.size:
            if e.kind != "free" or sizes.get(e.key):
                kept.append((e.kind, e.size, e.stream))
    return kept


@pytest.mark.parametrize("rank", [0, 5])
def test_chunks_on_demand_give_the_trace_of_torch_chunks_whole_list(monkeypatch, rank):
    # mlp at 8 ranks: its 10-row layers chunk into 5 chunks of 2 rows, so ranks 5 to 7 hold padding only
    job = Job(RunSpec("tests.workloads:mlp", 8, ("fsdp",), device="cuda", nproc_per_node=8))
    made = []

    class Counted(private._ChunksOnDemand):
        def __init__(self, *args):
            super().__init__(*args)
            made.append(self.num_chunks)  # not the object: it holds the parameter's storage alive

    monkeypatch.setattr(private, "_ChunksOnDemand", Counted)
    fast = predict_traced(job, rank=rank)
    assert made  # FSDP2 sharded through it
    monkeypatch.setattr(private, "fsdp_chunks_on_demand", contextlib.nullcontext)
    whole = predict_traced(job, rank=rank)
    assert _nonempty(fast.events) == _nonempty(whole.events)
    assert (fast.memory.peak_allocated_bytes, fast.memory.peak_reserved_bytes) == (
        whole.memory.peak_allocated_bytes, whole.memory.peak_reserved_bytes)
    assert fast.memory.breakdown_at_peak == whole.memory.breakdown_at_peak


def test_each_chunk_is_torch_chunks_and_the_rest_are_empty():
    t = torch.arange(10 * 3).view(10, 3)
    chunks = private._ChunksOnDemand(t, 8, 0)
    expected = list(torch.chunk(t, 8, 0))  # 5 chunks of 2 rows
    assert len(chunks) == 8 and len(expected) == 5
    for i in range(5):
        assert torch.equal(chunks[i], expected[i]) and chunks[i].stride() == expected[i].stride()
    assert all(chunks[i].numel() == 0 for i in range(5, 8)) and chunks[-1].numel() == 0
    uneven = private._ChunksOnDemand(t, 4, 0)  # 3, 3, 3, 1 rows
    assert [uneven[i].shape[0] for i in range(4)] == [3, 3, 3, 1]
    with pytest.raises(IndexError):
        chunks[8]
