"""Step timing and FLOP counting. The caller synchronises before reading a clock (train_step returns a .item())."""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable

from torch.utils.flop_counter import FlopCounterMode

from membench.results import Timing

# Dense peak FLOP/s by device name fragment and compute dtype, from the vendors' data sheets.
# fp32 means true fp32 (PyTorch's default matmul precision "highest", no TF32).
PEAK_FLOPS = {
    "H200": {"fp32": 67e12, "bf16": 989e12},
    "H100": {"fp32": 67e12, "bf16": 989e12},
    "A100": {"fp32": 19.5e12, "bf16": 312e12},
    "L4": {"fp32": 30.3e12, "bf16": 121e12},
}


def time_steps(step: Callable[[int], float], indices) -> tuple[list[float], list[float]]:
    """Run step(i) for each i; return (seconds per step, losses)."""
    times, losses = [], []
    for i in indices:
        start = time.perf_counter()
        losses.append(step(i))
        times.append(time.perf_counter() - start)
    return times, losses


def summarize(times: list[float]) -> Timing:
    q = statistics.quantiles(times, n=4) if len(times) >= 2 else [times[0]] * 3
    median = statistics.median(times)
    iqr = q[2] - q[0]
    # torch.utils.benchmark's rule of thumb: spread over 10% of the median means a noisy measurement.
    return Timing(step_times_s=list(times), median_s=median, iqr_s=iqr, min_s=min(times), max_s=max(times),
                  noisy=median > 0 and iqr / median > 0.10)


def count_flops(step: Callable[[], object]) -> int:
    with FlopCounterMode(display=False) as counter:
        step()
    return int(counter.get_total_flops())


def peak_flops(device_name: str, dtype: str) -> float | None:
    """The peak for a device name such as "NVIDIA H100 80GB HBM3": a model name matches as a whole word, so
    "L4" is not "L40" or "L40S"."""
    for model, table in PEAK_FLOPS.items():
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(model)}(?![A-Za-z0-9])", device_name):
            return table.get(dtype)
    return None
