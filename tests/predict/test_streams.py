"""FSDP2's allocations on their CUDA streams, in a prediction: a 2-layer model at world size 4, event for event
against the trace FSDP2's source makes (torch 2.14.1, torch/distributed/fsdp/_fully_shard/), and what the caching
allocator's per-stream pools then do with it."""

from __future__ import annotations

import pytest
from torch import nn

from membench.allocator import CachingAllocator, run_events, simulate
from membench.allocator.events import TraceEvent
from membench.predict.emulate import fake
from membench.predict.streams import StreamTags
from membench.trackers.storage import StorageTracker

DEFAULT, COPY_IN, REDUCE_SCATTER = 0, 1, 2  # numbered as first used: FSDP2's all-gather stream allocates nothing
W, SHARD, ACT = 16 * 16 * 4, 16 * 16 * 4 // 4, 2 * 16 * 4  # bytes: a weight, its shard at world size 4, an output

# The second step's forward and backward of nn.Sequential(Linear(16, 16, bias=False) x 2), each layer and the root
# under fully_shard at world size 4, input [2, 16] without grad, out.backward(g) with g made beforehand, the
# gradients set to None before. Names: AG = all-gather output, U = unsharded weight (its storage resized: a free
# and an alloc of 0 or its full size), Y = layer output, gW / gY = gradients, RSI / RSO = reduce-scatter input /
# output. (kind, name, bytes, stream); a free is (kind, name).
HAND_DERIVED = [
    # layer 0 pre_forward: unshard -> foreach_all_gather in the copy-in stream (state FORWARD) allocates the
    # all-gather output, the gathered weight (the input is a view into it, a world-size-1 share of it)
    ("alloc", "AG0", W, COPY_IN),
    # wait_for_unshard -> copy-out: alloc_all_gather_outputs resizes the unsharded weight, on the default stream
    ("free", "U0"), ("alloc", "U0", W, DEFAULT),
    ("alloc", "Y0", ACT, DEFAULT),  # the matmul
    ("free", "U0"), ("alloc", "U0", 0, DEFAULT),  # post_forward: reshard (free_storage: resize to 0)
    ("alloc", "AG1", W, COPY_IN),  # layer 1 pre_forward: its all-gather
    ("free", "U1"), ("alloc", "U1", W, DEFAULT),  # its copy-out ...
    # ... and only then layer 0's all-gather output, kept in comm_ctx.all_gather_state to overlap this copy-out
    # with the next all-gather: wait_for_unshard clears the state first, but its local prev_all_gather_state holds
    # it until the function returns
    ("free", "AG0"),
    ("alloc", "Y1", ACT, DEFAULT),
    ("free", "U1"), ("alloc", "U1", 0, DEFAULT),
    ("free", "AG1"),  # the root's post_forward frees the last all-gather state
    # backward: layer 1's pre_backward (a hook on its output) unshards in the copy-in stream (PRE_BACKWARD) ...
    ("alloc", "AG1b", W, COPY_IN),
    ("free", "U1"), ("alloc", "U1", W, DEFAULT),
    ("free", "AG1b"),  # ... frees the all-gather output right after the copy-out (not FORWARD) ...
    ("alloc", "AG0b", W, COPY_IN),  # ... and prefetches layer 0's all-gather (_backward_prefetch)
    ("alloc", "gW1", W, DEFAULT), ("alloc", "gY0", ACT, DEFAULT),  # MmBackward0: mat2's gradient, then self's
    ("free", "Y0"),  # its saved input, released after it ran
    # RegisterPostBackwardFunction's backward -> layer 1's post_backward: reshard, then foreach_reduce allocates
    # the reduce-scatter input on the current (default) stream, frees the unsharded gradient after copying it in,
    # and allocates the output (the sharded gradient) in the reduce-scatter stream
    ("free", "U1"), ("alloc", "U1", 0, DEFAULT),
    ("alloc", "RSI1", W, DEFAULT), ("alloc", "RSO1", SHARD, REDUCE_SCATTER),
    # the unsharded gradient is freed only when foreach_reduce returns: its list is cleared after the copy-in,
    # but the loop variable of its Shard(i > 0) loop (unsharded_grad) still holds the last one
    ("free", "gW1"),
    # layer 0's pre_backward: its all-gather was prefetched; copy-out, then its output freed
    ("free", "U0"), ("alloc", "U0", W, DEFAULT), ("free", "AG0b"),
    ("alloc", "gW0", W, DEFAULT),  # the input needs no gradient: only the weight's
    ("free", "gY0"),
    # the root's final callback runs layer 0's post_backward (its input needed no gradient, so no autograd node
    # did): reshard; the previous reduce-scatter input (reduce_scatter_states, at most 1 kept) freed before this
    # one is made
    ("free", "U0"), ("alloc", "U0", 0, DEFAULT),
    ("free", "RSI1"), ("alloc", "RSI0", W, DEFAULT), ("alloc", "RSO0", SHARD, REDUCE_SCATTER), ("free", "gW0"),
    ("free", "RSI0"),  # ... and the kept reduce-scatter input released at the end of backward
    ("free", "Y1"),  # the output, once backward returns
]


