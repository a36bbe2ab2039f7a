"""One attention forward and backward on each GPU class, as a CUDA prediction sees it: the kernel torch chooses
(predict/emulate/sdpa_choice.py) and what that kernel allocates, keeps and frees (predict/emulate/
attention_kernels.py), worked out by hand from torch 2.14's attention.cu, attention_backward.cu, flash_api.cpp,
MHA.cpp, the memory-efficient kernels' headers and the cuDNN frontend's SDPA backward node.

Events are written "+bytes" for an allocation (the requested size) and "-bytes" for the free of an earlier one.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from membench.predict import gpus
from membench.predict.emulate import fake
from membench.predict.emulate.attention_kernels import (
    backward_kernel,
    cudnn_engine_backward_bytes,
    cudnn_workspace_bytes,
    efficient_workspace_bytes,
    flash_split_kv,
)
from membench.predict.emulate.kernels import CudaKernels, cuda_gpu
from membench.predict.emulate.sdpa import CudaSdpa
from membench.trackers.storage import StorageTracker

H100, A100, L4, T4, V100 = (gpus.gpu(n) for n in ("H100", "A100", "L4", "T4", "V100"))
B, H, L, D = 2, 3, 100, 40  # q, k, v [2, 3, 100, 40]: 24,000 elements, 48,000 bytes in 16-bit
QKV = B * L * H * D * 2


def _events(trace, sizes: dict) -> list[str]:
    out = []
    for event in trace:
        if event[0] == "alloc":
            sizes[event[1]] = event[2]
            out.append(f"+{event[2]}")
        else:
            out.append(f"-{sizes.get(event[1], '?')}")
    return out


def attention(gpu, dtype=torch.bfloat16, grad="dense", d=D, **kwargs):
    """(forward events, backward events, bytes kept after the forward, backend) of one call on q, k, v made
    [B, L, H, d] and viewed [B, H, L, d], with a dense output gradient or (grad="sum") out.sum()'s."""
    with cuda_gpu(gpu) as device, fake.fake_tensors():
        sites = device.find(CudaSdpa).sites
        q, k, v = (torch.empty(B, L, H, d, dtype=dtype).transpose(1, 2).requires_grad_() for _ in range(3))
        g = torch.empty(B, L, H, d, dtype=dtype).transpose(1, 2) if grad == "dense" else None
        tracker = StorageTracker(trace=True)
        tracker.kernels = CudaKernels(gpu, workspace_bytes=0)
        with tracker:
            out = F.scaled_dot_product_attention(q, k, v, **kwargs)
            kept, forward = tracker.current, len(tracker.trace)
            if grad == "dense":
                out.backward(g)
            else:
                out.sum().backward()
        assert q.grad.shape == q.shape
        sizes = {}
        return _events(tracker.trace[:forward], sizes), _events(tracker.trace[forward:], sizes), kept, \
            sites.summary().sites[0].backend


def test_sm90_cudnn():
    # _cudnn_attention_forward: seed and offset (8 B each, on the GPU) first; run_cudnn_SDP_fprop: the output in
    # the query's layout (48,000 B) and the fp32 stats [B, H, L, 1] (2,400 B); the graph's workspace, the 256 B
    # the engine took in every forward call on an H200 (cuDNN 9.19; none of the frontend's), freed as it returns.
    fwd, bwd, kept, backend = attention(H100)
    assert backend == "cudnn"
    assert fwd == ["+8", "+8", f"+{QKV}", "+2400", "+256", "-256"]
    assert kept == QKV + 2400 + 16
    # Backward: dq, dk, dv; the workspace: the frontend's fp32 softmax sum [B, H, L] (2,400 B) and dQ accumulator
    # [B, H, L, D] (96,000 B) = 98,400 B, and the engine's 256 B, one allocation freed as the kernel returns; then
    # autograd lets go of the saved output, stats, seed, offset, and of the output gradient.
    assert cudnn_workspace_bytes(B, H, L, D, deterministic=False) == 98_400
    assert bwd[:5] == [f"+{QKV}"] * 3 + ["+98656", "-98656"]


def test_outputs_nothing_saves_are_let_go_first_to_last_as_atens_tuple_is():
    # In a non-reentrant checkpoint's first forward autograd saves nothing (its saved-tensor hooks pack none), so
    # only the output outlives the call: ATen's std::tuple of the rest is destroyed first to last, the stats before
    # the seed and offset (a Python tuple lets go last to first), as the H200's Llama-shape trace shows.
    with cuda_gpu(H100), fake.fake_tensors():
        q, k, v = (torch.empty(B, L, H, D, dtype=torch.bfloat16).transpose(1, 2).requires_grad_() for _ in range(3))
        tracker = StorageTracker(trace=True)
        tracker.kernels = CudaKernels(H100, workspace_bytes=0)
        with tracker, torch.autograd.graph.saved_tensors_hooks(lambda t: None, lambda packed: packed):
            out = F.scaled_dot_product_attention(q, k, v)
    assert out.shape == q.shape
    assert _events(tracker.trace, {}) == ["+8", "+8", f"+{QKV}", "+2400", "+256", "-256", "-2400", "-8", "-8"]


