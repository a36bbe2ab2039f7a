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

# cudaDeviceProp.maxThreadsPerMultiProcessor by compute capability: the CUDA C++ Programming Guide's table of
# technical specifications per compute capability ("Maximum number of resident threads per SM"). A card given by
# its properties takes its figure from here.
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


# Dense peak FLOP/s from NVIDIA's data sheets (the tensor-core figures without sparsity, i.e. half the sheets'
# starred numbers); fp32 is true fp32 (PyTorch's default matmul precision "highest", no TF32).
H100_SXM = (("fp32", 67e12), ("bf16", 989e12))  # H100 SXM data sheet: FP32 67, BF16 1,979* TFLOPS
H100_PCIE = (("fp32", 51e12), ("bf16", 756e12))  # H100 PCIe data sheet (2022): FP32 51, BF16 1,513*
NVL = (("fp32", 60e12), ("bf16", 835e12))  # H100 data sheet (2023) and H200 data sheet (2024), NVL: 60, 1,671*
A100_PEAKS = (("fp32", 19.5e12), ("bf16", 312e12))  # A100 data sheet, PCIe and SXM alike: 19.5, 624*
L4_PEAKS = (("fp32", 30.3e12), ("bf16", 121e12))  # L4 data sheet: 30.3, 242*
L40S_PEAKS = (("fp32", 91.6e12), ("bf16", 362.05e12))  # L40S data sheet (2023): FP32 91.6, BF16 733*

# Each card: compute capability, nominal memory, multiprocessors, from the vendor's published specification.
GPUS = {g.name: g for g in (
    # NVIDIA H100 Tensor Core GPU Architecture whitepaper: H100 SXM5 132 SMs, H100 PCIe 114; H100 data sheet:
    # SXM 80 GB, PCIe 80 GB, NVL 94 GB; the NVL card is the SXM5's full 132-SM configuration on PCIe.
    _card("H100", (9, 0), 80, 132, H100_SXM),  # SXM5
    _card("H100-PCIe", (9, 0), 80, 114, H100_PCIE),
    _card("H100-NVL", (9, 0), 94, 132, NVL),
    # H200 data sheet (2024): 141 GB HBM3e, SXM and NVL; the GH100 chip of the H100 SXM5 (132 SMs).
    _card("H200", (9, 0), 141, 132, H100_SXM),
    _card("H200-NVL", (9, 0), 141, 132, NVL),
    # NVIDIA A100 Tensor Core GPU Architecture whitepaper: 108 SMs; A100 data sheet: 40 and 80 GB.
    _card("A100", (8, 0), 80, 108, A100_PEAKS),
    _card("A100-40GB", (8, 0), 40, 108, A100_PEAKS),
    # NVIDIA Tesla V100 GPU Architecture whitepaper: 80 SMs; V100 data sheet: 16 and 32 GB.
    _card("V100", (7, 0), 16, 80),
    _card("V100-32GB", (7, 0), 32, 80),
    # NVIDIA Ada GPU Architecture whitepaper: L4 58 SMs 24 GB (L4 data sheet), RTX 4090 128 SMs 24 GB; L40 and
    # L40S: the AD102 with 142 SMs (L40S data sheet: 18,176 CUDA cores, 48 GB).
    _card("L4", (8, 9), 24, 58, L4_PEAKS),
    _card("RTX4090", (8, 9), 24, 128),
    _card("L40S", (8, 9), 48, 142, L40S_PEAKS),
    _card("L40", (8, 9), 48, 142),
    # NVIDIA Ampere GA102 GPU Architecture whitepaper: A10G (AWS's A10 variant) 80 SMs, A10 72 SMs 24 GB,
    # RTX 3090 82 SMs 24 GB, RTX 3080 68 SMs 10 GB, RTX A6000 84 SMs 48 GB; A40 data sheet: 10,752 CUDA cores
    # (84 SMs), 48 GB.
    _card("A10G", (8, 6), 24, 80),
    _card("A10", (8, 6), 24, 72),
    _card("RTX3090", (8, 6), 24, 82),
    _card("RTX3080", (8, 6), 10, 68),
    _card("A6000", (8, 6), 48, 84),
    _card("A40", (8, 6), 48, 84),
    # NVIDIA Turing GPU Architecture whitepaper: T4 40 SMs 16 GB (T4 data sheet); GeForce RTX 2060 (TU106):
    # 1,920 CUDA cores = 30 SMs, 6 GB.
    _card("T4", (7, 5), 16, 40),
    _card("RTX2060", (7, 5), 6, 30),
    # NVIDIA Blackwell: DGX B200 data sheet, 1,440 GB over 8 GPUs (180 GB each), 148 SMs (two dies of 74, the
    # figure torch reports for a B200); GeForce RTX 5090 (GB202): 21,760 CUDA cores = 170 SMs, 32 GB.
    _card("B200", (10, 0), 180, 148),
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
