"""What a CUDA prediction says about its attention: the backend chosen for each kind of call, on each GPU class,
kept in the record (Memory.attention, loaded back typed; records without it still load) and folded into the
one line `predict` prints (predict/emulate/sdpa.py's describe)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from membench.common.typedjson import build_checked, to_plain
from membench.predict import gpus
from membench.predict.emulate import fake
from membench.predict.emulate.kernels import cuda_gpu
from membench.predict.emulate.sdpa import CudaSdpa, describe
from membench.results.schema import Memory

B, H, L, D = 2, 4, 128, 64


def _attention(gpu: str, dtype=torch.bfloat16, **kwargs):
    with cuda_gpu(gpus.gpu(gpu)) as device, fake.fake_tensors():
        sites = device.find(CudaSdpa).sites
        q, k, v = (torch.randn(B, H, L, D, dtype=dtype, requires_grad=True) for _ in range(3))
        F.scaled_dot_product_attention(q, k, v, **kwargs).sum().backward()
        F.scaled_dot_product_attention(q, k, v, **kwargs)  # a second call of the same kind: one site
    return sites.summary()


@pytest.mark.parametrize(("gpu", "backend"), [("T4", "math"), ("V100", "math"), ("A100", "flash"),
                                              ("L4", "flash"), ("H100", "cudnn")])
def test_each_gpu_class_records_its_backend_for_bf16(gpu, backend):
    # bf16 below sm80: no cuDNN or flash, and memory-efficient attention refuses bf16 there; sm80-sm89: flash
    # first; sm90 with the installed cuDNN (> 9.15): cuDNN first.
    attention = _attention(gpu, is_causal=True)
    assert [s.backend for s in attention.sites] == [backend]
    site = attention.sites[0]
    assert (site.query_shape, site.dtype, site.is_causal, site.mask) == ([B, H, L, D], "bfloat16", True, False)
    major, minor = gpus.gpu(gpu).compute_capability
    assert f"on sm{major}{minor}" in attention.rule and attention.rule.startswith("torch 2.")


def test_the_refusals_before_the_choice_are_kept():
    site = _attention("T4").sites[0]
    assert [r.split(":")[0] for r in site.refused] == ["flash", "efficient"]
    assert site.refused[1] == "efficient: dtype bfloat16"


def test_the_record_keeps_the_attention_and_old_records_load():
    attention = _attention("A100", dropout_p=0.1)
    memory = Memory("cuda", "prediction", 1024, "backward", 0, attention=attention)
    plain = to_plain(memory)
    assert build_checked(Memory, plain, "r") == memory
    old = {k: v for k, v in plain.items() if k != "attention"}
    assert build_checked(Memory, old, "r") == dataclasses.replace(memory, attention=None)


def test_the_printed_line_folds_each_backend_once():
    a100, t4 = _attention("A100", dropout_p=0.1), _attention("T4")
    line = describe([a100, a100, t4])
    assert line == (f"attention kernels assumed ({t4.rule}; {a100.rule}): "  # each rule once, sorted
                    "flash for q [2, 4, 128, 64] bfloat16 dropout 0.1; "
                    "math for q [2, 4, 128, 64] bfloat16 (flash: needs sm80-sm121; efficient: dtype bfloat16)")
    assert describe([]) is None
