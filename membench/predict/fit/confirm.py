"""A fit's answer confirmed on a CUDA GPU: the batch run for real under the budget, walked down on OOM, up on
success."""

from __future__ import annotations

from pathlib import Path

from membench.launch.process import launch
from membench.predict.fit.search import Fit
from membench.spec import Job


def confirm_on_gpu(job: Job, fit: Fit, budget: int, out_dir: Path, tries: int = 4) -> Fit:
    """Run the predicted batch on the GPU under the budget (a memory fraction), each in its own process; walk
    down on OOM, up on success, at most `tries` runs. Not exercised on CPU-only machines: no GPU, no confirmation.
    """

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
