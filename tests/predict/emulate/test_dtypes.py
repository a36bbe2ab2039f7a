"""LayerNorm's and BatchNorm's statistics as CUDA keeps them (predict/emulate/dtypes.py): fp32 under 16-bit input,
as torch's own CUDA fake kernel makes them, where the CPU kernel keeps the input's dtype."""

from __future__ import annotations

import pytest
import torch

from membench.predict.emulate import fake
from membench.predict.emulate.kernels import CudaKernels
from membench.predict.gpus import gpu
from membench.private import fake_tensor_mode
from membench.trackers.storage import StorageTracker

aten = torch.ops.aten


def _layer_norm(device, dtype):
    x = torch.empty(4, 8, 16, dtype=dtype, device=device)
    w = torch.empty(16, dtype=dtype, device=device)
    return aten.native_layer_norm.default(x, [16], w, w, 1e-5)


def _batch_norm(device, dtype):
    x = torch.empty(4, 16, 8, 8, dtype=dtype, device=device)
    w = torch.empty(16, dtype=dtype, device=device)
    return aten.native_batch_norm.default(x, w, w, torch.empty_like(w), torch.empty_like(w), True, 0.1, 1e-5)


def _batch_norm_with_update(device, dtype):
    x = torch.empty(4, 16, 8, 8, dtype=dtype, device=device)
    w = torch.empty(16, dtype=dtype, device=device)
    return aten._batch_norm_with_update.default(x, w, w, torch.empty_like(w), torch.empty_like(w), 0.1, 1e-5)


# fp32 _batch_norm_with_update picks cuDNN on CUDA, whose fake kernel asks cuDNN for its reserve space: a GPU.
CASES = [(make, dtype) for make in (_layer_norm, _batch_norm, _batch_norm_with_update)
         for dtype in (torch.bfloat16, torch.float16, torch.float32)
         if not (make is _batch_norm_with_update and dtype == torch.float32)]


def _layout(outputs):
    return [(t.dtype, tuple(t.shape), t.stride()) for t in outputs]


@pytest.mark.parametrize("make, dtype", CASES, ids=[f"{m.__name__[1:]}-{str(d)[6:]}" for m, d in CASES])
def test_outputs_are_cudas(make, dtype):
    """The CUDA prediction's outputs (fake CPU tensors under the tracker's CUDA hook) are those of torch's CUDA fake
    kernel (FakeTensorMode on device cuda: its meta answer, without a GPU), and what the tracker counts follows."""
    with fake_tensor_mode():
        cuda = _layout(make("cuda", dtype))
    tracker = StorageTracker(trace=True)
    tracker.kernels = CudaKernels(gpu("A100"))
    with fake.fake_tensors():
        with tracker:
            predicted = make("cpu", dtype)
        cpu = _layout(make("cpu", dtype))
    assert _layout(predicted) == cuda
    if dtype == torch.float32:
        assert cpu == cuda
    else:
        assert cpu != cuda  # what the CPU kernel makes is not what CUDA makes: the rewrite is needed
    counted = [e[2] for e in tracker.trace if e[0] == "alloc"]
    assert counted[-3:] == [t.untyped_storage().nbytes() for t in predicted[:3]]


def test_layer_norm_keeps_fp32_statistics_for_backward():
    """A bf16 LayerNorm over [4, 8, 16] on CUDA: the output (1,024 B), then mean and rstd, 32 rows of fp32 each
    (128 B; the CPU kernel's bf16 would be 64 B), kept by autograd until backward, which takes them in fp32."""
    tracker = StorageTracker(trace=True)
    tracker.kernels = CudaKernels(gpu("H100"))
    with fake.fake_tensors():
        norm = torch.nn.LayerNorm(16, dtype=torch.bfloat16)
        x = torch.empty(4, 8, 16, dtype=torch.bfloat16, requires_grad=True)
        with tracker:
            y = norm(x)
            made = [e[2] for e in tracker.trace if e[0] == "alloc"]
            y.sum().backward()
    assert made == [1024, 128, 128]
    assert x.grad.dtype == torch.bfloat16 and norm.weight.grad.dtype == torch.bfloat16