def test_cudnn_grouped_query_backward_holds_every_query_heads_dk_and_dv():
    # The Llama shape the H200 ran (results/gpu-traces/): queries [4, 16, 1024, 64] over 4 key/value heads, bf16.
    # The frontend's workspace: softmax sum 4 x 16 x 1024 x 4 B = 262,144 B and dQ accumulator x 64 = 16,777,216 B;
    # the engine's: 256 B, and dK and dV for all 16 query heads before the per-group sums, [4, 16, 1024, 64] bf16 =
    # 8,388,608 B each. Together 33,816,832 B: the one workspace each backward call took on the GPU.
    q = torch.empty(4, 16, 1024, 64, dtype=torch.bfloat16, device="meta")
    kv = torch.empty(4, 4, 1024, 64, dtype=torch.bfloat16, device="meta")
    assert cudnn_workspace_bytes(4, 16, 1024, 64, deterministic=False) == 262_144 + 16_777_216
    assert cudnn_engine_backward_bytes(q, kv, kv) == 256 + 2 * 8_388_608
    assert cudnn_workspace_bytes(4, 16, 1024, 64, False) + cudnn_engine_backward_bytes(q, kv, kv) == 33_816_832
    # Without grouping (as many key/value heads as query heads) the engine keeps only its 256 B.
    assert cudnn_engine_backward_bytes(q, q, q) == 256


def test_sm90_cudnn_copies_an_output_gradient_without_a_unit_stride():
    # out.sum()'s gradient is a zero-stride expansion: run_cudnn_SDP_bprop materializes it in the output's layout
    # (48,000 B) after dq, dk, dv and before the workspace, and lets it go after (the sum and its 0-dim gradient
    # come first: 2 B each).
    _, bwd, _, _ = attention(H100, grad="sum")
    assert bwd[:9] == ["+2", "+2"] + [f"+{QKV}"] * 3 + [f"+{QKV}", "+98656", "-98656", f"-{QKV}"]


def test_sm80_flash():
    # mha_fwd: out = empty_like(q) (48,000 B), the fp32 log-sum-exp [B, H, L] (2,400 B), the RNG state (16 B) and
    # a spare (8 B). Split-KV: B x H x ceil(L / 64) = 12 query blocks < 0.8 x 2 x 108 SMs, but one key block
    # (ceil(100 / 256)): one split, no accumulators.
    fwd, bwd, kept, backend = attention(A100)
    assert backend == "flash"
    assert fwd == [f"+{QKV}", "+2400", "+16", "+8"]
    assert kept == QKV + 2400 + 24
    # mha_bwd: dq, dk, dv; softmax_d fp32 [B, H, L rounded to 128] = 3,072 B; dq_accum fp32 [B, 128, H, D rounded
    # to 32 = 64] = 196,608 B; both let go when it returns (dq_accum first).
    assert bwd[:7] == [f"+{QKV}"] * 3 + ["+3072", "+196608", "-196608", "-3072"]


def test_sm80_flash_pads_the_head_size_and_splits_keys_when_queries_are_few():
    # A head size of 36: attention.cpp pads q, k, v to 40 (three [2, 3, 100, 40] copies, 48,000 B each) and
    # slices the output back.
    fwd, _, _, _ = attention(A100, d=36)
    assert fwd[:4] == [f"+{QKV}"] * 3 + [f"+{QKV}"]
    # num_splits_heuristic on an A100 (216 "SMs" at 128 threads a block): 1 x 4 heads x 16 query blocks = 64;
    # 1024 keys are 4 blocks of 256; efficiencies 0.30, 0.59, (3 splits: not eligible), 0.59: 2 splits.
    assert flash_split_kv(1, 4, 1024, 1024, 64, A100.sm_count) == 2
    # An L4 (116): 0.55, 0.55, -, 0.74: 4 splits; with 2 sequences, 128 blocks >= 0.8 x 116: none.
    assert flash_split_kv(1, 4, 1024, 1024, 64, L4.sm_count) == 4
    assert flash_split_kv(2, 4, 1024, 1024, 64, L4.sm_count) == 1


