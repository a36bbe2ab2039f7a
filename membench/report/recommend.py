"""What to do, decided from the numbers of one sweep: a `Recommendation` (what is picked, why, the numbers), which
report/words.py puts into sentences for the terminal, report.md and report.html alike.

Goals:
- "lowest-peak" (the default): the lowest peak among the runs that train the same model as the baseline
  (equivalence bitwise or equivalent; for predictions, which run no check, the runs that keep the precision). A
  technique that changes precision, or whose equivalence was not checked, is never recommended as the same model;
  it is named apart when it goes lower. A saving below `min_saving_pct` (5% of the baseline's peak unless
  `lowest-peak:min-saving=PCT` says otherwise) is not a reason to change a training setup: the baseline is kept.
  On CUDA predictions made for a GPU (`membench predict`), the question is the one `predict` answers: does the step
  fit that GPU, and if not, the cheapest listed technique that does, by results/choice.py's one rule (its cost
  class, then one that changes nothing, then the fewest techniques, then the most room); a technique that changes
  something (bf16: the numerics) is named with what it changes.
- "fits:<size>" (e.g. fits:16GiB): among the runs that train the same model and whose peak fits in the budget
  (reserved memory where measured, as CUDA runs out of memory on it; else allocated), the fastest where the
  interleaved timing tells it apart from the others; else the lowest peak of those it cannot tell apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from membench.common.errors import UserError
from membench.common.units import fmt_bytes, parse_bytes
from membench.common.vocab import SAME_MODEL, Phase
from membench.report.noise import Speed, beats, speed
from membench.results import RunRecord
from membench.results.choice import card_fit, changes, order
from membench.results.sweep import Sweep

MIN_SAVING_PCT = 5.0  # a saving below this share of the baseline's peak is too small to change a setup for


@dataclass(frozen=True)
class Goal:
    kind: Literal["lowest-peak", "fits"]
    budget: int | None = None
    min_saving_pct: float = MIN_SAVING_PCT

    def describe(self) -> str:
        if self.kind == "fits":
            return f"fits in {fmt_bytes(self.budget)} with the highest throughput, training the same model"
        return (f"the lowest peak that trains the same model, saving at least {self.min_saving_pct:g}% of the "
                "baseline's peak")


_GOAL_HELP = "write lowest-peak, lowest-peak:min-saving=PCT (such as min-saving=2), or fits:SIZE such as fits:16GiB"


def parse_goal(text: str | None) -> Goal:
    """'lowest-peak' (default), 'lowest-peak:min-saving=2' or 'fits:16GiB'."""
    if not text or text == "lowest-peak":
        return Goal("lowest-peak")
    kind, sep, rest = text.partition(":")
    if kind == "fits" and sep:
        return Goal("fits", parse_bytes(rest))
    if kind == "lowest-peak" and rest.startswith("min-saving="):
        value = rest.removeprefix("min-saving=").rstrip("%")
        try:
            pct = float(value)
        except ValueError:
            pct = -1.0
        if not 0 <= pct < 100:
            raise UserError(f"cannot read goal {text!r}: min-saving is a percent from 0 to below 100, got {value!r}")
        return Goal("lowest-peak", min_saving_pct=pct)
    raise UserError(f"cannot read goal {text!r}: {_GOAL_HELP}")


@dataclass(frozen=True)
class Candidate:
    """A run as the recommendation weighs it. peak: the bytes the goal compares (allocated; for fits, reserved
    where measured). verdict: why it trains the same model ("baseline", "bitwise", "equivalent", or for a
    prediction "not checked: prediction")."""

    name: str
    peak: int
    speed: Speed
    verdict: str
    apart_from: str | None = None
    cost: str | None = None  # the step-time cost class, as recorded (a CUDA prediction's pick names it)
    numerics: str | None = None  # as recorded: what the pick changes, if anything (results/choice.py)


Exclusion = Literal["changes-precision", "not-checked", "not-equivalent", "check-failed"]


@dataclass(frozen=True)
class Excluded:
    """A run that goes lower than the pick but is not recommended, and why."""

    name: str
    peak: int
    why: Exclusion
    detail: str = ""


# pick: a run is picked. below-threshold: the best saving is under the goal's threshold (the baseline is kept).
# fits-card: a CUDA prediction's baseline fits the GPU it was predicted for (`card`); nothing-fits-card: nothing
# listed fits it (pick: the lowest). nothing-lower: no run that trains the same model lowers the baseline's peak.
# no-same-model: no run that trains the same model finished. nothing-finished: no run finished. nothing-fits:
# nothing that trains the same model fits. baseline-without-memory: the baseline says ok but holds no memory (a
# damaged or crafted file): nothing is recommended against it.
Outcome = Literal["pick", "below-threshold", "nothing-lower", "no-same-model", "nothing-finished", "nothing-fits",
                  "fits-card", "nothing-fits-card", "baseline-without-memory"]
# How a fits pick was made: the only run that fits; faster than the others beyond the intervals; or the lowest peak
# of those the timing cannot tell apart (`rivals`).
FitsBy = Literal["only", "fastest", "lowest-peak"]


@dataclass(frozen=True)
class Recommendation:
    """The decision for one sweep and one goal, with the numbers behind it.

    pick: the run picked (pick), the best saving (below-threshold) or the lowest peak (nothing-fits).
    baseline_status: set when the baseline did not finish (its status, or "missing"): changes are then not
    measured against it."""

    goal: Goal
    outcome: Outcome
    pick: Candidate | None = None
    baseline_peak: int | None = None
    baseline_phase: Phase | None = None
    baseline_status: str | None = None
    fits_by: FitsBy | None = None
    rivals: tuple[str, ...] = ()
    excluded: tuple[Excluded, ...] = ()
    predicted: bool = False
    card: str | None = None  # CUDA predictions: the GPU they were predicted for, and fit against


def _same_model(r: RunRecord, predicted: bool) -> bool:
    if r.is_baseline:
        return True
    if predicted:  # no check runs on fake tensors: the runs whose numerics change nothing (results/choice.py)
        return r.numerics is not None and changes(r.numerics) is None
    return r.equivalence is not None and r.equivalence.verdict in SAME_MODEL


def _fit_bytes(r: RunRecord) -> int:
    m = r.memory
    return (m.peak_reserved_bytes or m.peak_allocated_bytes) if m is not None else 0


def _candidate(r: RunRecord, predicted: bool, peak: int | None = None) -> Candidate:
    eq = r.equivalence
    verdict = ("baseline" if r.is_baseline else "not checked: prediction" if predicted
               else eq.verdict if eq is not None else "not checked")
    return Candidate(r.name, r.peak if peak is None else peak, speed(r), verdict,
                     eq.apart_from if eq is not None and not predicted else None, r.cost, r.numerics)


def _excluded(r: RunRecord) -> Excluded:
    eq = r.equivalence
    if r.changes_precision:
        return Excluded(r.name, r.peak, "changes-precision")
    if eq is None or eq.verdict == "reference":
        return Excluded(r.name, r.peak, "not-checked")
    if eq.verdict == "failed":
        return Excluded(r.name, r.peak, "check-failed", eq.detail)
    return Excluded(r.name, r.peak, "not-equivalent", eq.detail)


def recommend(sweep: Sweep, goal: Goal = Goal("lowest-peak")) -> Recommendation:
    """The decision for `sweep` and `goal`."""
    ref, base = sweep.reference, sweep.baseline
    context = dict(goal=goal, predicted=sweep.predicted, baseline_peak=ref.peak if ref else None,
                   baseline_phase=ref.memory.peak_phase if ref else None,
                   baseline_status=None if ref else (base.status if base else "missing"))
    done = sweep.finished
    if base is not None and base.status == "ok" and base.memory is None:  # a damaged or crafted result
        return Recommendation(outcome="baseline-without-memory", **{**context, "baseline_status": None})
    if not done:
        return Recommendation(outcome="nothing-finished", **context)
    if goal.kind == "lowest-peak" and all(card_fit(r) is not None for r in done):
        return _card(done, context)
    same = [r for r in done if _same_model(r, sweep.predicted)]
    others = [r for r in done if r not in same]
    if goal.kind == "fits":
        return _fits(same, done, sweep.predicted, context)
    pick = min(same, key=lambda r: r.peak) if same else None
    excluded = tuple(_excluded(r) for r in sorted(others, key=lambda r: r.peak) if pick is None or r.peak < pick.peak)
    context["excluded"] = excluded
    if pick is None:
        return Recommendation(outcome="no-same-model", **context)
    candidate = _candidate(pick, sweep.predicted)
    if ref is not None and pick.peak >= ref.peak:
        return Recommendation(outcome="nothing-lower", **context)
    if ref is not None and (ref.peak - pick.peak) * 100 < goal.min_saving_pct * ref.peak:
        return Recommendation(outcome="below-threshold", pick=candidate, **context)
    return Recommendation(outcome="pick", pick=candidate, **context)


def _fits(same: list[RunRecord], done: list[RunRecord], predicted: bool, context: dict) -> Recommendation:
    fitting = [_candidate(r, predicted, _fit_bytes(r)) for r in same if _fit_bytes(r) <= context["goal"].budget]
    if not fitting:
        low = min(same or done, key=_fit_bytes)
        return Recommendation(outcome="nothing-fits", pick=_candidate(low, predicted, _fit_bytes(low)), **context)
    if len(fitting) == 1:
        return Recommendation(outcome="pick", pick=fitting[0], fits_by="only", **context)
    fastest = [c for c in fitting if all(beats(c.speed, o.speed) for o in fitting if o is not c)]
    if fastest:
        return Recommendation(outcome="pick", pick=fastest[0], fits_by="fastest", **context)
    unbeaten = [c for c in fitting if not any(beats(o.speed, c.speed) for o in fitting)]
    pick = min(unbeaten, key=lambda c: c.peak)
    return Recommendation(outcome="pick", pick=pick, fits_by="lowest-peak",
                          rivals=tuple(c.name for c in unbeaten if c is not pick), **context)


def _card(done: list[RunRecord], context: dict) -> Recommendation:
    """CUDA predictions against the GPU they were predicted for: the baseline where it fits, else the cheapest
    listed technique that fits by results/choice.py's rule (the one `predict`'s answer uses), else the lowest."""
    fits = {r.name: card_fit(r) for r in done}
    card = done[0].spec.run.gpu
    base = next((r for r in done if r.is_baseline), None)
    if base is not None and fits[base.name][0]:
        return Recommendation(outcome="fits-card", pick=_candidate(base, True, fits[base.name][1]), card=card,
                              **context)
    fitting = [r for r in done if not r.is_baseline and fits[r.name][0]]
    if not fitting:
        low = min(done, key=lambda r: fits[r.name][1])
        return Recommendation(outcome="nothing-fits-card", pick=_candidate(low, True, fits[low.name][1]), card=card,
                              **context)
    pick = min(fitting, key=lambda r: order(r.cost, r.numerics, len(r.spec.run.techniques), -fits[r.name][1]))
    return Recommendation(outcome="pick", pick=_candidate(pick, True, fits[pick.name][1]), card=card, **context)
