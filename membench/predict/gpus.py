"""The GPUs a CUDA prediction can be for: what of each one changes the memory a training step takes.

A prediction runs on CPU fake tensors; what the GPU decides is added from this table: the cuBLAS workspace each
cuBLAS handle takes from the caching allocator, and the compute capability that decides it (and the attention
kernel); the multiprocessor count and the threads each multiprocessor runs at most, which size the scratch buffers
CUDA's reductions take (predict/emulate/reductions.py); the compute capability picks cub's sort tuning there too.
Memory sizes are the nominal ones the GPUs are sold with (GB as printed on the card's specification); the total a
process can use is a little less (the CUDA context and the driver take their share).
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from dataclasses import dataclass

from membench.common.errors import UserError

DEFAULT_GPU = "H100"


@dataclass(frozen=True)
class Gpu:
    name: str
    compute_capability: tuple[int, int]
    memory_gb: int  # nominal, as sold
    # cudaDeviceProp.multiProcessorCount and .maxThreadsPerMultiProcessor, which ATen's setReduceConfig reads.
    sm_count: int
    max_threads_per_sm: int
    warp_size: int = 32  # every NVIDIA GPU so far

    @property
    def cublas_workspace_bytes(self) -> int:
        return cublas_workspace_bytes(self.compute_capability)

    def describe(self) -> str:
        major, minor = self.compute_capability
        return (f"{self.name} (sm{major}{minor}, {self.memory_gb} GB nominal; cuBLAS workspace "
                f"{self.cublas_workspace_bytes:,} B per handle)")


# SM counts: NVIDIA's datasheets / whitepapers for each product (H100 SXM5 132, H100 PCIe 114, H200 132, A100 108,
# V100 80, L4 58, RTX 4090 128, A10G 80, T4 40). Threads per SM: the CUDA C++ Programming Guide's table of
# technical specifications per compute capability (2048 for 7.0, 8.0 and 9.0; 1536 for 8.6 and 8.9; 1024 for 7.5).
GPUS = {g.name: g for g in (
    Gpu("H100", (9, 0), 80, 132, 2048),  # SXM5
    Gpu("H100-PCIe", (9, 0), 80, 114, 2048),
    Gpu("H200", (9, 0), 141, 132, 2048),
    Gpu("A100", (8, 0), 80, 108, 2048),
    Gpu("A100-40GB", (8, 0), 40, 108, 2048),
    Gpu("V100", (7, 0), 16, 80, 2048),
    Gpu("V100-32GB", (7, 0), 32, 80, 2048),
    Gpu("L4", (8, 9), 24, 58, 1536),
    Gpu("RTX4090", (8, 9), 24, 128, 1536),
    Gpu("A10G", (8, 6), 24, 80, 1536),
    Gpu("T4", (7, 5), 16, 40, 1024),
)}


# Other names of the table's GPUs: what torch.cuda.get_device_name() and nvidia-smi call each card, and the
# spellings of the product's form factor and size. Matched like the table's names: whole, case and the choice of
# space or '-' aside ("h100 sxm5" is H100; "h-1-0-0" is nothing).
ALIASES = {
    "H100": ("H100-SXM", "H100-SXM5", "H100-80GB", "NVIDIA H100 80GB HBM3"),
    "H100-PCIe": ("NVIDIA H100 PCIe",),
    "H200": ("NVIDIA H200",),
    "A100": ("A100-80GB", "A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB"),
    "A100-40GB": ("A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB", "A100-PCIE-40GB", "NVIDIA A100-PCIE-40GB"),
    "V100": ("V100-16GB", "V100-SXM2-16GB", "Tesla V100-SXM2-16GB", "V100-PCIE-16GB", "Tesla V100-PCIE-16GB"),
    "V100-32GB": ("V100-SXM2-32GB", "Tesla V100-SXM2-32GB", "V100-PCIE-32GB", "Tesla V100-PCIE-32GB"),
    "L4": ("NVIDIA L4",),
    "RTX4090": ("RTX 4090", "GeForce RTX 4090", "NVIDIA GeForce RTX 4090"),
    "A10G": ("NVIDIA A10G",),
    "T4": ("Tesla T4",),
}


def _key(name: str) -> str:
    return " ".join(name.replace("-", " ").split()).casefold()


_BY_KEY = {_key(alias): GPUS[name] for name, aliases in ALIASES.items() for alias in (name, *aliases)}
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
        return Target(gpu(DEFAULT_GPU), f"the default {DEFAULT_GPU}: no CUDA GPU here")
    try:
        return Target(gpu(local), f"this machine's GPU ({local})")
    except UserError:
        return Target(gpu(DEFAULT_GPU), f"the default {DEFAULT_GPU}: this machine's {local} is not in the table "
                                        f"(--gpu names one: {', '.join(GPUS)})")


def gpu(name: str | None) -> Gpu:
    """The GPU of that name or alias (ALIASES; case, spaces and '-' aside), or one line naming the valid ones. None
    is the default GPU; any text must name one (an empty one names none)."""
    if name is None:
        name = DEFAULT_GPU
    found = _BY_KEY.get(_key(name)) if isinstance(name, str) and len(name) <= 100 else None
    if found is None:
        shown = repr(name) if not isinstance(name, str) or len(name) <= 60 else repr(name[:60]) + "..."
        raise UserError(f"unknown --gpu {shown}; valid: {', '.join(GPUS)} (or the name torch or nvidia-smi gives "
                        "the card, e.g. 'NVIDIA H100 80GB HBM3')")
    return found


# Compute capability majors whose default cuBLAS workspace is 32 MiB: Hopper (9) and Blackwell (10, 12), as
# parseChosenWorkspaceSize reads `properties->major` in the 2.14-era CublasHandlePool.cpp (earlier releases: sm90
# only; a later one adds 11). No GPU of the table has major 10 or 12 yet; a torch outside versions.py's checked
# releases is said in the output.
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
