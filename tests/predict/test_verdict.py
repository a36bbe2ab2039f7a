"""The answer predict and fit end with: fits or not on the target GPU, the margin, the cheapest listed technique that
fits when the baseline does not; then at most three lines on what was assumed (`--explain`: all of it)."""

from __future__ import annotations

import pytest

from membench import cli
from membench.predict.device import CUDA_CONTEXT_BYTES
from membench.predict.gpus import gpu
from membench.predict.verdict import Fit, answer, assumptions, capacity, cheapest, fit_answer, fitting
from membench.results import Memory, RunRecord
from membench.spec import Job, RunSpec
from membench.techniques import cost_of

GiB = 2**30
H100 = gpu("H100")
# The CUDA context predict/device.py estimates beside reserved (measured on an H200, torch 2.11): the fits
# line compares reserved + this with the card, so the records below reserve X - CONTEXT for a whole device of X.
CONTEXT = 804_061_184


def record(name: str, reserved: int | None, status: str = "ok", ranks: int = 1, error: str | None = None):
    techniques = () if name == "baseline" else tuple(name.split("+"))
    memory = None if reserved is None else Memory(device="cuda", method="prediction", peak_phase="backward",
                                                  peak_step=0, peak_allocated_bytes=reserved,
                                                  peak_reserved_bytes=reserved)
    return RunRecord(name=name, status=status, spec=Job(RunSpec("gpt-tiny", 4, techniques, "cuda", gpu="H100")),
                     memory=memory, predicted=True, world_size=ranks, error=error, cannot_see=["a (x)", "b", "c"])


def test_the_gpu_memory_is_its_nominal_gb():
    assert capacity(H100) == 80 * 10**9 and CUDA_CONTEXT_BYTES == CONTEXT
    assert answer([record("baseline", 10 * GiB)], H100).startswith("H100 (80 GB = 74.51 GiB): ")


def test_a_baseline_that_fits_says_its_margin():
    line = answer([record("baseline", 10 * GiB - CONTEXT), record("ckpt", 5 * GiB)], H100)
    assert line == "H100 (80 GB = 74.51 GiB): baseline fits, 64.51 GiB to spare (whole device 10.00 GiB)."


def test_a_baseline_over_the_gpu_names_the_cheapest_technique_that_fits():
    over = capacity(H100) + 2 * GiB - CONTEXT
    records = [record("baseline", over), record("ckpt", 60 * GiB), record("opt-in-bwd", 70 * GiB),
               record("bf16", 40 * GiB - CONTEXT), record("accum", 79 * GiB), record("opt-offload", 10 * GiB)]
    # opt-in-bwd is the one of "low" cost; bf16 costs nothing in step time but changes precision, so it comes
    # after the techniques of the same cost that train the same model, and before those that cost more.
    assert cost_of(("opt-in-bwd",)) == "low" and cost_of(("bf16",)) == "none" and cost_of(("ckpt",)) == "medium"
    line = answer(records, H100)
    assert line == ("H100 (80 GB = 74.51 GiB): baseline does not fit: 2.00 GiB over (whole device 76.51 GiB); "
                    "cheapest listed that fits: bf16 (no step-time cost; changes the numerics, 34.51 GiB to spare).")
    fits = fitting(records[:3], capacity(H100))
    assert cheapest(fits).record.name == "opt-in-bwd"  # without bf16: low beats medium (ckpt)


def test_an_adapter_that_fits_is_not_called_free():
    # lora costs nothing in step time (cost "none") but trains an adapter, not the baseline's model: the line says so.
    over = capacity(H100) + 2 * GiB - CONTEXT
    line = answer([record("baseline", over), record("lora", 20 * GiB - CONTEXT)], H100)
    assert line.endswith("cheapest listed that fits: lora (no step-time cost; trains an adapter, 54.51 GiB to "
                         "spare).")


def test_nothing_fits_names_the_lowest():
    over = capacity(H100) - CONTEXT
    line = answer([record("baseline", over + 3 * GiB), record("ckpt", over + GiB)], H100)
    assert line.endswith("no listed technique fits: the lowest, ckpt, is 1.00 GiB over.")


def test_a_failed_baseline_says_so_in_one_line():
    line = answer([record("baseline", None, "error", error="cannot predict: boom\nTraceback (most recent ...")],
                  H100)
    assert line == "H100 (80 GB = 74.51 GiB): the baseline could not be predicted (cannot predict: boom)."


