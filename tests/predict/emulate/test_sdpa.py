"""Attention, softmax and dropout in a CUDA prediction, derived by hand: scaled_dot_product_attention keeps what the
CUDA kernel torch chooses keeps (predict/emulate/sdpa.py; each kernel in
tests/predict/emulate/test_attention_kernels.py), softmax of a float16 input reads it directly
(predict/emulate/autocast.py), dropout keeps a one-byte mask."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from membench.allocator.events import TraceEvent
from membench.predict import gpus
from membench.predict.emulate import fake
from membench.predict.emulate.kernels import CudaKernels, cuda_gpu
from membench.predict.emulate.sdpa import CudaSdpa
from membench.trackers.storage import StorageTracker

B, H, L, D = 2, 4, 128, 64
OUT = B * H * L * D * 4  # the fp32 output: 262,144 bytes
LSE = B * H * L * 4  # the log-sum-exp, fp32: 4,096 bytes
WEIGHTS = B * H * L * L * 4  # one queries x keys fp32 matrix: 524,288 bytes


def _cuda_tracker(cuda: bool) -> StorageTracker:
    tracker = StorageTracker()
    if cuda:  # a CUDA prediction's tracker: the fused kernels' outputs and scratch, no cuBLAS workspace
        tracker.kernels = CudaKernels(gpus.gpu("H100"), workspace_bytes=0)
    return tracker


def _kept_after_forward(cuda: bool, **kwargs) -> int:
    """Bytes an SDPA forward leaves alive (its output and what it saved for backward), q, k, v made before."""
    policy = cuda_gpu() if cuda else torch.enable_grad()
    with policy, fake.fake_tensors():
        q, k, v = (torch.randn(B, H, L, D, requires_grad=True) for _ in range(3))
        if kwargs.get("attn_mask") == "bool":
            kwargs["attn_mask"] = torch.ones(L, L, dtype=torch.bool)
        tracker = _cuda_tracker(cuda)
        with tracker:
            out = F.scaled_dot_product_attention(q, k, v, **kwargs)
            kept = tracker.current
            out.sum().backward()
        assert q.grad.shape == q.shape
        return kept


@pytest.mark.parametrize("kwargs", [{"dropout_p": 0.1}, {"dropout_p": 0.1, "is_causal": True},
                                    {"dropout_p": 0.1, "attn_mask": "bool"}, {}])
def test_attention_with_or_without_dropout_keeps_the_output_and_a_log_sum_exp(kwargs):
    # fp32 on an H100: neither cuDNN nor flash takes fp32; memory-efficient attention keeps the output and a fp32
    # log-sum-exp (128 queries, already a multiple of 32), with or without dropout (its seed and offset are host
    # tensors). A boolean mask is turned into a float one before the kernel (L x L fp32, kept for backward as the
    # kernel's input): 65,536 bytes more.
    mask = L * L * 4 if kwargs.get("attn_mask") == "bool" else 0
    assert _kept_after_forward(True, **kwargs) == OUT + LSE + mask


def test_a_mask_that_needs_a_gradient_gets_one_from_memory_efficient_attention():
    # cuDNN refuses a mask that needs a gradient and flash takes no mask; memory-efficient attention computes it.
    with cuda_gpu() as device, fake.fake_tensors():
        sites = device.find(CudaSdpa).sites
        q, k, v = (torch.randn(B, H, L, D, requires_grad=True) for _ in range(3))
        bias = torch.zeros(L, L, requires_grad=True)
        with _cuda_tracker(True):
            F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=0.1).sum().backward()
        assert bias.grad.shape == (L, L)
        assert [s.backend for s in sites.summary().sites] == ["efficient"]


def test_a_cpu_prediction_keeps_the_math_paths_weights_with_dropout():
    # The CPU has no fused kernel with dropout: its math path keeps queries x keys matrices besides the output.
    assert _kept_after_forward(False, dropout_p=0.1) > OUT + WEIGHTS


@pytest.mark.parametrize("op", [torch.softmax, torch.log_softmax])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_softmax_of_a_half_input_reads_it_directly_as_cuda_does(op, dtype):
    # Under autocast, softmax runs in fp32 (dtype=float32 given). CUDA reads a float16 input directly
    # (_softmax with half_to_float): only the fp32 output, 64 x 1000 x 4 = 256,000 bytes. A bfloat16 input (and any
    # input off CUDA) is copied to fp32 first: a second 256,000 bytes for a moment.
    with cuda_gpu(), fake.fake_tensors():
        x = torch.randn(64, 1000, dtype=dtype, requires_grad=True)
        tracker = StorageTracker(trace=True)
        with tracker, torch.autocast("cpu", dtype=torch.float16):
            y = op(x, -1)
        assert y.dtype == torch.float32
        allocs = [e.size for e in tracker.trace if e.kind == "alloc"]
        assert allocs == ([256_000] if dtype == torch.float16 else [256_000, 256_000])
        y.sum().backward()
        assert x.grad.dtype == dtype


N, C = 256, 1024  # a dropout's input: 262,144 elements


def _dropout_keeps(cuda: bool, dropout, dtype=torch.float32) -> int:
    """Bytes a dropout leaves alive (its output and what it keeps for backward), its input made before."""
    policy = cuda_gpu() if cuda else torch.enable_grad()
    with policy, fake.fake_tensors():
        x = torch.randn(N, C, dtype=dtype, requires_grad=True)
        tracker = StorageTracker()
        with tracker:
            y = dropout(x)
            kept = tracker.current
            y.sum().backward()
        assert x.grad.shape == x.shape
        return kept


@pytest.mark.parametrize("dropout", [lambda x: F.dropout(x, 0.1), lambda x: torch.dropout(x, 0.1, True),
                                     torch.nn.Dropout(0.1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_training_dropout_keeps_a_boolean_mask_as_cuda_does(dropout, dtype):
    # CUDA fuses it (native_dropout): the output in the input's dtype plus a one-byte mask, 262,144 bytes.
    out = N * C * dtype.itemsize
    assert _dropout_keeps(True, dropout, dtype) == out + N * C
    # The CPU keeps a noise tensor of the input's dtype instead: twice the output (what a CUDA prediction kept).
    assert _dropout_keeps(False, dropout, dtype) == 2 * out


def _dropout_allocations(dropout) -> list[int]:
    """The sizes a dropout of a [N, C] fp32 input allocates, in order, on a CUDA prediction's tracker."""
    with cuda_gpu(), fake.fake_tensors():
        x = torch.randn(N, C, requires_grad=True)
        tracker = StorageTracker(trace=True)
        tracker.kernels = CudaKernels(gpus.gpu("H100"), workspace_bytes=0)
        with tracker:
            dropout(x)
        return [e.size for e in map(TraceEvent.of, tracker.trace) if e.kind == "alloc"]


