"""fit --by seq-len: the longest sequence at a fixed batch, over predictions (search.longest_sequence)."""

from __future__ import annotations

from types import SimpleNamespace

from membench.common.errors import UserError
from membench.predict.fit import longest_sequence
from membench.predict.verdict import fit_answer
from tests.helpers import spec


def traced_at(per_token: int, context: int):
    """A stand-in for predict_traced: a peak of per_token bytes a token; past `context` the workload refuses."""
    asked = []

    def traced(job):
        asked.append(job.run.seq_len)
        if job.run.seq_len > context:
            raise UserError(f"--seq-len {job.run.seq_len} is longer than the model's context ({context} positions)")
        return SimpleNamespace(memory=SimpleNamespace(peak_allocated_bytes=per_token * job.run.seq_len))
    return traced, asked


def test_doubling_then_bisection_finds_the_longest_length_that_fits():
    traced, asked = traced_at(1000, 4096)
    fit = longest_sequence(spec("gpt-tiny"), 5500, "allocated", traced)
    assert (fit.batch, fit.peak, fit.over_batch, fit.over_peak, fit.over) == (5, 5000, 6, 6000, "seq-len")
    assert asked == [1, 2, 4, 8, 6, 5]  # doubling until 8 is over, then bisection between 4 and 8


def test_the_models_context_bounds_it():
    traced, _ = traced_at(1, 100)
    fit = longest_sequence(spec("gpt-tiny"), 10**9, "allocated", traced)
    assert fit.batch == 100 and fit.over_batch == 101 and fit.note == "101 tokens are past the model's context"


def test_the_fits_line_says_seq_len():
    traced, _ = traced_at(1000, 4096)
    fits = [longest_sequence(spec("gpt-tiny").with_run(techniques=t), 5500 if not t else 9500, "allocated", traced)
            for t in ((), ("lora",))]
    fits[1].run = "lora"
    assert fit_answer(fits, 5500, "allocated", None).endswith(
        "the baseline trains at most seq-len 5, 500 B to spare; the largest seq-len: lora at 9 (but trains an "
        "adapter).")
