"""Typed, frozen descriptions of a run, split by concern, validated before any process starts.

- `RunSpec`: *what runs* (workload, batch, techniques, device, optimizer, seed, ranks). Two results are
  comparable when their RunSpecs are equal: `membench check` and `--resume` pair runs by it.
- `MeasureSpec`: *how it is measured* (steps, warm-up, the equivalence check, the timeline pass).
- `LaunchSpec`: *how it is launched* (timeout, torchrun arguments).
A `Job` is the three together: what the worker is given and what a result file records.
"""

from __future__ import annotations

import dataclasses
import math
import shlex
from dataclasses import dataclass, field
from typing import Literal

from membench.common.errors import UserError
from membench.common.typedjson import build_checked
from membench.spec.gpu import Gpu, gpu
from membench.spec.mesh import Mesh, check_reshard_after_forward, parse_mesh
from membench.spec.nodes import Nodes

Device = Literal["cpu", "cuda"]
ZeroGrad = Literal["none", "zeros"]
Dtype = Literal["fp32", "bf16", "fp16"]
DTYPES = ("fp32", "bf16", "fp16")
QuantType = Literal["nf4", "fp4"]
QUANT_TYPES = ("nf4", "fp4")  # bitsandbytes' 4-bit formats
ZERO_GRAD = ("none", "zeros")  # optimizer.zero_grad(set_to_none=True), or set_to_none=False
# Built-in optimizers by name; `package.module:factory` names any other (see membench.optimizers).
OPTIMIZERS = ("adam", "adamw", "sgd", "sgd-momentum", "adafactor")
# From a library (optimizers.LIBRARY: bitsandbytes, torchao), installed with the finetune extra.
LIBRARY_OPTIMIZERS = ("adamw8bit", "paged-adamw8bit", "torchao-adamw8bit", "torchao-adamw4bit", "torchao-adamwfp8")

# The defaults of `membench run` and `membench.run_sweep` (one place, so the CLI and the API agree).
DEFAULT_WORKLOAD = "vit-small"
DEFAULT_BATCH_SIZE = 32
DEFAULT_TECHNIQUES = "accum,ckpt,opt-in-bwd"


MAX_COUNT = 2**31 - 1  # batch, steps, ranks: beyond this torch's int32 sizes and indices overflow
MAX_SEED = 2**32 - 1  # the seed range every generator (torch, numpy, random) takes
MAX_WORLD_SIZE = 1024  # a prediction plays one rank and computes every collective's shapes for all of them
MAX_JOBS = 1024  # processes fit runs at once: more than any machine's cores
MAX_TIMEOUT_S = 366 * 86400.0  # a year: more than any run, well under threading.TIMEOUT_MAX (a longer wait overflows)


def _shown(value) -> str:
    """A bad value as a message shows it: bounded, and never str() of an integer too long for Python to print."""
    if isinstance(value, int) and abs(value) >= 10**40:
        return f"an integer of about {value.bit_length() * 0.30103:.0f} digits"
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "..."


class Check:
    """One option's valid values and the one message that names them, as the CLI user types the option: the CLI's
    argument types (membench.cli) and the specs' `validated` call the same check, so a bound is written once.

    kind: int, or float (which takes an int too); low is allowed unless `positive` (then only above it).
    """

    def __init__(self, option: str, kind: type, low: float, high: float | None = None, *, positive: bool = False,
                 what: str = ""):
        self.option, self.kind, self.low, self.high, self.positive = option, kind, low, high, positive
        if what:
            self.valid = what
        elif kind is int:
            self.valid = (f"an integer from {low} to {high}" if high is not None
                          else "zero or a positive integer" if low == 0 else f"an integer, {low} or more")
        else:
            self.valid = ("a finite positive number" if positive and low == 0
                          else f"a finite number {'above' if positive else 'from'} {low}")

    def __call__(self, value) -> None:
        # nan and inf are floats, but no count, rate or time; bool is an int Python-wise, never a count.
        number = isinstance(value, int) or (self.kind is float and isinstance(value, float) and math.isfinite(value))
        if (isinstance(value, bool) or not number or (value <= self.low if self.positive else value < self.low)
                or (self.high is not None and value > self.high)):
            raise UserError(f"{self.option} must be {self.valid}, got {_shown(value)}")


