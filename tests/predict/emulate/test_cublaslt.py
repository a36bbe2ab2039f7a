"""cuBLASLt's own workspace: under a torch whose cuBLASLt does not share the handle's cuBLAS workspace (before 2.13),
each thread's first addmm on the cuBLASLt path (a biased nn.Linear) makes one more block, kept for the process's
life. On a real H200 with torch 2.11 every prediction without it was exactly 1 MiB low per such thread
(results/gpu-runs/NVIDIA-H200_torch2.11.0.tar.xz: gpt-tiny -1,048,576 B, with ckpt -2,097,152 B)."""

from __future__ import annotations

import pytest
import torch

from membench.predict import gpus, run
from membench.predict.emulate import cublas, fake
from membench.predict.emulate.cublas import takes_cublaslt
from membench.predict.emulate.kernels import CudaKernels
from membench.predict.run import predict_memory
from membench.trackers.storage import StorageTracker
from tests.helpers import spec

MiB = 2**20
aten = torch.ops.aten


@pytest.mark.parametrize("release, env, expected", [
    ("2.11", {}, MiB),  # CUBLASLT_WORKSPACE_SIZE's default, 1024 KiB
    ("2.12", {}, MiB),
    ("2.11", {"CUBLASLT_WORKSPACE_SIZE": "2048"}, 2 * MiB),
    ("2.11", {"CUBLASLT_WORKSPACE_SIZE": "lots"}, MiB),  # torch warns and takes its default
    ("2.11", {"TORCH_CUBLASLT_UNIFIED_WORKSPACE": "1"}, 0),  # opt-in before 2.13
    ("2.11", {"TORCH_CUBLASLT_UNIFIED_WORKSPACE": "0"}, MiB),
    ("2.13", {}, 0),  # unified by default from 2.13
    ("2.14", {}, 0),
    ("2.14", {"TORCH_CUBLASLT_UNIFIED_WORKSPACE": "0"}, MiB),  # opt-out
    ("2.14", {"TORCH_CUBLASLT_UNIFIED_WORKSPACE": "off", "CUBLASLT_WORKSPACE_SIZE": "512"}, 512 * 1024),
])
def test_the_cublaslt_workspace_by_release_and_environment(release, env, expected):
    assert gpus.cublaslt_workspace_bytes(release, env) == expected


def test_which_addmm_calls_take_the_cublaslt_path(monkeypatch):
    x, w, b = torch.randn(8, 16), torch.randn(16, 32), torch.randn(32)
    out = torch.addmm(b, x, w)
    assert takes_cublaslt(aten.addmm.default, (b, x, w), {}, out)
    assert takes_cublaslt(aten._addmm_activation.default, (b, x, w), {"use_gelu": True}, out)
    assert not takes_cublaslt(aten.addmm.default, (b, x, w), {"beta": 0.5}, out)  # not a plain bias
    assert not takes_cublaslt(aten.addmm.default, (out, x, w), {}, out)  # a 2-D self
    assert not takes_cublaslt(aten.addmm.default, (b, x[:1], w), {}, out[:1])  # one row: cuBLASLt refuses it
    assert not takes_cublaslt(aten.mm.default, (x, w), {}, x @ w)
    monkeypatch.setenv("DISABLE_ADDMM_CUDA_LT", "1")
    assert not takes_cublaslt(aten.addmm.default, (b, x, w), {}, out)


def test_a_threads_cublaslt_workspace_comes_after_its_cublas_workspace_once():
    with fake.fake_tensors():
        tracker = StorageTracker(trace=True)
        tracker.kernels = CudaKernels(gpus.gpu("A100"), workspace_bytes=1000, lt_workspace_bytes=3000)
        with tracker:
            x, w, b = torch.empty(8, 16), torch.empty(16, 32), torch.empty(32)
            kept = [x @ w, torch.addmm(b, x, w), torch.addmm(b, x, w)]
    # x, w, b; mm's output, the handle's workspace; addmm's output, cuBLASLt's workspace; addmm's output
    assert [e.size for e in tracker.trace if e.kind == "alloc"] == [512, 2048, 128, 1024, 1000, 1024, 3000, 1024]
    assert tracker.kernels.workspaces.allocated_bytes == 4000 and len(kept) == 3


@pytest.mark.parametrize("techniques, threads", [((), 1), (("ckpt",), 2)])
def test_a_prediction_holds_one_cublaslt_workspace_per_thread_that_ran_a_biased_linear(monkeypatch, techniques,
                                                                                     threads):
    """gpt-tiny's biased Linears run addmm in forward (the main thread); with ckpt the recomputed forward runs on
    the autograd thread too, which makes its own. Each workspace lives from its first step on, so the peak is
    that many MiB above the unified prediction's."""
    job = spec("gpt-tiny", techniques, batch_size=4, device="cuda", gpu="H200")
    unified = predict_memory(job).peak_allocated_bytes
    monkeypatch.setattr(cublas, "cublaslt_workspace_bytes", lambda release: MiB)
    monkeypatch.setattr(run.gpus, "cublaslt_workspace_bytes", lambda release: MiB)
    assert predict_memory(job).peak_allocated_bytes == unified + threads * MiB
