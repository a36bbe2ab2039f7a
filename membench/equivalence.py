"""Does a technique train the same model as the baseline? Run both from the same seed on the same batches and
compare. Techniques that are not about numerics must match bit for bit (or say by how much they do not);
accumulation must match one big batch up to fp32 rounding; precision techniques report how far the loss moves.
"""

from __future__ import annotations

import dataclasses
import itertools

import torch
from torch import nn

from membench.spec import RunSpec
from membench.step import build_state, batches, train_step
from membench.workloads import Workload

# Relative to the largest parameter update: rounding differences of fp32 sums over a few steps stay far below.
BATCH_SPLIT_RTOL = 1e-4
EXACT_RTOL = 1e-5


def _train(spec: RunSpec, workload: Workload) -> tuple[list[torch.Tensor], list[torch.Tensor], list[float]]:
    from membench.techniques import instantiate

    state = build_state(spec, workload, instantiate(spec))
    start = [p.detach().float().cpu().clone() for p in _parameters(state.model)]
    losses = [train_step(state, b) for b in itertools.islice(batches(workload, spec), spec.check_steps)]
    end = [p.detach().float().cpu().clone() for p in _parameters(state.model)]
    del state
    return start, end, losses


def _parameters(model: nn.Module) -> list[torch.Tensor]:
    params = []
    for p in model.parameters():
        full = getattr(p, "full_tensor", None)  # a sharded (DTensor) parameter: compare the whole tensor
        params.append(full() if callable(full) else p)
    return params


def _has_batchnorm(workload: Workload) -> bool:
    with torch.device("meta"):
        model = workload.build_model()
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def check(spec: RunSpec, workload: Workload) -> dict:
    from membench.techniques import instantiate

    techniques = instantiate(spec)
    numerics = {t.numerics for t in techniques}
    if not techniques:
        return {"verdict": "reference", "detail": "the baseline is the reference"}
    mode = "precision" if "precision" in numerics else "batch-split" if "batch-split" in numerics else "exact"
    if mode == "batch-split":
        # Adam's first step is ~lr*sign(g): it turns rounding noise in near-zero gradients into full-size
        # updates. SGD's update is lr*g, so comparing SGD updates compares the gradients themselves.
        spec = dataclasses.replace(spec, optimizer="sgd")
    reference = dataclasses.replace(spec, techniques=())
    start, ref_end, ref_losses = _train(reference, workload)
    _, end, losses = _train(spec, workload)

    if len(end) != len(ref_end) or any(a.shape != b.shape for a, b in zip(end, ref_end)):
        return {"verdict": "not-equivalent", "mode": mode, "detail": "parameters differ in number or shape"}
    max_diff = max(float((a - b).abs().max()) for a, b in zip(end, ref_end))
    max_update = max(float((a - s).abs().max()) for a, s in zip(ref_end, start)) or 1.0
    loss_diff = max(abs(a - b) for a, b in zip(losses, ref_losses))
    result = {
        "mode": mode,
        "compared": f"parameters after {spec.check_steps} {spec.optimizer} steps",
        "max_abs_param_diff": max_diff,
        "max_param_update": max_update,
        "relative_diff": max_diff / max_update,
        "max_abs_loss_diff": loss_diff,
        "losses": losses,
        "reference_losses": ref_losses,
    }
    rel = max_diff / max_update
    if mode == "precision":
        result["verdict"] = "precision"
        result["detail"] = f"changes numerics on purpose: loss differs by up to {loss_diff:.3g} over " \
                           f"{spec.check_steps} steps"
    elif max_diff == 0:
        result["verdict"], result["detail"] = "bitwise", "parameters identical to the baseline, bit for bit"
    elif rel <= (BATCH_SPLIT_RTOL if mode == "batch-split" else EXACT_RTOL):
        result["verdict"] = "equivalent"
        result["detail"] = f"parameters within {rel:.2g} of the update size (floating-point rounding)"
    else:
        result["verdict"] = "not-equivalent"
        result["detail"] = f"parameters differ by {rel:.2g} of the update size"
    if mode == "batch-split" and _has_batchnorm(workload):
        result["verdict"] = "not-equivalent"
        result["detail"] = ("the model has BatchNorm: each micro-batch normalises with its own statistics, so "
                            f"accumulation trains a different model ({result['detail']})")
    return result
