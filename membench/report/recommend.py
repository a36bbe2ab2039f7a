"""What to do, computed from the numbers: which run to pick for the user's goal, what it saves, what it costs,
how sure the timing is and whether it trains the same model; and, when nothing helps, why.

Goals:
- "lowest-peak" (the default): the lowest peak among the runs that train the same model as the baseline
  (equivalence bitwise or equivalent). A technique that changes precision, or whose equivalence was not checked,
  is never recommended as the same model; it is named apart when it goes lower.
  A saving below `min_saving_pct` (5% of the baseline's peak unless `lowest-peak:min-saving=PCT` says otherwise)
  is not a reason to change a training setup: the baseline is kept and the output says the threshold.
- "fits:<size>" (e.g. fits:16GiB): among the runs that train the same model and whose peak fits in the budget
  (reserved memory where measured, as CUDA runs out of memory on it; else allocated), the highest throughput.
"""

from __future__ import annotations

from dataclasses import dataclass

from membench.common.errors import UserError
from membench.common.units import fmt_bytes, fmt_bytes_apart, fmt_number, parse_bytes, pct_change
from membench.report import noise
from membench.report.explain import PHASE_WORDS, find_baseline
from membench.results import RunRecord

SAME_MODEL = ("bitwise", "equivalent")
MIN_SAVING_PCT = 5.0  # a saving below this share of the baseline's peak is too small to change a setup for


@dataclass(frozen=True)
class Goal:
    kind: str  # "lowest-peak" or "fits"
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


def changes_precision(r: RunRecord) -> bool:
    """From the equivalence check when it ran; else from the stack's numerics."""
    eq = r.equivalence
    if eq is not None and eq.verdict != "reference":
        return eq.verdict == "precision" or eq.mode == "precision"
    if not r.spec.run.techniques:
        return False
    try:
        from membench.techniques import resolve

        return resolve(r.spec.run).low_precision
    except UserError:  # a technique this membench does not know: cannot tell
        return False


def _same_model(r: RunRecord) -> bool:
    return r.name == "baseline" or (r.equivalence is not None and r.equivalence.verdict in SAME_MODEL)


def _fit_bytes(r: RunRecord) -> int | None:
    m = r.memory
    return None if m is None else (m.peak_reserved_bytes or m.peak_allocated_bytes)


def ranks(r: RunRecord) -> int:
    """How many processes shared the work: a throughput over several ranks is theirs together."""
    return max(r.world_size or 1, r.spec.run.nproc_per_node or 1)


def _cost(r: RunRecord, base: RunRecord | None) -> str:
    t, bt = r.timing, base.timing if base else None
    if t is None or bt is None or not t.throughput or not bt.throughput:
        return "its throughput was not compared"
    n, bn = ranks(r), ranks(base)
    # More ranks give more throughput without the technique doing anything: compare what one rank does.
    value, ref = t.throughput / n, bt.throughput / bn
    per = " per rank" if (n, bn) != (1, 1) else ""
    note = f" ({n} ranks against the baseline's {bn}, compared per rank)" if n != bn else ""
    change = pct_change(value, ref)
    if noise.within_noise(t, bt):
        spread = ", ".join(f"±{s:.0%}" for s in (noise.spread(t), noise.spread(bt)) if s is not None)
        overlap = f"({change:+.1f}%, step-time intervals overlap" + (f": {spread}" if spread else "") + f"){note}"
        if abs(change) < noise.UNDECIDED_AT_PCT:  # the table's rule (noise.delta): a small change is noise
            return f"its throughput{per} is within noise of the baseline's {overlap}"
        return f"its throughput{per} against the baseline's is undecided: {noise.RERUN} {overlap}"
    how = f"costs {-change:.1f}% of throughput{per}" if change < 0 else f"is {change:.1f}% faster{per}"
    return (f"it {how} ({fmt_number(value)} vs {fmt_number(ref)} {t.unit or ''}, outside the noise){note}")


def _verdict(r: RunRecord) -> str:
    eq = r.equivalence
    if r.name == "baseline":
        return "the baseline itself"
    if eq is None:
        return "equivalence not checked"
    return f"trains the same model ({eq.verdict}" + (f", apart from {eq.apart_from}" if eq.apart_from else "") + ")"


def _why_nothing_helps(base: RunRecord, others: list[RunRecord]) -> str:
    phase = base.memory.peak_phase if base.memory else None
    if phase == "optimizer":
        return ("the baseline's peak is in the optimizer step, where parameters, gradients and optimizer state are "
                "all alive: techniques that save activations (accum, ckpt, sac) cannot lower it; opt-in-bwd (frees "
                "each gradient as it is used) or a smaller optimizer state can")
    if phase in ("forward", "backward"):
        return (f"the baseline's peak is in {PHASE_WORDS.get(phase, phase)}, held by activations and gradients; "
                "no technique measured here that trains the same model lowers it")
    return "no run that trains the same model has a lower peak"


