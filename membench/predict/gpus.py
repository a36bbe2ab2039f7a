"""What of a GPU changes the memory a training step takes, beyond the table's figures (membench/spec/gpu.py).

A prediction runs on CPU fake tensors; what the GPU decides is added from its `Gpu`: the cuBLAS workspace each
cuBLAS handle takes from the caching allocator, and the compute capability that decides it (and the attention
kernel); the multiprocessor count and the threads each multiprocessor runs at most, which size the scratch buffers
CUDA's reductions take (predict/emulate/reductions.py); the compute capability picks cub's sort tuning there too.
Here too: the GPU a prediction is for when --gpu is not given (`default_target`), and the cuBLAS workspaces.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from dataclasses import dataclass

from membench.common.errors import UserError
from membench.spec.gpu import ALIASES, DEFAULT_GPU, GPUS, Gpu, find, gpu

__all__ = ["ALIASES", "DEFAULT_GPU", "GPUS", "Gpu", "gpu"]  # the table's names, read here by earlier code and tests


@dataclass(frozen=True)
class Target:
    """The GPU a CUDA prediction is for when --gpu is not given, and why, in words for the output."""

    gpu: Gpu
    why: str


def local_gpu_name() -> str | None:
    """The name torch gives this machine's first CUDA GPU; None where torch sees none. Asked in a child process:
    naming the device initialises CUDA, after which this process could not fork (fit's workers do)."""
    import torch

    if not torch.cuda.is_available():  # counts devices without initialising CUDA
        return None
    return _asked_name()


@functools.cache
def _asked_name() -> str | None:
    """Once per process: planning and the output's line both ask."""
    asked = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.get_device_name(0))"],
                           capture_output=True, text=True, timeout=120)
    return asked.stdout.strip() or None if asked.returncode == 0 else None


def default_target() -> Target:
    """This machine's GPU when torch sees one the table knows (by the name torch gives it), else DEFAULT_GPU."""
    local = local_gpu_name()
    if local is None:
        return Target(GPUS[DEFAULT_GPU], f"the default {DEFAULT_GPU}: no CUDA GPU here")
    if (card := find(local)) is not None:
        return Target(card, f"this machine's GPU ({local})")
    return Target(GPUS[DEFAULT_GPU], f"the default {DEFAULT_GPU}: this machine's {local} is not in the table "
                                    f"(--gpu names one: {', '.join(GPUS)})")


def predicted_for(run) -> Gpu:
    """The GPU a CUDA prediction of RunSpec `run` is for: the one it names (`card`), else DEFAULT_GPU."""
    return run.card or GPUS[DEFAULT_GPU]


def runs_on(compute_capability: tuple[int, int], arch_list: list[str]) -> bool:
    """Whether code built for `arch_list` (torch.cuda.get_arch_list(): "sm_90", "compute_90", "sm_90a") runs on a
    card of this compute capability. The CUDA C++ Programming Guide, "Binary Compatibility": a cubin for X.y runs on
    X.z with z >= y only (an architecture-specific "a" cubin on X.y alone); "PTX Compatibility": PTX for a compute
    capability is compiled by the driver for any card of that one or higher."""
    for arch in arch_list:
        kind, _, version = arch.partition("_")
        digits = version.rstrip("af")
        if not digits.isdigit() or len(digits) < 2:
            continue
        built = (int(digits[:-1]), int(digits[-1]))
        if kind == "compute" and built <= compute_capability:
            return True
        if kind == "sm" and (built == compute_capability or (
                not version.endswith("a") and built[0] == compute_capability[0] and built[1] <= compute_capability[1])):
            return True
    return False


def arch_note(card: Gpu, arch_list: list[str] | None = None) -> str | None:
    """One line where the installed torch has no code for `card` (its torch.cuda.get_arch_list(), which the wheel
    answers without a GPU): a run there fails at its first kernel, so the prediction is for a setup that cannot run
    as installed. None where it has, and for a torch built without CUDA (which no GPU runs: the card's own torch
    is not known here)."""
    import torch

    archs = torch.cuda.get_arch_list() if arch_list is None else arch_list
    if not archs or runs_on(card.compute_capability, archs):
        return None
    return (f"warning: torch {torch.__version__} was built for {' '.join(archs)}, not for {card.name} ({card.sm}): "
            "a run there stops at its first kernel (\"no kernel image is available\"); predicted as if it could run")


# Compute capability majors whose default cuBLAS workspace is 32 MiB: Hopper (9) and Blackwell (10, 12), as
# parseChosenWorkspaceSize reads `properties->major` in the 2.14-era CublasHandlePool.cpp (earlier releases: sm90
# only; a later one adds 11). A torch outside versions.py's checked releases is said in the output.
LARGE_WORKSPACE_MAJORS = (9, 10, 12)


