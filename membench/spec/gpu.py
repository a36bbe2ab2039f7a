"""The one table of GPUs: what membench knows of each card (memory, multiprocessors, compute capability, peak
FLOP/s per dtype, the CUDA context), and the one rule that matches a name to a card.

`--gpu` is read here once, at the edge (the CLI's argument type, `RunSpec.validated`), into a `Gpu`: a name of the
table, an alias (the name torch.cuda.get_device_name() or nvidia-smi gives the card), or a card by its properties,
`sm86,sms=58,mem=16GiB`. A record keeps the text (`RunSpec.gpu`); `RunSpec.card` is its `Gpu`.
Imports no torch: the CLI's help lists the table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from membench.common.errors import UserError
from membench.common.units import parse_bytes

DEFAULT_GPU = "H100"

# What a training process holds outside the caching allocator (the CUDA context, cuBLAS's and cuDNN's handles, the
# kernels loaded lazily, torch's default since 1.13), measured on an NVIDIA H200 with torch 2.11.0+cu130 (CUDA 13.0,
# driver 580.159.04) after a matmul, cuDNN attention and a convolution ran forward and backward: 804,061,184 B
# (648,871,936 B right after CUDA started; benchmarks/gpu_acceptance.py's "CUDA context",
# results/gpu-acceptance/). One figure for every GPU and driver, none other measured: the context differs between
# them and grows with the kernels a run loads. (pytorch/pytorch#86509's 287,047,680 B, CUDA 11, was 2.8x too low
# there.)
CUDA_CONTEXT_BYTES = 804_061_184
CUDA_CONTEXT_SOURCE = ("measured on an NVIDIA H200 (torch 2.11, CUDA 13.0, driver 580) after a matmul, cuDNN "
                       "attention and a convolution; other GPUs and drivers differ")

# cudaDeviceProp.maxThreadsPerMultiProcessor by compute capability: the CUDA C++ Programming Guide's "Maximum
# number of resident threads per SM". That table itself was not among the sources reachable here; what confirms each:
# - 7.5 = 1024: a Tesla T4's deviceQuery, "Maximum number of threads per multiprocessor: 1024" ("NVIDIA 显卡信息",
#   https://chiemon.github.io/2024/12/25/%E6%98%BE%E5%8D%A1%E4%BF%A1%E6%81%AF.html).
# - 8.0 = 2048: an A100-SXM4-80GB's deviceQuery (https://gist.github.com/gengwg/3520df2ebf8872e5ee4818367e3a4122).
# - 8.6 = 1536: "maximum number of threads per block for sm_86 is 1536", citing the Guide's features and technical
#   specifications (https://github.com/pytorch/pytorch/pull/45889).
# - 8.9 = 1536: an L4's deviceQuery (kamelth/COE506_Project, README.md: "Maximum number of threads per
#   multiprocessor:  1536").
# - 8.6, 8.9, 12.0 = 1536 and 8.0, 9.0, 10.0 = 2048: a third party's reading of the Guide, oxicuda-launch's
#   SmVersion::max_warps_per_sm (https://docs.rs/oxicuda-launch/0.4.1/oxicuda_launch/telemetry/enum.SmVersion.html).
# - 7.0 = 2048: a Tesla V100-SXM2-16GB's deviceQuery ("Maximum number of threads per multiprocessor:  2048"), in
#   public repository text found with the search tool's find_string (repository not identified).
# - 7.2, 8.7, 10.3 = 2048: not confirmed from a source here (the Guide's figure as remembered).
# A card given by its properties takes its figure from here.
THREADS_PER_SM = {(7, 0): 2048, (7, 2): 2048, (7, 5): 1024, (8, 0): 2048, (8, 6): 1536, (8, 7): 2048,
                  (8, 9): 1536, (9, 0): 2048, (10, 0): 2048, (10, 3): 2048, (12, 0): 1536}


@dataclass(frozen=True)
class Gpu:
    name: str
    compute_capability: tuple[int, int]
    memory_bytes: int
    # cudaDeviceProp.multiProcessorCount and .maxThreadsPerMultiProcessor, which ATen's setReduceConfig reads.
    sm_count: int
    max_threads_per_sm: int
    # Dense peak FLOP/s by compute dtype, for MFU: (("fp32", ...), ("bf16", ...)); () where no sheet says.
    peak_flops: tuple[tuple[str, float], ...] = ()
    memory_label: str = ""  # the memory as sold ("80 GB") or as given ("16 GiB")
    given: bool = False  # a card described by its properties (--gpu smXY,...), not one of the table
    warp_size: int = 32  # every NVIDIA GPU so far

    def peak(self, dtype: str) -> float | None:
        return dict(self.peak_flops).get(dtype)

    @property
    def sm(self) -> str:
        major, minor = self.compute_capability
        return f"sm{major}{minor}"

    def assumed(self) -> str:
        """What a prediction for a card given by its properties takes from elsewhere, in words ("" for the table's
        cards)."""
        if not self.given:
            return ""
        return (f"a card given by its properties: {self.max_threads_per_sm} threads per multiprocessor (the CUDA "
                f"C++ Programming Guide's figure for {self.sm}), warp {self.warp_size}; memory as given")


def _card(name: str, cc: tuple[int, int], memory_gb: int, sms: int, peaks: tuple = ()) -> Gpu:
    """A card of the table: nominal memory in GB (10**9 B, as printed on its specification; a process can use a
    little less), threads per SM by its compute capability."""
    return Gpu(name, cc, memory_gb * 10**9, sms, THREADS_PER_SM[cc], peaks, f"{memory_gb} GB")


# Peak FLOP/s per dtype, DENSE throughout: the tensor-core figures without sparsity (half a sheet's starred "with
# sparsity" numbers); fp32 is the non-tensor figure (PyTorch's default matmul precision "highest", no TF32).
# H100 SXM / PCIe: NVIDIA's H100 table as reproduced in "NVIDIA H100" (hpctech,
# https://archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100.html): FP32 67 / 51, BF16 1,979* / 1,513* TFLOPS
# ("* Shown with sparsity"), i.e. 989.5 / 756.5 dense, kept as 989 / 756 (rounded down, under 0.1%); the SXM's dense
# 989.4 also in "H100" (https://glennklockwood.com/garden/processors/h100).
H100_SXM = (("fp32", 67e12), ("bf16", 989e12))
H100_PCIE = (("fp32", 51e12), ("bf16", 756e12))
# H100 NVL and H200 NVL: FP32 60, BF16 1,671* (835 dense): NOT confirmed from a source here (no NVIDIA NVL sheet was
# found; "H100 NVL" at https://gpu.blog/gpus/nvidia-h100-nvl gives FP32 67 and a "dense BF16" of 133, the non-tensor
# rate, so it confirms neither figure).
NVL = (("fp32", 60e12), ("bf16", 835e12))
# A100 (40 and 80 GB, PCIe and SXM alike): FP32 19.5, BF16 312 dense / 624*: "NVIDIA A100 40GB with NVLINK"
# (https://upb-pc2.atlassian.net/wiki/spaces/PC2DOK/pages/1900609/NVIDIA+A100+40GB+with+NVLINK) and "A100"
# (https://glennklockwood.com/garden/processors/A100, citing NVIDIA's A100 datasheet).
A100_PEAKS = (("fp32", 19.5e12), ("bf16", 312e12))
# L4: FP32 30.29 ("NVIDIA L4 vs NVIDIA Tesla M40", https://fpsbench.com/compare/gpu/nvidia-l4-vs-nvidia-tesla-m40);
# FP16 tensor 242* with sparsity ("NVIDIA L4 vs L40S", https://grokipedia.com/page/NVIDIA_L4_vs_L40S). BF16 121 dense
# takes BF16 = FP16 tensor rate: not confirmed from a source here (the sheet's BF16 row was not seen).
L4_PEAKS = (("fp32", 30.3e12), ("bf16", 121e12))
# L40S and L40: NVIDIA's L40/L40S table as reproduced by a reseller ("NVIDIA L40/L40S",
# https://www.mullet.se/product.html?product_id=355414): FP32 91.6 / 90.5, BF16 362.05 | 733* / 181.05 | 362.1*.
L40S_PEAKS = (("fp32", 91.6e12), ("bf16", 362.05e12))
L40_PEAKS = (("fp32", 90.5e12), ("bf16", 181.05e12))
# A40: the A40 data sheet as reproduced by a reseller, FP32 37.4, BF16 149.7 | 299.4*:
# https://www.ecer.com/corp/details-uuuedqa-p1bsay9-multi-display-setups-supported-by-48gb-gddr6-ecc-memory-nvidia-a40-gpu-and-vga-outputs.html  # noqa: E501
A40_PEAKS = (("fp32", 37.4e12), ("bf16", 149.7e12))

# Each card: compute capability, memory in GB as the vendor states it, multiprocessors; each figure cited.
# What a device reports (cudaDeviceProp.totalGlobalMem, found in public device reports cited per card below) is NOT
# "a little less" than GB x 10**9 on the HBM cards: A100-80GB 85,198,045,184 B, A100-40GB 42,405,855,232 B,
# V100-16GB 16,928,342,016 B, V100-32GB 34,089,926,656 B, H200 150,109,945,856 B (143,156 MiB), B200
# 191,514,017,792 B (182,642 MiB): there the vendor's "GB" is nearer a GiB, and the figures here understate the
# capacity by 6 to 6.5%. On the GDDR cards it holds: T4 15,843,721,216 B, L4 23,612,293,120 B. Kept as stated (fit
# verdicts depend on them); reported to the lead.
# Compute capability, unless said otherwise: "CUDA GPU Compute Capability" (https://developer.nvidia.com/cuda-gpus):
# 12.0 GeForce RTX 5090; 10.0 B200; 9.0 H200, H100; 8.9 L4, L40, L40S, GeForce RTX 4090; 8.6 A40, A10, RTX A6000,
# GeForce RTX 3090. V100 7.0: "Legacy CUDA GPU Compute Capability" (https://developer.nvidia.com/cuda-legacy-gpus).
GPUS = {g.name: g for g in (
    # H100 SXM5 132 SMs, PCIe 114, both 80 GB: hpctech's reproduction of NVIDIA's H100 table (above).
    _card("H100", (9, 0), 80, 132, H100_SXM),  # SXM5
    _card("H100-PCIe", (9, 0), 80, 114, H100_PCIE),
    # H100 NVL 94 GB: "H100 NVL" (https://www.aiminingco.com/gpu/h100-nvl/specs) and "NVIDIA H100 PCIe, SXM5 & NVL
    # GPU Comparison" (https://www.server-parts.eu/post/nvidia-h100-pcie-vs-sxm5-gpu-comparison); 132 SMs: device
    # reports in public repository text found with find_string (repositories not identified): "NVIDIA H100 NVL, 132
    # SMs, 95 GB, driver 580.159.04" and "NVIDIA H100 NVL, 132 SM, 63 MB L2"; also gpu.blog's page (above).
    _card("H100-NVL", (9, 0), 94, 132, NVL),
    # H200 141 GB: MLCommons' system description "H200-SXM-141GB"
    # (https://raw.githubusercontent.com/mlcommons/inference_results_v4.1/main/closed/NVIDIA/systems/H200-SXM-141GBx8_TRT_MaxQ.json),  # noqa: E501
    # and for SXM and NVL alike "NVIDIA H200" ("141 GB at 4.8 TB/s on its SXM and NVL boards";
    # https://aiwiki.ai/wiki/nvidia_h200/raw); 132 SMs (SXM): "NVIDIA H200 vs B300"
    # (https://itkb.uw.cz/2026/06/nvidia-h200-vs-b300-precisions-cores.html). Dense peaks as the H100 SXM: same page
    # (FP16/BF16 ~989 dense). A device report: "_CudaDeviceProperties(name='NVIDIA H200', major=9, minor=0,
    # total_memory=143156MB, multi_processor_count=132" (ai-bot-pro/achatbot,
    # deploy/modal/src/llm/vllm/vlm/skywork_r1v.py). H200 NVL: 132 SMs, cc 9.0 in a device report
    # found with find_string ("NVIDIA H200 NVL, 132 SMs, CC 9.0, max SM clock 1785 MHz, power limit 600 W").
    _card("H200", (9, 0), 141, 132, H100_SXM),
    _card("H200-NVL", (9, 0), 141, 132, NVL),
    # A100: 108 SMs and cc 8.0 in two deviceQuery outputs, the 40 GB card's (42,405,855,232 B; upb-pc2 page above)
    # and the 80 GB SXM4's (85,198,045,184 B; gengwg's gist above); 40 and 80 GB: glennklockwood's "A100" (above).
    _card("A100", (8, 0), 80, 108, A100_PEAKS),
    _card("A100-40GB", (8, 0), 40, 108, A100_PEAKS),
    # V100 80 SMs, 16 GB: NVIDIA's Volta table as reproduced in "NVIDIA Volta Tesla V100 Cards Detailed"
    # (https://www.techrival.com/nvidia-volta-tesla-v100-cards-detailed-150w-single-slot-300w-dual-slot-gv100-powered-pcie-accelerators/).  # noqa: E501
    # Device reports (deviceQuery outputs in public repository text, found with the search tool's find_string; the
    # repositories were not identified): "Tesla V100-SXM2-16GB ... (080) Multiprocessors ... 16928342016 bytes" and
    # "Tesla V100-SXM2-32GB ... (080) Multiprocessors ... 34089926656 bytes", both cc 7.0: 32 GB and 80 SMs confirmed.
    _card("V100", (7, 0), 16, 80),
    _card("V100-32GB", (7, 0), 32, 80),
    # L4 58 SMs, cc 8.9, 1536 threads/SM: a deviceQuery of "NVIDIA L4" ("(58) Multiprocessors, (128) CUDA Cores/MP:
    # 7424 CUDA Cores", "Maximum number of threads per multiprocessor: 1536", 23,612,293,120 B; kamelth/COE506_Project,
    # README.md). Spec pages disagree and are wrong on this: fpsbench (above) lists 7,424 shading units but "SM Count
    # 60"; "NVIDIA L4" (https://pcpartdb.com/gpus/view/nvidia-l4) lists 7,680 CUDA cores. 24 GB: fpsbench (above).
    _card("L4", (8, 9), 24, 58, L4_PEAKS),
    # RTX 4090 128 SMs, 24 GB: "NVIDIA GeForce RTX 4090" (16,384 of AD102's 18,432 cores, 128 RT cores, 24 GB;
    # https://www.notebookcheck.pl/NVIDIA-NVIDIA-GeForce-RTX-4090.677670.0.html) and "NVIDIA GeForce RTX 4090 GPU
    # Family Specifications" (16,384 CUDA cores, 128 per Ada SM, so 128 SMs; 24 GB;
    # https://www.thefpsreview.com/gpu-family/nvidia-geforce-rtx-4090-gpu-family-specifications).
    _card("RTX4090", (8, 9), 24, 128),
    # L40S 142 SMs, 18,176 shading units, 48 GB: TechPowerUp's L40S entry as reproduced by a shop ("SM Count 142"):
    # https://m.reach.dog/shop/computizer/products/nvidia-l40s-48gb-gddr6-graphics-card-for-ai-and-graphics-performance
    # L40 48 GB and 18,176 CUDA cores, 142 RT cores (one per SM): mullet.se's L40/L40S table (above), so 142 SMs.
    _card("L40S", (8, 9), 48, 142, L40S_PEAKS),
    _card("L40", (8, 9), 48, 142, L40_PEAKS),
    # A10G (AWS's A10 variant, not the A10; not in NVIDIA's compute-capability list): 80 SMs and cc 8.6 from a device
    # report, "_CudaDeviceProperties(name='NVIDIA A10G', major=8, minor=6, total_memory=22587MB,
    # multi_processor_count=80" (TorchCodec's tutorial "Accelerated video decoding on GPUs with CUDA and NVDEC",
    # basic_cuda_example, meta-pytorch/torchcodec docs). 24 GB: only a third party's catalog ("gpu catalog",
    # https://huggingface.co/RajBhope/gpu-runtime-predictor/blob/main/gpu_catalog.json, whose 9,216 CUDA cores for
    # the A10G are the A10's); the device's 22,587 MiB (23,684,186,112 B) fits a 24 GB GDDR6 card.
    _card("A10G", (8, 6), 24, 80),
    # A10 (not A10G) 72 SMs, 9,216 shaders, 24 GB: TechPowerUp's data as reproduced in "NVIDIA A10 PCIe vs NVIDIA
    # Quadro RTX 4000" (https://sysrqmts.com/ru/gpus/compare/nvidia-a10-pcie-vs-nvidia-quadro-rtx-4000).
    _card("A10", (8, 6), 24, 72),
    # RTX 3090 82 SMs, 24 GB: "NVIDIA GeForce RTX 3090 Ti: full specs" ("82 SM units and 10496 CUDA cores on the
    # RTX 3090"; https://www.tweaktown.com/news/84164/nvidia-geforce-rtx-3090-ti-full-specs-price-performance-details/index.html)  # noqa: E501
    # and "Nvidia GeForce RTX 3090 Specifications" (82 SMs, 24 GB;
    # https://holynerdvana.blogspot.com/2022/10/nvidia-geforce-rtx-3090-specifications.html).
    _card("RTX3090", (8, 6), 24, 82),
    # RTX 3080: the original 10 GB card of 2020, 68 SMs ("Nvidia RTX 3080 specs": 8,704 cores "arrayed across 68
    # streaming multiprocessors", 10GB; https://www.monsterpc-sg.com/custom-rig/21_nvidia-rtx-3080-founders-edition-review.html);  # noqa: E501
    # not the 12 GB card of 2022 (70 SMs, 12 GB;
    # https://sysrqmts.com/tr/gpus/compare/nvidia-geforce-rtx-3080-12-gb-vs-nvidia-rtx-a4000). cc 8.6: NVIDIA's
    # list is cut off after "GeForce RTX 3" in the copy here; "NVIDIA GPU Compute Capability"
    # (https://qiita.com/araroux/items/e07e817cdf020bbd84a1) gives RTX 3080 8.6.
    _card("RTX3080", (8, 6), 10, 68),
    # RTX A6000 84 SMs, 48 GB: "NVIDIA A16 PCIe vs NVIDIA RTX A6000"
    # (https://sysrqmts.com/tr/gpus/compare/nvidia-a16-pcie-vs-nvidia-rtx-a6000).
    _card("A6000", (8, 6), 48, 84),
    # A40 48 GB, 10,752 CUDA cores and 84 RT cores (one per SM), so 84 SMs: the A40 sheet at ecer.com (above).
    _card("A40", (8, 6), 48, 84, A40_PEAKS),
    # T4 40 SMs, cc 7.5: its deviceQuery (chiemon.github.io, above; 15,843,721,216 B); 16 GB and SM count 40:
    # "NVIDIA RTX A4000 vs NVIDIA Tesla T4" (https://sysrqmts.com/pt/gpus/compare/nvidia-rtx-a4000-vs-nvidia-tesla-t4).
    _card("T4", (7, 5), 16, 40),
    # RTX 2060 (TU106) 30 SMs, 6 GB: TechPowerUp's review "EVGA GeForce RTX 2060 XC Ultra"
    # (https://techpowerup.com/review/evga-geforce-rtx-2060-xc-ultra/single-page.html: 1,920 CUDA cores "spread
    # across 30 out of 36 streaming multiprocessors", 6 GB GDDR6); cc 7.5: qiita's list (above).
    _card("RTX2060", (7, 5), 6, 30),
    # B200 memory: 180 GB as NVIDIA's HGX B200 specification states it ("180GB HBM3E | 7.7TB/s" per GPU, up to 1.4 TB
    # for 8, as reproduced at https://zdszero.github.io/Computer/Artificial_Intelligence/Hardware.html). The 192 GB
    # often quoted ("B200", https://glennklockwood.com/garden/processors/B200: "192 GB HBM3 (8 stacks)") is the
    # HBM on the package by that page; and an HGX B200's nvidia-smi shows "179 GB" ("NVIDIA HGX B200 Hardware Overview",
    # https://docs.vultr.com/inference-cookbook/cuda/getting-started/hardware-overview). A device report:
    # "_CudaDeviceProperties(name='NVIDIA B200', major=10, minor=0, total_memory=182642MB,
    # multi_processor_count=148" (ai-bot-pro/achatbot, deploy/modal/src/llm/vllm/vlm/skywork_r1v.py): 148 SMs and
    # cc 10.0 confirmed, and 191.5e9 B total, so a process sees MORE than the 180e9 B here (kept as the vendor
    # states it; see the note above GPUS). Also 18,944 shaders = 148 x 128 ("NVIDIA B200 vs NVIDIA GB200",
    # https://hmc-tech.com/gpu/nvidia-b200-vs-nvidia-gb200).
    _card("B200", (10, 0), 180, 148),
    # RTX 5090 (GB202) 170 SMs, 21,760 shaders, 32 GB: "Nvidia GeForce RTX 5090" (Linux Format, May 2025,
    # https://pocketmags.com/linux-format-magazine/may-2025/articles/nvidia-geforce-rtx-5090).
    _card("RTX5090", (12, 0), 32, 170),
)}


# Other names of the table's GPUs: what torch.cuda.get_device_name() and nvidia-smi call each card, and the
# spellings of the product's form factor and size. Matched like the table's names: whole, case and the choice of
# space or '-' aside ("h100 sxm5" is H100; "h-1-0-0" is nothing).
ALIASES = {
    "H100": ("H100-SXM", "H100-SXM5", "H100-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA H100"),
    "H100-PCIe": ("NVIDIA H100 PCIe",),
    "H100-NVL": ("NVIDIA H100 NVL",),
    "H200": ("NVIDIA H200",),
    "H200-NVL": ("NVIDIA H200 NVL",),
    "A100": ("A100-80GB", "A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", "A100-PCIE-80GB", "NVIDIA A100 80GB PCIe"),
    "A100-40GB": ("A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB", "A100-PCIE-40GB", "NVIDIA A100-PCIE-40GB"),
    "V100": ("V100-16GB", "V100-SXM2-16GB", "Tesla V100-SXM2-16GB", "V100-PCIE-16GB", "Tesla V100-PCIE-16GB"),
    "V100-32GB": ("V100-SXM2-32GB", "Tesla V100-SXM2-32GB", "V100-PCIE-32GB", "Tesla V100-PCIE-32GB"),
    "L4": ("NVIDIA L4",),
    "RTX4090": ("RTX 4090", "GeForce RTX 4090", "NVIDIA GeForce RTX 4090"),
    "L40S": ("NVIDIA L40S",),
    "L40": ("NVIDIA L40",),
    "A10G": ("NVIDIA A10G",),
    "A10": ("NVIDIA A10",),
    "RTX3090": ("RTX 3090", "GeForce RTX 3090", "NVIDIA GeForce RTX 3090"),
    "RTX3080": ("RTX 3080", "GeForce RTX 3080", "NVIDIA GeForce RTX 3080"),
    "A6000": ("RTX A6000", "NVIDIA RTX A6000"),
    "A40": ("NVIDIA A40",),
    "T4": ("Tesla T4",),
    "RTX2060": ("RTX 2060", "GeForce RTX 2060", "NVIDIA GeForce RTX 2060"),
    "B200": ("NVIDIA B200",),
    "RTX5090": ("RTX 5090", "GeForce RTX 5090", "NVIDIA GeForce RTX 5090"),
}


def _key(name: str) -> str:
    return " ".join(name.replace("-", " ").split()).casefold()


_BY_KEY = {_key(alias): GPUS[name] for name, aliases in ALIASES.items() for alias in (name, *aliases)}

_PROPERTIES = re.compile(r"sm(\d+)(\d)((?:,[^,]*)*)", re.IGNORECASE)
GIVEN = "smXY,sms=N,mem=SIZE (a card by its properties, e.g. sm86,sms=58,mem=16GiB)"


def find(name: str) -> Gpu | None:
    """The table's card of that name or alias, case, spaces and '-' aside (the one name-matching rule: for --gpu
    and for the name torch gives a device); None where it names none."""
    return _BY_KEY.get(_key(name)) if isinstance(name, str) and len(name) <= 100 else None


def gpu(text: str | None) -> Gpu:
    """--gpu read: the GPU of that name or alias, or a card given by its properties; None is the default GPU. Any
    other text is one line naming what is valid."""
    if text is None:
        text = DEFAULT_GPU
    found = find(text)
    if found is None and isinstance(text, str) and (given := _PROPERTIES.fullmatch(text.strip())):
        return _given(text, given)
    if found is None:
        shown = repr(text) if not isinstance(text, str) or len(text) <= 60 else repr(text[:60]) + "..."
        raise UserError(f"unknown --gpu {shown}; valid: {', '.join(GPUS)} (or the name torch or nvidia-smi gives "
                        f"the card, e.g. 'NVIDIA H100 80GB HBM3'), or {GIVEN}")
    return found


def _given(text: str, given: re.Match) -> Gpu:
    """A card by its properties: compute capability, multiprocessors and memory, each needed (the first two decide
    kernels and scratch buffers, the last whether it fits); the rest from THREADS_PER_SM, labelled as assumed."""
    cc = (int(given.group(1)), int(given.group(2)))
    if cc not in THREADS_PER_SM:
        raise UserError(f"--gpu {text!r}: compute capability {cc[0]}.{cc[1]} is not one membench knows the threads "
                        f"per SM of (the CUDA C++ Programming Guide's table); valid: "
                        f"{', '.join(f'sm{a}{b}' for a, b in THREADS_PER_SM)}")
    fields: dict[str, str] = {}
    for part in given.group(3).split(",")[1:]:
        key, eq, value = part.strip().partition("=")
        if not eq or key not in ("sms", "mem") or key in fields:
            raise UserError(f"--gpu {text!r}: {part.strip()!r} is not sms=N or mem=SIZE (each once); {GIVEN}")
        fields[key] = value.strip()
    if set(fields) != {"sms", "mem"}:
        raise UserError(f"--gpu {text!r}: needs both sms= and mem=; {GIVEN}")
    if not fields["sms"].isdigit() or not 0 < int(fields["sms"]) <= 1024:
        raise UserError(f"--gpu {text!r}: sms={fields['sms'][:20]!r} is not a multiprocessor count from 1 to 1024")
    try:
        memory = parse_bytes(fields["mem"])
    except UserError as exc:
        raise UserError(f"--gpu {text!r}: mem: {exc}") from None
    label = fields["mem"].replace(" ", "")
    name = f"sm{cc[0]}{cc[1]},sms={int(fields['sms'])},mem={label}"
    label = re.sub(r"([0-9.])([A-Za-z])", r"\1 \2", label)
    return Gpu(name, cc, memory, int(fields["sms"]), THREADS_PER_SM[cc], (), label, given=True)


def of_device(device_name: str) -> Gpu | None:
    """The table's card for the name torch gives a device ("NVIDIA H100 80GB HBM3"), or None."""
    return find(device_name)