def test_sm89_flash_and_its_backward_head_size_limit():
    fwd, bwd, _, backend = attention(L4)
    assert backend == "flash" and fwd == [f"+{QKV}", "+2400", "+16", "+8"]
    assert bwd[:7] == [f"+{QKV}"] * 3 + ["+3072", "+196608", "-196608", "-3072"]
    # Training with a head size of 200 has no flash backward on sm86/sm89: memory-efficient attention.
    assert attention(L4, d=200)[3] == "efficient"


def test_sm75_memory_efficient_attention_in_fp16():
    # _efficient_attention_forward: the output (48,000 B), the fp32 log-sum-exp padded to 32 queries [2, 3, 128]
    # (3,072 B); seed and offset are host tensors (not counted).
    fwd, bwd, kept, backend = attention(T4, dtype=torch.float16)
    assert backend == "efficient"
    assert fwd == [f"+{QKV}", "+3072"]
    assert kept == QKV + 3072
    # Backward: dq, dk, dv; the first sm75 fp16 kernel for a head size of 40 is 64 x 64 with max_k 64: it keeps
    # dK/dV in registers and computes delta itself (fp32 [B, H, L]: 2,400 B); its workspace holds the dQ tiles of
    # split keys: per (batch, head) ceil(100 / 64) x ceil(40 / 64) tiles of 16 B + 64 x 64 x 4 B = 8,200 floats,
    # x 6 x 4 B = 196,800 B. delta, local to the kernel-launching lambda, goes when it returns, before the
    # workspace (attention_backward.cu; so on an H200's traces).
    kernel = backward_kernel(torch.float16, (7, 5), D, False, L, L)
    assert (kernel.block_i, kernel.block_j, kernel.max_k, kernel.output_in_rf) == (64, 64, 64, True)
    assert efficient_workspace_bytes(kernel, B, H, L, L, D, D) == 196_800
    assert bwd[:7] == [f"+{QKV}"] * 3 + ["+2400", "+196800", "-2400", "-196800"]


def test_sm75_bf16_runs_the_math_path_and_keeps_the_fp32_weights():
    # No flash below sm80 and no bf16 memory-efficient kernel: math. Kept after the forward, as
    # _scaled_dot_product_attention_math leaves them for backward: q x its scale and k^T x its scale (fp32
    # copies, 96,000 B each), the fp32 attention weights B x H x L x L (240,000 B), v in fp32 (96,000 B), and the
    # bf16 output (48,000 B).
    fwd, _, kept, backend = attention(T4)
    assert backend == "math"
    weights = B * H * L * L * 4
    assert kept == 3 * 2 * QKV + weights + QKV
    assert f"+{weights}" in fwd


def test_sm70_memory_efficient_attention_takes_the_sequence_aligned_kernel():
    # sm70 fp16 has kernels for lengths that are multiples of the block (64): same blocks, same workspace.
    kernel = backward_kernel(torch.float16, (7, 0), 64, False, 128, 128)
    assert kernel.seq_aligned and (kernel.block_i, kernel.block_j) == (64, 64)
    assert not backward_kernel(torch.float16, (7, 0), 64, False, 100, 100).seq_aligned


def test_fp32_memory_efficient_backward_makes_delta_out_of_the_kernel():
    # fp32: the kernel does not compute delta: (grad_out.float() * out.float()) [B, L, H, D] (96,000 B), its sum
    # over D [B, L, H] (2,400 B), the transposed contiguous delta (2,400 B); the expression's temporaries go as it
    # ends, the last made first: the sum, then the product (as an H200's traces show). Workspace on sm80: the
    # 64 x 64 fp32 kernel accumulates dQ tiles: 196,800 B as above; delta goes before it.
    _, bwd, _, backend = attention(A100, dtype=torch.float32)
    assert backend == "efficient"
    qkv = 2 * QKV
    assert bwd[:11] == [f"+{qkv}"] * 3 + ["+96000", "+2400", "+2400", "-2400", "-96000", "+196800", "-2400",
                                           "-196800"]


@pytest.mark.parametrize("gpu", [H100, A100, T4])
def test_a_boolean_mask_is_made_additive_before_the_kernel(gpu):
    # attention.cpp: where(~mask, -65504 (cuDNN) or -inf, 0): the zero (a one-element tensor on the mask's device,
    # or a host tensor for cuDNN), the inverted mask (10,000 B), the additive mask in the query's dtype.
    with cuda_gpu(gpu), fake.fake_tensors():
        q, k, v = (torch.empty(B, L, H, D, dtype=torch.float16).transpose(1, 2) for _ in range(3))
        mask = torch.ones(L, L, dtype=torch.bool)
        tracker = StorageTracker(trace=True)
        tracker.kernels = CudaKernels(gpu, workspace_bytes=0)
        with tracker:
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        events = _events(tracker.trace, {})
    zero = [] if gpu is H100 else ["+2"]
    assert events[:len(zero) + 2] == zero + ["+10000", "+20000"]
