"""Which attention kernel torch runs on each GPU class (predict/emulate/sdpa_choice.py), worked out by hand from
torch 2.14's sdp_utils.cpp / sdp_utils_cpp.h: priority order, then each backend's constraints in order; and torch
2.11's choices on a real GPU (results/gpu-acceptance/NVIDIA-H200_torch2.11.0.json)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from membench.predict.emulate.sdpa_choice import (
    CUDNN_ORDER,
    DEFAULT_ORDER,
    Call,
    Operand,
    Settings,
    choose,
    gemm_alignment,
    priority,
)

SM90, SM80, SM86, SM89, SM75, SM70 = (9, 0), (8, 0), (8, 6), (8, 9), (7, 5), (7, 0)
# The process as torch 2.14.1 with its bundled cuDNN 9.24 and CUDA 13.0 has it by default: 2.14's rules.
DEFAULTS = Settings(frozenset({"cudnn", "flash", "efficient", "math"}), DEFAULT_ORDER, deterministic=False,
                    cudnn_version=92400, cuda_version=13000, torch_release="2.14")
# torch 2.11.0+cu130 as the H200 run had it: cuDNN 9.19.0, CUDA 13.0.
TORCH_2_11 = dataclasses.replace(DEFAULTS, cudnn_version=91900, torch_release="2.11")
H200_RESULTS = Path(__file__).parents[3] / "results" / "gpu-acceptance" / "NVIDIA-H200_torch2.11.0.json"


def call(b=4, h=12, lq=1024, d=64, dtype=torch.bfloat16, mask=None, dropout=0.0, causal=True, grad=True, lk=None,
         dv=None, offset=0):
    """q, k, v as a fused qkv projection gives them: [B, L, 3, H, D] viewed [B, H, L, D] (non-contiguous)."""
    lk = lk or lq

    def operand(length, size):
        return Operand((b, h, length, size), (length * 3 * h * size, size, 3 * h * size, 1), offset, dtype, grad)

    return Call(operand(lq, d), operand(lk, d), operand(lk, dv or d), mask, dropout, causal, False, True)


def backend(c: Call, cc, settings: Settings = DEFAULTS) -> str:
    return choose(c, cc, settings).backend


def test_the_settings_of_this_process_are_torchs_defaults():
    s = Settings.of_process()
    assert s.enabled == DEFAULTS.enabled and s.order == DEFAULT_ORDER and not s.deterministic
    assert s.cudnn_version == torch.backends.cudnn.version()
    assert s.torch_release == ".".join(torch.__version__.split(".")[:2])


def test_a_torch_that_cannot_say_its_priority_order_has_the_default_one(monkeypatch):
    """torch 2.4 has no _get_sdp_priority_order (nor sdpa_kernel's set_priority): its order is the default."""
    monkeypatch.setattr("membench.private.sdp_priority_order", lambda: None)
    assert Settings.of_process().order == DEFAULT_ORDER


def test_cudnn_comes_first_on_hopper_and_blackwell_only():
    # check_prefer_cudnn_attention: cuDNN > 9.15 and compute capability major 9 or 10; CUDA < 13 wheels also need
    # minor 0 or 3 (sm90, sm100, sm103).
    assert priority(DEFAULTS, SM90) == CUDNN_ORDER
    assert priority(DEFAULTS, (10, 0)) == CUDNN_ORDER
    assert priority(DEFAULTS, SM80) == DEFAULT_ORDER
    assert priority(dataclasses.replace(DEFAULTS, cudnn_version=91500), SM90) == DEFAULT_ORDER
    assert priority(dataclasses.replace(DEFAULTS, cuda_version=12080), (10, 1)) == DEFAULT_ORDER
    assert priority(dataclasses.replace(DEFAULTS, cudnn_preferred=False), SM90) == DEFAULT_ORDER
    # A user's order (sdpa_kernel(..., set_priority=True)) is kept.
    mine = ("efficient", "flash", "math", "cudnn")
    assert priority(dataclasses.replace(DEFAULTS, order=mine), SM90) == mine


@pytest.mark.parametrize("cc, dtype, expected", [
    (SM90, torch.bfloat16, "cudnn"), (SM80, torch.bfloat16, "flash"), (SM86, torch.bfloat16, "flash"),
    (SM89, torch.float16, "flash"),
    # Below sm80 flash does not exist and memory-efficient attention takes only fp16 and fp32: bf16 runs math.
    (SM75, torch.bfloat16, "math"), (SM70, torch.bfloat16, "math"),
    (SM75, torch.float16, "efficient"), (SM70, torch.float16, "efficient"),
    # fp32: cuDNN and flash take only 16-bit types; memory-efficient attention takes fp32 everywhere.
    (SM90, torch.float32, "efficient"), (SM80, torch.float32, "efficient"), (SM75, torch.float32, "efficient"),
])
def test_each_gpu_class_runs_its_kernel(cc, dtype, expected):
    assert backend(call(dtype=dtype), cc) == expected


def test_the_refusals_say_why():
    assert choose(call(), SM75, DEFAULTS).refused == (("flash", "needs sm80-sm121"), ("efficient", "dtype bfloat16"))
    assert choose(call(dtype=torch.float32), SM90, DEFAULTS).refused == (
        ("cudnn", "dtype float32"), ("flash", "dtype float32"))


@pytest.mark.parametrize("d, dtype, cc, expected", [
    # flash pads head sizes to a multiple of 8 itself: any size up to 256.
    (36, torch.bfloat16, SM80, "flash"), (256, torch.bfloat16, SM80, "flash"),
    # Over 256: memory-efficient attention (16-bit head sizes in multiples of 8 on sm80).
    (264, torch.bfloat16, SM80, "efficient"), (260, torch.bfloat16, SM80, "math"),
    # Below sm80, fp16 head sizes must be multiples of 8 (tensor cores), fp32 anything (no tensor cores: 1).
    (36, torch.float16, SM75, "math"), (40, torch.float16, SM75, "efficient"), (34, torch.float32, SM75, "efficient"),
    # On sm80, fp32 head sizes must be multiples of 4.
    (34, torch.float32, SM80, "math"), (36, torch.float32, SM80, "efficient"),
    # cuDNN (2.14): multiples of 8, at most 256 on sm90 with cuDNN > 9.22 (with a backward: <= 128, 192/128 or
    # 256/256).
    (96, torch.bfloat16, SM90, "cudnn"), (200, torch.bfloat16, SM90, "flash"), (256, torch.bfloat16, SM90, "cudnn"),
    (36, torch.bfloat16, SM90, "flash"),
])
def test_head_sizes(d, dtype, cc, expected):
    assert backend(call(d=d, dtype=dtype), cc) == expected


def test_flash_on_sm86_89_has_no_backward_for_head_sizes_192_to_224():
    assert backend(call(d=200), SM86) == "efficient"
    assert backend(call(d=200, grad=False), SM86) == "flash"
    assert backend(call(d=232), SM89) == "flash"  # (224, 256] without dropout is fine
    assert backend(call(d=232, dropout=0.5), SM89) == "efficient"
    assert backend(call(d=200), SM80) == "flash"


def test_a_mask():
    mask = Operand((1024, 1024), (1024, 1), 0, torch.bfloat16, False)
    # flash takes no mask: memory-efficient attention on an A100, cuDNN on an H100.
    assert backend(call(mask=mask, causal=False), SM80) == "efficient"
    assert backend(call(mask=mask, causal=False), SM90) == "cudnn"
    # A mask whose last dimension is broadcast (stride 0) fails every GPU backend's stride check: math.
    broadcast = dataclasses.replace(mask, stride=(1, 0))
    assert backend(call(mask=broadcast, causal=False), SM90) == "math"
    # A mask that needs a gradient: cuDNN refuses it (check_attn_mask_shape); memory-efficient attention gives
    # it one.
    learned = dataclasses.replace(mask, requires_grad=True)
    refused = choose(call(mask=learned, causal=False), SM90, DEFAULTS).refused
    assert refused[0] == ("cudnn", "the mask requires a gradient")
    assert backend(call(mask=learned, causal=False), SM90) == "efficient"


def test_dropout_and_causal_masking():
    # torch 2.14 (and 2.12): cuDNN's dropout resolution is 1/16, so 0.1 is refused, 0.125 taken.
    assert backend(call(dropout=0.1), SM90) == "flash"
    assert backend(call(dropout=0.125), SM90) == "cudnn"
    assert backend(call(dropout=0.1), SM90, dataclasses.replace(DEFAULTS, torch_release="2.12")) == "flash"
    # flash will not mask causally with different query and key lengths.
    assert backend(call(lq=1, lk=1024, grad=False), SM80) == "efficient"
    assert backend(call(lq=1, lk=1024, grad=False, causal=False), SM80) == "flash"


def test_the_enable_flags_and_deterministic_algorithms():
    only_math = dataclasses.replace(DEFAULTS, enabled=frozenset({"math"}))
    assert backend(call(), SM90, only_math) == "math"
    no_cudnn = dataclasses.replace(DEFAULTS, enabled=frozenset({"flash", "efficient", "math"}))
    assert backend(call(), SM90, no_cudnn) == "flash"
    assert backend(call(), SM90, dataclasses.replace(DEFAULTS, deterministic=True)) == "flash"
    with pytest.raises(RuntimeError, match="No available kernel"):
        choose(call(), SM75, dataclasses.replace(DEFAULTS, enabled=frozenset({"flash", "cudnn"})))


def test_sdpa_kernel_contexts_reach_the_settings():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH]):
        assert backend(call(), SM90, Settings.of_process()) == "math"
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION], set_priority=True):
        assert backend(call(), SM80, Settings.of_process()) == "efficient"
    assert backend(call(), SM90, Settings.of_process()) == "cudnn"


