"""The Python API: the same sweep as `membench run`, from a notebook or a script, results as a DataFrame."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import torch

from membench import environment
from membench.errors import UserError
from membench.launcher import probe, run_all
from membench.results import to_frame
from membench.spec import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_TECHNIQUES,
    DEFAULT_WORKLOAD,
    Job,
    LaunchSpec,
    MeasureSpec,
    RunSpec,
    expand,
)
from membench.techniques import parse_techniques, resolve
from membench.workloads import check_workload_name, is_user_workload, load_workload


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda asked for, but torch sees no CUDA GPU here; use --device cpu or auto")
    if device not in ("cpu", "cuda"):
        raise UserError(f"unknown device {device!r}; valid: auto, cuda, cpu")
    return device


def _split_options(options: dict) -> tuple[dict, dict, dict]:
    """Route keyword options to the spec part that owns them; an unknown one is a usage error."""
    parts = []
    for cls in (RunSpec, MeasureSpec, LaunchSpec):
        names = {f.name for f in dataclasses.fields(cls)} - {"workload", "batch_size", "techniques", "device"}
        parts.append({k: v for k, v in options.items() if k in names})
    unknown = set(options) - set().union(*parts)
    if unknown:
        valid = sorted(set().union(*({f.name for f in dataclasses.fields(c)} for c in (RunSpec, MeasureSpec,
                                                                                     LaunchSpec)))
                       - {"workload", "techniques"})
        raise UserError(f"unknown options {sorted(unknown)}; valid: {valid}")
    return parts[0], parts[1], parts[2]


def plan(workload: str = DEFAULT_WORKLOAD, techniques: str = DEFAULT_TECHNIQUES, batch_size: int = DEFAULT_BATCH_SIZE,
         device: str = "auto", target_device: str | None = None, in_process: bool = False, **options) -> list[Job]:
    """Validate everything and expand into one Job per run (baseline first). Nothing runs yet.

    target_device: the device the numbers are for, when it is not where they are computed (a prediction for
    CUDA is computed on CPU): techniques are checked against it.
    in_process: the caller runs the workload in this process anyway (predict, fit): validate it here too.
    A user's `package.module:factory` is otherwise loaded only in a child process (launcher.probe).
    """
    check_workload_name(workload)
    run_opts, measure_opts, launch_opts = _split_options(options)
    device = resolve_device(device) if target_device is None else target_device
    base = RunSpec(workload=workload, batch_size=batch_size, device=device, **run_opts).validated()
    measure, launch = MeasureSpec(**measure_opts).validated(), LaunchSpec(**launch_opts).validated()
    specs = expand(base, parse_techniques(techniques))
    jobs = []
    for spec in specs:
        # --nproc-per-node is for the distributed techniques; the others (and the baseline) are single-device runs,
        # measured per device at --batch-size: what a rank's numbers compare against.
        if not resolve(spec).distributed:
            spec = dataclasses.replace(spec, nproc_per_node=1)
        jobs.append(Job(spec, measure, launch))
    if is_user_workload(workload) and not in_process:
        probe(jobs, launch.timeout_s)  # the user's code runs in a child process, under the timeout
    else:
        loaded = load_workload(workload)
        for job in jobs:
            resolve(job.run).validate(job.run, loaded)
    return jobs


def default_out_dir(spec: RunSpec, root: Path = Path("results")) -> Path:
    key = environment.machine_key(environment.describe(spec.device))
    return root / key / f"{spec.workload.replace(':', '.')}-bs{spec.batch_size}"


def run_sweep(workload: str = DEFAULT_WORKLOAD, techniques: str = DEFAULT_TECHNIQUES,
              batch_size: int = DEFAULT_BATCH_SIZE, device: str = "auto", out: str | Path | None = None,
              resume: bool = False, on_start: Callable | None = None, on_done: Callable | None = None, **options):
    """Run the baseline and each technique in its own process; return a DataFrame (one row per run).

    Options are those of `membench run` (steps, warmup, accum_steps, optimizer, lr, seed, check, timeline, ...).
    Example: ``membench.run_sweep("vit-tiny", "accum,ckpt", batch_size=8, steps=3)``.
    """
    jobs = plan(workload, techniques, batch_size, device, **options)
    out_dir = Path(out) if out else default_out_dir(jobs[0].run)
    results = run_all(jobs, out_dir, resume=resume, on_start=on_start, on_done=on_done)
    return to_frame(results)
