"""What of each GPU sets how fast a training step runs: dense peak FLOP/s per dtype, memory bandwidth, and the
links that move bytes off the card. Keyed by the names of predict/gpus.py's table (the `spec` helper's one GPU
table keeps the same names); the figures that change memory stay there, the ones that change time live here.

Every figure is the vendor's, for the product the table's name stands for, dense (the datasheets' sparsity figures
halved where only those are printed). fp32 is the CUDA cores' rate (torch's default matmul precision "highest"
runs no TF32); fp16 is the tensor cores' rate with fp32 accumulation, which cuBLAS uses for torch's fp16 GEMMs
(on GeForce cards that is half the fp16-accumulate rate printed first). None: the GPU has no such tensor core (a
GEMM in that dtype runs on the CUDA cores, or not at all: V100 and T4 have no bf16, tf32 or fp8 tensor cores).

Sources (vendor datasheets and whitepapers; the same figures are tabulated in Stas Bekman's ml-engineering,
compute/accelerator/README.md, "TFLOPS comparison table", for the H100, H200 and A100):
- H100 SXM5 / H100 PCIe: NVIDIA H100 Tensor Core GPU datasheet (2022/2023): FP32 67 / 51, TF32 989* / 756*,
  BF16 and FP16 1,979* / 1,513*, FP8 3,958* / 3,026* TFLOPS (* with sparsity); HBM3 3.35 / 2.0 TB/s; NVLink 900 /
  600 GB/s (bridge); PCIe Gen5 128 GB/s (both directions).
- H200 SXM: NVIDIA H200 datasheet (2024): as the H100 SXM's compute; HBM3e 4.8 TB/s; NVLink 900 GB/s; PCIe Gen5.
- A100 80GB SXM / A100 40GB: NVIDIA A100 datasheet (2021): FP32 19.5, TF32 156, BF16/FP16 312 TFLOPS dense;
  HBM2e 2,039 GB/s (80GB SXM) / HBM2 1,555 GB/s (40GB); NVLink 600 GB/s; PCIe Gen4 64 GB/s.
- V100 SXM2 16/32 GB: NVIDIA Tesla V100 datasheet (2018): FP32 15.7, Tensor 125 TFLOPS; HBM2 900 GB/s; NVLink 300
  GB/s; PCIe Gen3 32 GB/s. (The PCIe card is slower: 14 / 112 TFLOPS; the table's "V100" is the SXM2 module.)
- L4: NVIDIA L4 datasheet (2023): FP32 30.3, TF32 120*, BF16/FP16 242*, FP8 485* TFLOPS; 300 GB/s; PCIe Gen4.
- RTX 4090: NVIDIA Ada Lovelace architecture whitepaper (v1.0, 2022), GeForce RTX 4090 column: FP32 82.6; TF32
  82.6; FP16 and BF16 with FP32 accumulate 165.2; FP8 with FP32 accumulate 330.3 TFLOPS (dense); GDDR6X 1,008 GB/s.
- A10G (AWS G5; NVIDIA publishes no datasheet for it): Baseten, "NVIDIA A10 vs A10G for ML model inference"
  (2023), from AWS's figures: FP32 31.2, TF32 35, BF16/FP16 70 TFLOPS dense; 600 GB/s; PCIe Gen4. A second-hand
  source: the least sure figures of the table.
- T4: NVIDIA T4 datasheet (2019): FP32 8.1, mixed-precision FP16/FP32 65 TFLOPS; 320 GB/s; PCIe Gen3.
- H100 NVL / H200 NVL: the H100 and H200 datasheets' NVL columns: FP32 60, TF32 835*, BF16/FP16 1,671*, FP8
  3,341* TFLOPS; 3.9 TB/s (H100 NVL), 4.8 TB/s (H200 NVL); NVLink bridge 600 / 900 GB/s; PCIe Gen5.
- L40S / L40: NVIDIA L40S and L40 datasheets: FP32 91.6 / 90.5, TF32 366* / 181*, BF16/FP16 362.05 / 181 dense, FP8
  1,466* / 724* TFLOPS; 864 GB/s; PCIe Gen4.
- A10: NVIDIA A10 datasheet: FP32 31.2, TF32 125*, BF16/FP16 250* TFLOPS; 600 GB/s; PCIe Gen4. A40: NVIDIA A40
  datasheet: FP32 37.4, TF32 149.6*, BF16 299.4* (FP16 with FP32 accumulate as BF16) TFLOPS; 696 GB/s; PCIe Gen4.
- B200 (SXM): ml-engineering's TFLOPS comparison table (NVIDIA's HGX figures): FP32 80, TF32 1,125, BF16/FP16
  2,250, FP8 4,500 TFLOPS; its memory table: HBM3e 8.0 TB/s. NVLink 1,800 GB/s and PCIe Gen5 (NVIDIA's B200 page).
- The table's other cards (RTX 3090, RTX 3080, RTX A6000, RTX 2060, RTX 5090) have no figures here yet: a
  prediction for them prints no step time.

PCIe figures are per direction (x16 Gen3 16 GB/s, Gen4 32 GB/s, Gen5 64 GB/s: the PCI-SIG's raw rates); NVLink
figures are the datasheets' per-GPU totals over both directions.
"""

