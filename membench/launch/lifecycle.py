"""One run's lifecycle, whatever process it runs in: archive the earlier run's files, start the worker with its
log, pass on its stages, wait for it under the timeout, kill it on timeout or Ctrl-C, and make sure a result file
is left (a failure record with the end of the log when the worker left none).

How the worker's process starts is a `Launcher`: `process.Subprocess` (`python -m membench.child.worker`, or
torchrun for distributed stacks), `fork.Fork` (a forked child, for a workload object with no name) and
`fork.InProcess` (the caller's own process, where neither is possible). `run_job` is the one lifecycle for all.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from membench.allocator.settings import with_allocator_env
from membench.common.fsio import atomic_write_text, own_dir
from membench.launch.distributed import merge_ranks
from membench.launch.progress import PROGRESS_ENV, StageReader
from membench.results import Environment, RunRecord, archive, read_result, result_path, write_record
from membench.results.progress import Stage
from membench.spec import Job
from membench.techniques import Stack, resolve

# Variables that matter only to a new Python process (a worker's log is written as it goes): a run in the caller's
# own process neither needs nor sets them.
NEW_PROCESS_ONLY = frozenset({"PYTHONUNBUFFERED"})


def environment_for(stack: Stack) -> dict[str, str]:
    """The worker's environment: this process's, with the stack's allocator settings added to the user's."""
    env = with_allocator_env(os.environ, stack.env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def failure_record(job: Job, status: str, message: str, log: Path) -> RunRecord:
    """The record of a run that left none of its own (timeout, crash): why, and the end of its log."""
    return RunRecord(name=job.name, status=status, error=message, spec=job, env=Environment(device=job.run.device),
                     log_tail=_log_tail(log) or "")


POLL_S = 0.5  # how often the sweep reads a running worker's progress file


def stage_reader(job: Job, runs_dir: Path, env: dict[str, str], started: float) -> StageReader:
    """The progress file of one run (<out>/runs/<run>.progress), named to the worker in its environment."""
    path = runs_dir / f"{job.name}.progress"
    env[PROGRESS_ENV] = str(path.resolve())
    return StageReader(path, job.name, started)


def wait_reporting(wait: Callable[[float], object], reader: StageReader, timeout_s: float,
                   on_stage: Callable[[Stage], None] | None) -> bool:
    """wait(seconds) until it returns (True) or timeout_s passes (False), passing on the worker's stages."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        finished = wait(max(0.0, min(POLL_S, left)))
        if on_stage:
            for stage in reader.read():
                on_stage(stage)
        if finished:
            return True
        if left <= POLL_S:
            return False


class Started(Protocol):
    """A worker that was started."""

    def wait(self, seconds: float) -> bool:
        """Wait up to `seconds`; True once the worker has exited."""

    def kill(self) -> None:
        """End the worker (and what it started) now, and reap it."""

    def exit_code(self) -> int | None:
        """After it exited: its exit status, negative for a signal (None if unknown)."""


class Launcher(Protocol):
    """How one job's worker process starts. `what` names it in a failure message ("worker", "forked worker")."""

    what: str

    def start(self, job: Job, stack: Stack, out_path: Path, log: Path, env: dict[str, str]) -> Started:
        """Start the worker that runs `job` and writes `out_path`, its output into `log`, in environment `env`
        (the whole environment the worker should see: os.environ plus the stack's settings and the progress
        file)."""


def run_job(job: Job, out_dir: Path, launcher: Launcher, on_stage: Callable[[Stage], None] | None = None,
            archive_first: bool = True) -> RunRecord:
    """Run one job through `launcher` and return its record, which is always on disk at result_path(out_dir,
    job.name) afterwards. on_stage gets the worker's stages as they come (membench.launch.progress).
    archive_first=False: this run replaces an attempt of the same call that could not run (fork.launch)."""
    stack = resolve(job.run)
    out_path = result_path(out_dir, job.name)
    runs_dir = own_dir(Path(out_dir) / "runs")
    # What runs, written first: a disk that cannot take it fails the run before anything earlier is moved.
    atomic_write_text(spec_file(runs_dir, job), json.dumps(job.to_dict(), indent=1))
    if archive_first:
        archive(out_dir, job.name)
    log = runs_dir / f"{job.name}.log"
    env = environment_for(stack)
    started = time.time()
    reader = stage_reader(job, runs_dir, env, started)
    timeout = job.launch.timeout_s
    worker = launcher.start(job, stack, out_path, log, env)
    try:
        if not wait_reporting(worker.wait, reader, timeout, on_stage):
            worker.kill()
            return _written(out_path, failure_record(job, "timeout", f"no result after {timeout:g} s (--timeout)",
                                                     log))
    except KeyboardInterrupt:
        worker.kill()
        raise
    if through_torchrun(job, stack):  # every rank wrote its record: a failed rank's is the run's
        # Across nodes, global rank 0 may be on another node (spec/nodes.py): this node's record is then its first
        # rank's, and the report merges the nodes' records (results/nodes.py).
        merged = merge_ranks(out_path, started, rank0_here=not job.launch.nodes.several)
        if merged is not None:
            merged.log_tail = _log_tail(log)
            return _written(out_path, merged)
    if out_path.exists() and out_path.stat().st_mtime >= started - 1:
        return read_result(out_path)
    code = worker.exit_code()
    message = f"{launcher.what} exited with code {code} before writing a result"
    if code is not None and code < 0:
        message += f" (killed by signal {-code}{'; out of host memory?' if -code == signal.SIGKILL else ''})"
    record = failure_record(job, "error", message, log)
    last = next((line.strip() for line in reversed((record.log_tail or "").splitlines()) if line.strip()), "")
    if last:  # the reason it gave, if any (torchrun's "error: unrecognized arguments: ..."); the log has the rest
        record.error += f"; its log ends: {last[:300]}"
    return _written(out_path, record)


def through_torchrun(job: Job, stack: Stack) -> bool:
    """Several ranks on this node, or a distributed technique (across nodes, one torchrun job over them all). The
    other runs (the baseline included) are single-device runs, on each node alone (plan.py)."""
    return job.run.nproc_per_node > 1 or stack.distributed


def spec_file(runs_dir: Path, job: Job) -> Path:
    """runs/<run>.spec.json: the job as the worker reads it (`python -m membench.child.worker SPEC RESULT`)."""
    return runs_dir / f"{job.name}.spec.json"


def _written(path: Path, record: RunRecord) -> RunRecord:
    write_record(path, record)
    return read_result(path)


def _log_tail(log: Path) -> str | None:
    return log.read_text(errors="replace")[-4000:] if log.exists() else None
