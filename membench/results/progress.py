"""A run's stage as its worker reports it (launch/progress.py carries it across processes, report/live.py shows it)."""

from __future__ import annotations

from dataclasses import dataclass

STAGE_WORDS = {
    "start": "starting Python and torch",
    "build": "building the model",
    "warmup": "warm-up",
    "measure": "measuring memory",
    "timeline": "timeline pass",
    "time": "timing",
    "flops": "counting FLOPs",
    "compare": "timing against the baseline",
    "check": "equivalence check",
    "predict": "predicting it beside the measurement",
}


@dataclass(frozen=True)
class Stage:
    """One stage of one run, as the worker reported it. step/steps: 'timing step 3 of 5' (steps is None past
    --steps, when --min-time keeps timing); elapsed_s: seconds since the run started; host_peak_bytes: the
    worker's peak resident memory (RSS) so far, where it said; model_bytes: its model's parameters, once built."""

    run: str
    stage: str
    elapsed_s: float = 0.0
    step: int | None = None
    steps: int | None = None
    host_peak_bytes: int | None = None
    model_bytes: int | None = None  # the built model's parameter bytes, said once it is built (before warm-up)

    def describe(self) -> str:
        words = STAGE_WORDS.get(self.stage, self.stage)
        if self.step is None:
            return words + (f" ({self.steps} step{'s' if self.steps > 1 else ''})" if self.steps else "")
        return f"{words} step {self.step}" + (f" of {self.steps}" if self.steps else " (--min-time)")
