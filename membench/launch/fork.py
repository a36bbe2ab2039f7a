"""Runs of a workload that exists only in the caller's memory (a model defined in a notebook or a script).

`python -m membench.child.worker` rebuilds a workload from its name, which a `Workload` object made in a notebook does
not have. So such a run is isolated by forking the caller instead: the child inherits the object, runs the same
worker code and writes the same result file; an OOM, a crash or a hang there ends only the child. Fork works for
this only on Linux, only before the caller asked CUDA anything (a forked child cannot use CUDA once the parent
called torch.cuda.is_available() or started CUDA: membench itself asks torch.cuda.device_count(), which does not
count) and only where autograd works in the child (torch refuses in a child forked after the caller started
autograd's worker threads).
Otherwise the run happens in the caller's process, with a warning saying what that costs. A forked child
computes on one CPU thread (see _child_main): CPU timings of such runs are single-threaded.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from membench.common.errors import UserError
from membench.launch.lifecycle import NEW_PROCESS_ONLY, run_job
from membench.launch.lifeline import interrupts_held, release_interrupts
from membench.launch.progress import PROGRESS_ENV
from membench.results import RunRecord
from membench.spec import Job
from membench.techniques import Stack, resolve

IN_PROCESS_COST = (
    "an out-of-memory of the host, a crash or a hang in the model ends your own process (no timeout), and on CUDA "
    "your process's own tensors and cached blocks count in the measured peaks")


AUTOGRAD_FORK = "https://github.com/pytorch/pytorch/wiki/Autograd-and-Fork"


class InProcessWarning(UserWarning):
    """A run that could not be isolated in a child process."""


# The probe child's exit codes: what it found.
_FORK_OK, _NO_AUTOGRAD, _NO_CUDA = 0, 1, 3


def why_not_fork(device: str = "cpu") -> str | None:
    """None when a forked child can run a job on `device`; else why not, in words."""
    if sys.platform != "linux" or "fork" not in multiprocessing.get_all_start_methods():
        return f"fork is used only on Linux (this is {sys.platform})"
    if device == "cuda" and torch.cuda.is_initialized():
        return "CUDA is already initialised in this process, and a forked child cannot use it"
    found = _probe_fork(device)
    if found == _NO_CUDA:
        # torch.cuda.is_available() (cudaGetDeviceCount) poisons fork without initialising CUDA
        # (torch/csrc/cuda/Module.cpp): the child would fail at its first CUDA call.
        return ("CUDA was started in this process (torch.cuda.is_available() or another CUDA call), and a forked "
                "child cannot use it; torch.cuda.device_count() asks without starting it")
    if found != _FORK_OK:
        return f"autograd cannot run in a child forked from this process ({AUTOGRAD_FORK})"
    return None


def _probe_fork(device: str) -> int | None:
    """Whether a forked child can run a job: torch refuses backward in a child forked after the parent started
    autograd's worker threads, and CUDA in a child forked after the parent asked CUDA anything. No public flag
    says either in the parent, so ask a child: a few milliseconds. A model's own backward can still be refused
    where this small one is not: `launch` then runs it in this process."""
    probe = multiprocessing.get_context("fork").Process(target=_probe, args=(device,), daemon=True)
    probe.start()
    probe.join(60)
    if probe.is_alive():
        probe.kill()
        probe.join()
        return None
    return probe.exitcode


def _probe(device: str) -> None:
    try:
        if device == "cuda" and torch.cuda._is_in_bad_fork():
            os._exit(_NO_CUDA)
        torch.set_num_threads(1)
        x = torch.ones(2, requires_grad=True)
        (x * 2).sum().backward()
    except Exception:  # noqa: BLE001 - any failure means: do not fork
        os._exit(_NO_AUTOGRAD)
    os._exit(_FORK_OK)


# The worker's entry (child.worker.run), given by the caller: launch/ starts processes and never imports what runs
# in them.
Work = Callable[[Job, Path], None]


def launch(job: Job, out_dir: Path, on_stage=None, *, work: Work) -> RunRecord:
    """The sweep's `run_one` for a workload object: a forked child where possible, else this process."""
    if resolve(job.run).distributed or job.run.nproc_per_node > 1:
        raise UserError(f"{job.name} runs through torchrun, which rebuilds the workload by name: give it as "
                        "package.module:factory (membench run --workload ...)")
    reason = why_not_fork(job.run.device)
    if reason is not None:
        return run_job(job, out_dir, InProcess(reason, work), on_stage)
    record = run_job(job, out_dir, Fork(work), on_stage)
    if record.status == "error" and AUTOGRAD_FORK in (record.error or ""):
        # The probe's small backward passed, but this model's did not: what this process did with autograd
        # before cannot be forked. Run it here, as when fork is not possible at all; the refused attempt is not
        # a measurement to keep.
        return run_job(job, out_dir, InProcess("autograd refused to run in the forked child (this process used "
                                               "autograd in a way a fork cannot inherit: " + AUTOGRAD_FORK + ")",
                                     work),
                       on_stage, archive_first=False)
    return record


