"""The GPU a CUDA prediction is for when --gpu is not given: this machine's GPU where torch sees one the table knows,
else H100, said in the output; `fit` confirms only predictions made for the card it runs on."""

from __future__ import annotations

import argparse

import pytest
import torch

from membench import api, cli
from membench.predict import gpus


@pytest.mark.parametrize(("local", "name", "why"), [
    (None, "H100", "the default H100: no CUDA GPU here"),
    ("A100", "A100", "this machine's GPU (A100)"),
    ("NVIDIA B9000", "H100", "the default H100: this machine's NVIDIA B9000 is not in the table (--gpu names one: "
                             "H100, H100-PCIe"),
])
def test_the_default_target_is_this_machines_gpu_where_the_table_knows_it(monkeypatch, local, name, why):
    monkeypatch.setattr(gpus, "local_gpu_name", lambda: local)
    target = gpus.default_target()
    assert target.gpu.name == name and target.why.startswith(why)


def test_no_gpu_here_is_asked_without_a_child_process(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(gpus.subprocess, "run", lambda *a, **k: pytest.fail("no GPU: nothing to ask"))
    assert gpus.local_gpu_name() is None


def test_a_gpu_here_is_named_by_a_child_process_once(monkeypatch):
    """Naming the device initialises CUDA, after which the fitting process could not fork its workers."""
    asked = []

    class Done:
        returncode, stdout = 0, "NVIDIA H100 80GB HBM3\n"

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpus.subprocess, "run", lambda argv, **kw: asked.append(argv) or Done())
    gpus._asked_name.cache_clear()
    try:
        assert gpus.local_gpu_name() == gpus.local_gpu_name() == "NVIDIA H100 80GB HBM3"
    finally:
        gpus._asked_name.cache_clear()
    assert len(asked) == 1 and "get_device_name(0)" in asked[0][-1]
    assert not torch.cuda.is_initialized()


def test_a_cuda_plan_without_gpu_is_for_the_default_target_and_one_with_it_keeps_it(monkeypatch):
    monkeypatch.setattr(gpus, "local_gpu_name", lambda: "A100")
    [job] = api.plan("vit-tiny", "baseline", batch_size=2, target_device="cuda", in_process=True)
    assert job.run.gpu == "A100"
    [job] = api.plan("vit-tiny", "baseline", batch_size=2, target_device="cuda", in_process=True, gpu="T4")
    assert job.run.gpu == "T4"
    [job] = api.plan("vit-tiny", "baseline", batch_size=2, target_device="cpu", in_process=True)
    assert job.run.gpu is None


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the output where torch sees no CUDA GPU")
def test_the_prediction_says_which_gpu_it_is_for_and_why(tmp_path, capsys):
    assert cli.main(["predict", "--workload", "vit-tiny", "--batch-size", "2", "--techniques", "baseline",
                     "--out", str(tmp_path)]) == 0
    assert "PREDICTED (no timing) for H100 (sm90) (the default H100: no CUDA GPU here), with CUDA's autocast" \
        in capsys.readouterr().out


def test_fit_confirms_only_on_the_card_predicted_for():
    """A GPU here that is not the one predicted for: no confirmation runs, and the output says why."""
    args = argparse.Namespace(device="cuda", no_confirm=False)
    h100, a100 = gpus.gpu("H100"), gpus.gpu("A100")
    assert cli.confirmation(args, h100, "NVIDIA A100-SXM4-80GB", None) == \
        "not confirmed: predicted for H100, this machine's GPU is NVIDIA A100-SXM4-80GB"
    assert cli.confirmation(args, a100, "NVIDIA A100-SXM4-80GB", "this machine's GPU (NVIDIA A100-SXM4-80GB)") == \
        "confirmed on this GPU; A100: this machine's GPU (NVIDIA A100-SXM4-80GB)"
    assert cli.confirmation(args, h100, "a card no table knows", None).startswith("not confirmed: predicted for H100")
    assert cli.confirmation(args, h100, None, None) == "not confirmed (no CUDA GPU here)"
    assert cli.confirmation(argparse.Namespace(device="cuda", no_confirm=True), a100, "NVIDIA A100-SXM4-80GB",
                            None) == "not confirmed (--no-confirm)"
    assert cli.confirmation(argparse.Namespace(device="cpu", no_confirm=False), None, None, None) == "cpu target"
