"""The batch search: the largest batch whose predicted peak fits a budget, over multiples of the batch step every
technique of the stack takes. The full search predicts every batch it tries; fit_batch derives the allocations at
every batch from two predictions (affine.AffineTrace) and predicts for real only to confirm its answer."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from membench.common.errors import UserError
from membench.predict import gpus
from membench.predict.emulate.reductions import KernelScratch
from membench.predict.fit.affine import AffineTrace, NotAffine
from membench.predict.run import Traced, allocator_settings
from membench.predict.verdict import Fit  # read by the CLI without torch
from membench.spec import Job
from membench.techniques import resolve
from membench.workloads import load_workload

BELOW_CHECKED = 8  # batches below the answer simulated to say whether smaller ones fail (reserved memory)
SCAN_LIMIT = 64  # batches simulated downwards from the allocated-memory bound before bisecting instead


def bisect_last(fits: Callable[[int], bool], lo: int, hi: int) -> tuple[int, int]:
    """(k, k + 1) with fits(k) and not fits(k + 1), for lo <= k < hi, where fits(lo) holds and fits(hi) does not
    (neither is asked): bisection, each point asked at most once, as if fits held up to some k and not after."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo, hi


def batch_step(job: Job) -> int:
    """The smallest batch every technique of the stack accepts; all multiples of it are accepted too."""
    workload = load_workload(job.run.workload, job.run.seq_len)
    for b in range(1, 4097):
        trial = dataclasses.replace(job.run, batch_size=b)
        try:
            resolve(trial, target_device=job.run.device).validate(trial, workload)
        except UserError:
            continue
        return b
    raise UserError(f"no batch size up to 4096 is valid for {job.name}")


def largest_batch(job: Job, budget: int, peak: Callable[[Job], int], max_batch: int = 65536) -> Fit:
    """Exponential then binary search over multiples of batch_step(job) for the largest peak(job) <= budget."""
    step = batch_step(job)
    seen: dict[int, int] = {}

    def at(k: int) -> int:
        if k not in seen:
            seen[k] = peak(job.with_run(batch_size=k * step))
        return seen[k]

    if at(1) > budget:
        return Fit(job.name, 0, None, step, step, seen[1], len(seen), note="even the smallest batch is over budget")
    lo, hi = 1, 2
    while hi * step <= max_batch and at(hi) <= budget:
        lo, hi = hi, hi * 2
    if hi * step > max_batch:
        return Fit(job.name, lo * step, at(lo), step, None, None, len(seen), note=f"--max-batch {max_batch} fits")
    lo, hi = bisect_last(lambda k: at(k) <= budget, lo, hi)
    return Fit(job.name, lo * step, at(lo), step, hi * step, at(hi), len(seen))


