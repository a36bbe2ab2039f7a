"""A run's vocabulary: what runs, how it is measured and launched (`run.py`)."""

from membench.spec.run import (
    CHECKS,
    DEFAULT_BATCH_SIZE,
    DEFAULT_TECHNIQUES,
    DEFAULT_WORKLOAD,
    DTYPES,
    LIBRARY_OPTIMIZERS,
    MAX_COUNT,
    MAX_JOBS,
    MAX_SEED,
    MAX_TIMEOUT_S,
    MAX_WORLD_SIZE,
    MIN_COMPARE_PAIRS,
    OPTIMIZERS,
    OPTIONAL,
    QUANT_TYPES,
    ZERO_GRAD,
    Check,
    Device,
    Dtype,
    Job,
    LaunchSpec,
    MeasureSpec,
    QuantType,
    RunSpec,
    ZeroGrad,
    default,
    expand,
)

__all__ = [
    "CHECKS", "DEFAULT_BATCH_SIZE", "DEFAULT_TECHNIQUES", "DEFAULT_WORKLOAD", "DTYPES", "MAX_COUNT", "MAX_JOBS",
    "MAX_SEED", "MAX_TIMEOUT_S", "MAX_WORLD_SIZE", "MIN_COMPARE_PAIRS", "OPTIMIZERS", "OPTIONAL", "ZERO_GRAD",
    "Check", "Device", "Dtype", "Job", "LaunchSpec", "MeasureSpec", "RunSpec", "ZeroGrad", "default", "expand",
    "LIBRARY_OPTIMIZERS", "QUANT_TYPES", "QuantType",
]