def recommend(results: list[RunRecord], goal: Goal = Goal("lowest-peak")) -> list[str]:
    """Sentences, the first one the pick. `results` is one sweep."""
    head = f"Recommendation (goal: {goal.describe()}): "
    base = find_baseline(results)
    done = [r for r in results if r.status == "ok" and r.memory is not None]
    same = [r for r in done if _same_model(r)]
    other = [r for r in done if r not in same]
    if not done:
        return [head + "nothing to recommend: no run finished."]
    lines = []
    if base is None:
        b = next((r for r in results if r.name == "baseline"), None)
        lines.append(f"The baseline did not finish ({b.status if b else 'missing'}): its peak is partial and is no "
                     "reference, so runs are compared by their absolute numbers only.")
    if goal.kind == "fits":
        fitting = [r for r in same if (_fit_bytes(r) or 0) <= goal.budget]
        if not fitting:
            low = min(same or done, key=lambda r: _fit_bytes(r) or 0)
            return [head + f"nothing that trains the same model fits: the lowest peak is {low.name}'s "
                    f"{fmt_bytes(_fit_bytes(low))}."] + lines
        pick = max(fitting, key=lambda r: (r.timing.throughput if r.timing and r.timing.throughput else 0,
                                           -(_fit_bytes(r) or 0)))
        first = (f"pick {pick.name}: peak {fmt_bytes(_fit_bytes(pick))} fits in {fmt_bytes(goal.budget)}, "
                 f"{fmt_number(pick.timing.throughput)} {pick.timing.unit}" if pick.timing and pick.timing.throughput
                 else f"pick {pick.name}: peak {fmt_bytes(_fit_bytes(pick))} fits in {fmt_bytes(goal.budget)}")
        rivals = [r for r in fitting if r is not pick and noise.within_noise(r.timing, pick.timing)]
        if rivals:
            first += (f"; {', '.join(r.name for r in rivals)} within noise of it (the lowest peak of those: "
                      f"{min(rivals + [pick], key=lambda r: _fit_bytes(r) or 0).name})")
        lines.insert(0, head + first + f"; {_verdict(pick)}.")
        return lines
    pick = min(same, key=lambda r: (r.peak, -(r.timing.throughput if r.timing and r.timing.throughput else 0))) \
        if same else None
    small = (pick is not None and base is not None and pick.peak < base.peak
             and (base.peak - pick.peak) * 100 < goal.min_saving_pct * base.peak)
    if small:
        pick_peak, base_peak = fmt_bytes_apart(pick.peak, base.peak)
        lines.insert(0, head + f"keep the baseline: the lowest peak that trains the same model, {pick.name}'s "
                     f"{pick_peak}, saves only {fmt_bytes(base.peak - pick.peak)} "
                     f"({-pct_change(pick.peak, base.peak):.2f}% of the baseline's {base_peak}), below "
                     f"the {goal.min_saving_pct:g}% threshold (--goal lowest-peak:min-saving=PCT moves it).")
    elif pick is None or (base is not None and pick.peak >= base.peak):
        why = _why_nothing_helps(base, other) if base is not None else "no run that trains the same model finished"
        lines.insert(0, head + f"keep the baseline: nothing measured here lowers its peak of {fmt_bytes(base.peak)} "
                     f"while training the same model ({why})." if base is not None else head + why + ".")
    else:
        pick_peak, base_peak = fmt_bytes_apart(pick.peak, base.peak if base is not None else pick.peak)
        saving = (f", saving {fmt_bytes(base.peak - pick.peak)} ({pct_change(pick.peak, base.peak):+.1f}%) against "
                  f"the baseline's {base_peak}") if base is not None else ""
        lines.insert(0, head + f"pick {pick.name}: peak {pick_peak}{saving}; "
                     f"{_cost(pick, base) if base is not None else 'no reference throughput'}; {_verdict(pick)}.")
    lower = [r for r in other if pick is None or r.peak < pick.peak]
    for r in sorted(lower, key=lambda r: r.peak):
        reason = ("changes precision: not the same model" if changes_precision(r) else
                  "equivalence not checked" if r.equivalence is None else
                  f"does not train the same model ({r.equivalence.detail})")
        lines.append(f"Not recommended: {r.name} goes lower ({fmt_bytes(r.peak)}) but {reason}.")
    return lines