def test_distributed_predictions_fit_per_rank():
    assert "baseline fits per rank" in answer([record("baseline", GiB, ranks=8)], H100)


def test_assumptions_are_two_lines_and_explain_lists_everything():
    records = [record("baseline", GiB)]
    short = assumptions(records, H100, explain=False)
    assert len(short) == 2 and all(len(line) <= 120 for line in short)
    assert short[1].endswith("not seen: a and 2 more (--explain).")
    full = assumptions(records, H100, explain=True)
    assert full[-3:] == ["  - a (x)", "  - b", "  - c"]


def test_fit_answers_the_baseline_largest_batch_or_the_cheapest_that_fits():
    def fit(run, batch, peak):
        return Fit(run=run, batch=batch, peak=peak, step=1, over_batch=batch + 1, over_peak=peak + GiB, probes=3)

    fits = [fit("baseline", 8, 20 * GiB), fit("ckpt", 32, 23 * GiB)]
    assert fit_answer(fits, 24 * GiB, "reserved", H100) == (
        "H100, within 24.00 GiB of predicted peak reserved: the baseline trains at most batch 8, 4.00 GiB to spare; "
        "the largest batch: ckpt at 32.")
    none = Fit(run="baseline", batch=0, peak=None, step=1, over_batch=1, over_peak=30 * GiB, probes=1)
    line = fit_answer([none, fit("ckpt", 4, 20 * GiB), fit("opt-offload", 16, 10 * GiB)], 24 * GiB, "reserved", None)
    assert line == ("within 24.00 GiB of predicted peak reserved: the baseline does not fit even its smallest batch: "
                    "6.00 GiB over at batch 1; cheapest listed that fits: ckpt (up to batch 4, medium step-time cost).")
    # an adapter that fits the most is not the same model: said in a word either way
    line = fit_answer([fit("baseline", 8, 20 * GiB), fit("qlora", 32, 23 * GiB)], 24 * GiB, "reserved", H100)
    assert line.endswith("the largest batch: qlora at 32 (but trains an adapter).")
    line = fit_answer([none, fit("lora", 4, 20 * GiB)], 24 * GiB, "reserved", None)
    assert line.endswith("cheapest listed that fits: lora (up to batch 4, no step-time cost; trains an adapter).")


@pytest.mark.parametrize("explain", [False, True])
def test_predict_prints_the_fits_line_first_and_no_paragraph_over_three_lines(tmp_path, capsys, explain):
    argv = ["predict", "--workload", "gpt-tiny", "--batch-size", "4", "--techniques", "ckpt", "--out",
            str(tmp_path / "p")] + (["--explain"] if explain else [])
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("H100 (80 GB = 74.51 GiB): baseline fits, ")  # the answer, first
    conclusions = out.split("\n\n")[-1].strip().splitlines()
    if explain:
        assert "A prediction cannot see:" in conclusions and len([c for c in conclusions if c.startswith("  - ")]) >= 5
    else:
        # two lines of caveats, the attention kernels assumed (fp32 on an H100: efficient attention)
        assert len(conclusions) == 4 and conclusions[-1].startswith("predictions: ")
        assert all(len(line) <= 120 for line in conclusions[:2])
        assert conclusions[2].startswith("attention kernels assumed (")


def test_a_trace_over_the_card_is_judged_by_its_replay_under_the_card():
    from dataclasses import replace

    from membench.results.schema import OnCard

    unbounded = record("baseline", 90 * GiB)
    card = 80 * 10**9 - CONTEXT  # predict/device.py's card_capacity for one rank
    released = replace(unbounded, memory=replace(unbounded.memory, on_card=OnCard(card, 70 * GiB - CONTEXT, False)))
    assert answer([released], H100) == ("H100 (80 GB = 74.51 GiB): baseline fits, 4.51 GiB to spare (whole device "
                                        "70.00 GiB).")
    oom = replace(unbounded, memory=replace(unbounded.memory, on_card=OnCard(card, card, True)))
    assert answer([oom], H100).startswith("H100 (80 GB = 74.51 GiB): baseline does not fit: 16.24 GiB over "
                                          "(whole device 90.75 GiB)")
