"""fit: the largest batch under a budget of predicted peak memory; batch + step does not fit."""

from __future__ import annotations

import pytest
import torch

from membench import cli
from membench.fit import batch_step, confirm_on_gpu, largest_batch
from membench.predict import predict_memory
from membench.spec import Job
from tests.helpers import spec as job_spec


def peak(spec: Job) -> int:
    return predict_memory(spec).peak_allocated_bytes


@pytest.mark.parametrize("stack", [(), ("ckpt",), ("accum",)], ids=lambda s: "+".join(s) or "baseline")
def test_fit_returns_a_batch_that_fits_and_the_next_does_not(stack):
    spec = job_spec("vit-tiny", stack, batch_size=1, device="cuda", accum_steps=2)
    step = batch_step(spec)
    assert step == (2 if "accum" in stack else 1)
    budget = peak(spec.with_run(batch_size=5 * step)) + 1  # a budget between two batch sizes
    fit = largest_batch(spec, budget, peak)
    assert fit.batch % step == 0 and fit.over_batch == fit.batch + step
    # checked again from fresh predictions, not from the search's own numbers
    assert peak(spec.with_run(batch_size=fit.batch)) == fit.peak <= budget
    assert peak(spec.with_run(batch_size=fit.batch + step)) == fit.over_peak > budget
    assert fit.batch >= 5 * step


def test_nothing_fits_a_budget_below_the_smallest_batch():
    spec = job_spec("vit-tiny", batch_size=1, device="cuda")
    fit = largest_batch(spec, peak(spec) - 1, peak)
    assert fit.batch == 0 and fit.over_batch == 1 and "over budget" in fit.note


def test_max_batch_stops_the_search():
    spec = job_spec("vit-tiny", batch_size=1, device="cuda")
    fit = largest_batch(spec, 2**40, peak, max_batch=4)
    assert fit.batch == 4 and fit.over_batch is None and "--max-batch" in fit.note


def test_cli_fit_prints_a_table(capsys):
    code = cli.main(["fit", "--workload", "vit-tiny", "--techniques", "ckpt", "--budget", "4MiB", "--max-batch", "64"])
    out = capsys.readouterr().out
    assert code == 0
    assert "max batch (predicted)" in out and "ckpt" in out and "PREDICTED cuda peak" in out
    assert ("not confirmed: no CUDA GPU here" in out) == (not torch.cuda.is_available())


def test_cli_fit_bad_budget_is_a_usage_error(capsys):
    assert cli.main(["fit", "--workload", "vit-tiny", "--budget", "lots"]) == 2
    assert "cannot read 'lots' as a size" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: confirmation runs are real runs")
def test_confirmation_on_gpu_finds_a_batch_that_runs(tmp_path):
    spec = job_spec("vit-small", batch_size=1, device="cuda")
    budget = 2 * 2**30
    fit = confirm_on_gpu(spec, largest_batch(spec, budget, peak, max_batch=512), budget, tmp_path)
    assert fit.confirmed is not None and fit.confirmed > 0
