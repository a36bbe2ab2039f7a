"""Typed, frozen descriptions of what to run. Validation happens here, before any process starts."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from membench.errors import UserError

Device = Literal["cpu", "cuda"]
OPTIMIZERS = ("adam", "sgd")


@dataclass(frozen=True)
class RunSpec:
    """One training run: a workload, a batch size and a stack of techniques ('()' is the baseline)."""

    workload: str
    batch_size: int
    techniques: tuple[str, ...] = ()
    device: Device = "cpu"
    steps: int = 5
    warmup: int = 2
    accum_steps: int = 4
    optimizer: str = "adam"
    lr: float = 1e-3
    seed: int = 0
    check: bool = True
    check_steps: int = 2
    timeline: bool = True  # a few extra untimed steps that record a categorised memory timeline
    memory_budget: int | None = None
    peak_flops: float | None = None
    nproc_per_node: int = 1
    torchrun_args: str = ""  # passed to torchrun as is, e.g. "--nnodes=2 --rdzv-endpoint=host:29500"
    timeout_s: float = 1800.0

    @property
    def name(self) -> str:
        return "+".join(self.techniques) if self.techniques else "baseline"

    def with_techniques(self, techniques: tuple[str, ...]) -> RunSpec:
        return dataclasses.replace(self, techniques=tuple(techniques))

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["techniques"] = list(self.techniques)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> RunSpec:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise UserError(f"unknown run spec fields {sorted(unknown)}; valid: {sorted(known)}")
        d = dict(d)
        d["techniques"] = tuple(d.get("techniques", ()))
        return cls(**d).validated()

    def validated(self) -> RunSpec:
        for name in ("batch_size", "steps", "accum_steps", "check_steps", "nproc_per_node"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise UserError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
        if not isinstance(self.warmup, int) or self.warmup < 0:
            raise UserError(f"--warmup must be zero or a positive integer, got {self.warmup!r}")
        if self.lr <= 0:
            raise UserError(f"--lr must be positive, got {self.lr!r}")
        if self.timeout_s <= 0:
            raise UserError(f"--timeout must be positive, got {self.timeout_s!r}")
        if self.optimizer not in OPTIMIZERS:
            raise UserError(f"unknown optimizer {self.optimizer!r}; valid: {', '.join(OPTIMIZERS)}")
        if self.device not in ("cpu", "cuda"):
            raise UserError(f"unknown device {self.device!r}; valid: auto, cuda, cpu")
        if self.memory_budget is not None and self.memory_budget <= 0:
            raise UserError("--memory-budget must be positive")
        return self


@dataclass(frozen=True)
class SweepSpec:
    """A baseline plus technique stacks, all on the same workload: what `membench run` expands into."""

    base: RunSpec
    stacks: tuple[tuple[str, ...], ...] = field(default_factory=tuple)

    def runs(self) -> list[RunSpec]:
        """The baseline first (always measured, for comparison), then each stack once, in the order given."""
        seen: list[tuple[str, ...]] = [()]
        for stack in self.stacks:
            if stack not in seen:
                seen.append(stack)
        return [self.base.with_techniques(s) for s in seen]