def test_memory_efficient_storage_offsets_on_sm80():
    # On sm80+, q, k and v must start at a multiple of the gemm alignment (8 elements in 16-bit: 16 bytes): a view
    # 4 elements into its storage is refused; below sm80 the check does not apply.
    assert gemm_alignment(torch.float16, SM80) == 8 and gemm_alignment(torch.float32, SM80) == 4
    assert gemm_alignment(torch.float16, SM75) == 8 and gemm_alignment(torch.float32, SM75) == 1
    assert backend(call(dtype=torch.float32, offset=4), SM80) == "efficient"
    assert backend(call(dtype=torch.float32, offset=2), SM80) == "math"
    assert backend(call(dtype=torch.float32, offset=2), SM75) == "efficient"


def test_the_torch_release_decides_the_rules_that_changed():
    """torch 2.11 (libtorch_cuda.so of 2.11.0+cu130): no 1/16 dropout check, cuDNN head sizes up to 256 on sm90
    from cuDNN 9.10 with no check of the backward's, no 65535 limit on batch and heads; memory-efficient attention
    checks no storage offsets and takes no grouped-query attention. A release not checked gets 2.14's."""
    assert backend(call(dropout=0.1), SM90, TORCH_2_11) == "cudnn"
    cudnn_first = dataclasses.replace(TORCH_2_11, order=CUDNN_ORDER)  # as a cuDNN newer than 9.15 has it
    assert backend(call(d=256), SM90, dataclasses.replace(cudnn_first, cudnn_version=91000)) == "cudnn"
    assert backend(call(d=256), SM90, dataclasses.replace(cudnn_first, cudnn_version=90900)) == "flash"
    assert backend(call(d=256), SM90, dataclasses.replace(DEFAULTS, cudnn_version=91900)) == "flash"
    assert backend(call(d=256), (10, 0), TORCH_2_11) == "flash"  # 2.11: 256 on sm90 only
    assert backend(call(d=192, dv=128), (10, 0), TORCH_2_11) == "cudnn"
    assert backend(call(d=224), SM90, dataclasses.replace(DEFAULTS, cudnn_version=92400)) == "flash"  # no backward
    assert backend(call(d=224), SM90, TORCH_2_11) == "cudnn"
    assert backend(call(b=70000, lq=64), SM90, TORCH_2_11) == "cudnn"
    assert backend(call(b=70000, lq=64), SM90) == "flash"
    assert backend(call(dtype=torch.float32, offset=2), SM80, TORCH_2_11) == "efficient"
    gqa = dataclasses.replace(call(dtype=torch.float32, causal=False), enable_gqa=True)
    gqa = dataclasses.replace(gqa, key=dataclasses.replace(gqa.key, shape=(4, 4, 1024, 64)),
                              value=dataclasses.replace(gqa.value, shape=(4, 4, 1024, 64)))
    assert backend(gqa, SM80) == "efficient"
    assert backend(gqa, SM80, TORCH_2_11) == "math"
    assert backend(call(dropout=0.1), SM90, dataclasses.replace(DEFAULTS, torch_release="2.13")) == "flash"
    assert backend(call(dropout=0.1), SM90, dataclasses.replace(DEFAULTS, torch_release="2.10")) == "flash"