def test_cudas_fused_dropout_allocates_its_mask_before_its_output():
    # Dropout.cu's dropout_cuda: the bool mask (262,144 B), then the fp32 output (1 MiB); the fake kernel makes the
    # output first. Its shortcuts keep the fake kernel's order: train=False (a clone, then a mask of ones) and p = 1.
    assert _dropout_allocations(lambda x: F.dropout(x, 0.1)) == [N * C, N * C * 4]
    assert _dropout_allocations(lambda x: torch.native_dropout(x, 0.1, False)) == [N * C * 4, N * C]
    assert _dropout_allocations(lambda x: torch.native_dropout(x, 1.0, True)) == [N * C * 4, N * C]


@pytest.mark.parametrize("dropout", [lambda x: F.dropout(x, 0.1, training=False),
                                     lambda x: torch.dropout(x, 0.1, False),
                                     lambda x: F.dropout(x, 0.0), lambda x: F.dropout(x, 1.0),
                                     lambda x: F.dropout(x * 1, 0.1, inplace=True)])
def test_a_dropout_cuda_does_not_fuse_runs_as_before(dropout):
    # Out of training or with p = 0, dropout returns its input (nothing new); p = 1 multiplies by a zero; in place,
    # CUDA runs the same unfused path as the CPU: the x * 1 copy (1 MiB) and the noise (1 MiB) it keeps.
    assert _dropout_keeps(True, dropout) == _dropout_keeps(False, dropout)


