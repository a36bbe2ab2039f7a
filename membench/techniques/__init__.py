"""The technique registry: names, what each one trades, and the rules for stacking them with '+'."""

from __future__ import annotations

from membench.errors import UserError
from membench.techniques.accum import GradientAccumulation
from membench.techniques.act_offload import ActivationOffload
from membench.techniques.amp import AmpBf16, AmpFp16
from membench.techniques.base import Technique
from membench.techniques.baseline import Baseline
from membench.techniques.bf16 import Bf16
from membench.techniques.ckpt import ActivationCheckpointing
from membench.techniques.expandable_segments import ExpandableSegments
from membench.techniques.foreach_off import ForeachOff
from membench.techniques.fsdp import Fsdp, FsdpOffload
from membench.techniques.fused_adam import FusedAdam
from membench.techniques.init_on_device import InitOnDevice
from membench.techniques.opt_in_bwd import OptimizerInBackward
from membench.techniques.opt_offload import OptimizerOffload
from membench.techniques.sac import SelectiveCheckpointing

REGISTRY: dict[str, type[Technique]] = {
    cls.name: cls
    for cls in (Baseline, GradientAccumulation, ActivationCheckpointing, OptimizerInBackward, AmpBf16, AmpFp16,
                Bf16, ForeachOff, FusedAdam, InitOnDevice, OptimizerOffload, ActivationOffload,
                SelectiveCheckpointing, Fsdp, FsdpOffload, ExpandableSegments)
}


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


def instantiate(spec) -> list[Technique]:
    check_stack(spec.techniques, spec.device)
    return sorted((REGISTRY[n](spec) for n in spec.techniques), key=lambda t: t.order)


def conflicts_of(name: str) -> tuple[str, ...]:
    """Every technique that cannot be stacked with `name`, whichever side declared it."""
    return tuple(n for n, cls in REGISTRY.items()
                 if n in REGISTRY[name].conflicts or name in cls.conflicts)


__all__ = ["REGISTRY", "Technique", "parse_techniques", "check_stack", "instantiate", "conflicts_of"]
