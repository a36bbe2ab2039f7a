"""The Python API: the same sweep as `membench run`, from a notebook or a script, results as a DataFrame."""

from __future__ import annotations

import dataclasses
import functools
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from membench import environment, optimizers
from membench.common.errors import UserError
from membench.launch.probe import probe
from membench.launch.sweep import locked, run_all
from membench.report.live import StageLines
from membench.results import Environment, RunRecord, check_result_paths, to_frame
from membench.results.progress import Stage
from membench.results.sweep import Sweep
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
from membench.techniques import REGISTRY, parse_techniques, resolve
from membench.workloads import REGISTERED, Workload, check_workload_name, is_user_workload, load_workload


def cuda_devices() -> int:
    """How many CUDA GPUs this process can use, asked without starting CUDA: torch.cuda.device_count() asks NVML
    first and "will NOT poison fork if NVML discovery succeeds" (torch/cuda/__init__.py), where
    torch.cuda.is_available() calls cudaGetDeviceCount, after which a forked child cannot use CUDA (a notebook's
    runs are forked: launch/fork.py)."""
    return torch.cuda.device_count()


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if cuda_devices() > 0 else "cpu"
    if device == "cuda" and cuda_devices() == 0:
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


def plan(workload: str = DEFAULT_WORKLOAD, techniques: str | None = None, batch_size: int = DEFAULT_BATCH_SIZE,
         device: str = "auto", target_device: str | None = None, in_process: bool = False, **options) -> list[Job]:
    """Validate everything and expand into one Job per run (baseline first). Nothing runs yet.

    techniques: None is the default set (DEFAULT_TECHNIQUES), without those this workload or batch cannot take
    (a note on stderr for each); techniques the user names are never skipped, only refused.
    target_device: the device the numbers are for, when it is not where they are computed (a prediction for
    CUDA is computed on CPU): techniques are checked against it.
    in_process: the caller runs the workload in this process anyway (predict, fit): validate it here too.
    A user's `package.module:factory` is otherwise loaded only in a child process (launch.probe).
    """
    check_workload_name(workload)
    run_opts, measure_opts, launch_opts = _split_options(options)
    launch = LaunchSpec(**launch_opts).validated()
    if is_user_workload(workload) and not in_process:
        # The user's code (their factory) runs in a child process, under the timeout: it plans there and sends
        # the jobs back, so a factory that hangs, aborts or raises never runs in this process.
        return probe(dict(workload=workload, techniques=techniques, batch_size=batch_size, device=device,
                          target_device=target_device, **options), launch.timeout_s)
    device = resolve_device(device) if target_device is None else target_device
    loaded = load_workload(workload, run_opts.get("seq_len"))
    if run_opts.get("optimizer") is None:  # not given: the workload's own choice, else Adam
        run_opts["optimizer"] = loaded.optimizer or "adam"
    if target_device == "cuda" and run_opts.get("gpu") is None:  # not given: this machine's GPU, else the default
        from membench.predict.gpus import default_target

        run_opts["gpu"] = default_target().gpu.name
    base = RunSpec(workload=workload, batch_size=batch_size, device=device, **run_opts).validated()
    optimizers.check(base.optimizer)
    measure = MeasureSpec(**measure_opts).validated()
    # Inference has no backward and no step for the default techniques to act on: the baseline alone.
    default = "baseline" if base.inference else DEFAULT_TECHNIQUES
    stacks = parse_techniques(default if techniques is None else techniques)
    _check_sharding_options(base, stacks)
    jobs = []
    for spec in expand(base, stacks):
        try:
            # --nproc-per-node is for the distributed techniques; the others (and the baseline) are single-device
            # runs, measured per device at --batch-size: what a rank's numbers compare against.
            if not resolve(spec).distributed:
                spec = dataclasses.replace(spec, nproc_per_node=1)
            resolve(spec).validate(spec, loaded)
            if target_device is None:
                _check_ranks_fit(spec)
        except UserError as exc:
            # The default set is a suggestion: a technique this workload or batch cannot take (accum at a batch its
            # steps do not divide, ckpt without blocks) is skipped, saying why, rather than failing the user's
            # first run. A technique the user names is refused instead, and the baseline always runs.
            if techniques is not None or not spec.techniques:
                raise
            print(f"membench: skipping {spec.name} (a default technique): {exc}", file=sys.stderr)
            continue
        jobs.append(Job(spec, measure, launch))
    return jobs


