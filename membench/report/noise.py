"""How sure a timing is, and what a comparison of speeds may claim.

A run's median step time comes with a confidence interval (order statistics, trackers/timing.py); `±` is its
half-width. A run's speed against the baseline is claimed only from the interleaved timing (`Timing.vs_baseline`:
both timed step for step in alternation in the run's own process): runs timed one after another see the
machine's load change between them, which no interval of either run covers. A run without that timing gets no
speed claim at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from membench.common.units import pct_change
from membench.results import RunRecord, Timing

# A change this large (in %) whose interval still holds no change is not "no difference": the measurement was too
# noisy to decide either way, and says so.
UNDECIDED_AT_PCT = 10.0
RERUN = "rerun with --min-time"

SpeedVerdict = Literal["reference", "faster", "slower", "within-noise", "undecided", "not-compared", "not-enough"]
# The fewest interleaved pairs whose interval (their smallest to largest ratio) holds the median ratio with 95%
# confidence or more: 6 (96.9%; membench.spec.MIN_COMPARE_PAIRS, what a run takes). Fewer, as in a record written
# by hand or by an older membench, give no interval and no percentage.
MIN_PAIRS = 6


@dataclass(frozen=True)
class Speed:
    """A run's throughput against the baseline's, as far as the interleaved timing supports it.

    change_pct: the throughput change (from the median of the pairs' step-time ratios); [low_pct, high_pct] its
    interval at confidence `level` over `pairs` pairs. faster / slower: the whole interval is above / below no
    change; within-noise: it holds no change; undecided: it holds no change, yet the median moved by
    UNDECIDED_AT_PCT or more. not-compared: no interleaved timing (`why_not` says why; a run of one timed step
    is not timed against the baseline). not-enough: fewer pairs than an interval needs (MIN_PAIRS): no
    percentage is claimed. reference: the baseline.
    """

    verdict: SpeedVerdict
    change_pct: float | None = None
    low_pct: float | None = None
    high_pct: float | None = None
    level: float | None = None
    pairs: int | None = None
    why_not: str | None = None

    @property
    def interval(self) -> tuple[float, float] | None:
        """(low, high) throughput change in %, where interleaved; the baseline's own is (0, 0)."""
        return None if self.low_pct is None or self.high_pct is None else (self.low_pct, self.high_pct)


REFERENCE = Speed("reference", 0.0, 0.0, 0.0)


def speed(run: RunRecord) -> Speed:
    """What may be said of `run`'s speed against its sweep's baseline."""
    if run.is_baseline:
        return REFERENCE
    t = run.timing
    if t is None:
        return Speed("not-compared", why_not="a prediction has no timing" if run.predicted else "no timing")
    iv = t.vs_baseline
    if iv is None:
        return Speed("not-compared", why_not=t.not_interleaved or "recorded before membench timed a run against "
                                                                  "the baseline in its own process")
    if iv.pairs < MIN_PAIRS:
        return Speed("not-enough", pairs=iv.pairs, why_not=f"not enough steps to compare speed ({iv.pairs} pairs)")
    # A step-time ratio r is a throughput change of 1/r - 1: a slower step (r above 1) is a lower throughput.
    change, low, high = ((1 / r - 1) * 100 for r in (iv.ratio, iv.ratio_high, iv.ratio_low))
    verdict: SpeedVerdict = ("faster" if iv.ratio_high < 1 else "slower" if iv.ratio_low > 1
                             else "undecided" if abs(change) >= UNDECIDED_AT_PCT else "within-noise")
    return Speed(verdict, change, low, high, iv.level, iv.pairs)


def beats(a: Speed, b: Speed) -> bool:
    """Whether `a` is faster than `b` beyond both intervals (each against the same baseline)."""
    ia, ib = a.interval, b.interval
    return ia is not None and ib is not None and ia[0] > ib[1]


def step_interval(timing: Timing | None) -> tuple[float, float] | None:
    """The median step time's interval (low, high) in seconds; None where the result has none (recorded before
    intervals were, one step), only half of one, or one upside down (a hand-edited file): every use below asks
    here."""
    if timing is None or timing.ci_low_s is None or timing.ci_high_s is None:
        return None
    low, high = timing.ci_low_s, timing.ci_high_s
    if not (math.isfinite(low) and math.isfinite(high) and 0 <= low <= high):  # a crafted file: no interval at all
        return None
    return low, high


def spread(timing: Timing | None) -> float | None:
    """The interval's half-width as a share of the median (the '±' of a step time); None without an interval."""
    ci = step_interval(timing)
    if ci is None or not timing.median_s:
        return None
    return (ci[1] - ci[0]) / 2 / timing.median_s


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
    ci = step_interval(timing)
    if ci is None or not timing.throughput or not ci[0] or not ci[1]:
        return None
    per_step = timing.throughput * timing.median_s  # items per step
    return per_step / ci[1], per_step / ci[0]


def overlap(a: Timing | None, b: Timing | None) -> bool | None:
    """Whether two runs' median step times are within noise of each other (their intervals overlap). None when
    either has no interval (older results)."""
    ia, ib = step_interval(a), step_interval(b)
    if ia is None or ib is None:
        return None
    return ia[0] <= ib[1] and ib[0] <= ia[1]


def separate_runs_delta(timing: Timing | None, reference: Timing | None) -> str:
    """The change in throughput between runs timed apart (`membench compare`: before and after a change):
    '+7.7%' only where the intervals are apart, else 'within noise (+7.7%)' or, for a large change inside wide
    intervals, 'undecided (-50.8%)'. Load that changed between them is not in either interval: read it as such."""
    if timing is None or reference is None or not timing.throughput or not reference.throughput:
        return "-"
    change = pct_change(timing.throughput, reference.throughput)
    if overlap(timing, reference) is False:
        return f"{change:+.1f}%"
    return f"{'undecided' if abs(change) >= UNDECIDED_AT_PCT else 'within noise'} ({change:+.1f}%)"
