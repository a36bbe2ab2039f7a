"""Isolation: each run in its own process, so one run's OOM, crash or hang never costs the others' results."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from membench.results import Environment, RunRecord, is_finished, read_result, result_path, write_record
from membench.spec import Job
from membench.techniques import Stack, resolve


class Interrupted(Exception):
    """Ctrl-C during a sweep: the finished runs are on disk; `results` holds them."""

    def __init__(self, results: list[RunRecord]):
        super().__init__("interrupted")
        self.results = results


def command_for(job: Job, stack: Stack, spec_path: Path, out_path: Path) -> list[str]:
    if job.run.nproc_per_node > 1 or stack.distributed:
        # One machine: torchrun's standalone rendezvous; several: the user's own torchrun arguments.
        rendezvous = shlex.split(job.launch.torchrun_args) if job.launch.torchrun_args else ["--standalone"]
        return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={job.run.nproc_per_node}",
                *rendezvous, "-m", "membench.worker", str(spec_path), str(out_path)]
    return [sys.executable, "-m", "membench.worker", str(spec_path), str(out_path)]


def environment_for(stack: Stack) -> dict[str, str]:
    env = dict(os.environ)
    for key, value in stack.env.items():
        # Allocator settings are comma-separated lists: add ours to what the user already set.
        env[key] = f"{env[key]},{value}" if env.get(key) else value
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _archive(path: Path) -> None:
    """Never lose a measurement: an earlier result for the same run moves aside instead of being overwritten."""
    if path.exists():
        previous = path.parent / "previous"
        previous.mkdir(exist_ok=True)
        shutil.move(str(path), previous / f"{path.stem}.{int(path.stat().st_mtime)}.json")


def _failure(job: Job, status: str, message: str, log: Path) -> RunRecord:
    tail = log.read_text(errors="replace")[-4000:] if log.exists() else ""
    return RunRecord(name=job.name, status=status, error=message, spec=job, env=Environment(device=job.run.device),
                     log_tail=tail)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def launch(job: Job, out_dir: Path) -> RunRecord:
    """Run one job in a subprocess (a new process group, so a timeout kills torchrun's children too)."""
    stack = resolve(job.run)
    out_path = result_path(out_dir, job.name)
    runs_dir = out_dir / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    spec_path = runs_dir / f"{job.name}.spec.json"
    spec_path.write_text(json.dumps(job.to_dict(), indent=1))
    log = runs_dir / f"{job.name}.log"
    _archive(out_path)
    started = time.time()
    timeout = job.launch.timeout_s
    with open(log, "w") as log_file:
        proc = subprocess.Popen(command_for(job, stack, spec_path, out_path), stdout=log_file,
                                stderr=subprocess.STDOUT, env=environment_for(stack), start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(proc)
            write_record(out_path, _failure(job, "timeout", f"no result after {timeout:g} s (--timeout)", log))
            return read_result(out_path)
        except KeyboardInterrupt:
            _kill(proc)
            raise
    if out_path.exists() and out_path.stat().st_mtime >= started - 1:
        return read_result(out_path)
    message = f"worker exited with code {rc} before writing a result"
    if rc < 0:
        message += f" (killed by signal {-rc}{'; out of host memory?' if -rc == signal.SIGKILL else ''})"
    write_record(out_path, _failure(job, "error", message, log))
    return read_result(out_path)


def run_all(jobs: list[Job], out_dir: Path, resume: bool = False,
            on_start: Callable[[Job], None] | None = None,
            on_done: Callable[[Job, RunRecord, bool], None] | None = None,
            run_one: Callable[[Job, Path], RunRecord] | None = None) -> list[RunRecord]:
    """Run every job in turn; with resume, keep the results already finished in out_dir.

    run_one: how one job runs (default `launch`: its own `python -m membench.worker` process; membench.child
    forks, for a workload object that has no name to rebuild it from).
    """
    run_one = run_one or launch
    results = []
    for job in jobs:
        path = result_path(out_dir, job.name)
        if resume and is_finished(path):
            results.append(read_result(path))
            if on_done:
                on_done(job, results[-1], True)
            continue
        try:
            if on_start:
                on_start(job)
            results.append(run_one(job, out_dir))
        except KeyboardInterrupt:
            raise Interrupted(results) from None
        if on_done:
            on_done(job, results[-1], False)
    return results
