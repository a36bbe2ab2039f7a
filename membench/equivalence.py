"""Does a technique train the same model as the baseline? Run both from the same seed on the same batches and
compare. Techniques that are not about numerics must match bit for bit (or say by how much they do not);
accumulation must match one big batch up to fp32 rounding; precision techniques report how far the loss moves.
"""

from __future__ import annotations

import dataclasses
import itertools

import torch
from torch import nn

from membench.results import Equivalence
from membench.spec import RunSpec
from membench.step import batches, build_state, train_step
from membench.techniques import Stack, resolve
from membench.trackers.private import has_batchnorm
from membench.workloads import Workload

# Relative to the largest parameter update: rounding differences of fp32 sums over a few steps stay far below.
BATCH_SPLIT_RTOL = 1e-4
EXACT_RTOL = 1e-5
# Same formula, other order of float operations (fused kernels, a host step): compared after one step, before
# later steps amplify the last-bit differences; one Adam step's rounding is ~1e-4 of its update here.
ROUNDING_RTOL = 1e-3
TOLERANCE = {"exact": EXACT_RTOL, "batch-split": BATCH_SPLIT_RTOL, "rounding": ROUNDING_RTOL}
# p + update rounds to the parameter's own precision: with small updates (SGD, lr 1e-3) one ulp of a parameter
# can be a sizeable fraction of the update, so a parameter may also differ by this many of its ulps.
PARAM_ULPS = 2


def _within(end: list[torch.Tensor], ref_end: list[torch.Tensor], atol: float) -> bool:
    eps = torch.finfo(torch.float32).eps
    return all(bool(((a - b).abs() <= atol + PARAM_ULPS * eps * b.abs()).all()) for a, b in zip(end, ref_end))


def _train(spec: RunSpec, workload: Workload, steps: int, rank: int = 0, world: int = 1,
           init: list[torch.Tensor] | None = None) -> tuple[list[torch.Tensor], list[torch.Tensor], list[float]]:
    # A fresh stack: technique instances configure one training state each.
    state = build_state(spec, workload, resolve(spec).techniques, on_model=_loader(init) if init is not None else None)
    start = [p.detach().float().cpu().clone() for p in _parameters(state.model)]
    data = batches(workload, spec, rank, world)
    losses = [train_step(state, b) for b in itertools.islice(data, steps)]
    end = [p.detach().float().cpu().clone() for p in _parameters(state.model)]
    del state
    return start, end, losses


def _parameters(model: nn.Module) -> list[torch.Tensor]:
    params = []
    for p in model.parameters():
        full = getattr(p, "full_tensor", None)  # a sharded (DTensor) parameter: compare the whole tensor
        params.append(full() if callable(full) else p)
    return params


def _loader(init: list[torch.Tensor]):
    """Start from given initial values: copied into the freshly built model, before any technique wraps it."""
    done = []

    def load(model: nn.Module) -> None:
        if not done:
            with torch.no_grad():
                for p, value in zip(model.parameters(), init):
                    p.copy_(value)
            done.append(True)

    return load


def _has_batchnorm(workload: Workload) -> bool:
    with torch.device("meta"):
        return has_batchnorm(workload.build_model())


def check(spec: RunSpec, stack: Stack, workload: Workload, check_steps: int = 2) -> Equivalence:
    """Train the baseline and `spec` for check_steps steps from the same seed on the same data; compare.

    Under torchrun every rank must call this (sharded parameters are gathered for the comparison); the reference
    is one process training on the ranks' combined batch.
    """
    from membench.distributed import rank_world

    rank, world = rank_world()
    if not stack.techniques:
        return Equivalence(verdict="reference", detail="the baseline is the reference")
    mode = stack.numerics
    if mode in ("rounding", "batch-split"):
        # One step: later steps start from parameters that already differ by rounding and amplify it.
        check_steps = 1
    if world > 1 and mode == "exact":
        mode = "batch-split"  # the gradients of N ranks are summed in another order than one batch's
    if mode == "batch-split":
        # Adam's first step is ~lr*sign(g): it turns rounding noise in near-zero gradients into full-size
        # updates. SGD's update is lr*g, so comparing SGD updates compares the gradients themselves.
        spec = dataclasses.replace(spec, optimizer="sgd")
    reference = dataclasses.replace(spec, techniques=(), batch_size=spec.batch_size * world)
    start, ref_end, ref_losses = _train(reference, workload, check_steps)
    _, end, losses = _train(spec, workload, check_steps, rank, world, init=None if stack.same_init else start)

    if len(end) != len(ref_end) or any(a.shape != b.shape for a, b in zip(end, ref_end)):
        return Equivalence(verdict="not-equivalent", mode=mode, detail="parameters differ in number or shape")
    max_diff = max(float((a - b).abs().max()) for a, b in zip(end, ref_end))
    max_update = max(float((a - s).abs().max()) for a, s in zip(ref_end, start)) or 1.0
    loss_diff = max(abs(a - b) for a, b in zip(losses, ref_losses))
    result = {
        "mode": mode,
        "compared": f"parameters after {check_steps} {spec.optimizer} steps"
                    + (f", {world} ranks against one process at batch {reference.batch_size}" if world > 1 else "")
                    + ("" if stack.same_init else ", both from the baseline's initial values"),
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
                           f"{check_steps} steps"
    elif max_diff == 0:
        result["verdict"], result["detail"] = "bitwise", "parameters identical to the baseline, bit for bit"
    elif _within(end, ref_end, TOLERANCE[mode] * max_update):
        result["verdict"] = "equivalent"
        result["detail"] = (f"parameters differ by at most {max_diff:.3g} ({rel:.2g} of the update size; allowed: "
                            f"{TOLERANCE[mode]:g} of it or {PARAM_ULPS} ulp per parameter): floating-point rounding")
    else:
        result["verdict"] = "not-equivalent"
        result["detail"] = f"parameters differ by {rel:.2g} of the update size"
    if mode == "batch-split" and _has_batchnorm(workload):
        result["verdict"] = "not-equivalent"
        result["detail"] = ("the model has BatchNorm: each micro-batch normalises with its own statistics, so "
                            f"accumulation trains a different model ({result['detail']})")
    return Equivalence(**result)
