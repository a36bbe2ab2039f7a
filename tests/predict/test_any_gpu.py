"""Any GPU: the table's cards by name, a card by its properties (`--gpu sm86,sms=58,mem=16GiB`), and the one line
saying the installed torch has no code for the card predicted for."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
import torch

from membench import cli
from membench.common.errors import UserError
from membench.predict import gpus
from membench.predict.run import predict_all
from membench.spec import Job, RunSpec
from membench.spec.gpu import GPUS, gpu


def test_a_card_by_its_properties_reads_each_one_and_takes_the_threads_of_its_capability():
    card = gpu("SM75, sms=30, mem=8 GiB")
    assert (card.name, card.compute_capability, card.sm_count, card.memory_bytes) == (
        "sm75,sms=30,mem=8GiB", (7, 5), 30, 8 * 2**30)
    assert card.max_threads_per_sm == 1024 and card.given and card.memory_label == "8 GiB"
    assert gpu(card.name) == card  # the name a record keeps reads back as the same card
    assert "1024 threads per multiprocessor" in card.assumed() and gpu("T4").assumed() == ""
    assert gpu("sm86,sms=58,mem=16GB").memory_bytes == 16 * 10**9


@pytest.mark.parametrize(("text", "says"), [
    ("B9000", "valid: H100, H100-PCIe"), ("sm86,sms=58", "needs both sms= and mem="),
    ("sm99,sms=5,mem=1GB", "valid: sm70"), ("sm86,sms=0,mem=1GB", "from 1 to 1024"),
    ("sm86,sms=5,mem=lots", "mem: cannot read 'lots'"), ("sm86,sms=5,mem=1GB,clock=2", "is not sms=N or mem=SIZE"),
])
def test_bad_gpu_text_is_one_line_naming_what_is_valid(text, says):
    with pytest.raises(UserError) as raised:
        gpu(text)
    assert says in str(raised.value) and "\n" not in str(raised.value)


def test_bad_gpu_on_the_command_line_is_one_line_and_exit_2():
    done = subprocess.run([sys.executable, "-m", "membench", "predict", "--gpu", "B9000"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "unknown GPU 'B9000'; valid: H100," in done.stderr and "L40S" in done.stderr and "sm86,sms=58" in done.stderr


def test_the_cli_reads_gpu_once_into_a_gpu():
    parser = argparse.ArgumentParser()
    cli.add_target_options(parser)
    assert parser.parse_args(["--gpu", "nvidia l40s"]).gpu is GPUS["L40S"]
    assert parser.parse_args(["--gpu", "sm75,sms=30,mem=8GiB"]).gpu == gpu("sm75,sms=30,mem=8GiB")


def _predicted(tmp_path, name: str):
    job = Job(RunSpec("tests.workloads:mlp", 8, device="cuda", gpu=name).validated())
    [record] = predict_all([job], tmp_path / name.replace(",", "_"))
    assert record.status == "ok", record.error
    return record


def test_a_card_given_by_its_properties_predicts_as_the_table_card_it_describes(tmp_path, capsys):
    """What a prediction reads of a GPU is its compute capability, multiprocessors and threads (and memory for the
    fit): an L40S described by its properties is predicted to the byte as the L40S of the table."""
    named, given = _predicted(tmp_path, "L40S"), _predicted(tmp_path, "sm89,sms=142,mem=48GB")
    assert named.spec.run.gpu == "L40S" and given.spec.run.gpu == "sm89,sms=142,mem=48GB"  # the record keeps text
    assert given.memory.peak_allocated_bytes == named.memory.peak_allocated_bytes
    assert given.memory.peak_reserved_bytes == named.memory.peak_reserved_bytes
    assert given.memory.breakdown_at_peak == named.memory.breakdown_at_peak
    cli.print_predictions([given], argparse.Namespace(device="cuda", explain=False, gpu=None))
    out = capsys.readouterr().out
    assert "fits on sm89,sms=142,mem=48GB (48 GB): yes" in out
    assert "sm89,sms=142,mem=48GB: a card given by its properties: 1536 threads per multiprocessor" in out


@pytest.mark.parametrize(("cc", "archs", "runs"), [
    ((7, 0), ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"], False),  # the pinned 2.14.1+cu130 wheel
    ((8, 9), ["sm_80", "sm_86", "sm_90"], True),  # an sm_86 cubin runs on 8.9 (same major, higher minor)
    ((8, 0), ["sm_86"], False),  # ... never on a lower minor
    ((9, 0), ["sm_90a"], True), ((10, 0), ["sm_90a"], False),  # architecture-specific: that capability alone
    ((9, 0), ["sm_80", "compute_80"], True), ((7, 5), ["compute_80"], False),  # PTX: JIT for that one or higher
])
def test_code_built_for_an_arch_list_runs_on_the_capabilities_cuda_says(cc, archs, runs):
    assert gpus.runs_on(cc, archs) is runs


def test_a_card_the_installed_torch_has_no_code_for_is_said_in_one_line():
    note = gpus.arch_note(gpu("V100"), ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"])
    assert note.startswith(f"warning: torch {torch.__version__} was built for sm_75 sm_80") and "V100 (sm70)" in note
    assert gpus.arch_note(gpu("L40S"), ["sm_75", "sm_80", "sm_86", "sm_90"]) is None
    assert gpus.arch_note(gpu("V100"), []) is None  # a torch without CUDA: the card's own torch is not known here
    if torch.__version__ == "2.14.1+cu130":  # the pinned wheel answers without a GPU, and has no sm_70
        assert torch.cuda.get_arch_list() == ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
        assert gpus.arch_note(gpu("V100")) is not None and gpus.arch_note(gpu("H100")) is None


@pytest.mark.slow  # three predictions, each in a child process: 20 to 60 s on the shared machine
@pytest.mark.parametrize("card", ["L40S", "sm75,sms=30,mem=8GiB", "V100"])
def test_membench_predict_for_any_gpu(tmp_path, capsys, card):
    assert cli.main(["predict", "--workload", "tests.workloads:mlp", "--batch-size", "8", "--techniques",
                     "baseline", "--gpu", card, "--jobs", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"PREDICTED (no timing) for {gpu(card).name} ({gpu(card).sm})" in out
    warned = [line for line in out.splitlines() if line.startswith("warning: torch")]
    assert len(warned) == (1 if not gpus.runs_on(gpu(card).compute_capability, torch.cuda.get_arch_list())
                           and torch.cuda.get_arch_list() else 0)