def _check_sharding_options(spec: RunSpec, stacks: tuple[tuple[str, ...], ...]) -> None:
    """--mesh, --param-dtype, --reduce-dtype and --reshard-after-forward shape sharded training: without a sharding
    technique among the stacks they would change nothing, yet be stored in every record as if they had."""
    given = [option for option, value in (("--mesh", spec.mesh), ("--param-dtype", spec.param_dtype),
                                          ("--reduce-dtype", spec.reduce_dtype),
                                          ("--reshard-after-forward", spec.reshard_after_forward)) if value is not None]
    if given and not any(REGISTRY[n].distributed for stack in stacks for n in stack if n in REGISTRY):
        sharding = ", ".join(n for n, cls in REGISTRY.items() if cls.distributed)
        raise UserError(f"{', '.join(given)} shape sharded training: add a sharding technique to --techniques "
                        f"({sharding}), or leave {'them' if len(given) > 1 else 'it'} out")


def _check_ranks_fit(spec: RunSpec) -> None:
    """On CUDA each rank takes one GPU of this machine (distributed.process_group: set_device(LOCAL_RANK)): more
    ranks than GPUs would die at set-up, before any record is written."""
    if spec.device == "cuda" and spec.nproc_per_node > 1:
        gpus = cuda_devices()
        if spec.nproc_per_node > gpus:
            raise UserError(f"--nproc-per-node {spec.nproc_per_node} asks for one GPU per rank, and this machine "
                            f"has {gpus} CUDA GPU{'s' if gpus != 1 else ''}; valid: 1 to {gpus} (or --device cpu)")


def default_out_dir(spec: RunSpec, root: Path = Path("results")) -> Path:
    key = environment.machine_key(_describe_without_starting_cuda(spec.device))
    return root / key / f"{spec.workload.replace(':', '.')}-bs{spec.batch_size}{spec.loop_slug}"


def _describe_without_starting_cuda(device: str) -> Environment:
    """environment.describe, which on CUDA starts CUDA (the device's name): asked in a child process, so this
    process can still fork runs that use CUDA (launch/fork.py) and holds no CUDA context of its own on the GPU the
    runs measure."""
    if device != "cuda" or torch.cuda.is_initialized():
        return environment.describe(device)
    code = ("import dataclasses, json, membench.environment as e; "
            "print(json.dumps(dataclasses.asdict(e.describe('cuda'))))")
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        raise UserError(f"could not ask a child process for the CUDA device's name: {exc}; pass out=...") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise UserError(f"could not read the CUDA device's name in a child process ({last}); pass out=...")
    return Environment(**json.loads(done.stdout.strip().splitlines()[-1]))


def run_sweep(workload: str | Workload | Callable[[], nn.Module] = DEFAULT_WORKLOAD, techniques: str | None = None,
              batch_size: int = DEFAULT_BATCH_SIZE, device: str = "auto", out: str | Path | None = None,
              resume: bool = False, on_start: Callable | None = None, on_done: Callable | None = None,
              make_batch: Callable | None = None, loss_fn: Callable | None = None, name: str | None = None,
              progress: Callable | bool | None = None, **options):
    """Run the baseline and each technique in its own process; return a DataFrame (one row per run).

    workload: a name as `membench run --workload` takes it; a `Workload` object; or a function returning a fresh
    nn.Module, with `make_batch(batch_size, generator)` (and `loss_fn(model, batch)`, by default cross-entropy
    of model(*batch[:-1]) against batch[-1]). An object has no name a new process could rebuild it from, so its
    runs are forked from this process (Linux, before CUDA is initialised here); where that is not possible they
    run in this process, with an `InProcessWarning`: an OOM of the host, a crash or a hang then ends the caller.
    name: what its runs are recorded as (`python:NAME`; default: the function's name).
    Options are those of `membench run` (steps, warmup, accum_steps, optimizer, lr, seed, seq_len, check,
    timeline, ...). Example: ``membench.run_sweep("vit-tiny", "accum,ckpt", batch_size=8, steps=3)``.
    progress: None (default) prints one line per stage of each run to stderr (a notebook shows them); False
    prints nothing; a function is called with each `membench.launch.progress.Stage` (run, stage, elapsed_s, step, steps)
    as the worker reports it.
    """
    launch = None
    if not isinstance(workload, str):
        from membench.child import worker
        from membench.launch import fork

        workload = register(workload, make_batch, loss_fn, name)
        launch = functools.partial(fork.launch, work=worker.run)
    elif make_batch is not None or loss_fn is not None:
        raise UserError("make_batch and loss_fn go with a model function, not with a workload name")
    jobs = plan(workload, techniques, batch_size, device, **options)
    out_dir = Path(out) if out else default_out_dir(jobs[0].run)
    display = _Callbacks(StageLines() if progress is None else None, progress if callable(progress) else None,
                         on_start, on_done)
    return to_frame(list(execute(jobs, out_dir, display, resume, run_one=launch).runs))