def cublas_workspace_bytes(compute_capability: tuple[int, int], env: dict | None = None) -> int:
    """What torch gives each cuBLAS handle (aten/src/ATen/cuda/CublasHandlePool.cpp, parseChosenWorkspaceSize,
    torch 2.x): CUBLAS_WORKSPACE_CONFIG (":SIZE_KiB:COUNT" pairs, summed) when set, else 4096 KiB x 8 on
    LARGE_WORKSPACE_MAJORS and 4096 KiB x 2 + 16 KiB x 8 elsewhere. It is allocated through the caching allocator."""
    default = 4096 * 1024 * 8 if compute_capability[0] in LARGE_WORKSPACE_MAJORS else 4096 * 1024 * 2 + 16 * 1024 * 8
    config = (os.environ if env is None else env).get("CUBLAS_WORKSPACE_CONFIG")
    if not config:
        return default
    chosen = workspace_from_config(config)
    if chosen is None:
        _warn_unparsed(config, default)
        return default
    return chosen


#: The first torch release whose cuBLASLt shares its handle's cuBLAS workspace unless TORCH_CUBLASLT_UNIFIED_WORKSPACE
#: says otherwise: 2.13's torch.backends.cuda.blas_workspace_size documents the unified workspace as "the default on
#: open-source CUDA builds" (2.12's documents no such thing). Before it the unification is opt-in
#: (`check_env("TORCH_CUBLASLT_UNIFIED_WORKSPACE") == true` in CublasHandlePool.cpp), and on a real NVIDIA H200
#: torch 2.11.0 held a separate 1 MiB block for each thread that ran a biased addmm
#: (results/gpu-runs/NVIDIA-H200_torch2.11.0.tar.xz: -1 MiB per such thread in every prediction that lacked it).
UNIFIED_LT_FROM = (2, 13)
_TRUE, _FALSE = ("1", "ON", "YES", "TRUE", "Y"), ("0", "OFF", "NO", "FALSE", "N")  # c10::utils::check_env


def cublaslt_workspace_bytes(release: str, env: dict | None = None) -> int:
    """What cuBLASLt (addmm with a bias epilogue) takes from the caching allocator for each cuBLAS handle and stream
    beyond the handle's cuBLAS workspace, under torch `release` ("2.11"): 0 where the two are unified, else
    CUBLASLT_WORKSPACE_SIZE KiB (getCUDABlasLtWorkspaceSize: default 1024 KiB; a value it cannot read, or one out of
    range, makes torch warn and take the default)."""
    env = os.environ if env is None else env
    unified_flag = env.get("TORCH_CUBLASLT_UNIFIED_WORKSPACE", "").strip().upper()
    major, minor = (int(part) for part in release.split(".")[:2])
    unified = unified_flag not in _FALSE if (major, minor) >= UNIFIED_LT_FROM else unified_flag in _TRUE
    if unified:
        return 0
    text = env.get("CUBLASLT_WORKSPACE_SIZE", "").strip()
    kib = int(text) if text.isdigit() and 0 < int(text) < 2**31 else 1024
    return kib * 1024


def workspace_from_config(config: str) -> int | None:
    """CUBLAS_WORKSPACE_CONFIG read as torch reads it (parseChosenWorkspaceSize): every ":SIZE:COUNT" found anywhere
    in it (std::regex ":([0-9]+):([0-9]+)", searched for, not matched whole), SIZE x 1024 x COUNT summed in 64-bit
    unsigned arithmetic, which wraps; None where no pair is found (torch then warns and takes its default). A number
    std::stoull cannot read (2**64 or more) makes torch raise, and a total of 2**63 bytes or more is no tensor
    torch can make (a GPU is out of memory at once): both are refused, in one line."""
    pairs = re.findall(r":([0-9]+):([0-9]+)", config)
    if not pairs:
        return None
    shown = config if len(config) <= 60 else config[:60] + "..."
    if any(len(n) > 20 or int(n) >= 2**64 for pair in pairs for n in pair):
        raise UserError(f"CUBLAS_WORKSPACE_CONFIG={shown!r}: a number past 2**64 - 1, which torch cannot read "
                        "(std::stoull out of range: its first cuBLAS call raises); e.g. :4096:8")
    total = sum(int(size) * 1024 * int(count) for size, count in pairs) % 2**64
    if total >= 2**63:
        raise UserError(f"CUBLAS_WORKSPACE_CONFIG={shown!r} asks each cuBLAS handle for {total:,} B (torch "
                        "multiplies in 64 bits, wrapping): every GPU is out of memory at the first matmul; "
                        "e.g. :4096:8")
    return total


@functools.cache
def _warn_unparsed(config: str, default: int) -> None:
    """Once per process (torch warns once per handle)."""
    shown = config if len(config) <= 60 else config[:60] + "..."
    print(f"membench: warning: CUBLAS_WORKSPACE_CONFIG={shown!r} has no :SIZE:COUNT pair; torch warns (\"Could "
          f"not parse CUBLAS_WORKSPACE_CONFIG\") and uses its default, {default:,} B per handle, as predicted here",
          file=sys.stderr)
