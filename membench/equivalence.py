"""Does a technique train the same model as the baseline? Run both from the same seed on the same batches and
compare. Techniques that are not about numerics must match bit for bit (or say by how much they do not);
accumulation must match one big batch up to fp32 rounding; precision techniques report how far the loss moves.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import warnings
from dataclasses import dataclass

import torch
from torch import nn

from membench.private import DROPOUT_BASE, TorchDispatchMode, has_batchnorm
from membench.results import Equivalence, StateDiff
from membench.spec import RunSpec
from membench.step import batches, build_state, train_step
from membench.techniques import Stack, resolve
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


# Buffers are split: running statistics (floating point, compared against their own change) and counters
# (integers such as BatchNorm's num_batches_tracked, which must match exactly): a verdict names both.
PARTS = ("parameters", "buffers", "buffer counters", "optimizer state")


@dataclass
class Trained:
    """What a short training run leaves: the whole state, by part and name, and what it drew at random."""

    start: dict[str, torch.Tensor]  # parameters before the first step
    start_buffers: dict[str, torch.Tensor]
    state: dict[str, dict[str, torch.Tensor]]  # part -> name -> tensor, after the steps
    losses: list[float]
    random_ops: set[str]


class _RandomOps(TorchDispatchMode):
    """Sees every op of the step; keeps the names of those that draw random numbers (dropout's masks, ...)."""

    def __init__(self):
        super().__init__()
        self.seen: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if torch.Tag.nondeterministic_seeded in func.tags and _draws(func, args, kwargs or {}):
            self.seen.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _draws(func, args, kwargs) -> bool:
    """Whether a seeded op draws here: attention kernels and native_dropout are tagged as seeded whatever their
    dropout probability, but with p = 0 (or not training) they draw nothing."""
    values = {a.name: (args[i] if i < len(args) else kwargs.get(a.name, a.default_value))
              for i, a in enumerate(func._schema.arguments)}
    if values.get("train") is False:
        return False
    p = values.get("dropout_p", values.get("p") if "dropout" in func.overloadpacket.__name__ else None)
    return not (isinstance(p, (int, float)) and p == 0)


def _train(spec: RunSpec, workload: Workload, steps: int, rank: int = 0, world: int = 1,
           init: dict[str, torch.Tensor] | None = None, no_dropout: bool = False) -> Trained:
    # A fresh stack: technique instances configure one training state each.
    state = build_state(spec, workload, resolve(spec).techniques, on_model=_loader(init) if init is not None else None)
    if no_dropout:
        # For the check only: with dropout off, the runs draw no masks, so what remains is the technique's own.
        for m in state.model.modules():
            if isinstance(m, DROPOUT_BASE):
                m.p = 0.0
    start = {n: _full(p).float().cpu().clone() for n, p in state.model.named_parameters()}
    start_buffers = {n: _full(b).cpu().clone() for n, b in state.model.named_buffers()}
    # Made before the steps are watched: the synthetic data's own seeded draws are not the step's randomness.
    data = list(itertools.islice(batches(workload, spec, rank, world), steps))
    seen = _RandomOps()
    with seen:
        losses = [train_step(state, b) for b in data]
    trained = Trained(start, start_buffers, _whole_state(state), losses, seen.seen)
    del state
    return trained


def _full(t: torch.Tensor) -> torch.Tensor:
    full = getattr(t, "full_tensor", None)  # a sharded (DTensor) tensor: compare the whole of it
    return (full() if callable(full) else t).detach()


def _whole_state(state) -> dict[str, dict[str, torch.Tensor]]:
    """Everything a training run leaves that the next step reads: parameters, buffers (BatchNorm's running
    statistics and counter), and the optimizer's state, named after the parameter it belongs to."""
    model = state.model
    params = {n: _full(p).float().cpu().clone() for n, p in model.named_parameters()}
    all_buffers = {n: _full(b).cpu().clone() for n, b in model.named_buffers()}
    buffers = {n: b for n, b in all_buffers.items() if b.is_floating_point()}
    counters = {n: b for n, b in all_buffers.items() if not b.is_floating_point()}
    names = {id(p): n for n, p in model.named_parameters()}
    ordered = [n for n, _ in model.named_parameters()]
    in_optimizers = [p for opt in state.optimizers for g in opt.param_groups for p in g["params"]]
    # An optimizer over copies of the parameters (a host copy, opt-offload) keeps them in the model's order.
    by_position = len(in_optimizers) == len(ordered) and not all(id(p) in names for p in in_optimizers)
    optimizer: dict[str, torch.Tensor] = {}
    for i, p in enumerate(in_optimizers):
        name = ordered[i] if by_position else names.get(id(p), f"#{i}")
        for opt in state.optimizers:
            for key, value in opt.state.get(p, {}).items():
                if isinstance(value, torch.Tensor):
                    optimizer[f"{name}:{key}"] = _full(value).float().cpu().clone()
    return {"parameters": params, "buffers": buffers, "buffer counters": counters, "optimizer state": optimizer}


def _loader(init: dict[str, torch.Tensor]):
    """Start from given initial values: copied into the freshly built model, before any technique wraps it."""
    done = []

    def load(model: nn.Module) -> None:
        if not done:
            with torch.no_grad():
                for p, value in zip(model.parameters(), init.values()):
                    p.copy_(value)
            done.append(True)

    return load


def _has_batchnorm(workload: Workload) -> bool:
    with torch.device("meta"):
        return has_batchnorm(workload.build_model())


def _diff(part: str, ref: dict[str, torch.Tensor], run: dict[str, torch.Tensor], scale_of, tolerance: float
          ) -> StateDiff | str:
    """One part compared tensor by tensor; a string says why it cannot be (names or shapes differ)."""
    if ref.keys() != run.keys():
        only_ref, only_run = sorted(ref.keys() - run.keys()), sorted(run.keys() - ref.keys())
        parts = ([f"only the baseline has {', '.join(only_ref[:3])}"] if only_ref else []) + (
            [f"only this run has {', '.join(only_run[:3])}"] if only_run else [])
        return f"{part} differ in what they hold ({'; '.join(parts)})"
    for name in ref:
        if ref[name].shape != run[name].shape:
            return f"{part} differ in shape ({name}: {tuple(ref[name].shape)} vs {tuple(run[name].shape)})"
    eps = torch.finfo(torch.float32).eps
    max_diff, worst, scale, within = 0.0, None, 0.0, True
    for name, b in ref.items():
        a = run[name]
        delta = (a.double() - b.double()).abs()
        diff = float(delta.max()) if delta.numel() else 0.0
        s = scale_of(name, b)
        scale = max(scale, s)
        if diff > max_diff:
            max_diff, worst = diff, name
        if diff == 0:
            continue
        if not b.is_floating_point():  # counters (BatchNorm's num_batches_tracked): any difference is real
            within = False
        elif not bool((delta <= tolerance * s + PARAM_ULPS * eps * b.double().abs()).all()):
            within = False
    scale = scale or 1.0
    return StateDiff(part=part, tensors=len(ref), max_abs_diff=max_diff, scale=scale,
                     relative_diff=max_diff / scale, worst=worst, within_tolerance=within)


def _compare(ref: Trained, run: Trained, tolerance: float) -> tuple[list[StateDiff], str | None]:
    """Every part of the state; (diffs, why not comparable)."""
    updates = {n: float((ref.state["parameters"][n] - ref.start[n]).abs().max()) if ref.start[n].numel() else 0.0
               for n in ref.state["parameters"] if n in ref.start}
    largest_update = max(updates.values(), default=0.0)

    def buffer_scale(name: str, b: torch.Tensor) -> float:
        # A buffer's own change over the steps (a running mean moves by a fraction of the batch statistics).
        before = ref.start_buffers.get(name)
        if before is None or not b.is_floating_point() or before.shape != b.shape:
            return 1.0
        return float((b.double() - before.double()).abs().max()) if b.numel() else 0.0

    scales = {"parameters": lambda name, b: largest_update,
              "buffers": buffer_scale,
              "buffer counters": lambda name, b: 1.0,  # a count: its difference is itself
              # Optimizer state starts at zero: its size is its change.
              "optimizer state": lambda name, b: float(b.abs().max()) if b.numel() else 0.0}
    diffs = []
    for part in PARTS:
        d = _diff(part, ref.state[part], run.state[part], scales[part], tolerance)
        if isinstance(d, str):
            return diffs, d
        if d.tensors:
            diffs.append(d)
    return diffs, None


def _describe(diffs: list[StateDiff]) -> str:
    """'buffers differ by 1 (layer1.0.bn1.num_batches_tracked)...; parameters identical'."""
    out = []
    for d in diffs:
        if d.max_abs_diff == 0:
            out.append(f"{d.part} identical")
        else:
            if d.part == "buffer counters":
                out.append(f"buffer counters differ by up to {d.max_abs_diff:.3g} (in {d.worst})")
                continue
            against = {"parameters": "the update size", "buffers": "their own change over the steps",
                       "optimizer state": "their largest value"}[d.part]
            out.append(f"{d.part} differ by up to {d.max_abs_diff:.3g} (largest in {d.worst}; {d.relative_diff:.2g} "
                       f"of {against})")
    return "; ".join(out)


def _verdict(diffs: list[StateDiff], why: str | None, mode: str, tolerance: float) -> tuple[str, str]:
    if why is not None:
        return "not-equivalent", why
    if all(d.max_abs_diff == 0 for d in diffs):
        return "bitwise", f"{', '.join(d.part for d in diffs)} identical to the baseline, bit for bit"
    if all(d.within_tolerance for d in diffs):
        return "equivalent", (f"{_describe(diffs)}; allowed: {tolerance:g} of the update size or {PARAM_ULPS} ulp "
                              "per value: floating-point rounding")
    bad = [d for d in diffs if not d.within_tolerance]
    return "not-equivalent", f"{', '.join(d.part for d in bad)} differ: {_describe(diffs)}"


def _random_words(ops: set[str]) -> str:
    return "dropout masks" if ops and all("dropout" in o or "bernoulli" in o for o in ops) else \
        f"random ops ({', '.join(sorted(ops))})"


@contextlib.contextmanager
def deterministic(device: str):
    """On CUDA the check runs with torch.use_deterministic_algorithms(True, warn_only=True) and cuDNN's
    deterministic kernels (benchmark off), so a "bitwise" verdict does not depend on the order in which atomic
    adds landed (attention and embedding backward, index_add, scatter_add). Yields a list that names, after the
    block, the ops torch warned have no deterministic kernel (warn_only: they still ran). On CPU: nothing to do
    (its kernels are deterministic at a fixed thread count)."""
    flagged: list[str] = []
    if device != "cuda":
        yield flagged
        return
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield flagged
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[2], saved[3]
    for w in caught:
        text = str(w.message)
        # torch's alerts (aten/src/ATen/Context.cpp): "<op> does not have a deterministic implementation, ..."
        # and, for cuBLAS without CUBLAS_WORKSPACE_CONFIG=:4096:8, "... because it uses CuBLAS ...".
        name = ("cuBLAS (CUBLAS_WORKSPACE_CONFIG not set)" if "CuBLAS" in text else
                text.split(" does not have a deterministic implementation")[0] if
                " does not have a deterministic implementation" in text else None)
        if name and name not in flagged:
            flagged.append(name)


def check(spec: RunSpec, stack: Stack, workload: Workload, check_steps: int = 2) -> Equivalence:
    """The check (see _check), on CUDA with deterministic algorithms; a verdict says which ops had none."""
    with deterministic(spec.device) as flagged:
        result = _check(spec, stack, workload, check_steps)
    if flagged:
        result.detail += (f" (checked with deterministic algorithms on; without a deterministic kernel: "
                          f"{', '.join(flagged)}: a last-bit difference can be their summation order)")
    return result


def _check(spec: RunSpec, stack: Stack, workload: Workload, check_steps: int = 2) -> Equivalence:
    """Train the baseline and `spec` for check_steps steps from the same seed on the same data; compare the whole
    state they leave (parameters, buffers, optimizer state).

    Under torchrun every rank must call this (sharded parameters are gathered for the comparison); the reference
    is one process training on the ranks' combined batch. A step that draws random numbers (dropout) is checked
    again with dropout off, so a difference in masks is not mistaken for a different model.
    """
    from membench.launch.distributed import agree, data_rank

    rank, world = data_rank(spec)  # tensor-parallel ranks share a batch: the data-parallel ranks split it
    if not stack.techniques:
        return Equivalence(verdict="reference", detail="the baseline is the reference")
    setup = _setup(spec, stack, world, check_steps)
    mode, spec, reference, tolerance, check_steps = (setup.mode, setup.spec, setup.reference, setup.tolerance,
                                                     setup.check_steps)

    def both(no_dropout: bool = False) -> tuple[Trained, Trained]:
        ref, error = None, None
        try:
            ref = _train(reference, workload, check_steps, no_dropout=no_dropout)
        except Exception as exc:  # noqa: BLE001 - every rank must hear of it before the next collective
            error = exc
        # The reference pass has no collective in it (each rank trains it alone); the run's has: agree first.
        agree(error, "the check's reference pass")
        run = _train(spec, workload, check_steps, rank, world, init=None if stack.same_init else ref.start,
                     no_dropout=no_dropout)
        return ref, run

    ref, run = both()
    diffs, why = _compare(ref, run, tolerance)
    params = next((d for d in diffs if d.part == "parameters"), None)
    loss_diff = max(abs(a - b) for a, b in zip(run.losses, ref.losses))
    random_ops = ref.random_ops | run.random_ops
    result = Equivalence(
        verdict="precision", mode=mode,
        compared=f"{', '.join(d.part for d in diffs) or 'nothing'} after {check_steps} {spec.optimizer} steps"
                 + (f", {world} ranks against one process at batch {reference.batch_size}" if world > 1 else "")
                 + ("" if stack.same_init else ", both from the baseline's initial values"),
        parts=diffs,
        max_abs_param_diff=params.max_abs_diff if params else None,
        max_param_update=params.scale if params else None,
        relative_diff=params.relative_diff if params else None,
        max_abs_loss_diff=loss_diff, losses=run.losses, reference_losses=ref.losses,
        random_ops=sorted(random_ops) or None)
    if mode == "precision":
        result.detail = f"changes numerics on purpose: loss differs by up to {loss_diff:.3g} over {check_steps} steps"
        return result
    verdict, detail = _verdict(diffs, why, mode, tolerance)
    batchnorm = _has_batchnorm(workload)
    if verdict == "not-equivalent" and random_ops and not (mode == "batch-split" and batchnorm):
        verdict, detail = _again_without_dropout(both, result, detail, random_ops, setup)
    recomputes = any(t.recomputes_forward for t in stack.techniques)
    if verdict == "not-equivalent" and recomputes and batchnorm and why is None and any(
            d.part in ("buffers", "buffer counters") and not d.within_tolerance for d in diffs):
        detail = ("the model has BatchNorm: recomputation runs its forward again in backward and updates its "
                  f"running statistics twice, so the trained model differs ({detail})")
    if mode == "batch-split" and batchnorm:
        verdict = "not-equivalent"
        detail = ("the model has BatchNorm: each micro-batch normalises with its own statistics, so "
                  f"accumulation trains a different model ({detail})")
    result.verdict, result.detail = verdict, detail
    return result


@dataclass
class _Setup:
    """What the check compares: its numerics mode, the run and the one-process reference it trains, the relative
    tolerance, and how many steps."""

    mode: str
    spec: RunSpec
    reference: RunSpec
    tolerance: float
    check_steps: int


def _setup(spec: RunSpec, stack: Stack, world: int, check_steps: int) -> _Setup:
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
    return _Setup(mode, spec, reference, TOLERANCE.get(mode, EXACT_RTOL), check_steps)


def _again_without_dropout(both, result: Equivalence, detail: str, random_ops: set[str],
                           setup: _Setup) -> tuple[str, str]:
    """A not-equivalent verdict of a step that draws random numbers, checked again with dropout off (different
    masks are not a different model): the verdict and its detail; `result` says what was compared again."""
    words = _random_words(random_ops)
    ref2, run2 = both(no_dropout=True)
    diffs2, why2 = _compare(ref2, run2, setup.tolerance)
    verdict2, detail2 = _verdict(diffs2, why2, setup.mode, setup.tolerance)
    left = ref2.random_ops | run2.random_ops
    if verdict2 in ("bitwise", "equivalent") and not left:
        result.apart_from, result.parts = words, diffs2
        result.compared += ", again with dropout disabled"
        return "equivalent", (f"equivalent apart from {words}: the step draws random numbers "
                              f"({', '.join(sorted(random_ops))}), and the runs draw them differently, so with "
                              f"dropout on the {detail.split(': ', 1)[-1]}; with dropout disabled for the check, "
                              f"{detail2}")
    extra = (f"random ops remain with dropout disabled ({', '.join(sorted(left))})" if left
             else f"with dropout disabled for the check it is still {verdict2}: {detail2}")
    return "not-equivalent", f"{detail} (the step draws random numbers: {words}; {extra})"
