"""What each technique did, computed from the numbers (never from what it is supposed to do): a `RunStory` per
run, which report/words.py puts into sentences for the terminal, report.md and report.html alike.

The reference tutorial reads its snapshots this way: which category of memory is gone at the peak and how much,
where the peak moved (forward, backward, optimizer step), what it cost in throughput, whether training is the same.
"""

from __future__ import annotations

from dataclasses import dataclass

from membench.common.vocab import CATEGORIES, Category, Phase, Status
from membench.report.noise import Speed, speed
from membench.results import Equivalence, RunRecord
from membench.results.sweep import Sweep

# A change smaller than this share of the baseline's peak is noise in a sentence (it stays in the tables).
MENTION_SHARE = 0.01


@dataclass(frozen=True)
class CategoryChange:
    """Bytes of one category at the run's peak against the baseline's at its peak."""

    category: Category
    before: int
    after: int


@dataclass(frozen=True)
class RunStory:
    """One run against the baseline. For the reference itself (or a sweep without one): its peak and largest
    categories. A run that did not finish: its status and error."""

    name: str
    status: Status
    error: str | None = None
    is_reference: bool = False
    peak: int | None = None
    phase: Phase | None = None
    largest: tuple[CategoryChange, ...] = ()  # the reference's largest categories at its peak (before = after)
    baseline_peak: int | None = None
    baseline_phase: Phase | None = None
    breakdown_known: bool = False
    less: tuple[CategoryChange, ...] = ()  # categories it holds less of at its peak, most saved first
    more: tuple[CategoryChange, ...] = ()  # and more of, most added first
    speed: Speed | None = None
    equivalence: Equivalence | None = None


def breakdown(result: RunRecord) -> dict[str, int] | None:
    """Bytes by category at the peak: the measured step's (CPU), else the recording pass's (CUDA, 512 B-rounded)."""
    if result.memory and result.memory.breakdown_at_peak:
        return result.memory.breakdown_at_peak
    return result.timeline.breakdown_at_peak if result.timeline else None


def peak_phase(result: RunRecord) -> Phase | None:
    return result.memory.peak_phase if result.memory else None


def explain(result: RunRecord, reference: RunRecord | None) -> RunStory:
    """`result` against `reference` (the sweep's baseline that finished, or None)."""
    if result.status != "ok":
        return RunStory(result.name, result.status, error=result.error)
    if reference is None or result is reference:
        parts = breakdown(result) or {}
        top = sorted(((v, c) for c, v in parts.items() if v > 0), reverse=True)[:4] if result.peak else []
        return RunStory(result.name, result.status, is_reference=True, peak=result.peak, phase=peak_phase(result),
                        largest=tuple(CategoryChange(c, v, v) for v, c in top))
    parts, base_parts = breakdown(result), breakdown(reference)
    less, more = _category_changes(parts, base_parts, reference.peak)
    return RunStory(result.name, result.status, peak=result.peak, phase=peak_phase(result),
                    baseline_peak=reference.peak, baseline_phase=peak_phase(reference),
                    breakdown_known=bool(parts and base_parts and reference.peak), less=less, more=more,
                    speed=speed(result) if result.timing is not None else None, equivalence=result.equivalence)


def _category_changes(parts: dict | None, base_parts: dict | None, base_peak: int | None
                      ) -> tuple[tuple[CategoryChange, ...], tuple[CategoryChange, ...]]:
    """(categories held less of, more of) at the peaks, each beyond MENTION_SHARE of the baseline's peak."""
    if not parts or not base_parts or not base_peak:
        return (), ()
    changes = [CategoryChange(c, base_parts.get(c, 0), parts.get(c, 0)) for c in CATEGORIES]
    threshold = MENTION_SHARE * base_peak
    less = sorted((c for c in changes if c.after - c.before < -threshold), key=lambda c: c.after - c.before)
    more = sorted((c for c in changes if c.after - c.before > threshold), key=lambda c: c.before - c.after)
    return tuple(less), tuple(more)


def explain_all(sweep: Sweep) -> dict[str, RunStory]:
    return {r.name: explain(r, sweep.reference) for r in sweep.runs}
