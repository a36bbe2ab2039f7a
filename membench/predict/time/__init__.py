"""Step time without a GPU: the predicted step's ops (ops.py, recorded while predict/run.py runs the real step on
fake tensors), each timed from the GPU's figures (hardware.py) and the fraction of them its kind of kernel reaches
(efficiency.py), the host and the GPU as two clocks (model.py). docs/time.md says what it assumes."""

from __future__ import annotations

from membench.predict.time.hardware import SPEEDS, GpuSpeed, speed
from membench.predict.time.model import CLASSES, estimate, main_dtype, model_flops
from membench.predict.time.ops import OpCall, OpRecorder
from membench.results.schema import PredictedTime

METHOD = ("predicted: each op of the step on fake tensors timed from the GPU's datasheet peak and bandwidth at "
          "published efficiencies (tile and wave quantization for GEMMs, per-backend attention, streaming "
          "bandwidth), host and GPU as two clocks with a per-op launch cost; range: every efficiency at the ends "
          "of its published band")


def predict_time(calls: list[OpCall], gpu_name: str, sm_count: int, compute_capability: tuple[int, int],
                 batch_size: int, items_per_sample: int = 1, unit: str = "samples") -> PredictedTime:
    """The step's predicted time on the GPU named (a name of predict/gpus.py's table), its range, breakdown,
    throughput in the workload's unit and MFU."""
    gpu = speed(gpu_name)
    central, slow, fast = (estimate(calls, gpu, sm_count, compute_capability, end)
                           for end in ("central", "slow", "fast"))
    flops = model_flops(calls)
    dtype = main_dtype(calls, gpu, compute_capability)
    mfu = flops / central.step_s / gpu.peak(dtype) if central.step_s > 0 and flops else None
    items = batch_size * (items_per_sample if unit == "tokens" else 1)
    return PredictedTime(gpu=gpu_name, step_s=central.step_s, low_s=fast.step_s, high_s=slow.step_s,
                         by_class_s=central.by_class_s, recomputed_s=central.recomputed_s, flops=flops, mfu=mfu,
                         peak_dtype=dtype, throughput=items / central.step_s if central.step_s > 0 else 0.0,
                         unit=unit, kernels=central.kernels, method=METHOD)


__all__ = ["CLASSES", "METHOD", "SPEEDS", "GpuSpeed", "OpCall", "OpRecorder", "PredictedTime", "predict_time",
           "speed"]