from __future__ import annotations

from dataclasses import dataclass

from membench.common.errors import UserError

TERA = 1e12
GB = 1e9  # vendors' GB/s are 10**9 bytes a second


@dataclass(frozen=True)
class GpuSpeed:
    """Dense peak FLOP/s per compute dtype (None: no such unit), memory bandwidth and link speeds, in bytes/s."""

    name: str
    fp32: float
    tf32: float | None
    fp16: float | None
    bf16: float | None
    fp8: float | None
    memory_bandwidth: float
    pcie: float  # host link, per direction
    nvlink: float | None  # per GPU, both directions
    source: str

    def peak(self, compute: str) -> float:
        """The dense peak for a compute dtype ("fp32", "tf32", "fp16", "bf16", "fp8"); a dtype this GPU has no
        tensor core for runs at the CUDA cores' fp32 rate (as cuBLAS falls back)."""
        rate = getattr(self, compute, None)
        return rate if rate else self.fp32


_H100 = dict(fp32=67 * TERA, tf32=494.5 * TERA, fp16=989.5 * TERA, bf16=989.5 * TERA, fp8=1979 * TERA)
_A100 = dict(fp32=19.5 * TERA, tf32=156 * TERA, fp16=312 * TERA, bf16=312 * TERA, fp8=None)
_V100 = dict(fp32=15.7 * TERA, tf32=None, fp16=125 * TERA, bf16=None, fp8=None)
_GEN3, _GEN4, _GEN5 = 16 * GB, 32 * GB, 64 * GB
_NVL = dict(fp32=60 * TERA, tf32=417.5 * TERA, fp16=835.5 * TERA, bf16=835.5 * TERA, fp8=1670.5 * TERA)