class Display(Protocol):
    """What a sweep shows as it goes: a run starting, its stages, a note about it, its end (skipped: kept from an
    earlier sweep by --resume). `membench run`'s live display (report.live.SweepProgress) is one."""

    def start(self, job: Job) -> None: ...

    def stage(self, job: Job, stage: Stage) -> None: ...

    def note(self, job: Job, message: str) -> None: ...

    def done(self, job: Job, result: RunRecord, skipped: bool) -> None: ...


def execute(jobs: list[Job], out_dir: Path, display: Display, resume: bool = False,
            run_one: Callable[..., RunRecord] | None = None) -> Sweep:
    """Run planned jobs into out_dir, holding its lock (launch.sweep.run_all): the one sweep behind `membench
    run` and `run_sweep`. run_one: how one job runs (default: its own process)."""
    with locked(out_dir):
        check_result_paths(jobs, out_dir)
        results = run_all(jobs, out_dir, resume=resume, on_start=display.start, on_done=display.done,
                          on_note=display.note, run_one=run_one, on_stage=display.stage)
    return Sweep.of(results)


class _Callbacks:
    """run_sweep's display: one line per stage on stderr (StageLines) or the caller's progress function, and the
    caller's on_start / on_done."""

    def __init__(self, lines: StageLines | None, progress: Callable | None, on_start: Callable | None,
                 on_done: Callable | None):
        self.lines, self.progress, self.on_start, self.on_done = lines, progress, on_start, on_done

    def start(self, job: Job) -> None:
        if self.lines:
            self.lines.start(job)
        if self.on_start:
            self.on_start(job)

    def stage(self, job: Job, stage: Stage) -> None:
        if self.lines:
            self.lines(stage)
        if self.progress:
            self.progress(stage)

    def note(self, job: Job, message: str) -> None:
        if self.lines:
            self.lines.note(job, message)

    def done(self, job: Job, result: RunRecord, skipped: bool) -> None:
        if self.lines:
            self.lines.done(job, result, skipped)
        if self.on_done:
            self.on_done(job, result, skipped)


def _default_loss(model: nn.Module, batch) -> torch.Tensor:
    *inputs, target = batch
    return nn.functional.cross_entropy(model(*inputs), target)


def register(workload: Workload | Callable[[], nn.Module], make_batch: Callable | None = None,
             loss_fn: Callable | None = None, name: str | None = None) -> str:
    """Make a workload object runnable by name in this process (and in children forked from it)."""
    if isinstance(workload, Workload):
        if make_batch is not None or loss_fn is not None:
            raise UserError("make_batch and loss_fn go with a model function; a Workload already has its own")
        label = name or getattr(workload.build_model, "__name__", "")
    elif callable(workload):
        if make_batch is None:
            raise UserError("a model function needs make_batch=(batch_size, generator) -> tuple of tensors "
                            "(or pass a membench.workloads.Workload)")
        label = name or getattr(workload, "__name__", "")
        workload = Workload(build_model=workload, make_batch=make_batch, loss_fn=loss_fn or _default_loss)
    else:
        raise UserError(f"workload must be a name, a membench.workloads.Workload or a function returning an "
                        f"nn.Module, got {type(workload).__name__}")
    label = label if label.isidentifier() else "workload"  # lambdas are '<lambda>'
    key = f"python:{label}"
    REGISTERED[key] = workload
    return key
