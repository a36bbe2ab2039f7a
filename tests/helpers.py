"""Helpers shared by tests: in-process runs under the exact CPU tracker, equivalence checks, test-only techniques."""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from membench import equivalence
from membench.spec import RunSpec
from membench.step import build_state, train_step
from membench.techniques import REGISTRY, instantiate
from membench.trackers.memory import CpuMeter
from membench.worker import execute
from membench.workloads import load_workload


def spec(workload: str = "gpt-tiny", techniques: tuple[str, ...] = (), batch_size: int = 4, **options) -> RunSpec:
    options = {"steps": 1, "warmup": 1, "check": False, "check_steps": 2, **options}
    return RunSpec(workload=workload, batch_size=batch_size, techniques=tuple(techniques), **options).validated()


def measure(workload: str = "gpt-tiny", techniques: tuple[str, ...] = (), **options) -> dict:
    """One run in this process with the exact CPU tracker: the worker's result (memory, timing)."""
    return execute(spec(workload, techniques, **options), {})


def verdict(workload: str = "gpt-tiny", techniques: tuple[str, ...] = (), **options) -> dict:
    s = spec(workload, techniques, check=True, **options)
    return equivalence.check(s, load_workload(s.workload))


def adam_step_bytes(workload: str = "gpt-tiny") -> int:
    """Adam keeps one fp32 `step` counter per parameter, whatever the parameters' dtype or sharding."""
    return 4 * len(list(load_workload(workload).build_model().parameters()))


@contextlib.contextmanager
def on_cpu_too(monkeypatch, *names: str):
    """Let CUDA-only techniques run on CPU, to test their logic (their memory effect needs a GPU)."""
    for name in names:
        monkeypatch.setattr(REGISTRY[name], "devices", ("cpu", "cuda"))
    yield


@contextlib.contextmanager
def registered(cls):
    """A technique defined by a test, in the registry for the duration of a with-block."""
    REGISTRY[cls.name] = cls
    try:
        yield cls
    finally:
        del REGISTRY[cls.name]


def track_steps(s: RunSpec, steps: int = 2, warmup: int = 1) -> tuple[dict, CpuMeter, object, tuple]:
    """Warm up, reset the peak, run `steps` steps on one held batch; returns (memory result, meter, state, batch)."""
    workload = load_workload(s.workload)
    techniques = instantiate(s)
    for t in techniques:
        t.validate(s, workload)
    meter = CpuMeter(budget=s.memory_budget)
    with meter.active():
        state = build_state(s, workload, techniques, on_model=meter.attach_model)
        meter.attach_optimizers(state.optimizers)
        batch = workload.make_batch(s.batch_size, torch.Generator().manual_seed(0))
        meter.track_inputs(batch)
        for i in range(warmup):
            train_step(state, batch, meter.phase)
        meter.reset_peak()
        for i in range(steps):
            train_step(state, batch, meter.phase)
    return meter.result(), meter, state, batch


def replace(s: RunSpec, **kw) -> RunSpec:
    return dataclasses.replace(s, **kw).validated()
