"""How sure a timing is, what a failed baseline may not be used for, and the recommendation: from the numbers.

The results are real tiny runs (tests/sweeps.py) with their timing or memory varied by hand, so each rule is
tested on a known case; no test asserts how fast anything runs.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest

from membench.cli import main
from membench.report import charts, explain, noise
from membench.report.live import SweepProgress
from membench.report.recommend import Goal, parse_goal, recommend
from membench.report.table import render, rows
from membench.results import Equivalence, RunRecord, load_dir
from membench.trackers import timing
from tests.helpers import spec
from tests.sweeps import tiny_sweep


def _timed(record: RunRecord, median: float, low: float, high: float) -> RunRecord:
    """The record with a step time of `median` s and that interval (throughput follows the median)."""
    r = copy.deepcopy(record)
    items_per_step = r.timing.throughput * r.timing.median_s
    r.timing = dataclasses.replace(r.timing, median_s=median, ci_low_s=low, ci_high_s=high, ci_level=0.95,
                                   throughput=items_per_step / median)
    return r


@pytest.fixture()
def sweep(tmp_path):
    results = {r.name: r for r in load_dir(tiny_sweep(tmp_path))}
    return results["baseline"], results["opt-in-bwd"]


# --- timing: an interval, calibration, within noise ------------------------------------------------------------
def test_median_interval_from_order_statistics():
    low, high, level = timing.median_ci([5.0, 1.0, 4.0, 2.0, 3.0])
    assert (low, high) == (1.0, 5.0) and level == pytest.approx(1 - 2 / 32)  # 5 values: min to max, 93.75%
    values = [float(i) for i in range(20)]
    low, high, level = timing.median_ci(values)
    assert level >= 0.95 and 0 < low < 9.5 < high < 19  # narrower than min..max once there are enough steps
    summary = timing.summarize(values)
    assert (summary.ci_low_s, summary.ci_high_s, summary.ci_level) == (low, high, level)
    one = timing.summarize([0.25])  # one step: no interval, and its time is not shown as exact
    assert one.ci_low_s is None and noise.step_ms(one) == "250.0 (1 step)"


def test_timing_is_calibrated_to_a_time_budget_within_a_cap():
    calls = []
    times, losses = timing.time_steps(lambda i: calls.append(i) or 0.0, range(3))
    assert len(times) == 3 == len(losses)
    times, _ = timing.time_steps(lambda i: 0.0, range(3), min_time_s=3600)  # never reached: stops at the cap
    assert len(times) == 3 * timing.MAX_STEPS_FACTOR


def test_a_difference_inside_the_noise_is_not_printed_as_fact(sweep):
    base, run = sweep
    base = _timed(base, 0.100, 0.090, 0.110)
    overlapping = _timed(run, 0.095, 0.085, 0.105)  # 5% faster, intervals overlap
    apart = _timed(run, 0.050, 0.048, 0.052)  # twice as fast, intervals apart
    assert noise.delta(overlapping.timing, base.timing).startswith("within noise (+")
    assert noise.delta(apart.timing, base.timing) == "+100.0%"
    head, body = rows([base, overlapping])
    assert head[7] == "step ms ±CI" and body[0][7] == "100.0 ±10.0%"
    assert body[1][9].startswith("within noise")
    text = " ".join(explain.explain(overlapping, base))
    assert "within noise" in text and "faster" not in text
    # A 5% change inside the noise reads as the table reads it, not as "undecided" (kept for 10% and more).
    assert "undecided" not in text
    first = recommend([base, overlapping])[0]
    assert "its throughput is within noise of the baseline's (+5.3%" in first and "undecided" not in first
    assert "outside the noise" in " ".join(explain.explain(apart, base))


def test_the_progress_line_shows_the_noise(sweep, capsys):
    base, _ = sweep
    base = _timed(base, 0.100, 0.080, 0.130)
    base.timing.noisy = True
    progress = SweepProgress([spec("vit-tiny", batch_size=1)], "out")
    progress.done(base.spec, base, skipped=False)
    err = capsys.readouterr().err
    assert "±30.0%" in err and "noisy timing" in err


def test_pareto_chart_has_error_bars_and_marks_precision(sweep):
    base, run = sweep
    base = _timed(base, 0.100, 0.090, 0.110)
    amp = _timed(run, 0.050, 0.045, 0.055)
    amp.name = "amp-bf16"
    amp.equivalence = Equivalence(verdict="precision", mode="precision", detail="changes numerics on purpose")
    fig = charts.pareto_chart([base, amp])
    ax = fig.axes[0]
    assert len(ax.containers) == 2  # one error bar per run
    labels = [t.get_text() for t in ax.texts]
    assert "amp-bf16 (precision)" in labels and "baseline" in labels
    assert "changes precision (not the same model)" in [t.get_text() for t in ax.get_legend().get_texts()]


# --- a failed baseline is no reference --------------------------------------------------------------------------
def test_an_oom_baseline_is_not_the_reference(sweep):
    base, run = sweep
    oom = copy.deepcopy(base)
    oom.status, oom.error = "oom", "out of memory during measure"
    oom.memory.peak_allocated_bytes = run.peak + 1000  # partial: stopped where the budget ran out
    head, body = rows([oom, run])
    assert body[1][4] == "-" and body[1][9] == "-"  # no "vs base" against a partial peak
    text = render([oom, run])
    assert "baseline did not finish (oom)" in text and "absolute numbers only" in text
    assert not any("lowers the peak" in s for s in explain.explain(run, explain.find_baseline([oom, run])))
    advice = recommend([oom, run])
    assert any("did not finish (oom)" in s for s in advice)


# --- the recommendation -----------------------------------------------------------------------------------------
def test_recommends_the_lowest_peak_that_trains_the_same_model(sweep):
    base, run = sweep  # vit-tiny at batch 1: opt-in-bwd lowers a peak that is in the optimizer step, bitwise
    advice = recommend([base, run])
    first = advice[0]
    assert first.startswith("Recommendation (goal: the lowest peak that trains the same model, saving at least 5% "
                            "of the baseline's peak): pick opt-in-bwd")
    assert "saving" in first and "bitwise" in first and ("undecided" in first or "outside the noise" in first)


def test_a_saving_below_the_threshold_keeps_the_baseline(sweep):
    base, run = sweep
    small = copy.deepcopy(run)
    # 4.99% of the baseline's peak below it: under the default 5% threshold, by a byte count worked out here
    small.memory.peak_allocated_bytes = base.peak - (base.peak * 499) // 10000
    first = recommend([base, small])[0]
    assert "keep the baseline" in first and "below the 5% threshold" in first and "min-saving=PCT" in first
    assert "pick opt-in-bwd" in recommend([base, small], parse_goal("lowest-peak:min-saving=4"))[0]
    assert "pick opt-in-bwd" in recommend([base, small], parse_goal("lowest-peak:min-saving=0"))[0]
    assert main(["report", "--no-files", "--goal", "lowest-peak:min-saving=x", "x"]) == 2
    assert main(["report", "--no-files", "--goal", "lowest-peak:min-saving=100", "x"]) == 2


def test_a_noisy_timing_is_undecided_and_a_clear_one_is_in_readable_numbers(sweep):
    base, run = sweep
    base = _timed(base, 0.100, 0.050, 0.200)
    noisy = _timed(run, 0.050, 0.020, 0.150)  # 2x faster, but the intervals overlap
    first = recommend([base, noisy])[0]
    assert "undecided: rerun with --min-time" in first and "faster" not in first
    assert any("undecided: rerun with --min-time" in s for s in explain.explain(noisy, base))
    clear = _timed(run, 0.050, 0.049, 0.051)
    base_tight = _timed(base, 0.100, 0.099, 0.101)
    clear.timing.throughput, base_tight.timing.throughput = 29_800.0, 14_900.0
    first = recommend([base_tight, clear])[0]
    assert "is 100.0% faster (29,800 vs 14,900 " in first


def test_more_ranks_are_not_a_techniques_speedup(sweep):
    base, run = sweep
    base = _timed(base, 0.100, 0.099, 0.101)
    fsdp = _timed(run, 0.200, 0.199, 0.201)
    base.timing.throughput, fsdp.timing.throughput = 1000.0, 1600.0  # 1.6x in all from two ranks: 800 a rank
    fsdp.world_size = 2
    first = recommend([base, fsdp])[0]
    assert "faster" not in first and "costs 20.0% of throughput per rank (800 vs 1,000 " in first
    assert "2 ranks against the baseline's 1, compared per rank" in first


def test_when_nothing_helps_it_says_why(sweep):
    base, run = sweep
    ckpt = copy.deepcopy(base)
    ckpt.name, ckpt.equivalence = "ckpt", Equivalence(verdict="bitwise")
    assert base.memory.peak_phase == "optimizer"
    first = recommend([base, ckpt])[0]
    assert "keep the baseline" in first and "optimizer step" in first and "activations" in first


def test_precision_and_unverified_runs_are_never_recommended_as_the_same_model(sweep):
    base, run = sweep
    amp = copy.deepcopy(run)
    amp.name = "amp-bf16"
    amp.memory.peak_allocated_bytes = run.peak // 2
    amp.equivalence = Equivalence(verdict="precision", mode="precision", detail="changes numerics on purpose")
    unchecked = copy.deepcopy(run)
    unchecked.name, unchecked.equivalence = "sac", None
    unchecked.memory.peak_allocated_bytes = run.peak // 3
    advice = recommend([base, run, amp, unchecked])
    assert "pick opt-in-bwd" in advice[0]
    assert any(s.startswith("Not recommended: amp-bf16") and "changes precision" in s for s in advice)
    assert any(s.startswith("Not recommended: sac") and "not checked" in s for s in advice)


def test_the_fits_goal_picks_the_highest_throughput_that_fits(sweep):
    base, run = sweep
    fast = _timed(base, 0.050, 0.045, 0.055)
    slow = _timed(run, 0.100, 0.090, 0.110)
    goal = parse_goal(f"fits:{fast.peak}B")  # the baseline just fits: fastest
    assert "pick baseline" in recommend([fast, slow], goal)[0]
    goal = parse_goal(f"fits:{slow.peak}B")  # only opt-in-bwd fits
    assert "pick opt-in-bwd" in recommend([fast, slow], goal)[0]
    assert "nothing that trains the same model fits" in recommend([fast, slow], Goal("fits", 1))[0]
    assert main(["report", "--no-files", "--goal", "fits:lots", "x"]) == 2


def test_report_and_html_put_the_recommendation_first(tmp_path, capsys):
    sweep_dir = tiny_sweep(tmp_path)
    assert main(["report", str(sweep_dir)]) == 0
    out = capsys.readouterr().out
    assert "Recommendation (goal:" in out
    page = (sweep_dir / "report" / "report.html").read_text()
    assert page.index("Recommendation") < page.index("<h2>Summary</h2>")
    md = (sweep_dir / "report" / "report.md").read_text()
    assert md.index("## Recommendation") < md.index("| run")


@pytest.mark.slow
def test_a_real_oom_baseline_is_not_the_reference(tmp_path):
    """A memory budget between accum's peak and the baseline's: the baseline ends as oom at a partial peak."""
    from membench.child.worker import run

    def sweep(out, budget=None):
        return [run(spec("vit-tiny", t, batch_size=4, memory_budget=budget), out / f"{t[0] if t else 'baseline'}.json")
                for t in ((), ("accum",))]

    base, accum = sweep(tmp_path / "free")
    assert accum.peak < base.peak
    budget = (accum.peak + base.peak) // 2
    oom_base, accum = sweep(tmp_path / "budget", budget)
    assert oom_base.status == "oom" and accum.status == "ok"
    head, body = rows([oom_base, accum])
    assert body[1][4] == "-"  # never a saving against a peak that stopped at the budget
    assert "baseline did not finish (oom)" in render([oom_base, accum])
    assert any("did not finish (oom)" in s for s in recommend([oom_base, accum]))


def test_the_table_calls_a_large_change_inside_wide_intervals_undecided(sweep):
    base, run = sweep
    base = _timed(base, 0.100, 0.050, 0.200)
    slower = _timed(run, 0.200, 0.090, 0.300)  # half the throughput, intervals overlap
    assert noise.delta(slower.timing, base.timing) == "undecided (-50.0%): rerun with --min-time"
    smaller = _timed(run, 0.105, 0.050, 0.200)  # 4.8% slower inside the same intervals: no difference shown
    assert noise.delta(smaller.timing, base.timing) == "within noise (-4.8%)"