def test_checkpointing_recomputes_the_same_fused_dropout_in_backward():
    # Checkpointing reruns the forward inside backward and checks that it saves tensors of the same dtypes: the
    # boolean mask both times (a torch function mode, off within backward, would recompute the CPU's fp32 noise).
    # Kept after the forward: the output (1 MiB) only, the mask being recomputed.
    def kept():
        with cuda_gpu(), fake.fake_tensors():
            x = torch.randn(N, C, requires_grad=True)
            tracker = StorageTracker()
            with tracker:
                y = torch.utils.checkpoint.checkpoint(lambda t: F.dropout(t, 0.1), x, use_reentrant=False)
                kept = tracker.current
                y.sum().backward()
            assert x.grad.shape == x.shape
            return kept
    assert kept() == N * C * 4


def test_checkpointed_attention_with_dropout_is_recomputed_as_it_ran():
    # Backward recomputes a checkpointed forward on the autograd engine's thread: the CUDA kernel choice is made at
    # the dispatcher, so the recomputation runs the same kernel, saves the same tensors, and torch.utils.checkpoint
    # accepts them (a torch function mode would be off there: a CheckpointError in `membench predict --workload
    # hf:gpt2 --techniques ckpt`). Kept after the forward: the output only.
    def kept() -> int:
        with cuda_gpu(), fake.fake_tensors():
            q, k, v = (torch.randn(B, H, L, D, requires_grad=True) for _ in range(3))
            tracker = _cuda_tracker(True)
            with tracker:
                out = torch.utils.checkpoint.checkpoint(
                    lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.1), q, k, v,
                    use_reentrant=False)
                kept = tracker.current
                out.sum().backward()
            assert q.grad.shape == q.shape
            return kept
    assert kept() == OUT


def test_the_math_path_adds_the_mask_in_place_and_its_safe_softmax_takes_its_masks():
    # fp64 on an H100: no fused kernel takes it, so attention.cpp's math path runs. Its scores (2 x 4 x 128 x 128
    # fp64: 1 MiB) get the mask added in place (`attn.add_(mask)`: a plain run's tensors are not subclass-like, the
    # fake ones are), so no second scores tensor; _safe_softmax then makes its output (1 MiB), its bool mask
    # (131,072 B), row mask (1024 B) and zero (8 B), frees those three, and the scores go as attn is reassigned.
    with cuda_gpu(), fake.fake_tensors():
        q, k, v = (torch.randn(B, H, L, D, dtype=torch.float64, requires_grad=True) for _ in range(3))
        mask = torch.zeros(L, L, dtype=torch.float64)
        tracker = StorageTracker(trace=True)
        tracker.kernels = CudaKernels(gpus.gpu("H100"), workspace_bytes=0)
        with tracker:
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    sizes, events = {}, []
    for event in map(TraceEvent.of, tracker.trace):
        if event.kind == "alloc":
            sizes[event.key] = event.size
        events.append((event.kind, sizes[event.key]))
    scores = B * H * L * L * 8
    at = events.index(("alloc", scores))
    assert events[at:at + 9] == [("alloc", scores), ("alloc", scores), ("alloc", B * H * L * L), ("alloc", B * H * L),
                                 ("alloc", 8), ("free", 8), ("free", B * H * L), ("free", B * H * L * L),
                                 ("free", scores)]
