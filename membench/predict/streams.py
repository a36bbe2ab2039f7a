"""The CUDA stream each allocation of a prediction would be made on, and what is made on each stream.

The CUDA caching allocator keeps its free blocks by stream: a request takes only a block of its own stream, and a
block freed goes back to the pool of the stream it was allocated on (c10/cuda/CUDACachingAllocator.cpp:
`get_free_block` returns a block only when `block->stream == p.stream()`; `free` returns it to its pool at once
unless `record_stream` gave it uses on other streams). Memory freed on one stream is not there for another's
requests: with several streams, reserved memory sits further above allocated.

A prediction runs on CPU fake tensors, and FSDP2 enters its streams there too: `torch.cpu.stream(s)` sets the
current stream (torch/cpu/__init__.py keeps one, as CUDA keeps one per device), so whatever FSDP2 allocates inside
`device_handle.stream(...)` is allocated, in the prediction, with that stream current. `StreamTags` numbers the
streams (0: the default stream) and the storage tracker tags each allocation with the current one.

Where FSDP2 allocates (torch 2.14.1, torch/distributed/fsdp/_fully_shard/):
- the all-gather copy-in stream: `foreach_all_gather` allocates the all-gather output (one flat buffer of the
  group's gathered parameters; its all-gather input is a view into it) and, under a MixedPrecisionPolicy with a
  param_dtype, the shards' casts to it (`_get_param_all_gather_inputs`), in forward and in backward's prefetch
  (`FSDPCommContext.get_all_gather_streams`; an unshard in any other state runs on the current stream);
- the all-gather stream: the collective, which allocates nothing here (a synchronous NCCL collective runs on the
  current stream, and torch 2.14's ProcessGroupNCCL records no stream on its tensors: its own warning says
  TORCH_NCCL_AVOID_RECORD_STREAMS "is the default now");
- the default stream: the unsharded parameters (`alloc_all_gather_outputs`, in `wait_for_unshard`'s copy-out),
  the reduce-scatter input (`foreach_reduce` allocates it before it enters the reduce-scatter stream), and every
  op of forward, backward and the optimizer step;
- the reduce-scatter stream: the reduce-scatter output, whose views are the sharded gradients, and their cast to
  the parameters' dtype where the reduce dtype differs (`_to_dtype_if_needed`), except under HSDP;
- the all-reduce stream (HSDP): that cast, after the all-reduce across replicas.
FSDP2 calls no `record_stream`: it keeps a buffer used on another stream referenced until that stream is known to
be done (the all-gather output until the next group's copy-out in forward, the reduce-scatter input until the next
group's post-backward), and the prediction runs the same code, so its frees come at the same points.
"""

from __future__ import annotations

import torch

from membench import private
from membench.results import StreamUse

DEFAULT = 0
# FSDPCommContext's attribute -> the name a result shows, and what FSDP2 allocates there (see above).
FSDP_STREAMS = {
    "all_gather_copy_in_stream": ("fsdp all-gather copy-in", "all-gather outputs (gathered parameters), the "
                                  "shards' casts to the param dtype (_fsdp_collectives.foreach_all_gather)"),
    "all_gather_stream": ("fsdp all-gather", "nothing: the all-gather collective"),
    "reduce_scatter_stream": ("fsdp reduce-scatter", "reduce-scatter outputs (the sharded gradients) and their "
                              "cast to the parameter dtype (_fsdp_collectives.foreach_reduce)"),
    "all_reduce_stream": ("fsdp all-reduce", "HSDP: the all-reduced gradients' cast to the parameter dtype "
                          "(_fsdp_collectives.foreach_reduce)"),
}
DEFAULT_SOURCE = ("every op of forward, backward and the optimizer step; FSDP2's unsharded parameters and "
                  "reduce-scatter inputs")


class StreamTags:
    """Numbers each stream as it is first current at an allocation: 0 for the default stream, then 1, 2, ..."""

    def __init__(self):
        self._ids: dict[int, int] = {}
        self._streams: list = []  # kept alive, so that an id() is never another stream's
        self._number(torch.cpu.current_stream())

    def _number(self, stream) -> int:
        self._ids[id(stream)] = len(self._streams)
        self._streams.append(stream)
        return self._ids[id(stream)]

    def current(self) -> int:
        stream = torch.cpu.current_stream()
        number = self._ids.get(id(stream))
        return self._number(stream) if number is None else number

    def names(self, model) -> dict[int, tuple[str, str]]:
        """Each numbered stream's (name, what is allocated on it), FSDP2's by their place in its comm context."""
        named = {DEFAULT: ("default", DEFAULT_SOURCE)}
        for attribute, stream in private.fsdp_comm_streams(model).items():
            if id(stream) in self._ids and attribute in FSDP_STREAMS:
                named[self._ids[id(stream)]] = FSDP_STREAMS[attribute]
        for number in range(len(self._streams)):
            named.setdefault(number, (f"stream {number}", "unknown: a stream FSDP2 does not name"))
        return named


def stream_uses(names: dict[int, tuple[str, str]], allocated: dict[int, dict[str, int]],
                reserved_at_peak: dict[int, int]) -> list[StreamUse]:
    """The record's account of each stream that allocated or held anything, default first."""
    used = sorted(set(allocated) | set(reserved_at_peak))
    return [StreamUse(stream=names[n][0], allocated_bytes_by_category=dict(sorted(allocated.get(n, {}).items())),
                      reserved_at_peak_bytes=reserved_at_peak.get(n, 0), source=names[n][1]) for n in used]
