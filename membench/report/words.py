"""The report's English: sentences from the decisions (report/recommend.py), the run stories (report/explain.py)
and the speed verdicts (report/noise.py). The terminal, report.md and report.html print these same lines; the
table prints `speed_cell`, which gives the same percentage as the sentences.
"""

from __future__ import annotations

from collections.abc import Callable

from membench.common.units import fmt_bytes, fmt_bytes_apart, pct_change
from membench.report.explain import CategoryChange, RunStory
from membench.report.noise import RERUN, Speed
from membench.report.recommend import Candidate, Excluded, Recommendation
from membench.results import Equivalence
from membench.results.choice import changes_phrase, cost_phrase

CATEGORY_WORDS = {"parameters": "parameters", "gradients": "gradients", "optimizer_state": "optimizer state",
                  "activations": "activations", "recomputed_activations": "recomputed activations",
                  "temporaries": "temporaries", "inputs": "inputs", "other": "other tensors"}
PHASE_WORDS = {"setup": "setup (between steps)", "inputs": "input copy", "forward": "forward",
               "backward": "backward", "optimizer": "optimizer step"}


def phase(name: str | None) -> str:
    return PHASE_WORDS.get(name, name or "unknown")


# --- speed -------------------------------------------------------------------------------------------------------

def _apart(s: Speed) -> str:
    return f"{s.change_pct:+.1f}% [{s.low_pct:+.1f}, {s.high_pct:+.1f}]"


_CELL: dict[str, Callable[[Speed], str]] = {
    "reference": lambda s: "reference",
    "faster": _apart,
    "slower": _apart,
    "within-noise": lambda s: f"within noise ({s.change_pct:+.1f}%)",
    "undecided": lambda s: f"undecided ({s.change_pct:+.1f}%)",
    "not-compared": lambda s: "-",
    "not-enough": lambda s: "not enough steps",
}


def speed_cell(s: Speed) -> str:
    """The table's "speed vs base" cell: '-11.8% [-14.0, -9.9]' (the interval, where it excludes no change),
    'within noise (+2.1%)', 'undecided (-50.0%)', or '-' where not compared."""
    return _CELL[s.verdict](s)


def _interval(s: Speed) -> str:
    return (f"timed in alternation with the baseline in its process: {s.low_pct:+.1f}% to {s.high_pct:+.1f}%, "
            f"{s.level:.0%} confidence over {s.pairs} pairs")


_SPEED: dict[str, Callable[[Speed], str]] = {
    "reference": lambda s: "it is the baseline",
    "faster": lambda s: f"it is {s.change_pct:.1f}% faster ({_interval(s)})",
    "slower": lambda s: f"it costs {-s.change_pct:.1f}% of throughput ({_interval(s)})",
    "within-noise": lambda s: f"its throughput is within noise of the baseline's ({s.change_pct:+.1f}%; "
                              f"{_interval(s)})",
    "undecided": lambda s: f"its throughput against the baseline's is undecided: {RERUN} ({s.change_pct:+.1f}%; "
                           f"{_interval(s)})",
    "not-compared": lambda s: f"its speed was not compared with the baseline's ({s.why_not})",
    "not-enough": lambda s: s.why_not,
}


def speed_phrase(s: Speed) -> str:
    return _SPEED[s.verdict](s)


# --- what each run did -------------------------------------------------------------------------------------------

def _peak_line(story: RunStory) -> str:
    before, after = story.baseline_peak, story.peak
    if before == after:
        return f"{story.name} leaves the peak unchanged at {fmt_bytes(after)} (to the byte)."
    verb, what = ("lowers", "saved") if after < before else ("raises", "more")
    a, b = fmt_bytes_apart(before, after)
    return (f"{story.name} {verb} the peak from {a} to {b} ({pct_change(after, before):+.1f}%, "
            f"{fmt_bytes(abs(after - before))} {what}).")


def _less(c: CategoryChange) -> str:
    a, b = fmt_bytes_apart(c.before, c.after)
    return f"{CATEGORY_WORDS[c.category]} ({a} to {b}, -{fmt_bytes(c.before - c.after)})"


