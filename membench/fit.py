"""The largest batch that fits a memory budget, per technique: found from predictions, confirmed on a GPU.

Predictions are cheap (seconds, no GPU), so the search is exponential (1, 2, 4, ... until one does not fit) then
binary. Where a CUDA GPU is present, the predicted batch is then run for real in a subprocess under the budget; an
OOM there is a data point (the prediction was optimistic: step down), a success is tried one step further up.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from membench.errors import UserError
from membench.spec import Job
from membench.techniques import resolve
from membench.workloads import load_workload


@dataclass
class Fit:
    """batch fits (peak <= budget), batch + step does not (or max_batch was reached)."""

    run: str
    batch: int  # 0: not even the smallest batch fits
    peak: int | None  # predicted peak at `batch`
    step: int  # batch sizes this stack accepts are multiples of it (accumulation needs equal micro-batches)
    over_batch: int | None  # the smallest batch tried that does not fit
    over_peak: int | None
    probes: int
    confirmed: int | None = None  # largest batch that ran without OOM on the GPU, when confirmed
    note: str = ""


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
    while hi - lo > 1:  # at(lo) fits, at(hi) does not
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if at(mid) <= budget else (lo, mid)
    return Fit(job.name, lo * step, at(lo), step, hi * step, at(hi), len(seen))


def confirm_on_gpu(job: Job, fit: Fit, budget: int, out_dir: Path, tries: int = 4) -> Fit:
    """Run the predicted batch on the GPU under the budget (a memory fraction), each in its own process; walk
    down on OOM, up on success, at most `tries` runs. Not exercised on CPU-only machines: no GPU, no confirmation.
    """
    from membench.launcher import launch

    def fits(batch: int) -> bool | None:
        run = job.with_run(device="cuda", batch_size=batch, memory_budget=budget).with_measure(
            check=False, steps=2, warmup=1, timeline=False)
        status = launch(run, out_dir / f"{job.name}-bs{batch}").status
        return {"ok": True, "oom": False}.get(status)  # None: it failed for another reason

    batch, step = max(fit.batch, fit.step), fit.step
    ok = fits(batch)
    runs, best = 1, (batch if ok else None)
    direction = step if ok else -step
    while ok is not None and runs < tries:
        batch += direction
        if batch <= 0:
            break
        ok = fits(batch)
        runs += 1
        if ok:
            best = max(best or 0, batch)
        if (direction > 0 and not ok) or (direction < 0 and ok):
            break
    fit.confirmed = best if best is not None else 0
    if ok is None:
        fit.note = (fit.note + "; " if fit.note else "") + f"a confirmation run failed (see {out_dir})"
    return fit
