"""_foreach_norm's CUDA scratch under gradient clipping (predict/emulate/foreach_norm.py), hand-derived from torch
2.14's ForeachReduceOp.cu: ntensors x ceil(longest numel / 65536) partial norms in the opmath dtype."""

from __future__ import annotations

import linecache
import types

import torch

from membench.predict import beside
from membench.predict.emulate.foreach_norm import foreach_norm_scratch
from tests.helpers import spec

NORM = torch.ops.aten._foreach_norm.Scalar
H100 = types.SimpleNamespace(major=9, minor=0, multi_processor_count=132, max_threads_per_multi_processor=2048)


def test_one_partial_norm_per_chunk_of_the_longest_tensor_per_tensor():
    ts = [torch.empty(65536), torch.empty(65537), torch.empty(10)]
    assert foreach_norm_scratch(NORM, (ts, 2), {}) == 3 * 2 * 4
    assert foreach_norm_scratch(NORM, ([t.bfloat16() for t in ts], 2), {}) == 3 * 2 * 4  # opmath: float
    assert foreach_norm_scratch(NORM, ([t.double() for t in ts], 1), {}) == 3 * 2 * 8
    assert foreach_norm_scratch(NORM, (ts, float("inf")), {}) == 24
    assert foreach_norm_scratch(NORM, (ts, 3), {}) == 0  # the slow path: one norm per tensor
    assert foreach_norm_scratch(NORM, ([ts[0], ts[1].double()], 2), {}) == 0  # no fast route
    assert foreach_norm_scratch(NORM, ([torch.empty(4, 4).t()], 2), {}) == 4  # transposed, still dense: 1 chunk
    assert foreach_norm_scratch(NORM, ([torch.empty(8)[::2]], 2), {}) == 0  # overlapping/strided: slow path
    assert foreach_norm_scratch(NORM, ([torch.zeros(3, dtype=torch.int64)], 2), {}) == 0


def _clip_allocations(device: str, clip: float | None) -> list[int]:
    """The sizes of what clip_grad_norm_ allocates in the predicted step of gpt-tiny, past its 0-dim norms."""
    job = spec("gpt-tiny", device=device, batch_size=1, clip_grad_norm=clip)
    predicted = beside.predict_for(job, beside.target_for(device, H100, "NVIDIA H100 80GB HBM3"))
    step = beside.predicted_step(predicted.traced, predicted.sides)
    return [e.size for e in step if e.kind == "alloc" and e.size > 4 and e.site
            and "clip_grad_norm_" in linecache.getline(*_path_line(e.site))]


def _path_line(site: str) -> tuple[str, int]:
    path, rest = site.rsplit(":", 1)  # 'file:line (function)'
    return path, int(rest.split(" ")[0])


def test_a_cuda_prediction_takes_the_scratch_once_per_clipping_and_the_cpu_none():
    # gpt-tiny: 29 gradients, the longest 16,384 elements (1 chunk): 29 x 1 x 4 bytes of partial norms on CUDA;
    # on both, torch.stack of the 29 norms (29 x 4 bytes) before their total norm.
    assert _clip_allocations("cuda", 1.0) == [29 * 1 * 4, 29 * 4]
    assert _clip_allocations("cpu", 1.0) == [29 * 4]
    assert _clip_allocations("cuda", None) == []


def test_the_partial_norms_come_before_the_norms_themselves_as_on_the_h200():
    # foreach_tensor_norm_cuda_internal makes output_per_tensor first, then one 0-dim norm per tensor, and frees
    # the first as it returns: a prediction's trace in that order (three tensors, one chunk each: 12 bytes).
    from membench.predict import gpus
    from tests.helpers import cuda_trace

    kept = []

    def clip():
        ts = [torch.empty(10), torch.empty(20), torch.empty(30)]  # 40, 80 and 120 B
        kept.append((ts, torch._foreach_norm(ts, 2)))

    assert cuda_trace(clip, gpus.gpu("H100")) == [("alloc", 40), ("alloc", 80), ("alloc", 120), ("alloc", 12),
                                                  ("alloc", 4), ("alloc", 4), ("alloc", 4), ("free", 12)]
