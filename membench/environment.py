"""Where a run happened: device, versions, host, code revision. Results are keyed by this machine."""

from __future__ import annotations

import platform
import re
import socket
import subprocess
from pathlib import Path

import torch

from membench.results import Environment


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def _driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def describe(device: str) -> Environment:
    """This machine, as the record a result carries (the result schema's own type: nothing to copy)."""
    cuda = device == "cuda"
    return Environment(
        device=device,
        device_name=torch.cuda.get_device_name() if cuda else _cpu_name(),  # this rank's own GPU under torchrun
        device_count=torch.cuda.device_count() if cuda else 1,
        driver_version=_driver_version() if cuda else None,
        torch=torch.__version__,
        cuda=torch.version.cuda,
        python=platform.python_version(),
        host=socket.gethostname(),
        platform=platform.platform(),
        cpu_threads=torch.get_num_threads(),
        git_commit=_git_commit(),
    )


def machine_key(env: Environment) -> str:
    """A filesystem-safe key: results from different machines or versions are never mixed."""
    parts = [env.device_name if env.device == "cuda" else "cpu", f"torch{env.torch.split('+')[0]}"]
    if env.device == "cuda":
        parts.append(f"cuda{env.cuda}")
    return re.sub(r"[^A-Za-z0-9._-]+", "-", "_".join(parts)).strip("-")
