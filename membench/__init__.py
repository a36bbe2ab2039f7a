"""membench: measure GPU memory-saving techniques on one PyTorch training workload, side by side."""

from membench.common.errors import UserError
from membench.spec import Job, LaunchSpec, MeasureSpec, RunSpec

__all__ = ["Job", "LaunchSpec", "MeasureSpec", "RunSpec", "UserError", "run_sweep"]
__version__ = "0.1.0"


def run_sweep(*args, **kwargs):
    """Run a sweep and return its results as a pandas DataFrame (see membench.api.run_sweep)."""
    from membench.api import run_sweep as _run_sweep

    return _run_sweep(*args, **kwargs)
