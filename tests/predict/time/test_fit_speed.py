"""fit --objective speed: each fit timed at its batch, and the fastest named."""

from __future__ import annotations

from membench.api import plan
from membench.child.probe import timed_fit
from membench.predict.time.show import fastest_lines
from membench.predict.verdict import Fit


def _fit(run: str, batch: int, throughput: float | None, step_s: float | None = None) -> Fit:
    return Fit(run, batch, 1, 1, None, None, 1, step_s=step_s, throughput=throughput, unit="samples")


def test_the_fastest_by_predicted_throughput_comes_first():
    """accum fits batch 64 at 200 samples/s, the baseline batch 16 at 250: the baseline is the fastest, accum
    250 / 200 - 1 = 25% slower per sample; a run with no timing (nothing fits) is left out."""
    lines = fastest_lines([_fit("accum", 64, 200.0, 0.32), _fit("baseline", 16, 250.0, 0.064),
                           _fit("ckpt", 0, None)])
    assert lines[0].startswith("Fastest that fits (predicted step time, no GPU ran): baseline at batch 16, "
                               "250.0 samples/s (64 ms a step)")
    assert lines[1] == "  accum at batch 64: 200.0 samples/s (320 ms a step, +25% slower per sample than baseline)"
    assert len(lines) == 2


def test_a_fit_is_timed_at_its_batch_only_for_the_speed_objective():
    """gpt-tiny at batch 2 on an A100: the fit gains the step time predicted at batch 2 and its tokens/s (2
    sequences of the workload's tokens over that time); the memory objective leaves it as it was."""
    [job] = plan("gpt-tiny", "baseline", 2, device="cpu", target_device="cuda", gpu="A100", check=False,
                 timeline=False, in_process=True)
    fit = _fit("baseline", 2, None)
    assert timed_fit(job, fit, "memory") is fit
    timed = timed_fit(job, fit, "speed")
    assert timed.step_s > 0 and timed.unit == "tokens"
    from membench.workloads import load_workload

    tokens = load_workload("gpt-tiny", None).items_per_sample
    assert abs(timed.throughput - 2 * tokens / timed.step_s) < 1e-9 * timed.throughput
