"""PyTorch's own FSDP2 memory test, held against membench's prediction: test_fully_shard_training_memory
(test/distributed/_composable/fsdp/test_fully_shard_memory.py in pytorch's repository) trains a 3-layer transformer
over 2 GPUs and bounds the peak active memory of each phase of its first step in MB (1e6 bytes), above a base
that holds the cuBLAS workspaces. Here the same model and step are predicted for CUDA on CPU (fake tensors, a fake
process group of 2), each phase's peak taken from the storage tracker less the cuBLAS workspaces alive then, and
held to the same bounds, rounded as the test rounds. Its CPU-offload case is not predictable (fsdp-offload moves
memory between host and device), and the test's init bounds follow a model built on the CPU and moved module by
module, where membench builds it on the device: both left out. One bound is one block's all-gather output higher
than the test's, with the reason from FSDP2's source (reshard_after_forward=False, forward)."""

from __future__ import annotations

import pytest

from membench.predict.run import predict_memory
from membench.spec import Job, MeasureSpec, RunSpec
from membench.trackers.storage import StorageTracker
from tests.workloads.fsdp_transformer import DIM, VOCAB, Transformer

WORKLOAD = "tests.workloads.fsdp_transformer:transformer"
OPTIMIZER = "tests.workloads.fsdp_transformer:adam_single_tensor"


def _numels() -> dict[str, int]:
    """The test's own counts of parameters (fp32, 4 bytes each)."""
    model = Transformer()
    unsharded = sum(p.numel() for p in model.parameters())
    non_block = sum(p.numel() for m in (model.tok_embeddings, model.pos_embeddings, model.norm, model.output)
                    for p in m.parameters())
    return {"unsharded": unsharded, "sharded": (unsharded + 1) // 2,
            "block": sum(p.numel() for p in model.layers[0].parameters()), "non_block": non_block}


def test_the_models_parameters_are_the_tests():
    n = _numels()
    block = 4 * DIM * DIM + 2 * (DIM * 4 * DIM) + 4 * DIM + DIM + 2 * 2 * DIM  # attention, mlp and its biases, norms
    assert n["block"] == block == 7_084_800
    assert n["non_block"] == VOCAB * DIM + 16 * DIM + 2 * DIM + DIM * VOCAB == 62_976
    assert n["unsharded"] == 3 * block + n["non_block"]


def _predicted_phases(monkeypatch, reshard_after_forward: bool) -> tuple[dict[str, int], int]:
    """Each phase's peak active bytes less the cuBLAS workspaces, and what the step leaves (its optimizer state
    made in it: the test measures a first step)."""
    peaks: dict[str, int] = {}
    left: dict[str, int] = {}
    changed = StorageTracker._changed

    def seen(tracker):
        changed(tracker)
        workspaces = tracker.kernels.workspaces.allocated_bytes if tracker.kernels is not None else 0
        peaks[tracker.phase] = max(peaks.get(tracker.phase, 0), tracker.current - workspaces)
        if tracker.phase == "optimizer":
            left["bytes"] = tracker.current - workspaces  # its last: after zero_grad(set_to_none=True)

    monkeypatch.setattr(StorageTracker, "_changed", seen)
    run = RunSpec(WORKLOAD, 1, ("fsdp",), device="cuda", nproc_per_node=2, optimizer=OPTIMIZER,
                  reshard_after_forward=reshard_after_forward)
    predict_memory(Job(run, MeasureSpec(warmup=0)))
    return peaks, left["bytes"]


def _mb(nbytes: int) -> int:
    return round(nbytes / 1e6)


@pytest.mark.slow  # a prediction of a 3-layer transformer each: 5 to 10 s on the shared machine
@pytest.mark.parametrize("reshard_after_forward", [True, False])
def test_fsdp2s_own_memory_bounds_hold_for_the_prediction(monkeypatch, reshard_after_forward):
    n = _numels()
    peaks, left = _predicted_phases(monkeypatch, reshard_after_forward)
    buffer_mb = 16
    if reshard_after_forward:
        # current all-gather + copy-out and the next all-gather, non-block parameters, sharded parameters
        forward = (3 * n["block"] + n["non_block"] + n["sharded"]) * 4 / 1e6 + buffer_mb
        # the all-gather, gradients and reduce-scatter input, non-block parameters, sharded parameters and gradients
        backward = (3 * n["block"] + n["non_block"] + 2 * n["sharded"]) * 4 / 1e6 + buffer_mb
    else:
        forward = (n["sharded"] + n["unsharded"] + n["block"]) * 4 / 1e6 + buffer_mb
        # One block's all-gather output more than the test allows: at the last block's copy-out, the previous
        # block's all-gather result is still referenced by wait_for_unshard's local `prev_all_gather_state` (torch
        # 2.14.1, _fsdp_param_group.py: it drops comm_ctx.all_gather_state, but the local lives until the copy-out
        # returns), so two all-gather outputs are alive with every unsharded parameter. The prediction follows the
        # source (185 MB against the test's 172 MB); which one a GPU shows is for a GPU run to say.
        forward += n["block"] * 4 / 1e6
        backward = (n["sharded"] + n["unsharded"] + 1.5 * n["block"]) * 4 / 1e6 + buffer_mb
    optimizer = buffer_mb + 4 * n["sharded"] * 4 / 1e6  # sharded parameters, gradients, Adam's two states
    assert _mb(max(peaks.get("inputs", 0), peaks["forward"])) <= forward
    assert _mb(peaks["backward"]) <= backward
    assert _mb(peaks["optimizer"]) <= optimizer
    # zero_grad: sharded parameters and Adam's two states, a buffer for each
    assert _mb(left) <= 3 * n["sharded"] * 4 / 1e6 + 2 * buffer_mb
