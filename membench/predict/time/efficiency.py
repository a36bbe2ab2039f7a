"""What fraction of a GPU's peak each kind of kernel reaches, from published measurements and the kernels' own
code; never fitted to the throughput tables the model is checked against (benchmarks/validate_time.py).

Each figure is a `Band`: (slow, central, fast). A prediction is made three times, every figure at its slow end,
its central value and its fast end; the two ends are the range printed beside the central step time. Where a source
gives a range, the band is that range; where it gives one number, the band is that number and the nearest other
published figure of the same kind (said at each one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: The threadblock tiles a GEMM may run with: CUTLASS's default for tensor-core and SIMT GEMMs on sm70-sm90 is
#: 128 x 128 (cutlass/include/cutlass/gemm/device/default_gemm_configuration.h: GemmShape<128, 128, 32> for
#: OpClassTensorOp, <128, 128, 8> for OpClassSimt), and its kernel instances include the halves. NVIDIA's "Matrix
#: Multiplication Background User's Guide" (Deep Learning Performance docs) names the two losses a tile makes: tile
#: quantization (M and N rounded up to whole tiles) and wave quantization (tiles run in waves of one per SM, the
#: last part-empty), and says smaller tiles are less efficient: each loads its operands for fewer FLOPs. Their
#: relative efficiency here is that reuse, tm * tn / (tm + tn) against the 128 x 128 tile's (64); the library is
#: taken to choose the tile that does best (cuBLAS's heuristics choose by shape).
TILES = ((128, 128), (128, 64), (64, 128), (64, 64))
#: cuBLAS splits K across thread blocks when the tiles cannot fill the GPU (CUTLASS's GemmSplitKParallel does the
#: same); each split keeps at least this much of K (a multiple of the tile's K, four k-iterations of 64).
MIN_SPLIT_K = 256


@dataclass(frozen=True)
class Band:
    slow: float
    central: float
    fast: float

    def at(self, end: str) -> float:
        return getattr(self, end)


ENDS = ("slow", "central", "fast")

# Large-GEMM efficiency: Stas Bekman's "Maximum Achievable Matmul FLOPS" table (ml-engineering, compute/accelerator/
# README.md, commit 744d01e, bf16 matmul, best shape of a brute-force search, torch 2.5-2.7): A100 SXM 86.9%, A100
# PCIe 81.1%, H100 SXM 80.3% ("H200 is the same"), GH200 83.8%. That is the best shape; the slow end is the lowest
# NVIDIA row of that table (GB200, 72.9%). GPUs it has not measured get the NVIDIA rows' median (80.3%) with
# their whole spread (72.9-86.9%). The same fraction stands for fp32 and tf32 GEMMs (no such table is published).
_MAMF = {"A100": 0.869, "A100-40GB": 0.869, "H100": 0.803, "H200": 0.803, "H100-PCIe": 0.811}
_MAMF_LOWEST, _MAMF_MEDIAN, _MAMF_HIGHEST = 0.729, 0.803, 0.869


def gemm_peak_fraction(gpu: str) -> Band:
    best = _MAMF.get(gpu)
    if best is None:
        return Band(_MAMF_LOWEST, _MAMF_MEDIAN, _MAMF_HIGHEST)
    return Band(_MAMF_LOWEST, best, best)


def _tile_fraction(batch: int, m: int, n: int, k: int, sm_count: int, tm: int, tn: int) -> float:
    tiles_m, tiles_n = math.ceil(m / tm), math.ceil(n / tn)
    quantized = (m * n) / (tiles_m * tm * tiles_n * tn)
    tiles = batch * tiles_m * tiles_n
    split = max(1, min(sm_count // tiles, k // MIN_SPLIT_K)) if tiles < sm_count else 1
    blocks = tiles * split
    waves = math.ceil(blocks / sm_count)
    reuse = (tm * tn / (tm + tn)) / 64
    return reuse * quantized * blocks / (waves * sm_count)


def gemm_shape_fraction(batch: int, m: int, n: int, k: int, sm_count: int) -> float:
    """Tile and wave quantization of a [batch] x (M x K) @ (K x N) GEMM on `sm_count` SMs, with the best of TILES
    and K split while the tiles leave SMs idle. 1.0 for a GEMM of whole 128 x 128 tiles filling whole waves."""
    return max(_tile_fraction(batch, m, n, k, sm_count, tm, tn) for tm, tn in TILES)


# Fused attention, fraction of the tensor cores' peak, forward and backward alike:
# - flash (FlashAttention-2, torch's flash backend since 2.2): Dao, "FlashAttention-2" (arXiv 2307.08691),
#   abstract: "reaching 50-73% of the theoretical maximum FLOPs/s on A100". On Hopper: Shah et al.,
#   "FlashAttention-3" (arXiv 2407.08608), introduction: "FlashAttention-2 achieves only 35% utilization on the
#   H100"; the band runs to A100's slow end (50%) as the fast end and 35% x 0.85 below.
# - cuDNN (torch picks it first on sm90 from 2.5): the FlashAttention-3 paper's Hopper comparison has cuDNN's fused
#   attention close to FlashAttention-3, "75% utilization" (740 TFLOPs/s fp16); band 35% (FA2's) to 75%.
# - memory-efficient (xformers' CUTLASS kernel): in the FlashAttention-2 paper's A100 benchmarks (figures 4-5)
#   xformers runs at roughly 0.5-0.8x FlashAttention-2's rate (read off the plots, not a stated number): the band
#   is FA2's band scaled by those.
ATTENTION = {
    ("flash", "ampere"): Band(0.50, 0.615, 0.73),
    ("flash", "hopper"): Band(0.30, 0.35, 0.50),
    ("cudnn", "hopper"): Band(0.35, 0.55, 0.75),
    ("efficient", "ampere"): Band(0.25, 0.40, 0.58),
    ("efficient", "hopper"): Band(0.15, 0.25, 0.40),
}


def attention_fraction(backend: str, compute_capability: tuple[int, int]) -> Band:
    """The band for a fused attention backend on a GPU; a backend a generation has no figure for (cuDNN before
    Hopper, where torch does not pick it; anything on Volta and Turing, which only the memory-efficient kernel
    runs on) takes the nearest generation's."""
    generation = "hopper" if compute_capability[0] >= 9 else "ampere"
    if backend == "cudnn" and generation != "hopper":
        backend = "flash"
    return ATTENTION.get((backend, generation), ATTENTION[("efficient", generation)])


