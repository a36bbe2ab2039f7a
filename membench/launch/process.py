"""The usual launcher: the worker in a new Python process (`python -m membench.child.worker`), or torchrun and
its ranks for a distributed stack, in a session of its own (a terminal's Ctrl-C reaches only the sweep, which kills
the worker's group itself). The worker dies with the sweep however the sweep dies, and torchrun's ranks with
torchrun (lifeline)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from membench.common.fsio import open_fresh
from membench.launch.lifecycle import run_job, spec_file, through_torchrun
from membench.launch.lifeline import child_env, interrupts_held, preexec_for
from membench.results import RunRecord
from membench.results.progress import Stage
from membench.spec import Job
from membench.techniques import Stack

WORKER = "membench.child.worker"


def command_for(job: Job, stack: Stack, spec_path: Path, out_path: Path) -> list[str]:
    if through_torchrun(job, stack):
        # One machine: torchrun's standalone rendezvous; several: the nodes' options (spec/nodes.py), and the
        # user's own torchrun arguments.
        nodes = job.launch.nodes.torchrun_options(job.name)
        extra = shlex.split(job.launch.torchrun_args)
        rendezvous = [*nodes, *extra] if nodes or extra else ["--standalone"]
        return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={job.run.nproc_per_node}",
                *rendezvous, "-m", WORKER, str(spec_path), str(out_path)]
    return [sys.executable, "-m", WORKER, str(spec_path), str(out_path)]


class Subprocess:
    what = "worker"

    def start(self, job: Job, stack: Stack, out_path: Path, log: Path, env: dict[str, str]) -> _Popen:
        spec_path = spec_file(log.parent, job)
        with open_fresh(log) as log_file, interrupts_held():  # the child holds its own copy of the descriptor
            return _Popen(subprocess.Popen(command_for(job, stack, spec_path, out_path), stdout=log_file,
                                           stderr=subprocess.STDOUT, env=child_env(env), start_new_session=True,
                                           preexec_fn=preexec_for(os.getpid())))


class _Popen:
    def __init__(self, proc: subprocess.Popen):
        self.proc = proc

    def wait(self, seconds: float) -> bool:
        try:
            self.proc.wait(timeout=seconds)
            return True
        except subprocess.TimeoutExpired:
            return False

    def kill(self) -> None:
        kill_session(self.proc)

    def exit_code(self) -> int | None:
        return self.proc.returncode


def kill_session(proc: subprocess.Popen) -> None:
    """Kill a child started with start_new_session and everything in its session's group, then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def launch(job: Job, out_dir: Path, on_stage: Callable[[Stage], None] | None = None) -> RunRecord:
    """Run one job in its own process (lifecycle.run_job)."""
    return run_job(job, Path(out_dir), Subprocess(), on_stage)