# Every numeric option's check, by the field (or the CLI's dest) it sets: the one table of bounds (None, where a field
# allows it, is checked by the caller). Fields without an entry are checked by kind (device, optimizer, zero_grad,
# gpu, torchrun_args) in `validated`. A new option adds its line here; the CLI's argument type reads it (cli._checked).
CHECKS: dict[str, Check] = {
    "batch_size": Check("--batch-size", int, 1, MAX_COUNT),
    "accum_steps": Check("--accum-steps", int, 1, MAX_COUNT),
    "nproc_per_node": Check("--nproc-per-node", int, 1, MAX_COUNT),
    "seq_len": Check("--seq-len", int, 1, MAX_COUNT),
    "memory_budget": Check("--memory-budget", int, 1, 2**63 - 1),
    "seed": Check("--seed", int, 0, MAX_SEED),
    "lr": Check("--lr", float, 0, positive=True),
    "clip_grad_norm": Check("--clip-grad-norm", float, 0, positive=True),
    "steps": Check("--steps", int, 1, MAX_COUNT),
    "check_steps": Check("--check-steps", int, 1, MAX_COUNT),  # no CLI option: the API's and a spec file's
    "warmup": Check("--warmup", int, 0, MAX_COUNT),
    "min_time_s": Check("--min-time", float, 0, MAX_TIMEOUT_S, what="zero or a positive number of seconds (at "
                        f"most {MAX_TIMEOUT_S:.0f}: 366 days)"),
    # The CLI takes TFLOP/s and the spec FLOP/s: positive either way, the one bound there is.
    "peak_flops": Check("--peak-tflops", float, 0, positive=True),
    "timeout_s": Check("--timeout", float, 0, MAX_TIMEOUT_S, positive=True,
                       what=f"a positive number of seconds, at most {MAX_TIMEOUT_S:.0f} (366 days)"),
    # Options of predict, fit and replay, which set no spec field:
    "world_size": Check("--world-size", int, 1, MAX_WORLD_SIZE,
                        what=f"an integer from 1 to {MAX_WORLD_SIZE} (the ranks one prediction plays)"),
    "jobs": Check("--jobs", int, 1, MAX_JOBS, what=f"an integer from 1 to {MAX_JOBS} (1: one after another)"),
    "max_batch": Check("--max-batch", int, 1, MAX_COUNT),
    "memory_fraction": Check("--memory-fraction", float, 0, 1, positive=True,
                             what="a number above 0 and at most 1 (as torch.cuda.set_per_process_memory_fraction)"),
    # True and False too (bool is checked apart); an int is a world size to reshard to, a divisor of dp_shard
    # (techniques/mesh.py checks that against the mesh)
    "reshard_after_forward": Check("--reshard-after-forward", int, 2, MAX_COUNT),
    # lora and qlora (techniques/lora.py): peft's LoraConfig r, lora_alpha, lora_dropout
    "lora_rank": Check("--lora-rank", int, 1, MAX_COUNT),
    "lora_alpha": Check("--lora-alpha", float, 0, positive=True),
    "lora_dropout": Check("--lora-dropout", float, 0, 1, what="a number from 0 to 1 (a probability)"),
}


OPTIONAL = {"seq_len", "memory_budget", "clip_grad_norm", "peak_flops"}  # None: the workload's, or none at all


def _check(spec, *names: str) -> None:
    for name in names:
        value = getattr(spec, name)
        if value is not None or name not in OPTIONAL:
            CHECKS[name](value)


