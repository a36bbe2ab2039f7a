"""How sure a timing is, what a failed baseline may not be used for, and the recommendation: from the numbers.

The results are real tiny runs (tests/sweeps.py) with their timing or memory varied by hand, so each rule is
tested on a known case; no test asserts how fast anything runs.
"""

from __future__ import annotations

import copy
import dataclasses
import re

import pytest

from membench.cli import main
from membench.report import charts, noise
from membench.report.explain import explain
from membench.report.live import SweepProgress
from membench.report.recommend import Goal, parse_goal, recommend
from membench.report.table import render, rows
from membench.report.words import recommendation_lines, speed_cell, speed_phrase, story_lines
from membench.results import Equivalence, Interleaved, RunRecord, load_dir
from membench.results.sweep import Sweep
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


def _against_base(record: RunRecord, ratio: float, low: float, high: float, pairs: int = 6) -> RunRecord:
    """The record with an interleaved timing against the baseline: its step / the baseline's, and that interval."""
    r = copy.deepcopy(record)
    r.timing.vs_baseline = Interleaved(pairs=pairs, ratio=ratio, ratio_low=low, ratio_high=high, level=0.969,
                                       run_median_s=0.1 * ratio, baseline_median_s=0.1)
    r.timing.not_interleaved = None
    return r


def _advice(*runs: RunRecord, goal: Goal = Goal("lowest-peak")) -> list[str]:
    return recommendation_lines(recommend(Sweep.of(runs), goal))


def _cells(*runs: RunRecord) -> dict[str, dict[str, str]]:
    head, body = rows(Sweep.of(runs))
    return {row[0]: dict(zip(head, row)) for row in body}


@pytest.fixture()
def sweep(tmp_path):
    results = {r.name: r for r in load_dir(tiny_sweep(tmp_path))}
    return results["baseline"], results["opt-in-bwd"]


# --- timing: an interval, calibration ---------------------------------------------------------------------------
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


def test_half_an_interval_is_no_interval():
    """A result file with only one end of the interval (hand-edited; found by the fuzz test) compares as one with
    none, instead of comparing a number with None."""
    whole = timing.summarize([1.0, 2.0, 3.0, 4.0, 5.0])
    whole.throughput = 10.0
    half = dataclasses.replace(whole, ci_high_s=None)
    assert noise.overlap(whole, whole) is True and noise.spread(whole) == pytest.approx(2 / 3)
    assert noise.step_interval(half) is None
    assert noise.overlap(whole, half) is None and noise.overlap(half, whole) is None
    assert noise.spread(half) is None and noise.throughput_interval(half) is None
    assert noise.throughput_interval(dataclasses.replace(whole, ci_low_s=0.0)) is None


def test_timing_is_calibrated_to_a_time_budget_within_a_cap():
    calls = []
    times, losses = timing.time_steps(lambda i: calls.append(i) or 0.0, range(3))
    assert len(times) == 3 == len(losses)
    times, _ = timing.time_steps(lambda i: 0.0, range(3), min_time_s=3600)  # never reached: stops at the cap
    assert len(times) == 3 * timing.MAX_STEPS_FACTOR


def test_the_plus_minus_is_the_half_width_of_the_interval(sweep):
    base, _ = sweep
    lopsided = _timed(base, 0.100, 0.090, 0.130)  # 10 ms below the median, 30 above: 40 ms wide, half is 20%
    assert noise.spread(lopsided.timing) == pytest.approx(0.20)
    assert noise.step_ms(lopsided.timing) == "100.0 ±20.0%"


# --- interleaved timing: what a speed claim rests on ------------------------------------------------------------
def test_interleaving_alternates_which_side_goes_first_and_pairs_the_times():
    order = []
    run = timing.Stepper(lambda: None, lambda _: order.append("run"))
    base = timing.Stepper(lambda: None, lambda _: order.append("base"))
    run_times, base_times = timing.interleave(run, base, pairs=4)
    assert order == ["run", "base", "base", "run", "run", "base", "base", "run"]
    assert len(run_times) == len(base_times) == 4
    run_times, _ = timing.interleave(run, base, pairs=2, min_time_s=3600)  # never reached: stops at the cap
    assert len(run_times) == 2 * timing.MAX_STEPS_FACTOR