def _category_lines(story: RunStory) -> list[str]:
    if not story.breakdown_known:
        return ["No breakdown by category for this run (no timeline recorded)."]
    lines = []
    if story.less:
        lines.append("At its peak it holds less " + ", less ".join(_less(c) for c in story.less)
                     + " than the baseline at its peak.")
    if story.more:
        more = (f"{CATEGORY_WORDS[c.category]} (+{fmt_bytes(c.after - c.before)})" for c in story.more)
        lines.append("It holds more " + ", more ".join(more) + ".")
    return lines or ["The peak's make-up by category is the same as the baseline's (within 1% of its peak)."]


def _phase_line(story: RunStory) -> list[str]:
    if not story.phase or not story.baseline_phase:
        return []
    if story.phase == story.baseline_phase:
        return [f"The peak stays in the {phase(story.phase)} phase."]
    return [f"The peak moves from the {phase(story.baseline_phase)} phase to the {phase(story.phase)} phase."]


_VERDICT_WORDS = {"bitwise": "It trains bit for bit the same model as the baseline",
                  "equivalent": "It trains the same model as the baseline up to floating-point rounding",
                  "not-equivalent": "It does NOT train the same model as the baseline",
                  "precision": "It changes the numerics on purpose",
                  "failed": "Its equivalence check did not finish"}


def equivalence_line(eq: Equivalence | None) -> str:
    if eq is None:
        return "Numerical equivalence was not checked."
    words = _VERDICT_WORDS.get(eq.verdict, f"Equivalence: {eq.verdict}")
    if eq.apart_from:
        words = f"It trains the same model as the baseline, apart from {eq.apart_from}"
    return f"{words}{': ' + eq.detail if eq.detail else ''}."


def story_lines(story: RunStory) -> list[str]:
    """Sentences about one run."""
    if story.status != "ok":
        return [f"{story.name} did not finish ({story.status}): {story.error or 'no detail'}."]
    if story.is_reference:
        lines = [f"The peak is {fmt_bytes(story.peak)}, in the {phase(story.phase)} phase."]
        if story.largest:
            lines.append("At the peak: " + ", ".join(f"{CATEGORY_WORDS[c.category]} {fmt_bytes(c.after)}"
                                                     for c in story.largest) + ".")
        return lines
    lines = [_peak_line(story)] if story.peak and story.baseline_peak else []
    lines += _category_lines(story) + _phase_line(story)
    if story.speed is not None:
        said = speed_phrase(story.speed)
        lines.append(said[0].upper() + said[1:] + ".")
    return lines + [equivalence_line(story.equivalence)]


# --- the recommendation ------------------------------------------------------------------------------------------

def _verdict(c: Candidate) -> str:
    if c.verdict == "baseline":
        return "the baseline itself"
    if c.verdict.startswith("not checked"):
        return f"equivalence {c.verdict}"
    return f"trains the same model ({c.verdict}" + (f", apart from {c.apart_from}" if c.apart_from else "") + ")"


def _card_pick(rec: Recommendation) -> str:
    c = rec.pick
    said = changes_phrase(c.numerics)
    return (f"pick {c.name}: the cheapest listed that fits the {rec.card} ({cost_phrase(c.cost)}"
            f"{'; ' + said if said else ''}), predicted peak reserved {fmt_bytes(c.peak)} on the card; the baseline "
            "does not fit.")


def _pick(rec: Recommendation) -> str:
    c = rec.pick
    if rec.card is not None:
        return _card_pick(rec)
    if rec.goal.kind == "fits":
        return _fits_pick(rec)
    if rec.baseline_peak is None:
        return f"pick {c.name}: peak {fmt_bytes(c.peak)}; no reference to compare with; {_verdict(c)}."
    pick_peak, base_peak = fmt_bytes_apart(c.peak, rec.baseline_peak)
    speed = "" if rec.predicted else f"; {speed_phrase(c.speed)}"
    return (f"pick {c.name}: peak {pick_peak}, saving {fmt_bytes(rec.baseline_peak - c.peak)} "
            f"({pct_change(c.peak, rec.baseline_peak):+.1f}%) against the baseline's {base_peak}{speed}; "
            f"{_verdict(c)}.")


_FITS_BY = {
    "only": lambda rec: "the only run that trains the same model and fits",
    "fastest": lambda rec: "faster than every other run that fits, beyond their interleaved intervals",
    "lowest-peak": lambda rec: ("the lowest peak of the runs that fit; "
                                + (f"the interleaved timing does not tell {', '.join(rec.rivals)} apart from it "
                                   "in speed" if rec.rivals else "the others are slower beyond their intervals")),
}