class _Predictions:
    """fit_batch's real predictions, each batch (in batch steps) predicted once and shown through on_probe."""

    def __init__(self, job: Job, step: int, by: str, traced: Callable[[Job], Traced],
                 on_probe: Callable[[Job, int], None] | None):
        self.job, self.step, self.traced, self.on_probe = job, step, traced, on_probe
        self.key = f"peak_{by}_bytes"
        self.seen: dict[int, Traced] = {}

    def real(self, k: int) -> Traced:
        if k not in self.seen:
            trial = self.job.with_run(batch_size=k * self.step)
            self.seen[k] = self.traced(trial)
            if self.on_probe:
                self.on_probe(trial, getattr(self.seen[k].memory, self.key))
        return self.seen[k]

    def value(self, k: int) -> int:
        return getattr(self.real(k).memory, self.key)

    def full_search(self, why: str, budget: int, max_batch: int) -> Fit:
        fit = largest_batch(self.job, budget, lambda j: self.value(j.run.batch_size // self.step), max_batch)
        fit.note = "; ".join(n for n in (f"{why}: full search", fit.note) if n)
        fit.probes = len(self.seen)
        return fit


def fit_batch(job: Job, budget: int, by: str, traced: Callable[[Job], Traced], max_batch: int = 65536,
              on_probe: Callable[[Job, int], None] | None = None) -> Fit:
    """The largest batch whose predicted peak `by` ("allocated" or "reserved") fits the budget, from two traces,
    confirmed by real predictions at the answer and the first batch over (see the package docstring); the full
    search where the traces do not allow it. traced(job) is one prediction (predict.run.predict_traced)."""
    step = batch_step(job)
    kmax = max_batch // step
    predictions = _Predictions(job, step, by, traced, on_probe)
    if kmax < 1:
        raise UserError(f"--max-batch {max_batch} is below the smallest batch {job.name} takes ({step})")
    if kmax < 3 or predictions.value(2) > budget:
        return _at_the_smallest(predictions, budget, kmax, max_batch)
    try:
        model, first = _derived(predictions, budget, kmax)
    except NotAffine as why:
        return predictions.full_search(f"allocations differ between batch sizes ({why})", budget, max_batch)
    found = _search_derived(model, by, budget, step, first, kmax)
    answer = found.batch
    for k in (answer, answer + 1):
        if k <= kmax and (why := model.matches(predictions.real(k), k * step)):
            return predictions.full_search(f"derived allocations differ from a real prediction ({why})", budget,
                                           max_batch)
    if predictions.value(answer) > budget or (answer < kmax and predictions.value(answer + 1) <= budget):
        return predictions.full_search("the derived peaks differ from real predictions", budget, max_batch)
    return _fit_found(predictions, found, first, kmax, max_batch)


def _at_the_smallest(predictions: _Predictions, budget: int, kmax: int, max_batch: int) -> Fit:
    """One or two batch steps: one step is special (a transpose of one sample is contiguous: fewer copies)."""
    name, step, value = predictions.job.name, predictions.step, predictions.value
    if value(1) > budget:
        return Fit(name, 0, None, step, step, value(1), len(predictions.seen), note="even the smallest batch is over "
                   "budget", method="one prediction")
    over = (2 * step, value(2)) if kmax >= 2 else (None, None)
    return Fit(name, step, value(1), step, *over, len(predictions.seen), method="predictions at the smallest batches",
               note="" if kmax >= 2 else f"--max-batch {max_batch} fits")


def _derived(predictions: _Predictions, budget: int, kmax: int) -> tuple[AffineTrace, int]:
    """The affine trace through the predictions at two and three batch steps, else (two steps can be special too:
    a size-2 dimension another kernel path takes) at three and four; and the first batch step it holds for.
    NotAffine, with both reasons, where neither pair gives one."""
    job, step, real = predictions.job, predictions.step, predictions.real
    settings = allocator_settings(resolve(job.run))
    scratch = KernelScratch(gpus.predicted_for(job.run)) if job.run.device == "cuda" else None
    try:
        return AffineTrace.derive(real(2), 2 * step, real(3), 3 * step, settings, scratch), 2
    except NotAffine as why:
        if not (kmax >= 4 and predictions.value(3) <= budget):
            raise
        try:
            return AffineTrace.derive(real(3), 3 * step, real(4), 4 * step, settings, scratch), 3
        except NotAffine as again:
            raise NotAffine(f"{why}; {again}") from None


@dataclass
class _Found:
    """What the search over derived allocations found, in batch steps."""

    batch: int
    fails_below: list[int]  # batches (not steps) below it that do not fit, ascending
    note: str
    simulations: int


def _search_derived(model: AffineTrace, by: str, budget: int, step: int, first: int, kmax: int) -> _Found:
    """The largest batch step from `first` to kmax whose derived peak fits, by bisection of allocated memory (it
    only grows with the batch: every size has a slope >= 0), then for reserved memory a walk down from there."""
    simulations = 0

    def fits(k: int) -> bool:
        nonlocal simulations
        if by == "allocated":
            return model.peak_allocated(k * step) <= budget
        simulations += 1
        return model.peak_reserved(k * step) <= budget

    lo, _ = bisect_last(lambda k: model.peak_allocated(k * step) <= budget, first, kmax + 1)  # kmax + 1: beyond
    note = ""
    if by == "reserved":
        # Reserved memory is not monotonic in the batch (segment sizes): walk down from the bound to the largest
        # batch that fits, rather than trust a bisection's luck; bisect only past SCAN_LIMIT batches.
        top = lo
        while lo > first and not fits(lo) and top - lo < SCAN_LIMIT:
            lo -= 1
        if lo > first and not fits(lo):
            lo, _ = bisect_last(fits, first, lo)
            note = f"reserved memory bisected below batch {(top - SCAN_LIMIT) * step}"
    fails_below = [k * step for k in range(lo - 1, max(lo - 1 - BELOW_CHECKED, first - 1), -1)
                   if by == "reserved" and not fits(k)]
    return _Found(lo, sorted(fails_below), note, simulations)


def _fit_found(predictions: _Predictions, found: _Found, first: int, kmax: int, max_batch: int) -> Fit:
    """The Fit of a search from derived allocations that real predictions confirmed."""
    step, answer, value = predictions.step, found.batch, predictions.value
    fit = Fit(predictions.job.name, answer * step, value(answer), step, None, None, len(predictions.seen),
              simulations=found.simulations,
              method=f"from traces at {first * step} and {(first + 1) * step}, confirmed at the answer and the batch "
                     "above",
              fails_below=found.fails_below)
    note = found.note
    if answer < kmax:
        fit.over_batch, fit.over_peak = (answer + 1) * step, value(answer + 1)
    else:
        note = f"--max-batch {max_batch} fits"
    if found.fails_below:
        listed = ", ".join(map(str, fit.fails_below))
        note = "; ".join(n for n in (note, f"smaller batches {listed} do not fit (reserved memory is not monotonic "
                                            f"in the batch; {BELOW_CHECKED} batches below checked)") if n)
    fit.note = note
    return fit
