"""nn.MultiheadAttention in a CUDA prediction (predict/emulate/sdpa.py): in training it reaches
scaled_dot_product_attention (with need_weights=False, as torchvision's ViT asks) and so the kernel the GPU
chooses."""

from __future__ import annotations

import torch
from torch import nn

from membench.predict import gpus
from membench.predict.emulate import fake
from membench.predict.emulate.kernels import CudaKernels, cuda_gpu
from membench.predict.emulate.sdpa import CudaSdpa
from membench.trackers.storage import StorageTracker

B, T, E, HEADS = 2, 16, 64, 4  # head size 16


def run(gpu_name: str, train: bool, need_weights: bool = False):
    """(allocation sizes in order, backends chosen) of one call on a [B, T, E] bf16 input."""
    gpu = gpus.gpu(gpu_name)
    with cuda_gpu(gpu) as device, fake.fake_tensors():
        sites = device.find(CudaSdpa).sites
        mha = nn.MultiheadAttention(E, HEADS, batch_first=True, dtype=torch.bfloat16)
        mha.train(train)
        x = torch.empty(B, T, E, dtype=torch.bfloat16, requires_grad=train)
        tracker = StorageTracker(trace=True)
        tracker.kernels = CudaKernels(gpu, workspace_bytes=0)
        with tracker, torch.set_grad_enabled(train):
            y, _ = mha(x, x, x, need_weights=need_weights)
        assert y.shape == (B, T, E)
        summary = sites.summary()
        return [e[2] for e in tracker.trace if e[0] == "alloc"], [s.backend for s in summary.sites] if summary else []


def test_training_reaches_the_kernel_the_gpu_chooses():
    assert run("H100", True)[1] == ["cudnn"]
    assert run("A100", True)[1] == ["flash"]
    assert run("T4", True)[1] == ["math"]  # bf16 below sm80
    # need_weights=True (nn.MultiheadAttention's default) computes the weights itself: no attention kernel.
    allocs, backends = run("H100", True, need_weights=True)
    assert backends == [] and B * HEADS * T * T * 2 in allocs
