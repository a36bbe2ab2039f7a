"""A notebook's runs fork: asking whether CUDA exists must not poison fork (checked on CPU, standing in
for the torch calls that need a GPU; what only a GPU can show is in tests/trackers/test_cuda.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from membench import api, environment
from membench.child import worker
from membench.common.errors import UserError
from membench.launch import fork
from membench.results import read_result
from membench.spec import RunSpec
from tests.helpers import spec


# --- 1. a notebook's runs fork: asking whether CUDA exists must not poison fork ----------------------------------
@pytest.fixture
def poisoning_is_available(monkeypatch):
    """torch.cuda.is_available() as on a GPU machine: cudaGetDeviceCount poisons fork, so a child forked after it
    is 'in bad fork' (torch/csrc/cuda/Module.cpp, poison_fork). device_count() asks NVML and poisons nothing."""
    parent, poisoned = os.getpid(), []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: poisoned.append(True) or True)
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: bool(poisoned) and os.getpid() != parent)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    return poisoned


_POISONED_FORK = """
import os, torch
from membench.launch import fork
parent, poisoned = os.getpid(), []
torch.cuda.is_available = lambda: poisoned.append(True) or True  # as poisoning_is_available does
torch.cuda._is_in_bad_fork = lambda: bool(poisoned) and os.getpid() != parent
torch.cuda.device_count = lambda: 1
print(fork.why_not_fork("cuda"))
torch.cuda.is_available()  # what a notebook typically did before calling membench
print(fork.why_not_fork("cuda"))
print(fork.why_not_fork("cpu"))  # a CPU run does not touch CUDA in the child
"""


def test_a_cuda_run_is_not_forked_after_is_available_poisoned_fork():
    # A fresh interpreter: once a backward on fake CUDA tensors has run in this process (other tests do), autograd's
    # device threads forbid backward in any forked child, and the probe rightly answers that before CUDA's state.
    proc = subprocess.run([sys.executable, "-c", _POISONED_FORK], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    before, after, cpu = proc.stdout.splitlines()
    assert before == "None" and cpu == "None"
    assert "torch.cuda.is_available()" in after


def test_resolving_the_device_does_not_poison_fork(poisoning_is_available):
    assert api.resolve_device("auto") == "cuda" and api.resolve_device("cuda") == "cuda"
    assert not poisoning_is_available  # is_available() was never called
    assert fork.why_not_fork("cuda") is None


def test_the_default_out_dir_does_not_start_cuda_in_this_process(monkeypatch):
    def started(*args):
        raise AssertionError("CUDA started in the caller's process")

    monkeypatch.setattr(torch.cuda, "get_device_name", started)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    # The child process asks instead; on this CPU machine it has no GPU to name: one clear line.
    with pytest.raises(UserError, match="could not read the CUDA device's name in a child process"):
        api.default_out_dir(RunSpec("tests.workloads:mlp", 4, device="cuda"))
    assert api.default_out_dir(RunSpec("tests.workloads:mlp", 4)).parts[0] == "results"


def test_a_worker_that_cannot_describe_its_device_still_writes_a_record(tmp_path, monkeypatch):
    def describe(device):
        raise RuntimeError("Cannot re-initialize CUDA in forked subprocess.")

    monkeypatch.setattr(environment, "describe", describe)
    record = worker.run(spec("tests.workloads:mlp"), tmp_path / "baseline.json")
    assert record.status == "error" and "Cannot re-initialize CUDA" in record.error
    assert read_result(tmp_path / "baseline.json").status == "error"