def test_a_drift_in_load_cancels_in_the_pairs():
    """The machine slows down 3x half way (another job starts): each pair's ratio stays 1.2, so the comparison
    says 1.2 exactly, where the two sides' own medians, taken apart, would not."""
    load = [1.0] * 3 + [3.0] * 3
    base_times = [0.100 * f for f in load]
    run_times = [0.120 * f for f in load]
    result = timing.compare(run_times, base_times)
    assert result.ratio == pytest.approx(1.2) and result.ratio_low == pytest.approx(1.2)
    assert result.ratio_high == pytest.approx(1.2) and result.pairs == 6
    assert result.level == pytest.approx(1 - 2 / 64)


def test_speed_is_claimed_only_beyond_the_interleaved_interval(sweep):
    base, run = sweep
    faster = _against_base(run, 0.80, 0.75, 0.85)  # its step 0.8 of the baseline's: 25% more throughput
    slower = _against_base(run, 1.25, 1.20, 1.30)
    noise_only = _against_base(run, 0.98, 0.90, 1.05)
    wide = _against_base(run, 0.50, 0.30, 1.50)
    assert noise.speed(faster).verdict == "faster" and noise.speed(faster).change_pct == pytest.approx(25.0)
    assert noise.speed(slower).verdict == "slower" and noise.speed(slower).change_pct == pytest.approx(-20.0)
    assert noise.speed(noise_only).verdict == "within-noise"
    assert noise.speed(wide).verdict == "undecided"
    assert speed_cell(noise.speed(faster)) == "+25.0% [+17.6, +33.3]"
    assert speed_cell(noise.speed(noise_only)) == "within noise (+2.0%)"
    assert speed_cell(noise.speed(wide)) == "undecided (+100.0%)"
    assert "faster" not in speed_phrase(noise.speed(wide)) and "rerun with --min-time" in speed_phrase(
        noise.speed(wide))


def test_runs_timed_apart_are_never_compared_on_speed(sweep):
    """Without the interleaved timing (a result from before it, or a distributed run), the separate medians are
    not a claim, however far apart: no percentage, and the reason is said."""
    base, run = sweep
    base = _timed(base, 0.100, 0.099, 0.101)
    apart = _timed(run, 0.050, 0.049, 0.051)  # twice as fast, intervals far apart: sequential only
    apart.timing.vs_baseline, apart.timing.not_interleaved = None, "a distributed run"
    assert _cells(base, apart)["opt-in-bwd"]["speed vs base"] == "-"
    advice = _advice(base, apart)[0]
    assert "faster" not in advice and "not compared with the baseline's (a distributed run)" in advice
    assert "opt-in-bwd: speed not compared (a distributed run)" in render([Sweep.of([base, apart])])


def test_the_sentence_and_the_table_give_the_same_percentage(sweep):
    base, run = sweep
    for ratio, low, high in ((0.117, 0.11, 0.12), (1.3, 1.25, 1.4), (1.02, 0.9, 1.1)):
        fast = _against_base(run, ratio, low, high)
        cell = _cells(base, fast)["opt-in-bwd"]["speed vs base"]
        table_pct = abs(float(re.search(r"[-+][0-9.]+(?=%)", cell).group()))
        said = " ".join(_advice(base, fast)) + " ".join(story_lines(explain(fast, base)))
        assert f"{table_pct:.1f}%" in said, (cell, said)


def test_the_progress_line_shows_the_noise(sweep, capsys):
    base, _ = sweep
    base = _timed(base, 0.100, 0.080, 0.130)
    base.timing.noisy = True
    progress = SweepProgress([spec("vit-tiny", batch_size=1)], "out")
    progress.done(base.spec, base, skipped=False)
    err = capsys.readouterr().err
    assert "±25.0%" in err and "noisy timing" in err


def test_pareto_chart_has_error_bars_and_marks_precision(sweep):
    base, run = sweep
    base = _timed(base, 0.100, 0.090, 0.110)
    amp = _timed(run, 0.050, 0.045, 0.055)
    amp.name, amp.spec = "amp-bf16", amp.spec.with_run(techniques=("amp-bf16",))
    amp.equivalence = Equivalence(verdict="precision", mode="precision", detail="changes numerics on purpose")
    fig = charts.pareto_chart(Sweep.of([base, amp]))
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
    cells = _cells(oom, run)["opt-in-bwd"]
    assert cells["vs base"] == "-" and cells.get("speed vs base", "-") == "-"  # no change against a partial peak
    text = render([Sweep.of([oom, run])])
    assert "baseline did not finish (oom)" in text and "absolute numbers only" in text
    story = explain(run, Sweep.of([oom, run]).reference)
    assert story.is_reference and not any("lowers the peak" in s for s in story_lines(story))
    assert any("did not finish (oom)" in s for s in _advice(oom, run))


