"""Isolation: each run in its own process, so one run's OOM, crash or hang never costs the others' results."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from membench.errors import UserError
from membench.fsio import atomic_write_text, is_environment_error, make_dir, open_fresh, own_dir, user_error
from membench.lifeline import Terminated, child_env, preexec_for
from membench.progress import PROGRESS_ENV, Stage, StageReader
from membench.results import Environment, RunRecord, is_finished, read_result, result_path, write_record
from membench.spec import Job
from membench.techniques import Stack, resolve


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
    path = Path(out_dir) / LOCK_NAME
    try:
        # Not inherited by workers (O_CLOEXEC by default); never through a link planted in its place.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UserError(f"{path} is a symlink: membench does not write through links; remove it") from None
        if not is_environment_error(exc):
            raise
        raise user_error(exc, "write in", Path(out_dir)) from None
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


def command_for(job: Job, stack: Stack, spec_path: Path, out_path: Path) -> list[str]:
    if job.run.nproc_per_node > 1 or stack.distributed:
        # One machine: torchrun's standalone rendezvous; several: the user's own torchrun arguments.
        rendezvous = shlex.split(job.launch.torchrun_args) if job.launch.torchrun_args else ["--standalone"]
        return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={job.run.nproc_per_node}",
                *rendezvous, "-m", "membench.worker", str(spec_path), str(out_path)]
    return [sys.executable, "-m", "membench.worker", str(spec_path), str(out_path)]


# The CUDA allocator's settings go by two names, and torch reads them in different orders: since 2.9
# AcceleratorAllocatorConfig prefers PYTORCH_ALLOC_CONF ("PYTORCH_CUDA_ALLOC_CONF is also supported with lower
# priority", c10/core/AllocatorConfig.h), CUDAAllocatorConfig::instance() reads PYTORCH_CUDA_ALLOC_CONF first
# (c10/cuda/CUDAAllocatorConfig.h, 2.14). A setting made under one name only is ignored wherever the other is set.
ALLOC_CONF = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def environment_for(stack: Stack) -> dict[str, str]:
    env = dict(os.environ)
    for key, value in stack.env.items():
        # Allocator settings are comma-separated lists: add ours to what the user already set, under both names
        # (each keeps what the user set under it, else under the other name).
        names = ALLOC_CONF if key in ALLOC_CONF else (key,)
        user = {name: env.get(name) for name in names}
        for name in names:
            theirs = user[name] or next((user[n] for n in names if user[n]), None)
            env[name] = f"{theirs},{value}" if theirs else value
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


# A run's files beside its result: <run>.json, <run>.timeline.json, <run>.snapshot.pickle, <run>.oom.pickle, and
# the same off rank 0 as <run>.rank<N>.* (worker._stem).
_RUN_FILE = r"(\.rank\d+)?\.(json|timeline\.json|snapshot\.pickle|oom\.pickle)"


def run_files(out_dir: Path, name: str) -> list[Path]:
    pattern = re.compile(re.escape(name) + _RUN_FILE)
    return sorted(p for p in Path(out_dir).iterdir() if pattern.fullmatch(p.name) and not p.is_dir())


def archive(out_dir: Path, name: str) -> Path | None:
    """Never lose a measurement: an earlier run's files (result, timeline, snapshots, and its log) move together
    to previous/<run>.<UTC time of its result, to the microsecond>-<n>/ instead of being overwritten. Together,
    the archived result's relative file names still point at its own timeline and snapshots; <n> keeps two
    archives of the same microsecond apart (the folder is created exclusively)."""
    files = run_files(out_dir, name)
    if not files:
        return None
    result = result_path(out_dir, name)
    stamp = datetime.fromtimestamp((result if result in files else files[0]).stat().st_mtime, timezone.utc)
    previous = own_dir(Path(out_dir) / "previous")
    for n in itertools.count():
        folder = previous / f"{name}.{stamp:%Y%m%dT%H%M%S.%fZ}-{n}"
        try:
            folder.mkdir()
            break
        except FileExistsError:
            continue
    log = Path(out_dir) / "runs" / f"{name}.log"
    for path in files + ([log] if log.is_file() and not log.is_symlink() else []):
        os.replace(path, folder / path.name)
    return folder


def failure_record(job: Job, status: str, message: str, log: Path) -> RunRecord:
    """The record of a run that left none of its own (timeout, crash): why, and the end of its log."""
    tail = log.read_text(errors="replace")[-4000:] if log.exists() else ""
    return RunRecord(name=job.name, status=status, error=message, spec=job, env=Environment(device=job.run.device),
                     log_tail=tail)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


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


def _popen_waiter(proc: subprocess.Popen) -> Callable[[float], bool]:
    def wait(seconds: float) -> bool:
        try:
            proc.wait(timeout=seconds)
            return True
        except subprocess.TimeoutExpired:
            return False
    return wait


def launch(job: Job, out_dir: Path, on_stage: Callable[[Stage], None] | None = None) -> RunRecord:
    """Run one job in a subprocess, in a new session (a terminal's Ctrl-C reaches only the sweep, which kills the
    worker's group itself). The worker dies with this process however it dies, and torchrun's ranks with
    torchrun (membench.lifeline). on_stage gets the worker's stages as they come (membench.progress)."""
    stack = resolve(job.run)
    out_path = result_path(out_dir, job.name)
    runs_dir = own_dir(out_dir / "runs")
    spec_path = runs_dir / f"{job.name}.spec.json"
    atomic_write_text(spec_path, json.dumps(job.to_dict(), indent=1))
    archive(out_dir, job.name)
    log = runs_dir / f"{job.name}.log"
    started = time.time()
    timeout = job.launch.timeout_s
    env = environment_for(stack)
    reader = stage_reader(job, runs_dir, env, started)
    with open_fresh(log) as log_file:
        proc = subprocess.Popen(command_for(job, stack, spec_path, out_path), stdout=log_file,
                                stderr=subprocess.STDOUT, env=child_env(env), start_new_session=True,
                                preexec_fn=preexec_for(os.getpid()))
        try:
            if not wait_reporting(_popen_waiter(proc), reader, timeout, on_stage):
                _kill(proc)
                write_record(out_path, failure_record(job, "timeout", f"no result after {timeout:g} s (--timeout)",
                                                      log))
                return read_result(out_path)
            rc = proc.returncode
        except KeyboardInterrupt:
            _kill(proc)
            raise
    if job.run.nproc_per_node > 1 or stack.distributed:  # every rank wrote its record: a failed rank's is the run's
        from membench.distributed import merge_ranks

        merged = merge_ranks(out_path, started)
        if merged is not None:
            merged.log_tail = log.read_text(errors="replace")[-4000:] if log.exists() else None
            write_record(out_path, merged)
            return read_result(out_path)
    if out_path.exists() and out_path.stat().st_mtime >= started - 1:
        return read_result(out_path)
    message = f"worker exited with code {rc} before writing a result"
    if rc < 0:
        message += f" (killed by signal {-rc}{'; out of host memory?' if -rc == signal.SIGKILL else ''})"
    record = failure_record(job, "error", message, log)
    last = next((line.strip() for line in reversed((record.log_tail or "").splitlines()) if line.strip()), "")
    if last:  # the reason it gave, if any (torchrun's "error: unrecognized arguments: ..."); the log has the rest
        record.error += f"; its log ends: {last[:300]}"
    write_record(out_path, record)
    return read_result(out_path)


PROBE_MIN_S = 30.0


def probe(plan_args: dict, timeout_s: float) -> list[Job]:
    """Plan a sweep of a user's workload in a child process, under the run's timeout: the user's factory is
    imported and called there, never in the sweep's own process. A factory that hangs, aborts or raises is one
    line (UserError) before anything runs. Notes the child prints ("membench: ...") are passed on."""
    import tempfile

    workload = plan_args["workload"]
    # Starting Python and importing torch takes seconds before the factory runs: a short --timeout (meant for a
    # training run) must not fail the loading, so the probe waits at least PROBE_MIN_S.
    timeout_s = max(timeout_s, PROBE_MIN_S)
    with tempfile.TemporaryDirectory(prefix="membench-probe-") as tmp:
        path = Path(tmp) / "plan.json"
        path.write_text(json.dumps(plan_args))
        try:
            proc = subprocess.run([sys.executable, "-m", "membench.plan_probe", str(path)],
                                  capture_output=True, text=True, timeout=timeout_s, env=child_env(dict(os.environ)),
                                  preexec_fn=preexec_for(os.getpid()))
        except subprocess.TimeoutExpired:
            raise UserError(f"workload {workload!r} did not load within {timeout_s:g} s (--timeout): its factory "
                            "hangs?") from None
    lines = proc.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if proc.returncode == 0 and lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit code {proc.returncode}"
        tail = (proc.stderr.strip().splitlines() or [""])[-1][:200]
        raise UserError(f"workload {workload!r} crashed while loading ({how}){': ' + tail if tail else ''}")
    if answer.get("error"):
        raise UserError(str(answer["error"]).splitlines()[0])
    for line in proc.stderr.splitlines():
        if line.startswith("membench: "):
            print(line, file=sys.stderr)
    return [Job.from_dict(d) for d in answer["jobs"]]


def call_isolated(kind: str, request: dict, timeout_s: float, what: str) -> dict:
    """Run `python -m membench.plan_probe --call KIND` on `request` in a child process, under `timeout_s`: how predict
    and fit run a user's code (and everything after it) out of this process, as `run` does with its workers.

    The answer comes back in a file, never on the child's stdout (user code prints: 10 MB of it, or an atexit
    handler's). The child's output (progress lines, the user's prints) is passed on to stderr, line by line. The
    child runs in a session of its own, which is killed when it ends however it ends, so processes the user's
    code forked end with it; it dies with this process (lifeline); the temporary folder goes on SIGTERM too.
    A child that hangs, exits or dies without answering is one line (UserError); an answer {"error": ...} too.
    """
    import tempfile
    import threading

    timeout_s = max(timeout_s, PROBE_MIN_S)
    with sigterm_as_interrupt(), tempfile.TemporaryDirectory(prefix=f"membench-{kind}-") as tmp:
        request_path, answer_path = Path(tmp) / "request.json", Path(tmp) / "answer.json"
        request_path.write_text(json.dumps(request))
        proc = subprocess.Popen([sys.executable, "-m", "membench.plan_probe", "--call", kind, str(request_path),
                                 str(answer_path)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=child_env(dict(os.environ)), start_new_session=True,
                                preexec_fn=preexec_for(os.getpid()))

        def relay() -> None:  # ends when the last holder of the pipe (the child, or one it forked) is gone
            for line in iter(proc.stdout.readline, b""):
                sys.stderr.write(line.decode(errors="replace"))
                sys.stderr.flush()

        reader = threading.Thread(target=relay, daemon=True)
        reader.start()
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            rc = None
        finally:  # a timeout, Ctrl-C, SIGTERM or a clean end: the child's whole session goes
            _kill(proc)
            reader.join(5)
            proc.stdout.close()
        if rc is None:
            raise UserError(f"{what} did not finish within {timeout_s:g} s (--timeout): the workload's code hangs, "
                            "or give more time")
        try:
            answer = json.loads(answer_path.read_text())
        except (OSError, ValueError):
            answer = None
    if not isinstance(answer, dict):
        how = f"was killed by signal {-rc}" if rc < 0 else f"exited with code {rc}"
        raise UserError(f"{what} {how} before answering (the workload's code exits or crashes the process?)")
    if answer.get("error"):
        raise UserError(str(answer["error"]).splitlines()[0])
    return answer


def _flat(d: dict, prefix: str = "") -> dict:
    return {k2: v2 for k, v in d.items()
            for k2, v2 in (_flat(v, f"{prefix}{k}.").items() if isinstance(v, dict) else [(f"{prefix}{k}", v)])}


def spec_changes(stored: Job, job: Job) -> list[str]:
    """How the job a result was measured with differs from `job` ('run.batch_size 4 -> 8'); [] when equal.
    The whole job is compared (what ran, how it was measured and launched): a result is reused only as is."""
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

    run_one(job, out_dir, on_stage): how one job runs (default `launch`: its own `python -m membench.worker`
    process; membench.child forks, for a workload object that has no name to rebuild it from).
    """
    # Absolute before any user code runs: a factory that changes the working directory must not move --out.
    out_dir = Path(out_dir).absolute()
    with locked(out_dir):
        return _run_all(jobs, out_dir, resume, on_start, on_done, on_note, run_one or launch, on_stage)


def check_result_paths(jobs: list[Job], out_dir: Path) -> None:
    """Before anything runs: a folder where a result goes would fail its run only after it ran."""
    for job in jobs:
        path = result_path(out_dir, job.name)
        if path.exists() and not path.is_file():
            raise UserError(f"{path} is not a result file (a folder or a device is in its place): move it away "
                            "or choose another --out")


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
