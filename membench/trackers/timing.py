"""Step timing and FLOP counting. The caller synchronises before reading a clock (train_step returns a .item())."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from torch.utils.flop_counter import FlopCounterMode

from membench.results import Interleaved, Timing
from membench.spec import MIN_COMPARE_PAIRS
from membench.spec.gpu import of_device

# A timed run goes on past its --steps to fill --min-time, but never past this many times --steps.
MAX_STEPS_FACTOR = 20
CI_LEVEL = 0.95
# torch.utils.benchmark's rule of thumb: spread over 10% of the median means a noisy measurement.
NOISY_SPREAD = 0.10


def time_steps(step: Callable, indices, min_time_s: float = 0.0, prepare: Callable | None = None,
               on_step: Callable[[int], None] | None = None) -> tuple[list[float], list[float]]:
    """Run step(i) for each i (step(prepare(i)) when prepare is given: the input is made before the clock
    starts, so making a batch is not timed); then, while less than min_time_s was timed, more steps (up to
    MAX_STEPS_FACTOR x as many). Returns (seconds per step, losses). on_step(k) is called before the k-th step
    (1-based), outside the timed interval."""
    times, losses = [], []

    def timed(i: int) -> None:
        if on_step:
            on_step(len(times) + 1)
        arg = prepare(i) if prepare is not None else i
        start = time.perf_counter()
        losses.append(step(arg))
        times.append(time.perf_counter() - start)

    last = None
    for last in indices:
        timed(last)
    if min_time_s > 0 and times:
        cap = len(times) * MAX_STEPS_FACTOR
        while sum(times) < min_time_s and len(times) < cap:
            last += 1
            timed(last)
    return times, losses


def median_ci(values: list[float], level: float = CI_LEVEL) -> tuple[float, float, float]:
    """A distribution-free confidence interval for the median: (low, high, its confidence).

    Order statistics: the k-th smallest and k-th largest of n values bracket the true median with probability
    1 - 2 P(B < k), B ~ Binomial(n, 1/2), whatever the distribution of step times (they are skewed: a step is
    slowed by other work, never sped up). The narrowest such interval with at least `level` confidence; with
    fewer than 6 values none reaches 95%, and the widest (min to max) is returned with its own, lower, confidence.
    """
    xs = sorted(values)
    n = len(xs)
    if n == 1:
        return xs[0], xs[0], 0.0
    best = (xs[0], xs[-1], 1 - 2 * 0.5**n)
    for k in range(1, n // 2):
        coverage = 1 - 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n
        if coverage < level:
            break
        best = (xs[k], xs[n - 1 - k], coverage)
    return best


def summarize(times: list[float]) -> Timing:
    q = statistics.quantiles(times, n=4) if len(times) >= 2 else [times[0]] * 3
    median = statistics.median(times)
    iqr = q[2] - q[0]
    # One step has no spread to speak of: no interval (a difference against it cannot be told from noise).
    low, high, level = median_ci(times) if len(times) > 1 else (None, None, None)
    return Timing(step_times_s=list(times), median_s=median, iqr_s=iqr, min_s=min(times), max_s=max(times),
                  noisy=median > 0 and (iqr / median > NOISY_SPREAD or
                                        (low is not None and (high - low) / 2 / median > NOISY_SPREAD)),
                  ci_low_s=low, ci_high_s=high, ci_level=level)


# The fewest pairs whose interval (their smallest to largest ratio) holds the median with 95% confidence or more
# (6: 96.9%); a run timed against the baseline takes at least this many pairs, whatever its --steps.
MIN_PAIRS = MIN_COMPARE_PAIRS


@dataclass(frozen=True)
class Stepper:
    """One side of an interleaved timing: `prepare()` makes a step's input outside the clock, `step(input)` is
    timed."""

    prepare: Callable[[], object]
    step: Callable[[object], object]

    def timed(self) -> float:
        arg = self.prepare()
        start = time.perf_counter()
        self.step(arg)
        return time.perf_counter() - start


def interleave(run: Stepper, reference: Stepper, pairs: int, min_time_s: float = 0.0,
               on_pair: Callable[[int], None] | None = None) -> tuple[list[float], list[float]]:
    """Time `run` and `reference` one step each in turn, `pairs` times (then, while less than min_time_s was
    timed on the run's side, more pairs, up to MAX_STEPS_FACTOR x as many). The order alternates from pair to pair
    (run first, then reference first: ABBA), so a load that grows or shrinks steadily favours neither side.
    Returns (the run's step times, the reference's), pair by pair. on_pair(k) is called before the k-th pair."""
    run_times: list[float] = []
    reference_times: list[float] = []
    cap = pairs * MAX_STEPS_FACTOR
    while len(run_times) < pairs or (sum(run_times) < min_time_s and len(run_times) < cap):
        if on_pair:
            on_pair(len(run_times) + 1)
        if len(run_times) % 2 == 0:
            run_times.append(run.timed())
            reference_times.append(reference.timed())
        else:
            reference_times.append(reference.timed())
            run_times.append(run.timed())
    return run_times, reference_times


def compare(run_times: list[float], reference_times: list[float]) -> Interleaved:
    """The run against the reference from interleaved pairs: each pair's ratio (the same moment's load on both
    sides), their median and its order-statistics interval."""
    ratios = [r / b for r, b in zip(run_times, reference_times)]
    low, high, level = median_ci(ratios)
    return Interleaved(pairs=len(ratios), ratio=statistics.median(ratios), ratio_low=low, ratio_high=high,
                       level=level, run_median_s=statistics.median(run_times),
                       baseline_median_s=statistics.median(reference_times))


def count_flops(step: Callable[[], object]) -> tuple[int | None, str | None]:
    """The step's FLOPs by torch's FLOP counter, or None and why where the counter cannot count one of its ops.
    The step has run already (the timed steps), so what raises here is the counter's: torch 2.11's formula for
    attention asserts that query and key have as many heads, and grouped-query attention through cuDNN does not
    (a Llama shape on an H200 ended its run "during time" so). Memory and time measured stand."""
    try:
        with FlopCounterMode(display=False) as counter:
            step()
    except Exception as exc:  # noqa: BLE001 - the counter's failure is no failure of the run
        return None, f"torch's FLOP counter raised {type(exc).__name__}: {str(exc)[:200]}"
    return int(counter.get_total_flops()), None


def peak_flops(device_name: str, dtype: str) -> float | None:
    """The dense peak FLOP/s of the device torch names so ("NVIDIA H100 80GB HBM3") for a compute dtype: the GPU
    table's figure (membench/spec/gpu.py, matched by its one rule), None where the table has none."""
    card = of_device(device_name)
    return card.peak(dtype) if card is not None else None
