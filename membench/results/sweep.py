"""A sweep: the runs of one workload at one batch size on one device, the baseline among them, compared with
each other and with nothing else.

`membench run`, `membench.run_sweep`, the report, `check` and `compare` all hold results as sweeps: which runs go
together (`SweepKey`), which run is the baseline and whether it can be the reference (`Sweep.baseline`,
`Sweep.reference`) are decided here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from membench.common.errors import UserError
from membench.common.fsio import safe_component
from membench.results.schema import RunRecord


@dataclass(frozen=True)
class SweepKey:
    """What runs must share to be compared: workload, batch size, the device the numbers are for (a CUDA
    prediction is for cuda and the GPU it names, though computed on a CPU), measured or predicted, and the
    training loop's options."""

    workload: str
    batch_size: int
    device: str
    gpu: str | None
    predicted: bool
    loop: str

    @classmethod
    def of(cls, record: RunRecord) -> SweepKey:
        run = record.spec.run
        device = record.predicted_for or (record.env.device if record.env else run.device)
        gpu = run.gpu if record.predicted and device == "cuda" else None
        return cls(run.workload, run.batch_size, device, gpu, record.predicted, run.loop)

    @property
    def target(self) -> str:
        """'cpu', 'cuda', 'cuda H100 (predicted)', 'cpu (predicted)'."""
        where = f"{self.device} {self.gpu}" if self.gpu else self.device
        return where + (" (predicted)" if self.predicted else "")

    def title(self) -> str:
        loop = f", {self.loop}" if self.loop else ""
        return f"{self.workload}, batch {self.batch_size}, {self.target}{loop}"

    def folder(self) -> str:
        """One path component naming this sweep's report: a prediction and a measurement of the same workload, or
        predictions for two GPUs, never share one (text from result files: one harmless component)."""
        parts = [self.workload, f"bs{self.batch_size}", self.device, self.gpu or "",
                 "predicted" if self.predicted else "", self.loop.replace(", ", "-").replace(" ", "-")]
        return safe_component("-".join(p for p in parts if p), limit=120)


def _order(record: RunRecord) -> tuple:
    """The baseline first, then the runs in the order they ran."""
    return not record.is_baseline, record.started or float("inf"), record.name


@dataclass(frozen=True)
class Sweep:
    """One sweep's runs, the baseline first, then in the order they ran."""

    key: SweepKey
    runs: tuple[RunRecord, ...]

    @classmethod
    def group(cls, records: Iterable[RunRecord]) -> list[Sweep]:
        """Records grouped by sweep, in the order their sweeps were first seen."""
        groups: dict[SweepKey, list[RunRecord]] = {}
        for r in records:
            groups.setdefault(SweepKey.of(r), []).append(r)
        return [cls(key, tuple(sorted(runs, key=_order))) for key, runs in groups.items()]

    @classmethod
    def of(cls, records: Iterable[RunRecord]) -> Sweep:
        """The one sweep these records make; a UserError naming the sweeps when they make several."""
        sweeps = cls.group(records)
        if not sweeps:
            raise UserError("no results: a sweep needs at least one run")
        if len(sweeps) > 1:
            found = "; ".join(s.key.title() for s in sweeps)
            raise UserError(f"these results hold more than one sweep ({found}): point at one sweep's directory, "
                            "e.g. results/<machine>/<workload>-bs<N>")
        return sweeps[0]

    @property
    def baseline(self) -> RunRecord | None:
        """The run without techniques, whatever its status."""
        return next((r for r in self.runs if r.is_baseline), None)

    @property
    def reference(self) -> RunRecord | None:
        """The baseline when it finished ok with memory measured: what every change is measured against. A baseline
        that ran out of memory or failed stopped at a partial peak and is no reference."""
        base = self.baseline
        return base if base is not None and base.status == "ok" and base.memory is not None else None

    @property
    def finished(self) -> list[RunRecord]:
        """The runs that finished ok with memory measured."""
        return [r for r in self.runs if r.status == "ok" and r.memory is not None]

    @property
    def predicted(self) -> bool:
        return self.key.predicted

    def title(self) -> str:
        return self.key.title()

    def heading(self) -> str:
        """The report's title: the device's own name where a measured run recorded it."""
        env = next((r.env for r in self.runs if r.env and r.env.device_name), None)
        where = env.device_name if env is not None and not self.predicted else self.key.target
        return f"membench: {self.key.workload}, batch {self.key.batch_size}, on {where}"