# --- the recommendation -----------------------------------------------------------------------------------------
def test_recommends_the_lowest_peak_that_trains_the_same_model(sweep):
    base, run = sweep  # vit-tiny at batch 1: opt-in-bwd lowers a peak that is in the optimizer step, bitwise
    decision = recommend(Sweep.of([base, run]))
    assert decision.outcome == "pick" and decision.pick.name == "opt-in-bwd" and decision.pick.verdict == "bitwise"
    first = recommendation_lines(decision)[0]
    assert first.startswith("Recommendation (goal: the lowest peak that trains the same model, saving at least 5% "
                            "of the baseline's peak): pick opt-in-bwd")
    assert "saving" in first and "bitwise" in first
    # the tiny sweep times one step (--steps 1, a memory gate's): its speed is not compared, and it says why
    assert "not enough steps to compare speed (--steps 1: 2 or more time the run against the baseline)" in first


def test_a_saving_below_the_threshold_keeps_the_baseline(sweep):
    base, run = sweep
    small = copy.deepcopy(run)
    # 4.99% of the baseline's peak below it: under the default 5% threshold, by a byte count worked out here
    small.memory.peak_allocated_bytes = base.peak - (base.peak * 499) // 10000
    assert recommend(Sweep.of([base, small])).outcome == "below-threshold"
    first = _advice(base, small)[0]
    assert "keep the baseline" in first and "below the 5% threshold" in first and "min-saving=PCT" in first
    assert "pick opt-in-bwd" in _advice(base, small, goal=parse_goal("lowest-peak:min-saving=4"))[0]
    assert "pick opt-in-bwd" in _advice(base, small, goal=parse_goal("lowest-peak:min-saving=0"))[0]
    assert main(["report", "--no-files", "--goal", "lowest-peak:min-saving=x", "x"]) == 2
    assert main(["report", "--no-files", "--goal", "lowest-peak:min-saving=100", "x"]) == 2


def test_a_noisy_comparison_is_undecided_and_a_clear_one_is_said_with_its_interval(sweep):
    base, run = sweep
    noisy = _against_base(run, 0.5, 0.2, 1.5)  # 2x faster in the median, but the interval holds no change
    first = _advice(base, noisy)[0]
    assert "undecided: rerun with --min-time" in first and "faster" not in first
    assert any("undecided: rerun with --min-time" in s for s in story_lines(explain(noisy, base)))
    clear = _against_base(run, 0.5, 0.49, 0.51)
    first = _advice(base, clear)[0]
    assert "it is 100.0% faster (timed in alternation with the baseline in its process: +96.1% to +104.1%" in first


def test_more_ranks_are_not_a_techniques_speedup(sweep):
    """A distributed run is not timed against the baseline (its ranks step together): no speed claim at all."""
    base, run = sweep
    fsdp = _timed(run, 0.200, 0.199, 0.201)
    base.timing.throughput, fsdp.timing.throughput = 1000.0, 1600.0  # 1.6x in all from two ranks
    fsdp.world_size = 2
    fsdp.timing.vs_baseline = None
    fsdp.timing.not_interleaved = "a distributed run: its ranks step together, the baseline alone in one process"
    first = _advice(base, fsdp)[0]
    assert "faster" not in first and "%" not in first.split("pick opt-in-bwd")[1].split(";")[1]
    assert "its speed was not compared with the baseline's (a distributed run" in first


def test_when_nothing_helps_it_says_why(sweep):
    base, run = sweep
    ckpt = copy.deepcopy(base)
    ckpt.name, ckpt.spec, ckpt.equivalence = "ckpt", base.spec.with_run(techniques=("ckpt",)), \
        Equivalence(verdict="bitwise")
    assert base.memory.peak_phase == "optimizer"
    decision = recommend(Sweep.of([base, ckpt]))
    assert decision.outcome == "nothing-lower" and decision.baseline_phase == "optimizer"
    first = recommendation_lines(decision)[0]
    assert "keep the baseline" in first and "optimizer step" in first and "activations" in first


