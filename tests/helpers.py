"""Helpers shared by tests: in-process runs under the exact CPU tracker, equivalence checks, test-only techniques.

Every memory number here comes from membench.measure.Session, the procedure the worker and the predictor use.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools

import torch

from membench import equivalence
from membench.child.worker import Worker
from membench.measure import Session
from membench.results import Equivalence, Memory, RunRecord
from membench.spec import Job, MeasureSpec, RunSpec
from membench.step import TrainState, batches
from membench.techniques import REGISTRY, resolve
from membench.trackers.memory import CpuMeter
from membench.workloads import load_workload


def spec(workload: str = "gpt-tiny", techniques: tuple[str, ...] = (), batch_size: int = 4, **options) -> Job:
    """A Job for in-process tests: run options go to RunSpec, the others to MeasureSpec."""
    run_fields = {f.name for f in dataclasses.fields(RunSpec)}
    run = {k: v for k, v in options.items() if k in run_fields}
    how = {"steps": 1, "warmup": 1, "check": False, "check_steps": 2,
           **{k: v for k, v in options.items() if k not in run_fields}}
    return Job(RunSpec(workload=workload, batch_size=batch_size, techniques=tuple(techniques), **run),
               MeasureSpec(**how)).validated()


def measure(workload: str = "gpt-tiny", techniques: tuple[str, ...] = (), **options) -> RunRecord:
    """One run in this process, as the worker runs it (no timeline file, no equivalence check)."""
    job = spec(workload, techniques, **options)
    record = RunRecord(name=job.name, status="ok", spec=job)
    Worker(job, None).execute().record_on(record)
    return record


def session_for(run: RunSpec, data=None, meter: CpuMeter | None = None) -> Session:
    workload = load_workload(run.workload)
    stack = resolve(run)
    stack.validate(run, workload)
    return Session(run, stack, workload, meter or CpuMeter(budget=run.memory_budget),
                   data if data is not None else batches(workload, run))


def verdict(workload: str = "gpt-tiny", techniques: tuple[str, ...] = (), **options) -> Equivalence:
    job = spec(workload, techniques, check=True, **options)
    return equivalence.check(job.run, resolve(job.run), load_workload(job.run.workload), job.measure.check_steps)


def cuda_trace(fn, gpu) -> list[tuple[str, int]]:
    """The ("alloc" | "free", bytes) sequence a CUDA prediction's tracker records while fn runs on fake tensors for
    `gpu` (a predict.gpus entry); cuBLAS's workspaces are left out (0 bytes)."""
    from membench.predict.emulate import fake
    from membench.predict.emulate.kernels import CudaKernels
    from membench.trackers.storage import StorageTracker

    with fake.fake_tensors():
        tracker = StorageTracker(trace=True)
        tracker.kernels = CudaKernels(gpu, workspace_bytes=0)
        with tracker:
            fn()
    return sized_events(tracker.trace)  # a storage tracker traces allocations and frees only


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


def track_steps(s: Job, steps: int = 2, warmup: int = 1) -> tuple[Memory, CpuMeter, TrainState, tuple]:
    """Warm up, reset the peak, run `steps` steps on one held batch; returns (memory, meter, state, batch)."""
    workload = load_workload(s.run.workload)
    batch = workload.make_batch(s.run.batch_size, torch.Generator().manual_seed(0))
    meter = CpuMeter(budget=s.run.memory_budget)
    session = session_for(s.run, data=itertools.repeat(batch), meter=meter)
    session.build()
    session.warm_up(warmup)
    memory, _, _ = session.measure(steps)
    return memory, meter, session.state, batch


def replace(s: Job, **kw) -> Job:
    run_fields = {f.name for f in dataclasses.fields(RunSpec)}
    run = {k: v for k, v in kw.items() if k in run_fields}
    how = {k: v for k, v in kw.items() if k not in run_fields}
    return dataclasses.replace(s, run=dataclasses.replace(s.run, **run),
                               measure=dataclasses.replace(s.measure, **how)).validated()


@dataclasses.dataclass
class Cli:
    """What one `membench ...` command did, run in this process: exit code and its output."""

    returncode: int
    stdout: str
    stderr: str


def cli(*args) -> Cli:
    """`membench ARGS` in this process (seconds faster than `python -m membench`, which imports torch again).

    Keep real subprocesses for what needs the process boundary: signals, closed pipes, the interpreter's exit.
    """
    import io

    from membench.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in args])
        except SystemExit as stop:  # argparse: usage errors and --help/--version
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 2)
    return Cli(code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def probe_in_process(monkeypatch):
    """Plan a user's package.module:factory workload in this process instead of the launcher's child process: the
    same planning and the same answer, without starting Python and torch again. tests/launch/test_isolation.py checks
    the child process itself (a factory that hangs, aborts or raises)."""
    from membench import plan
    from membench.child.probe import plan_here
    from membench.common.errors import UserError

    def probe(plan_args: dict, timeout_s: float) -> list[Job]:
        answer = plan_here(plan_args)
        if answer.get("error"):
            raise UserError(str(answer["error"]).splitlines()[0])
        return [Job.from_dict(d) for d in answer["jobs"]]

    monkeypatch.setattr(plan, "probe", probe)
    yield


def sized_events(trace) -> list[tuple[str, int]]:
    """A storage tracker's trace as (kind, bytes) in order, a free named by the bytes of what it frees."""
    sizes, order = {}, []
    for event in trace:
        if event.kind == "alloc":
            sizes[event.key] = event.size
        order.append((event.kind, sizes[event.key]))
    return order


# --- `membench run` of a tiny workload in this process, and the one error line it ends with -----------------------

TINY_RUN = ("--workload", "tests.workloads:mlp", "--batch-size", "4", "--techniques", "baseline", "--steps", "1",
            "--warmup", "1", "--no-check", "--no-timeline")


def run_tiny(*args) -> int:
    from membench.cli import main

    return main(["run", *TINY_RUN, *args])


def one_error_line(capsys) -> str:
    """The one error line (the sweep's progress lines may come before it), and no traceback."""
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("membench: error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]
