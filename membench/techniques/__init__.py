"""The technique registry: names, what each one trades, and the rules for stacking them with '+'.

Read without torch (`membench techniques`, `check`, `compare`, the CLI's validation): a technique module imports
torch inside the hooks that run a step, never at its top (tests/test_startup.py checks it).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from dataclasses import dataclass

from membench.common.errors import UserError
from membench.techniques.accum import GradientAccumulation
from membench.techniques.act_offload import ActivationOffload
from membench.techniques.amp import AmpBf16, AmpFp16
from membench.techniques.base import COSTS, Cost, Technique
from membench.techniques.baseline import Baseline
from membench.techniques.bf16 import Bf16
from membench.techniques.chunked_ce import ChunkedCrossEntropy
from membench.techniques.ckpt import ActivationCheckpointing
from membench.techniques.compile import Compile
from membench.techniques.expandable_segments import ExpandableSegments
from membench.techniques.foreach_off import ForeachOff
from membench.techniques.fsdp import Fsdp, FsdpOffload
from membench.techniques.fused_adam import FusedAdam
from membench.techniques.init_on_device import InitOnDevice
from membench.techniques.lora import Lora
from membench.techniques.opt_in_bwd import OptimizerInBackward
from membench.techniques.opt_offload import OptimizerOffload
from membench.techniques.qlora import Qlora
from membench.techniques.sac import SelectiveCheckpointing
from membench.techniques.tp import TensorParallel

REGISTRY: dict[str, type[Technique]] = {
    cls.name: cls
    for cls in (Baseline, GradientAccumulation, ActivationCheckpointing, OptimizerInBackward, AmpBf16, AmpFp16,
                Bf16, ForeachOff, FusedAdam, InitOnDevice, OptimizerOffload, ActivationOffload,
                SelectiveCheckpointing, Fsdp, FsdpOffload, TensorParallel, ExpandableSegments, Lora, Qlora,
                Compile)
}
REGISTRY[ChunkedCrossEntropy.name] = ChunkedCrossEntropy  # a line of its own, so that others' additions merge


def parse_techniques(text: str) -> tuple[tuple[str, ...], ...]:
    """'accum,ckpt+opt-in-bwd' -> (('accum',), ('ckpt', 'opt-in-bwd')). 'baseline' is the empty stack."""
    stacks = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        names = tuple(n.strip() for n in item.split("+"))
        for n in names:
            if n not in REGISTRY:
                raise UserError(f"unknown technique {n!r}; valid: {', '.join(REGISTRY)}")
        if len(set(names)) != len(names):
            raise UserError(f"technique combination {item!r} names a technique twice")
        stack = tuple(n for n in names if n != "baseline")
        if "baseline" in names and stack:
            raise UserError(f"'baseline' cannot be combined with other techniques in {item!r}")
        same = next((s for s in stacks if set(s) == set(stack)), None)
        if same is not None:
            raise UserError(f"--techniques names {'+'.join(stack) or 'baseline'} twice"
                            + (f" (as {'+'.join(same)}: a stack's order does not matter)" if same != stack else "")
                            + "; each run is listed once (the baseline always runs)")
        stacks.append(stack)
    if not stacks:
        raise UserError("--techniques is empty; valid: " + ", ".join(REGISTRY))
    return tuple(stacks)


def check_stack(stack: tuple[str, ...], device: str) -> None:
    """Refuse, before anything runs, a stack whose techniques cannot go together or cannot run on device."""
    label = "+".join(stack)
    for i, name in enumerate(stack):
        cls = REGISTRY[name]
        for other in stack[i + 1:]:
            for a, b in ((cls, REGISTRY[other]), (REGISTRY[other], cls)):
                if b.name in a.conflicts:
                    raise UserError(f"cannot combine {name} with {other} in {label!r}: "
                                    f"{a.conflict_reason or a.summary}")
        for needed in cls.requires:
            if needed not in stack:
                raise UserError(f"{name} needs {needed} in the same run: use {label}+{needed}")
        if device not in cls.devices:
            raise UserError(f"technique {name} cannot run on {device}; it runs on: {', '.join(cls.devices)}")
        installed = torch_older_than(cls.min_torch)
        if installed:
            raise UserError(f"technique {name} needs torch >= {cls.min_torch} ({cls.min_torch_for}); this is torch "
                            f"{installed}")


def torch_older_than(floor: str | None) -> str | None:
    """The installed torch's version where it is a release older than `floor` ("2.9"), else None (no floor, or an
    unknown version: torch then says what it lacks itself)."""
    if floor is None:
        return None
    installed = _installed_torch()
    return installed if installed and _release_of(installed) < _release_of(floor) else None


def _installed_torch() -> str | None:
    """The installed torch's version, read from its metadata (importing torch takes a second); None if unknown."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def _release_of(version: str) -> tuple[int, int]:
    """(2, 14) of '2.14.1+cu130'."""
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