def _fits_pick(rec: Recommendation) -> str:
    c = rec.pick
    speed = "" if rec.predicted or c.verdict == "baseline" else f"; {speed_phrase(c.speed)}"
    return (f"pick {c.name}: peak {fmt_bytes(c.peak)} fits in {fmt_bytes(rec.goal.budget)}, "
            f"{_FITS_BY[rec.fits_by](rec)}{speed}; {_verdict(c)}.")


_WHY_NOTHING_HELPS = {
    "optimizer": ("the baseline's peak is in the optimizer step, where parameters, gradients and optimizer state "
                  "are all alive: techniques that save activations (accum, ckpt, sac) cannot lower it; opt-in-bwd "
                  "(frees each gradient as it is used) or a smaller optimizer state can"),
    "forward": ("the baseline's peak is in forward, held by activations and gradients; no technique measured "
                "here that trains the same model lowers it"),
    "backward": ("the baseline's peak is in backward, held by activations and gradients; no technique measured "
                 "here that trains the same model lowers it"),
}


def _below_threshold(rec: Recommendation) -> str:
    c = rec.pick
    pick_peak, base_peak = fmt_bytes_apart(c.peak, rec.baseline_peak)
    return (f"keep the baseline: the lowest peak that trains the same model, {c.name}'s {pick_peak}, saves only "
            f"{fmt_bytes(rec.baseline_peak - c.peak)} ({-pct_change(c.peak, rec.baseline_peak):.2f}% of the "
            f"baseline's {base_peak}), below the {rec.goal.min_saving_pct:g}% threshold "
            "(--goal lowest-peak:min-saving=PCT moves it).")


def _nothing_lower(rec: Recommendation) -> str:
    why = _WHY_NOTHING_HELPS.get(rec.baseline_phase, "no run that trains the same model has a lower peak")
    return (f"keep the baseline: nothing {'predicted' if rec.predicted else 'measured'} here lowers its peak of "
            f"{fmt_bytes(rec.baseline_peak)} while training the same model ({why}).")


_FIRST: dict[str, Callable[[Recommendation], str]] = {
    "pick": _pick,
    "below-threshold": _below_threshold,
    "nothing-lower": _nothing_lower,
    "no-same-model": lambda rec: "no run that trains the same model finished.",
    "nothing-finished": lambda rec: "nothing to recommend: no run finished.",
    "nothing-fits": lambda rec: (f"nothing that trains the same model fits: the lowest peak is {rec.pick.name}'s "
                                 f"{fmt_bytes(rec.pick.peak)}."),
    "baseline-without-memory": lambda rec: ("nothing to recommend: the baseline's result says ok but holds no "
                                            "memory (a damaged or edited file); run it again."),
    "fits-card": lambda rec: (f"keep the baseline: it fits the {rec.card} (predicted peak reserved "
                              f"{fmt_bytes(rec.pick.peak)} on the card)."),
    "nothing-fits-card": lambda rec: (f"nothing listed fits the {rec.card}: the lowest, {rec.pick.name}, reserves "
                                      f"{fmt_bytes(rec.pick.peak)} unbounded."),
}

_EXCLUDED = {
    "changes-precision": lambda e: "changes precision: not the same model",
    "not-checked": lambda e: "equivalence not checked",
    "not-equivalent": lambda e: f"does not train the same model ({e.detail})",
    "check-failed": lambda e: f"its equivalence check did not finish ({e.detail})",
}


def _excluded_line(e: Excluded) -> str:
    return f"Not recommended: {e.name} goes lower ({fmt_bytes(e.peak)}) but {_EXCLUDED[e.why](e)}."


def recommendation_lines(rec: Recommendation) -> list[str]:
    """Sentences, the first one the decision."""
    goal = (f"fits the {rec.card} it was predicted for, at the least step-time cost" if rec.card is not None
            else rec.goal.describe())
    lines = [f"Recommendation (goal: {goal}): " + _FIRST[rec.outcome](rec)]
    if rec.baseline_status is not None and rec.outcome != "nothing-finished":
        lines.append(f"The baseline did not finish ({rec.baseline_status}): its peak is partial and is no "
                     "reference, so runs are compared by their absolute numbers only.")
    return lines + [_excluded_line(e) for e in rec.excluded]
