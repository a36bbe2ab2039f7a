"""Helpers shared by the technique-catalogue tests: one in-process run, one equivalence check, all on CPU."""

from __future__ import annotations

import contextlib

from membench import equivalence
from membench.spec import RunSpec
from membench.techniques import REGISTRY
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