SPEEDS = {s.name: s for s in (
    GpuSpeed("H100", **_H100, memory_bandwidth=3350 * GB, pcie=_GEN5, nvlink=900 * GB,
             source="NVIDIA H100 datasheet, SXM5"),
    GpuSpeed("H100-PCIe", fp32=51 * TERA, tf32=378 * TERA, fp16=756.5 * TERA, bf16=756.5 * TERA, fp8=1513 * TERA,
             memory_bandwidth=2000 * GB, pcie=_GEN5, nvlink=600 * GB, source="NVIDIA H100 datasheet, PCIe"),
    GpuSpeed("H200", **_H100, memory_bandwidth=4800 * GB, pcie=_GEN5, nvlink=900 * GB,
             source="NVIDIA H200 datasheet, SXM"),
    GpuSpeed("A100", **_A100, memory_bandwidth=2039 * GB, pcie=_GEN4, nvlink=600 * GB,
             source="NVIDIA A100 datasheet, 80GB SXM"),
    GpuSpeed("A100-40GB", **_A100, memory_bandwidth=1555 * GB, pcie=_GEN4, nvlink=600 * GB,
             source="NVIDIA A100 datasheet, 40GB"),
    GpuSpeed("V100", **_V100, memory_bandwidth=900 * GB, pcie=_GEN3, nvlink=300 * GB,
             source="NVIDIA V100 datasheet, SXM2"),
    GpuSpeed("V100-32GB", **_V100, memory_bandwidth=900 * GB, pcie=_GEN3, nvlink=300 * GB,
             source="NVIDIA V100 datasheet, SXM2"),
    GpuSpeed("L4", fp32=30.3 * TERA, tf32=60 * TERA, fp16=121 * TERA, bf16=121 * TERA, fp8=242.5 * TERA,
             memory_bandwidth=300 * GB, pcie=_GEN4, nvlink=None, source="NVIDIA L4 datasheet"),
    GpuSpeed("RTX4090", fp32=82.6 * TERA, tf32=82.6 * TERA, fp16=165.2 * TERA, bf16=165.2 * TERA, fp8=330.3 * TERA,
             memory_bandwidth=1008 * GB, pcie=_GEN4, nvlink=None, source="NVIDIA Ada whitepaper, RTX 4090"),
    GpuSpeed("A10G", fp32=31.2 * TERA, tf32=35 * TERA, fp16=70 * TERA, bf16=70 * TERA, fp8=None,
             memory_bandwidth=600 * GB, pcie=_GEN4, nvlink=None, source="Baseten's A10 vs A10G (AWS figures)"),
    GpuSpeed("T4", fp32=8.1 * TERA, tf32=None, fp16=65 * TERA, bf16=None, fp8=None,
             memory_bandwidth=320 * GB, pcie=_GEN3, nvlink=None, source="NVIDIA T4 datasheet"),
    GpuSpeed("H100-NVL", **_NVL, memory_bandwidth=3900 * GB, pcie=_GEN5, nvlink=600 * GB,
             source="NVIDIA H100 datasheet, NVL"),
    GpuSpeed("H200-NVL", **_NVL, memory_bandwidth=4800 * GB, pcie=_GEN5, nvlink=900 * GB,
             source="NVIDIA H200 datasheet, NVL"),
    GpuSpeed("L40S", fp32=91.6 * TERA, tf32=183 * TERA, fp16=362 * TERA, bf16=362 * TERA, fp8=733 * TERA,
             memory_bandwidth=864 * GB, pcie=_GEN4, nvlink=None, source="NVIDIA L40S datasheet"),
    GpuSpeed("L40", fp32=90.5 * TERA, tf32=90.5 * TERA, fp16=181 * TERA, bf16=181 * TERA, fp8=362 * TERA,
             memory_bandwidth=864 * GB, pcie=_GEN4, nvlink=None, source="NVIDIA L40 datasheet"),
    GpuSpeed("A10", fp32=31.2 * TERA, tf32=62.5 * TERA, fp16=125 * TERA, bf16=125 * TERA, fp8=None,
             memory_bandwidth=600 * GB, pcie=_GEN4, nvlink=None, source="NVIDIA A10 datasheet"),
    GpuSpeed("A40", fp32=37.4 * TERA, tf32=74.8 * TERA, fp16=149.7 * TERA, bf16=149.7 * TERA, fp8=None,
             memory_bandwidth=696 * GB, pcie=_GEN4, nvlink=112.5 * GB, source="NVIDIA A40 datasheet"),
    GpuSpeed("B200", fp32=80 * TERA, tf32=1125 * TERA, fp16=2250 * TERA, bf16=2250 * TERA, fp8=4500 * TERA,
             memory_bandwidth=8000 * GB, pcie=_GEN5, nvlink=1800 * GB, source="ml-engineering's table, B200 SXM"),
)}


def speed(name: str) -> GpuSpeed:
    """The figures for a GPU of predict/gpus.py's table, by its table name."""
    if name not in SPEEDS:
        raise UserError(f"no speed figures for GPU {name!r}; known: {', '.join(SPEEDS)}")
    return SPEEDS[name]
