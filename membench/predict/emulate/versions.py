"""Which torch releases each CUDA emulation's rules were checked on, and the one line a prediction under another
release prints.

Rules read from the installed torch itself follow it whatever its release: the autocast op lists (the wheel's
`autocast_mode.h`, predict/emulate/autocast.py), and Adam's priming, which checks `_init_group`'s signature and
runs the warm-up step where it differs (membench/private.py). The rest was read from one release's source or
binary and is stated here with the releases it was checked on (major.minor); under any other, a CUDA prediction says
which parts may differ. It never refuses: what runs is the installed torch's own training step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Rule:
    part: str  # what of a CUDA prediction follows it
    checked: tuple[str, ...]  # torch releases (major.minor) whose source or binary it was checked against
    source: str  # where it was read


RULES = (
    Rule("reductions' vector widths and scratch", ("2.14",), "Reduce.cuh, and the vectorization the 2.14 binary "
         "picks for 16-bit means (predict/emulate/reductions.py)"),
    Rule("nn.Embedding's backward scratch and cub's storage", ("2.11", "2.14"), "Embedding.cu and "
         "EmbeddingBackwardKernel.cu (its fused pass, pytorch#172454), cub.cuh and CCCL's dispatch code "
         "(predict/emulate/embedding.py, cub.py); 2.11 on an NVIDIA H200's traces, the 2.11 and 2.14 binaries' "
         "kernels, 2.14's cub.cuh and SortingCommon.cuh"),
    Rule("cuBLAS and cuBLASLt workspace sizes", ("2.11", "2.14"), "CublasHandlePool.cpp and "
         "torch.backends.cuda's documentation (cuBLASLt's own workspace before 2.13, gpus.cublaslt_workspace_bytes); "
         "2.11 on the real GPU traces (benchmarks/validate_predictions.py) and on an H200 "
         "(benchmarks/validate_gpu_runs.py)"),
    Rule("CUDA output dtypes (fp32 norm statistics)", ("2.11", "2.14"), "FakeTensorMode on device cuda over the "
         "OpInfo database (benchmarks/cuda_dtypes.py; 2.11 the same four ops as 2.14 with --samples 2; 2.9.1 and "
         "2.6.0 the same but for _batch_norm_with_update, whose CUDA fake kernel needs a GPU there, and 2.4.1's fake "
         "kernels keep layer norm's statistics in the input's dtype, so it cannot tell)"),
    Rule("optimizers' host tensors (CPU step counts)", ("2.4", "2.6", "2.9", "2.11", "2.14"), "torch/optim/adam.py, "
         "adamw.py (2.4's is its own) and _adafactor.py of those wheels (predict/emulate/host.py)"),
    Rule("math attention's in-place mask add and _safe_softmax temporaries", ("2.11", "2.14"), "attention.cpp "
         "(areAnyTensorSubclassLike, _safe_softmax); the 2.11 and 2.14 binaries' CPU runs (torch.profiler: add_, "
         "isneginf, all, scalar_tensor, where); 2.11 on an NVIDIA H200 (the Llama shape's snapshot)"),
    Rule("attention backend choice", ("2.11", "2.12", "2.14"), "sdp_utils.cpp and sdp_utils_cpp.h: 2.14's source "
         "and binary, the 2.11 and 2.12 binaries' constraints and headers; 2.11 on an NVIDIA H200, 108 calls alike "
         "(predict/emulate/sdpa_choice.py, results/gpu-acceptance/)"),
)


def release(version: str | None = None) -> str:
    """'2.14' of '2.14.1+cu130'."""
    return ".".join((version or torch.__version__).split("+")[0].split(".")[:2])


def unchecked(version: str | None = None) -> list[Rule]:
    """The rules not checked on this torch release."""
    this = release(version)
    return [rule for rule in RULES if this not in rule.checked]


def notice(version: str | None = None) -> str | None:
    """One line naming what of a CUDA prediction may differ under this torch release, None where all was checked."""
    rules = unchecked(version)
    if not rules:
        return None
    parts = "; ".join(f"{r.part} (checked on torch {', '.join(r.checked)})" for r in rules)
    return f"torch {version or torch.__version__}: CUDA rules not checked on this release, which may differ: {parts}"