@dataclass(frozen=True)
class RunSpec:
    """What runs: one training workload at one batch size under a stack of techniques (() is the baseline)."""

    workload: str
    batch_size: int
    techniques: tuple[str, ...] = ()
    device: Device = "cpu"
    accum_steps: int = 4
    optimizer: str = "adam"  # a name in OPTIMIZERS or package.module:factory (plan() fills the workload's default)
    lr: float = 1e-3
    seed: int = 0
    memory_budget: int | None = None  # a device of this size, simulated (CPU) or enforced (CUDA fraction)
    nproc_per_node: int = 1  # ranks per node of a distributed run (torchrun)
    # Tokens per sample for text workloads (gpt-*, hf:*); None: the workload's own default. Results written before
    # this field existed read it as None, so they still pair with runs that do not set it (check, --resume).
    seq_len: int | None = None
    # The training loop's choices that change memory (membench's defaults are torch's current ones):
    zero_grad: ZeroGrad = "none"  # after the step, gradients are freed (set_to_none) or kept as zeros (pre-2.0)
    clip_grad_norm: float | None = None  # clip the gradients' total 2-norm to this before the step
    inference: bool = False  # forward only: eval mode, torch.inference_mode, no backward, no optimizer
    # The GPU a CUDA prediction is for, by its name in membench/spec/gpu.py's table or its properties (`card` is its
    # Gpu); None: measured runs, and predictions for cpu. Predictions for different GPUs are different sweeps.
    gpu: str | None = None
    # Sharded training (fsdp, fsdp-offload, tp; techniques/mesh.py): the device mesh by torchtitan's dimension
    # names ("dp_shard=8,tp=2"; None: one dp_shard dimension of every rank), and FSDP2's MixedPrecisionPolicy
    # (param_dtype, reduce_dtype; None: the parameters' own) and reshard_after_forward (True, False or a world size
    # to reshard to; None: fully_shard's default, True for blocks and False for the root).
    mesh: str | None = None
    param_dtype: Dtype | None = None
    reduce_dtype: Dtype | None = None
    reshard_after_forward: bool | int | None = None
    # lora and qlora (techniques/lora.py, qlora.py): peft's LoraConfig defaults (r 8, alpha 8, dropout 0); targets
    # None: peft's default modules for the model type, else every linear layer of the blocks; base_dtype: the frozen
    # base weights' dtype (None: the stack's); qlora's bitsandbytes 4-bit format, its double quantization of the
    # absmax, and the dtype its matmuls compute in (the QLoRA paper's NF4, double quantization, bf16 by default).
    lora_rank: int = 8
    lora_alpha: float = 8
    lora_dropout: float = 0.0
    lora_targets: str | None = None
    base_dtype: Dtype | None = None
    quant_type: QuantType = "nf4"
    double_quant: bool = True
    compute_dtype: Dtype = "bf16"
    # The compile technique (techniques/compile.py): torch.compile's mode, and Inductor options as "key=value,..."
    compile_mode: str = "default"
    compile_options: str | None = None

    @property
    def name(self) -> str:
        return "+".join(self.techniques) if self.techniques else "baseline"

    @property
    def loop(self) -> str:
        """The loop options that differ from membench's defaults, e.g. "zero-grad zeros, clip-grad-norm 1.0" ("":
        none). They change memory, so runs that differ in them are different sweeps."""
        parts = [f"zero-grad {self.zero_grad}" if self.zero_grad != "none" else "",
                 f"clip-grad-norm {self.clip_grad_norm:g}" if self.clip_grad_norm is not None else "",
                 "inference" if self.inference else ""]
        return ", ".join(p for p in parts if p)

    @property
    def loop_slug(self) -> str:
        """`loop` as part of a folder name ("" for the defaults): "-zero-grad-zeros-clip-grad-norm-1"."""
        return "".join("-" + part.replace(" ", "-") for part in self.loop.split(", ") if part)

    def validated(self) -> RunSpec:
        _check(self, "batch_size", "accum_steps", "nproc_per_node", "lr", "seq_len", "memory_budget", "seed",
               "clip_grad_norm")
        if not isinstance(self.optimizer, str) or (self.optimizer not in OPTIMIZERS + LIBRARY_OPTIMIZERS
                                                   and ":" not in self.optimizer):
            valid = ", ".join(OPTIMIZERS + LIBRARY_OPTIMIZERS)
            raise UserError(f"unknown optimizer {self.optimizer!r}; valid: {valid}, or package.module:factory")
        if self.device not in ("cpu", "cuda"):
            raise UserError(f"unknown device {self.device!r}; valid: auto, cuda, cpu")
        if self.zero_grad not in ZERO_GRAD:
            raise UserError(f"unknown --zero-grad {self.zero_grad!r}; valid: {', '.join(ZERO_GRAD)}")
        if self.gpu is not None and gpu(self.gpu).name != self.gpu:
            return dataclasses.replace(self, gpu=gpu(self.gpu).name).validated()  # one spelling: runs pair by it
        if not isinstance(self.inference, bool):
            raise UserError(f"--inference must be true or false, got {self.inference!r}")
        _check(self, "lora_rank", "lora_alpha", "lora_dropout")
        if self.quant_type not in QUANT_TYPES:
            raise UserError(f"unknown --quant-type {self.quant_type!r}; valid: {', '.join(QUANT_TYPES)}")
        if not isinstance(self.double_quant, bool):
            raise UserError(f"--double-quant must be true or false, got {self.double_quant!r}")
        for option, dtype in (("--param-dtype", self.param_dtype), ("--reduce-dtype", self.reduce_dtype),
                              ("--base-dtype", self.base_dtype), ("--compute-dtype", self.compute_dtype)):
            if dtype is not None and dtype not in DTYPES:
                raise UserError(f"unknown {option} {dtype!r}; valid: {', '.join(DTYPES)}")
        if self.mesh is not None or self.reshard_after_forward is not None:
            # Its size against the ranks is checked where they are known: predict's --world-size, and each rank
            # of a run (several nodes: nproc_per_node is one node's share).
            mesh = parse_mesh(self.mesh if self.mesh is not None else None, self.nproc_per_node
                              if self.mesh is None else None)
            if self.mesh is not None and mesh.text != self.mesh:
                return dataclasses.replace(self, mesh=mesh.text).validated()  # one spelling: runs pair by it
            if not isinstance(self.reshard_after_forward, bool) and self.reshard_after_forward is not None:
                _check(self, "reshard_after_forward")
            check_reshard_after_forward(self.reshard_after_forward, mesh)
        return self

    @property
    def card(self) -> Gpu | None:
        """The GPU a CUDA prediction is for, as the table's typed value (the record keeps its name)."""
        return None if self.gpu is None else gpu(self.gpu)

    def mesh_of(self, world: int | None = None) -> Mesh:
        """The device mesh as a typed value: --mesh, checked against `world` ranks where given; without --mesh one
        dp_shard dimension of `world` ranks (default: nproc_per_node, one node's share)."""
        return parse_mesh(self.mesh, world) if self.mesh is not None else Mesh(dp_shard=world or self.nproc_per_node)


