"""A training step's time on a CUDA GPU, from its ops (ops.OpCall) and the GPU's figures (hardware.py), with the
efficiencies of efficiency.py. No GPU is used and nothing is fitted.

Each op's time on the GPU is the longer of its compute time (FLOPs at the peak of the dtype it computes in, times
the fraction its kind of kernel reaches) and its memory time (bytes at the bandwidth a streaming kernel reaches).
The host issues ops one after another (eager PyTorch: Python, the dispatcher, a kernel launch per op) and the GPU
runs them in order as they arrive, so the step is two clocks: the host's advances by a per-op cost; a kernel starts
when both the GPU is free and the host has issued it; an op that reads a value back (`.item()`) makes the host
wait for the GPU. Whatever the GPU spends waiting for the host is the step's launch cost: small models come out
launch-bound, as they are.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from membench.predict.time import efficiency
from membench.predict.time.hardware import GpuSpeed
from membench.predict.time.ops import OpCall

#: The classes of the record's breakdown, in the order they print.
CLASSES = ("gemm", "attention", "elementwise", "optimizer", "communication", "launch")

_TENSOR_CORE = {"float16": "fp16", "bfloat16": "bf16", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8"}


def compute_dtype(call: OpCall, gpu: GpuSpeed, compute_capability: tuple[int, int]) -> str:
    """The peak an op computes at. fp32 matmuls: torch.backends.cuda.matmul.allow_tf32 is False by default (since
    torch 1.12), so true fp32; fp32 convolutions: torch.backends.cudnn.allow_tf32 is True by default, so TF32 on
    GPUs that have it (Ampere and later)."""
    if call.dtype in _TENSOR_CORE:
        return _TENSOR_CORE[call.dtype]
    if call.kind == "conv" and compute_capability >= (8, 0) and gpu.tf32:
        return "tf32"
    return "fp32"


def op_time(call: OpCall, gpu: GpuSpeed, sm_count: int, compute_capability: tuple[int, int], end: str) -> float:
    """Seconds the GPU spends on one op at one end of the bands (efficiency.ENDS)."""
    memory_s = call.bytes / (gpu.memory_bandwidth * efficiency.MEMORY_BANDWIDTH.at(end))
    if call.kind in ("memory", "sync", "host", "none") or not call.flops:
        return memory_s if call.kind == "memory" else 0.0
    peak = gpu.peak(compute_dtype(call, gpu, compute_capability))
    if call.kind == "attention":
        fraction = efficiency.attention_fraction(call.backend, compute_capability).at(end)
    else:
        fraction = efficiency.gemm_peak_fraction(gpu.name).at(end)
        if call.gemm is not None:
            fraction *= efficiency.gemm_shape_fraction(*call.gemm, sm_count)
    return max(call.flops / (peak * fraction), memory_s)


def op_class(call: OpCall) -> str:
    """The breakdown's class of an op: the optimizer step's ops (clipping included) are the optimizer's."""
    if call.phase == "optimizer":
        return "optimizer"
    if call.kind in ("gemm", "conv"):
        return "gemm"
    return "attention" if call.kind == "attention" else "elementwise"


@dataclass
class StepEstimate:
    """One end's prediction: the step's seconds, the GPU's busy seconds by class, recomputation's share."""

    step_s: float
    by_class_s: dict[str, float]
    recomputed_s: float
    kernels: int


def estimate(calls: list[OpCall], gpu: GpuSpeed, sm_count: int, compute_capability: tuple[int, int],
             end: str = "central") -> StepEstimate:
    """The two clocks (the module's docstring) over the step's ops."""
    host = device = recomputed = 0.0
    busy: dict[str, float] = defaultdict(float)
    kernels = 0
    per_op = efficiency.HOST_PER_OP_S.at(end)
    per_kernel = efficiency.HOST_PER_EXTRA_KERNEL_S.at(end)
    for call in calls:
        if call.kind == "none":
            continue
        host += per_op + per_kernel * (call.kernels - 1)
        if call.kind == "sync":
            host = max(host, device)
            continue
        if call.kind == "host":
            continue
        seconds = op_time(call, gpu, sm_count, compute_capability, end)
        device = max(device, host) + seconds
        busy[op_class(call)] += seconds
        kernels += call.kernels
        if call.recomputed:
            recomputed += seconds
    step = max(host, device)
    by_class = {name: busy.get(name, 0.0) for name in CLASSES}
    by_class["launch"] = max(0.0, step - sum(busy.values()))
    return StepEstimate(step, by_class, recomputed, kernels)


def model_flops(calls: list[OpCall]) -> int:
    """The step's FLOPs as torch's FLOP counter counts them, recomputation left out (what MFU counts)."""
    return sum(c.flops for c in calls if not c.recomputed)


def main_dtype(calls: list[OpCall], gpu: GpuSpeed, compute_capability: tuple[int, int]) -> str:
    """The compute dtype most of the step's FLOPs run in (the peak MFU is taken against)."""
    flops: dict[str, int] = defaultdict(int)
    for c in calls:
        if c.flops:
            flops[compute_dtype(c, gpu, compute_capability)] += c.flops
    return max(flops, key=flops.get) if flops else "fp32"