class Fork:
    what = "forked worker"

    def __init__(self, work: Work):
        self.work = work

    def start(self, job: Job, stack: Stack, out_path: Path, log: Path, env: dict[str, str]) -> _Forked:
        child = multiprocessing.get_context("fork").Process(target=_child_main,
                                                            args=(self.work, job, out_path, log, env),
                                                            daemon=True)
        with interrupts_held():
            child.start()
            return _Forked(child)


class _Forked:
    def __init__(self, child: multiprocessing.Process):
        self.child = child

    def wait(self, seconds: float) -> bool:
        self.child.join(seconds)
        return not self.child.is_alive()

    def kill(self) -> None:
        self.child.kill()
        self.child.join()

    def exit_code(self) -> int | None:
        return self.child.exitcode


def _child_main(work: Work, job: Job, out_path: Path, log: Path, env: dict[str, str]) -> None:
    """In the forked child: output to the run's log (in a notebook sys.stdout is the kernel's socket, which the
    child must not write to), the stack's environment (allocator settings act at CUDA's first use), then the
    worker, exactly as `python -m membench.child.worker` runs it."""
    release_interrupts()  # forked under lifeline.interrupts_held
    out = open(log, "w", buffering=1)  # kept open for the child's whole life
    os.dup2(out.fileno(), 1)
    os.dup2(out.fileno(), 2)
    sys.stdout = sys.stderr = out
    os.environ.update(env)
    # GNU OpenMP cannot start threads in a process forked after its parent used them (the child hangs in its
    # first parallel op), and a notebook has usually run the model already. One thread always works; memory is
    # the same, CPU step times are single-threaded (the result's env.cpu_threads says 1).
    torch.set_num_threads(1)
    work(job, out_path)
    out.flush()


class InProcess:
    """The worker in the caller's own process: no timeout, no isolation (IN_PROCESS_COST); it has finished
    when `start` returns."""

    what = "the worker in this process"

    def __init__(self, reason: str, work: Work):
        self.reason, self.work = reason, work

    def start(self, job: Job, stack: Stack, out_path: Path, log: Path, env: dict[str, str]) -> _Done:
        changed = {k: v for k, v in env.items() if k not in NEW_PROCESS_ONLY and os.environ.get(k) != v}
        before_cuda = set(changed) - {PROGRESS_ENV}  # what acts at CUDA's first use (allocator settings)
        if before_cuda and torch.cuda.is_initialized():
            raise UserError(f"{job.name} needs {', '.join(sorted(before_cuda))} set before CUDA starts, and CUDA "
                            "has already started in this process; run it before any CUDA work, or as "
                            "package.module:factory from the CLI")
        warnings.warn(f"membench: {job.name} runs in this process ({self.reason}): {IN_PROCESS_COST}",
                      InProcessWarning, stacklevel=2)
        saved = {k: os.environ.get(k) for k in changed}
        os.environ.update(changed)
        try:
            with _callers_random_state():
                self.work(job, out_path)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        return _Done()


def _callers_random_state():
    """The run seeds torch's generators (build_state: torch.manual_seed): the caller's own random streams go on
    afterwards as if it had not run. CPU's, and the current CUDA device's where CUDA had started (before that, the
    CUDA generator has no state of the caller's to keep)."""
    devices = [torch.cuda.current_device()] if torch.cuda.is_initialized() else []
    return torch.random.fork_rng(devices=devices)


class _Done:
    def wait(self, seconds: float) -> bool:
        return True

    def kill(self) -> None:
        pass

    def exit_code(self) -> int | None:
        return 0