MIN_COMPARE_PAIRS = 6


@dataclass(frozen=True)
class MeasureSpec:
    """How a run is measured. None of it changes what the model computes."""

    steps: int = 5  # timed steps, after warm-up
    warmup: int = 2
    # Calibration to a time budget (as pytest-benchmark's min_time, torch.utils.benchmark's blocked_autorange):
    # timing goes on past `steps` until this many seconds were timed, up to MAX_STEPS_FACTOR x steps.
    min_time_s: float = 0.0
    check: bool = True  # train baseline and technique side by side and compare (equivalence)
    check_steps: int = 2
    timeline: bool = True  # a few extra untimed steps that record a categorised memory timeline
    predict: bool = True  # after the measurement, the run predicted for its device beside it (predict/beside.py)
    peak_flops: float | None = None  # the device's peak FLOP/s, for MFU where membench does not know it

    def validated(self) -> MeasureSpec:
        _check(self, "steps", "check_steps", "warmup", "peak_flops", "min_time_s")
        return self

    @property
    def compare_pairs(self) -> int:
        """Pairs of steps in the compare stage (a technique timed against the baseline in alternation): at least
        MIN_COMPARE_PAIRS, whose interval holds the median ratio with 95% confidence or more (6: 96.9%)."""
        return max(self.steps, MIN_COMPARE_PAIRS)


