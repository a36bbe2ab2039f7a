"""The planner: a sweep's options validated and expanded into Jobs, baseline first, before anything runs. The
Python API (`membench.api`), the CLI and the child processes (`child/`) all plan through here."""

from __future__ import annotations

import dataclasses
import sys

import torch

from membench import optimizers
from membench.common.errors import UserError
from membench.launch.probe import probe
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
from membench.spec.gpu import Gpu
from membench.spec.mesh import Mesh
from membench.spec.nodes import Nodes
from membench.techniques import REGISTRY, parse_techniques, resolve
from membench.workloads import check_workload_name, is_user_workload, load_workload


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


def _named(options: dict) -> dict:
    """gpu= and mesh= as the API's caller may give them, a Gpu and a Mesh, by the names a RunSpec keeps."""
    typed = {"gpu": (Gpu, lambda g: g.name), "mesh": (Mesh, lambda m: m.text)}
    named = {k: typed[k][1](v) if k in typed and isinstance(v, typed[k][0]) else v for k, v in options.items()}
    if isinstance(named.get("nodes"), Nodes):  # as JSON carries it to the probe's child (launch/probe.py)
        named["nodes"] = dataclasses.asdict(named["nodes"])
    return named


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
    options = _named(options)
    run_opts, measure_opts, launch_opts = _split_options(options)
    if "nodes" in launch_opts:
        launch_opts["nodes"] = Nodes(**launch_opts["nodes"])
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
    optimizers.check_device(base.optimizer, device)
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
            if resolve(spec).compiles and measure.warmup < 1:
                raise UserError(f"{spec.name} compiles in its first step: it needs --warmup 1 or more, so that the "
                                "measured steps run the compiled code")
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