# Memory-bound kernels (elementwise, reductions, copies, optimizers), fraction of the datasheet bandwidth:
# BabelStream 5.0 (UoB-HPC) on an H100 NVL: Triad 3.30 TB/s of 3.9 (85%), Copy 3.06 (78%); CUDA samples'
# bandwidthTest device-to-device (read + write counted) on an A100-SXM4-40GB 1,157.5 GB/s of 1,555 (74%) and on a
# T4 239.6 of 320 (75%). Central: the mean of the four (78%).
MEMORY_BANDWIDTH = Band(0.74, 0.78, 0.85)

# PCIe host links: nvbandwidth on 8x H200 (ml-engineering, network/README.md): 55.4 GB/s host-to-device of 63
# (88%), 55.1 device-to-host (87%). NVLink: the same node's pairwise copy 396.4 of 450 GB/s (88%).
LINK = Band(0.80, 0.875, 0.88)

# The host's cost per op dispatched in eager PyTorch (Python, the autograd and ATen dispatchers, the kernel launch):
# "~5-25 µs of CPU-side work per op" (J. Lin, "From PyTorch op to kernel launch", GPU kernel serving lesson 18,
# which itemises the layers); central: their geometric mean.
HOST_PER_OP_S = Band(25e-6, 11e-6, 5e-6)
# Each further kernel an op launches (a foreach op's chunks): cudaLaunchKernel alone, "~1-3 µs on CUDA 12+
# drivers" (the same lesson's table).
HOST_PER_EXTRA_KERNEL_S = Band(3e-6, 2e-6, 1e-6)