# What --inference can stack: the techniques that change the forward. The others act on backward or the step.
FORWARD_TECHNIQUES = ("amp-bf16", "amp-fp16", "bf16", "init-on-device", "expandable-segments")


def check_loop(spec) -> None:
    """Refuse loop options (RunSpec.inference, zero_grad, clip_grad_norm) a technique in the stack contradicts."""
    label = "+".join(spec.techniques)
    if spec.inference:
        other = [n for n in spec.techniques if n not in FORWARD_TECHNIQUES]
        if other:
            raise UserError(f"--inference runs the forward only, but {', '.join(other)} in {label!r} acts on backward "
                            f"or the optimizer step; valid with --inference: {', '.join(FORWARD_TECHNIQUES)}")
    if "opt-in-bwd" in spec.techniques:
        if spec.zero_grad == "zeros":
            raise UserError(f"cannot combine opt-in-bwd with --zero-grad zeros in {label!r}: opt-in-bwd frees each "
                            "gradient inside backward, which is the memory it saves")
        if spec.clip_grad_norm is not None:
            raise UserError(f"cannot combine opt-in-bwd with --clip-grad-norm in {label!r}: clipping needs every "
                            "gradient before any parameter steps, and opt-in-bwd steps each inside backward")


NUMERICS_ORDER = ("precision", "batch-split", "rounding", "exact")  # the loosest technique decides the stack's


@dataclass(frozen=True)
class Stack:
    """A resolved technique stack: the instances in configure order and what the stack as a whole implies.

    Resolved once per run (`resolve`); nothing else looks technique names up in the registry.
    """

    names: tuple[str, ...]
    techniques: tuple[Technique, ...]
    distributed: bool  # launched through torchrun
    numerics: str  # exact, rounding, batch-split or precision: how closely it must match the baseline
    param_dtype: str | None  # the name of the torch dtype the parameters train in ("bfloat16"; None: fp32)
    same_init: bool  # False: initial values may differ from the baseline's draw
    predictable: bool  # whether a prediction on CPU can tell its device memory from its host memory
    env: dict[str, str]  # environment variables for the run's own process

    @property
    def low_precision(self) -> bool:
        return self.numerics == "precision"

    @property
    def compiles(self) -> bool:
        """torch.compile's the model (techniques/compile.py)."""
        return any(t.compiles for t in self.techniques)

    def validate(self, spec, workload) -> None:
        for t in self.techniques:
            t.validate(spec, workload)


def pairing_key(run):
    """`run` as check, compare and --resume pair it: the options of techniques it does not use (--accum-steps
    without accum) set to their defaults, so changing one does not un-pair a run that never read it."""
    used = {option for name in run.techniques if name in REGISTRY for option in REGISTRY[name].options}
    unused = {option for cls in REGISTRY.values() for option in cls.options} - used
    defaults = {f.name: f.default for f in dataclasses.fields(run) if f.name in unused}
    return dataclasses.replace(run, **defaults)


def resolve(spec, target_device: str | None = None) -> Stack:
    """Check the stack (conflicts, requirements, the device it targets) and instantiate it in configure order.

    target_device: the device the numbers are for, when it differs from where the stack runs (a prediction
    for CUDA runs on CPU).
    """
    check_stack(spec.techniques, target_device or spec.device)
    check_loop(spec)
    classes = [REGISTRY[n] for n in spec.techniques]
    dtypes = [c.param_dtype for c in classes if c.param_dtype is not None]
    numerics = {c.numerics for c in classes}
    env: dict[str, str] = {}
    for c in classes:
        for key, value in c.env.items():
            env[key] = f"{env[key]},{value}" if key in env else value
    param_dtype = dtypes[0] if dtypes else None
    techniques = tuple(sorted((c(spec, param_dtype) for c in classes), key=lambda t: t.order))
    return Stack(names=tuple(spec.techniques), techniques=techniques,
                 distributed=any(c.distributed for c in classes),
                 # a value not in NUMERICS_ORDER (a newer technique's) is looser than any listed: it decides
                 numerics=min(numerics, key=lambda m: NUMERICS_ORDER.index(m) if m in NUMERICS_ORDER else -1,
                              default="exact"),
                 param_dtype=param_dtype, same_init=all(c.same_init for c in classes),
                 predictable=all(c.predictable for c in classes), env=env)


def conflicts_of(name: str) -> tuple[str, ...]:
    """Every technique that cannot be stacked with `name`, whichever side declared it."""
    return tuple(n for n, cls in REGISTRY.items()
                 if n in REGISTRY[name].conflicts or name in cls.conflicts)


def cost_of(names: tuple[str, ...]) -> Cost:
    """A stack's step-time cost class: its costliest technique's (base.Technique.cost); "none" for the baseline."""
    ranks = [COSTS.index(REGISTRY[n].cost) for n in names if n in REGISTRY]
    return COSTS[max(ranks, default=0)]


__all__ = ["REGISTRY", "Technique", "COSTS", "Cost", "cost_of", "parse_techniques", "check_stack", "check_loop",
           "resolve", "Stack", "conflicts_of"]
