"""How sure a timing is, in words and numbers, for tables, sentences and charts.

A run's median step time comes with a confidence interval (order statistics, trackers/timing.py). Two runs whose
intervals overlap are *within noise* of each other: their difference in throughput is not shown as a fact.
"""

from __future__ import annotations

from membench.common.units import pct_change
from membench.results import Timing


def overlap(a: Timing | None, b: Timing | None) -> bool | None:
    """Whether two runs' median step times are within noise of each other (their intervals overlap). None when
    either has no interval (older results)."""
    if a is None or b is None or a.ci_low_s is None or b.ci_low_s is None:
        return None
    return a.ci_low_s <= b.ci_high_s and b.ci_low_s <= a.ci_high_s


def spread(timing: Timing | None) -> float | None:
    """Half the interval's width as a share of the median (the '±' of a step time); None without an interval."""
    if timing is None or timing.ci_low_s is None or timing.ci_high_s is None or not timing.median_s:
        return None
    return max(timing.median_s - timing.ci_low_s, timing.ci_high_s - timing.median_s) / timing.median_s


def step_ms(timing: Timing | None) -> str:
    """'351.0 ±3.2%'; the median alone for results recorded before intervals were."""
    if timing is None:
        return "-"
    s = spread(timing)
    if s is None and len(timing.step_times_s) == 1:
        return f"{timing.median_s * 1e3:.1f} (1 step)"
    return f"{timing.median_s * 1e3:.1f}" + (f" ±{s:.1%}" if s is not None else "")


def throughput_interval(timing: Timing) -> tuple[float, float] | None:
    """The throughput's interval, from the step time's (a slower step is a lower throughput)."""
    if timing.ci_low_s is None or not timing.throughput or not timing.ci_low_s:
        return None
    per_step = timing.throughput * timing.median_s  # items per step
    return per_step / timing.ci_high_s, per_step / timing.ci_low_s


def within_noise(timing: Timing | None, reference: Timing | None) -> bool:
    """True when the two runs' intervals overlap, or when there is no interval to tell (older results, a
    single step): a difference that cannot be told from noise is treated as noise."""
    same = overlap(timing, reference)
    return True if same is None else same


# A change this large (in %) whose intervals still overlap is not "no difference": the measurement was too noisy
# to decide either way, and says so.
UNDECIDED_AT_PCT = 10.0
RERUN = "rerun with --min-time"


def undecided(timing: Timing | None, reference: Timing | None) -> bool:
    """Within noise, yet the medians differ by UNDECIDED_AT_PCT or more: too noisy to tell."""
    if timing is None or reference is None or not timing.throughput or not reference.throughput:
        return False
    change = pct_change(timing.throughput, reference.throughput)
    return within_noise(timing, reference) and abs(change) >= UNDECIDED_AT_PCT


def delta(timing: Timing | None, reference: Timing | None) -> str:
    """The change in throughput against the reference: '+7.7%', 'within noise (+7.7%)', or, for a large change
    inside wide intervals, 'undecided (-50.8%): rerun with --min-time'."""
    if timing is None or reference is None or not timing.throughput or not reference.throughput:
        return "-"
    change = f"{pct_change(timing.throughput, reference.throughput):+.1f}%"
    if timing is reference:
        return change
    if undecided(timing, reference):
        return f"undecided ({change}): {RERUN}"
    return f"within noise ({change})" if within_noise(timing, reference) else change
