"""A sweep: every job in turn in one results folder, held under a lock; Ctrl-C or SIGTERM stops it with the
finished runs kept; --resume keeps results measured with the same job."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import signal
from collections.abc import Callable
from pathlib import Path

from membench.common.errors import UserError
from membench.common.fsio import make_dir, open_lock_file
from membench.launch.lifeline import Terminated
from membench.launch.process import launch
from membench.results import RunRecord, check_result_paths, is_finished, read_result, result_path
from membench.results.progress import Stage
from membench.spec import Job
from membench.techniques import pairing_key


class Interrupted(Exception):
    """Ctrl-C or SIGTERM during a sweep: the finished runs are on disk; `results` holds them."""

    def __init__(self, results: list[RunRecord], terminated: bool = False):
        super().__init__("terminated" if terminated else "interrupted")
        self.results = results
        self.terminated = terminated  # SIGTERM rather than Ctrl-C (SIGINT): exit code 143 rather than 130


@contextlib.contextmanager
def sigterm_as_interrupt():
    """Inside the block, SIGTERM (kill, systemd, a CI runner's cancel) stops the sweep the way Ctrl-C does."""

    def handler(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


LOCK_NAME = ".membench.lock"
_HELD: set[Path] = set()  # folders this process has locked: locking one again inside is a no-op


@contextlib.contextmanager
def locked(out_dir: Path):
    """One writer per results folder: two sweeps into one --out would archive and overwrite each other's runs.

    An flock on <out>/.membench.lock, taken without waiting. The kernel drops it when the holder exits however it
    exits (kill -9 included), so a stale lock file never blocks the next sweep; the file itself stays (deleting it
    would race with the next writer taking it). It holds the holder's pid, for the refusal message only.
    """
    make_dir(out_dir)
    key = Path(out_dir).resolve()
    if key in _HELD:  # this process holds it already (the CLI locks before its progress display starts)
        yield
        return
    fd = open_lock_file(out_dir, LOCK_NAME)  # not inherited by workers
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise UserError(f"{out_dir} is in use by another membench run (pid {holder}): wait for it to finish "
                            "or choose another --out") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        _HELD.add(key)
        try:
            yield
        finally:
            _HELD.discard(key)
    finally:
        os.close(fd)


def _flat(d: dict, prefix: str = "") -> dict:
    return {k2: v2 for k, v in d.items()
            for k2, v2 in (_flat(v, f"{prefix}{k}.").items() if isinstance(v, dict) else [(f"{prefix}{k}", v)])}


def spec_changes(stored: Job, job: Job) -> list[str]:
    """How the job a result was measured with differs from `job` ('run.batch_size 4 -> 8'); [] when equal.
    The whole job is compared (what ran, how it was measured and launched; not the options of techniques it
    does not use: techniques.pairing_key): a result is reused only as is."""
    stored, job = (dataclasses.replace(j, run=pairing_key(j.run)) for j in (stored, job))
    old, new = _flat(stored.to_dict()), _flat(job.to_dict())
    return [f"{k} {old.get(k, '(none)')!r} -> {new.get(k, '(none)')!r}"
            for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]


def run_all(jobs: list[Job], out_dir: Path, resume: bool = False,
            on_start: Callable[[Job], None] | None = None,
            on_done: Callable[[Job, RunRecord, bool], None] | None = None,
            on_note: Callable[[Job, str], None] | None = None,
            run_one: Callable[..., RunRecord] | None = None,
            on_stage: Callable[[Job, Stage], None] | None = None) -> list[RunRecord]:
    """Run every job in turn, holding out_dir's lock; with resume, keep the results already finished there
    with the same job (on_note says why another is run again). on_stage(job, stage): the running job's stages.

    run_one(job, out_dir, on_stage): how one job runs (default `process.launch`: its own
    `python -m membench.child.worker` process; fork.launch forks, for a workload object that has no name to
    rebuild it from).
    """
    # Absolute before any user code runs: a factory that changes the working directory must not move --out.
    out_dir = Path(out_dir).absolute()
    with locked(out_dir):
        return _run_all(jobs, out_dir, resume, on_start, on_done, on_note, run_one or launch, on_stage)


def _run_all(jobs, out_dir, resume, on_start, on_done, on_note, run_one, on_stage) -> list[RunRecord]:
    check_result_paths(jobs, out_dir)
    results = []
    for job in jobs:
        path = result_path(out_dir, job.name)
        if resume and is_finished(path):
            kept = read_result(path)
            changes = spec_changes(kept.spec, job)
            if not changes:
                results.append(kept)
                if on_done:
                    on_done(job, kept, True)
                continue
            if on_note:
                on_note(job, f"not resumed: {path} was measured with another spec ({'; '.join(changes)}); "
                              "running it again (the old result moves to previous/)")
        try:
            if on_start:
                on_start(job)
            results.append(run_one(job, out_dir, (lambda stage, job=job: on_stage(job, stage)) if on_stage else None))
        except KeyboardInterrupt as stop:
            raise Interrupted(results, terminated=isinstance(stop, Terminated)) from None
        if on_done:
            on_done(job, results[-1], False)
    return results