def _variant(run: RunRecord, name: str, peak: int, eq: Equivalence | None, numerics: str | None = None):
    r = copy.deepcopy(run)
    r.name, r.spec, r.equivalence, r.numerics = name, run.spec.with_run(techniques=(name,)), eq, numerics
    r.memory.peak_allocated_bytes = peak
    return r


def test_precision_and_unverified_runs_are_never_recommended_as_the_same_model(sweep):
    base, run = sweep
    amp = _variant(run, "amp-bf16", run.peak // 2,
                   Equivalence(verdict="precision", mode="precision", detail="changes numerics on purpose"))
    unchecked = _variant(run, "sac", run.peak // 3, None, "exact")
    decision = recommend(Sweep.of([base, run, amp, unchecked]))
    assert decision.pick.name == "opt-in-bwd"
    assert [(e.name, e.why) for e in decision.excluded] == [("sac", "not-checked"), ("amp-bf16", "changes-precision")]
    advice = recommendation_lines(decision)
    assert any(s.startswith("Not recommended: amp-bf16") and "changes precision" in s for s in advice)
    assert any(s.startswith("Not recommended: sac") and "not checked" in s for s in advice)


def test_a_run_without_a_check_still_changes_precision_from_its_record(sweep):
    """--no-check: the record's numerics say a precision technique changes precision (no technique registry)."""
    base, run = sweep
    amp = _variant(run, "amp-bf16", run.peak // 2, None, "precision")
    assert amp.changes_precision
    assert recommend(Sweep.of([base, amp])).excluded[0].why == "changes-precision"


def test_predictions_are_recommended_by_memory_with_equivalence_not_checked(sweep):
    base, run = sweep
    runs = []
    for r, numerics in ((base, "exact"), (run, "exact")):
        r = copy.deepcopy(r)
        r.predicted, r.predicted_for, r.timing, r.equivalence, r.numerics = True, "cpu", None, None, numerics
        runs.append(r)
    amp = _variant(runs[1], "amp-bf16", run.peak // 2, None, "precision")
    decision = recommend(Sweep.of([*runs, amp]))
    assert decision.outcome == "pick" and decision.pick.name == "opt-in-bwd"
    first = recommendation_lines(decision)[0]
    assert "equivalence not checked: prediction" in first and "throughput" not in first
    assert decision.excluded[0].name == "amp-bf16" and decision.excluded[0].why == "changes-precision"


def test_the_fits_goal_picks_the_fastest_only_beyond_the_intervals(sweep):
    base, run = sweep
    goal = parse_goal(f"fits:{run.peak}B")  # only opt-in-bwd fits
    decision = recommend(Sweep.of([base, run]), goal)
    assert decision.pick.name == "opt-in-bwd" and decision.fits_by == "only"
    goal = parse_goal(f"fits:{base.peak}B")  # both fit
    clear = _against_base(run, 0.5, 0.45, 0.55)
    decision = recommend(Sweep.of([base, clear]), goal)
    assert decision.pick.name == "opt-in-bwd" and decision.fits_by == "fastest"
    slower = _against_base(run, 1.5, 1.45, 1.55)
    decision = recommend(Sweep.of([base, slower]), goal)
    assert decision.pick.name == "baseline" and decision.fits_by == "fastest"
    noisy = _against_base(run, 0.5, 0.2, 1.5)  # cannot tell: the lowest peak of the two, naming the other
    decision = recommend(Sweep.of([base, noisy]), goal)
    assert decision.pick.name == "opt-in-bwd" and decision.fits_by == "lowest-peak" and decision.rivals == (
        "baseline",)
    assert "does not tell baseline apart from it in speed" in recommendation_lines(decision)[0]
    assert recommend(Sweep.of([base, run]), Goal("fits", 1)).outcome == "nothing-fits"
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
        # two steps: with one, no comparison is timed at all (not enough steps), whatever the budget
        return [run(spec("vit-tiny", t, batch_size=4, memory_budget=budget, steps=2),
                    out / f"{t[0] if t else 'baseline'}.json") for t in ((), ("accum",))]

    base, accum = sweep(tmp_path / "free")
    assert accum.peak < base.peak
    budget = (accum.peak + base.peak) // 2
    oom_base, accum = sweep(tmp_path / "budget", budget)
    assert oom_base.status == "oom" and accum.status == "ok"
    assert accum.timing.vs_baseline is None and "--memory-budget" in accum.timing.not_interleaved
    assert _cells(oom_base, accum)["accum"]["vs base"] == "-"  # never a saving against a peak at the budget
    assert "baseline did not finish (oom)" in render([Sweep.of([oom_base, accum])])
    assert any("did not finish (oom)" in s for s in _advice(oom_base, accum))


def test_compare_calls_a_large_change_inside_wide_intervals_undecided(sweep):
    base, run = sweep
    base = _timed(base, 0.100, 0.050, 0.200)
    slower = _timed(run, 0.200, 0.090, 0.300)  # half the throughput, intervals overlap
    assert noise.separate_runs_delta(slower.timing, base.timing) == "undecided (-50.0%)"
    smaller = _timed(run, 0.105, 0.050, 0.200)  # 4.8% slower inside the same intervals: no difference shown
    assert noise.separate_runs_delta(smaller.timing, base.timing) == "within noise (-4.8%)"
    apart = _timed(run, 0.050, 0.049, 0.051)
    assert noise.separate_runs_delta(apart.timing, _timed(base, 0.1, 0.099, 0.101).timing) == "+100.0%"


def test_fewer_pairs_than_an_interval_needs_claim_no_percentage(sweep):
    """Below 6 pairs (96.9%: the fewest whose smallest-to-largest ratio holds the median with 95% confidence), no
    interval and no percentage: 'not enough steps to compare speed (N pairs)' (a record written by hand, or by an
    older membench; a run takes at least 6, and a run of one timed step none: tests/child)."""
    base, run = sweep
    two = _against_base(run, 0.2, 0.1, 0.3, pairs=2)  # 5x faster by two pairs: no claim
    said = noise.speed(two)
    assert said.verdict == "not-enough" and said.interval is None and said.change_pct is None
    assert speed_cell(said) == "not enough steps"
    assert "opt-in-bwd: not enough steps to compare speed (2 pairs)" in render([Sweep.of([base, two])])
    assert "%" not in _cells(base, two)["opt-in-bwd"]["speed vs base"]
    assert "Not enough steps to compare speed (2 pairs)." in story_lines(explain(two, base))


def test_the_ci_recipe_times_one_step_so_it_claims_no_speed():
    """docs/ci.md's recipe runs with --steps 1: the worker then times no comparison (its record says why, and the
    tiny sweep above, run with --steps 1, shows the sentence), so the recipe prints no speed verdict."""
    from pathlib import Path

    recipe = (Path(__file__).resolve().parents[2] / "docs" / "ci.md").read_text()
    runs = [line for line in recipe.splitlines() if "--steps" in line and "--out" in line]
    assert runs and all("--steps 1 " in line for line in runs)


def test_an_interval_upside_down_is_no_interval(sweep):
    """A crafted result with ci_low_s above ci_high_s (matplotlib refused the negative error bar with a
    traceback): no interval, no error bar, the report still drawn."""
    base, run = sweep
    crafted = _timed(run, 0.1, 0.2, 0.05)
    assert noise.step_interval(crafted.timing) is None and noise.throughput_interval(crafted.timing) is None
    assert charts.pareto_chart(Sweep.of([base, crafted])) is not None
    outside = _timed(run, 0.1, 0.2, 0.3)  # a median outside its own interval
    assert charts.pareto_chart(Sweep.of([base, outside])) is not None


def test_a_baseline_that_says_ok_without_memory_is_no_reference_and_nothing_is_recommended(sweep):
    base, run = sweep
    hollow = copy.deepcopy(base)
    hollow.memory = None
    advice = _advice(hollow, run)
    assert advice == ["Recommendation (goal: the lowest peak that trains the same model, saving at least 5% of the "
                      "baseline's peak): nothing to recommend: the baseline's result says ok but holds no memory (a "
                      "damaged or edited file); run it again."]
    assert "did not finish (ok)" not in render([Sweep.of([hollow, run])])
    assert "holds no memory" in render([Sweep.of([hollow, run])])