@pytest.fixture(scope="module")
def second_step():
    """The tracker's whole trace, where the second step begins in it (the first makes the unsharded weights and
    FSDP's lazy state), and the streams' names."""
    import torch.distributed.fsdp  # noqa: F401 - before the tracker starts, so it sees FSDP's storage resizes
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    meta = fake.build_on_meta(lambda: nn.Sequential(nn.Linear(16, 16, bias=False), nn.Linear(16, 16, bias=False)))
    with fake.fake_process_group(4), fake.fake_tensors():
        model = fake.materialize(meta)
        with fake.real_tensors():
            mesh = init_device_mesh("cpu", (4,))
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        x, g = torch.empty(2, 16), torch.empty(2, 16)
        tracker, tags = StorageTracker(trace=True), StreamTags()
        tracker.stream_of = tags.current
        with tracker:
            for _ in range(2):
                model.zero_grad(set_to_none=True)
                start = len(tracker.trace)
                model(x).backward(g)
        names = {number: name for number, (name, _) in tags.names(model).items()}
    return list(tracker.trace), start, names


def _names(step: list[TraceEvent]) -> dict:
    """The step's storage keys -> the names above, by order of first use."""
    order = [e[1] for e in HAND_DERIVED]
    names: dict = {}
    for e in step:
        if e.key not in names:
            names[e.key] = next(n for n in order if n not in names.values())
    return names


def test_fsdp2_allocates_on_its_streams_as_its_source_says_event_for_event(second_step):
    trace, start, stream_names = second_step
    names = _names(trace[start:])
    named = [(e.kind, names[e.key], e.size, e.stream) if e.kind == "alloc" else (e.kind, names[e.key])
             for e in trace[start:]]
    assert named == HAND_DERIVED
    assert stream_names == {DEFAULT: "default", COPY_IN: "fsdp all-gather copy-in",
                            REDUCE_SCATTER: "fsdp reduce-scatter"}


def _replayed(events: list[TraceEvent]) -> tuple[dict, dict]:
    """Each allocation's block address by the name of its storage (a storage resized gets several), and the bytes
    free on the copy-in stream at each allocation, by the same names."""
    alloc = CachingAllocator()
    where: dict = {}
    free_copy_in: dict = {}

    def seen(key, block):
        where.setdefault(key, []).append(block.ptr)
        free_copy_in.setdefault(key, []).append(
            sum(size for stream, size, _ in alloc.small.keys + alloc.large.keys if stream == COPY_IN))

    run_events(alloc, events, on_malloc=seen)
    return where, free_copy_in


def test_a_block_freed_on_the_copy_in_stream_is_not_reused_by_the_default_stream(second_step):
    trace, start, _ = second_step
    names = _names(trace[start:])
    events = [e._replace(key=names.get(e.key, e.key)) for e in trace]  # the whole trace: the step's names given
    blocks, free_copy_in = _replayed(events)
    # When the default stream asks for the first reduce-scatter input, the copy-in stream holds free blocks of
    # more than its size (its segment less layer 0's prefetched all-gather output) ...
    segment = 2 * 2**20  # every request here is small: 2 MiB segments
    assert free_copy_in["RSI1"] == [segment - W]
    # ... which serve only the copy-in stream: the request is served from another segment, the default stream's,
    # as every default-stream request is; the copy-in stream reuses its own (layer 0's backward all-gather output
    # takes the block layer 1's was freed from).
    copy_in = {b // segment for name in ("AG0", "AG1", "AG1b", "AG0b") for b in blocks[name]}
    default = {b // segment for name in ("RSI1", "RSI0", "U0", "U1", "gW1", "gW0", "Y0") for b in blocks[name]}
    assert len(copy_in) == len(default) == 1 and copy_in != default
    assert blocks["AG0b"] == blocks["AG1b"]
    streamed, single = simulate(events), simulate([e._replace(stream=DEFAULT) for e in events])
    assert streamed.reserved_by_stream_at_peak == {DEFAULT: segment, COPY_IN: segment, REDUCE_SCATTER: segment}
    assert (streamed.peak_reserved_bytes, single.peak_reserved_bytes) == (3 * segment, segment)


def test_an_allocation_of_no_bytes_takes_no_block():
    """FSDP2 resizes a freed unsharded parameter's storage to 0 bytes: c10's allocate() asks the allocator for
    nothing then, and its free frees nothing."""
    result = simulate([("alloc", "u", 0), ("alloc", "a", 512), ("free", "u"), ("free", "a")])
    assert (result.allocations, result.peak_allocated_bytes, result.segments) == (1, 512, [2 * 2**20])


def test_a_prediction_records_each_streams_share(tmp_path):
    from membench.predict.run import predict
    from membench.results import read_result, write_record
    from membench.spec import Job, RunSpec

    write_record(tmp_path / "fsdp.json", predict(Job(RunSpec("gpt-tiny", 2, ("fsdp",), nproc_per_node=4,
                                                             device="cuda"))))
    memory = read_result(tmp_path / "fsdp.json").memory
    by_name = {s.stream: s for s in memory.streams}
    assert list(by_name) == ["default", "fsdp all-gather copy-in", "fsdp reduce-scatter"]
    assert sum(s.reserved_at_peak_bytes for s in memory.streams) == memory.peak_reserved_bytes
    assert set(by_name["fsdp reduce-scatter"].allocated_bytes_by_category) == {"gradients"}
    assert "foreach_all_gather" in by_name["fsdp all-gather copy-in"].source
