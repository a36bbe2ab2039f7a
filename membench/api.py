"""The Python API: the same sweep as `membench run`, from a notebook or a script, results as a DataFrame."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

import torch

from membench import environment
from membench.errors import UserError
from membench.launcher import run_all
from membench.results import to_frame
from membench.spec import RunSpec, SweepSpec
from membench.techniques import REGISTRY, instantiate, parse_techniques
from membench.workloads import check_workload_name, load_workload

DEFAULT_TECHNIQUES = "accum,ckpt,opt-in-bwd"


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda asked for, but torch sees no CUDA GPU here; use --device cpu or auto")
    if device not in ("cpu", "cuda"):
        raise UserError(f"unknown device {device!r}; valid: auto, cuda, cpu")
    return device


def plan(workload: str, techniques: str = DEFAULT_TECHNIQUES, batch_size: int = 8, device: str = "auto",
         **options) -> list[RunSpec]:
    """Validate everything and expand into one RunSpec per run (baseline first). Nothing runs yet."""
    check_workload_name(workload)
    known = {f.name for f in dataclasses.fields(RunSpec)}
    unknown = set(options) - known
    if unknown:
        raise UserError(f"unknown options {sorted(unknown)}; valid: {sorted(known - {'workload', 'techniques'})}")
    base = RunSpec(workload=workload, batch_size=batch_size, device=resolve_device(device), **options).validated()
    specs = SweepSpec(base, parse_techniques(techniques)).runs()
    # --nproc-per-node is for the distributed techniques; the others (and the baseline) are single-device runs,
    # measured per device at --batch-size: what a rank's numbers compare against.
    specs = [s if any(REGISTRY[t].distributed for t in s.techniques) else dataclasses.replace(s, nproc_per_node=1)
             for s in specs]
    loaded = load_workload(workload)
    for spec in specs:
        for t in instantiate(spec):
            t.validate(spec, loaded)
    return specs


def default_out_dir(spec: RunSpec, root: Path = Path("results")) -> Path:
    key = environment.machine_key(environment.describe(spec.device))
    return root / key / f"{spec.workload.replace(':', '.')}-bs{spec.batch_size}"


def run_sweep(workload: str = "vit-tiny", techniques: str = DEFAULT_TECHNIQUES, batch_size: int = 8,
              device: str = "auto", out: str | Path | None = None, resume: bool = False,
              on_start: Callable | None = None, on_done: Callable | None = None, **options):
    """Run the baseline and each technique in its own process; return a DataFrame (one row per run).

    Example: ``membench.run_sweep("vit-tiny", "accum,ckpt", batch_size=8, steps=3)``.
    """
    specs = plan(workload, techniques, batch_size, device, **options)
    out_dir = Path(out) if out else default_out_dir(specs[0])
    results = run_all(specs, out_dir, resume=resume, on_start=on_start, on_done=on_done)
    return to_frame(results)