def test_the_h200_run_of_torch_2_11_chose_as_predicted_for_each_call():
    """benchmarks/gpu_acceptance.py's SDPA_CALLS on an NVIDIA H200 (sm90), torch 2.11.0+cu130, cuDNN 9.19.0:
    torch._fused_sdp_choice's backend for every call equals choose()'s under torch 2.11's rules."""
    results = json.loads(H200_RESULTS.read_text())
    assert results["environment"]["torch"] == "2.11.0+cu130" and results["environment"]["cuda"] == "13.0"
    check = next(c for c in results["checks"] if c["name"] == "SDPA backend choice")
    assert check["figures"]["cudnn"] == 91900
    calls = check["figures"]["calls"]
    assert len(calls) == 108
    differ = []
    for row in calls:
        dtype, d, grad = getattr(torch, row["dtype"]), row["head"], row["grad"]
        qkv = Operand((2, 4, 128, d), (4 * 128 * d, 128 * d, d, 1), 0, dtype, grad)
        mask = Operand((2, 1, 128, 128), (128 * 128, 128 * 128, 128, 1), 0, dtype, False) if row["mask"] else None
        c = Call(qkv, qkv, qkv, mask, row["dropout"], row["causal"], False, grad)
        if choose(c, SM90, TORCH_2_11).backend != row["gpu"]:
            differ.append(row)
    assert not differ