@dataclass(frozen=True)
class LaunchSpec:
    """How a run is launched: its own process (torchrun for distributed runs), stopped after timeout_s."""

    timeout_s: float = 1800.0
    torchrun_args: str = ""  # passed to torchrun as is, e.g. "--rdzv-conf=timeout=900"
    nodes: Nodes = field(default_factory=Nodes)  # several machines (spec/nodes.py)

    def validated(self) -> LaunchSpec:
        _check(self, "timeout_s")
        self.nodes.validated()
        try:
            args = shlex.split(self.torchrun_args)
        except ValueError as exc:
            raise UserError(f"--torchrun-args: cannot split {self.torchrun_args!r} into arguments: {exc}") from None
        if args:
            _check_torchrun_args(args)
        return self


def _check_torchrun_args(args: list[str]) -> None:
    """torchrun's own parser reads them now, so a flag it does not know is one line before anything runs, not a
    worker that exits with code 2 part way through the sweep."""
    import contextlib
    import io

    from torch.distributed.run import get_args_parser

    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            parser = get_args_parser()
            parser.prog = "torchrun"
            _, unknown = parser.parse_known_args([*args, "membench_worker.py"])
    except SystemExit:
        reason = said.getvalue().strip().splitlines()[-1:] or ["torchrun refuses them"]
        raise UserError(f"--torchrun-args {' '.join(args)!r}: {reason[0].removeprefix('usage: ')}") from None
    if unknown:
        raise UserError(f"--torchrun-args: torchrun does not know {' '.join(unknown)!r} (see torchrun --help)")


@dataclass(frozen=True)
class Job:
    """One run as the worker receives it and a result file records it."""

    run: RunSpec
    measure: MeasureSpec = field(default_factory=MeasureSpec)
    launch: LaunchSpec = field(default_factory=LaunchSpec)

    @property
    def name(self) -> str:
        return self.run.name

    def with_run(self, **changes) -> Job:
        return dataclasses.replace(self, run=dataclasses.replace(self.run, **changes))

    def with_measure(self, **changes) -> Job:
        return dataclasses.replace(self, measure=dataclasses.replace(self.measure, **changes))

    def validated(self) -> Job:
        self.run.validated(), self.measure.validated(), self.launch.validated()
        return self

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["run"]["techniques"] = list(self.run.techniques)
        return d

    @classmethod
    def from_dict(cls, d: dict, where: str = "run spec") -> Job:
        return build_checked(cls, d, where).validated()

    @staticmethod
    def split_flat(flat: dict) -> dict:
        """A schema-1 flat spec dict as the three parts (fields a part does not know are dropped)."""
        parts = {}
        for name, cls in (("run", RunSpec), ("measure", MeasureSpec), ("launch", LaunchSpec)):
            known = {f.name for f in dataclasses.fields(cls)}
            parts[name] = {k: v for k, v in flat.items() if k in known}
        return parts


def default(cls: type, name: str):
    """The default of field `name` of a spec class: written once, on the field; the CLI's options read it here."""
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


def expand(base: RunSpec, stacks: tuple[tuple[str, ...], ...]) -> list[RunSpec]:
    """The baseline first (always measured, for comparison), then each stack once, in the order given."""
    seen: list[tuple[str, ...]] = [()]
    for stack in stacks:
        if stack not in seen:
            seen.append(stack)
    return [dataclasses.replace(base, techniques=s) for s in seen]
