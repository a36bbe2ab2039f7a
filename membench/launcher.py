"""Isolation: each run in its own process, so one run's OOM, crash or hang never costs the others' results."""

from __future__ import annotations

import contextlib
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
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from membench.errors import UserError
from membench.fsio import atomic_write_text, is_environment_error, make_dir, user_error
from membench.lifeline import Terminated, child_env, preexec_for
from membench.results import SCHEMA_VERSION, is_finished, read_result, result_path, write_json
from membench.spec import RunSpec
from membench.techniques import REGISTRY


class Interrupted(Exception):
    """Ctrl-C or SIGTERM during a sweep: the finished runs are on disk; `results` holds them."""

    def __init__(self, results: list[dict], terminated: bool = False):
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
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by workers (O_CLOEXEC by default)
    except OSError as exc:
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


def command_for(spec: RunSpec, spec_path: Path, out_path: Path) -> list[str]:
    if spec.nproc_per_node > 1 or any(REGISTRY[t].distributed for t in spec.techniques):
        # One machine: torchrun's standalone rendezvous; several: the user's own torchrun arguments.
        rendezvous = shlex.split(spec.torchrun_args) if spec.torchrun_args else ["--standalone"]
        return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={spec.nproc_per_node}",
                *rendezvous, "-m", "membench.worker", str(spec_path), str(out_path)]
    return [sys.executable, "-m", "membench.worker", str(spec_path), str(out_path)]


def environment_for(spec: RunSpec) -> dict[str, str]:
    env = dict(os.environ)
    for name in spec.techniques:
        for key, value in REGISTRY[name].env.items():
            # Allocator settings are comma-separated lists: add ours to what the user already set.
            env[key] = f"{env[key]},{value}" if env.get(key) else value
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
    previous = make_dir(Path(out_dir) / "previous")
    for n in itertools.count():
        folder = previous / f"{name}.{stamp:%Y%m%dT%H%M%S.%fZ}-{n}"
        try:
            folder.mkdir()
            break
        except FileExistsError:
            continue
    log = Path(out_dir) / "runs" / f"{name}.log"
    for path in files + ([log] if log.is_file() else []):
        os.replace(path, folder / path.name)
    return folder


def _failure(spec: RunSpec, status: str, message: str, log: Path) -> dict:
    tail = log.read_text(errors="replace")[-4000:] if log.exists() else ""
    return {"schema_version": SCHEMA_VERSION, "name": spec.name, "status": status, "error": message,
            "spec": spec.to_dict(), "env": {"device": spec.device}, "log_tail": tail}


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def launch(spec: RunSpec, out_dir: Path) -> dict:
    """Run one spec in a subprocess, in a new session (a terminal's Ctrl-C reaches only the sweep, which kills the
    worker's group itself). The worker dies with this process however it dies, and torchrun's ranks with
    torchrun (membench.lifeline)."""
    out_path = result_path(out_dir, spec.name)
    runs_dir = out_dir / "runs"
    make_dir(runs_dir)
    spec_path = runs_dir / f"{spec.name}.spec.json"
    atomic_write_text(spec_path, json.dumps(spec.to_dict(), indent=1))
    archive(out_dir, spec.name)
    log = runs_dir / f"{spec.name}.log"
    started = time.time()
    with open(log, "w") as log_file:
        proc = subprocess.Popen(command_for(spec, spec_path, out_path), stdout=log_file, stderr=subprocess.STDOUT,
                                env=child_env(environment_for(spec)), start_new_session=True,
                                preexec_fn=preexec_for(os.getpid()))
        try:
            rc = proc.wait(timeout=spec.timeout_s)
        except subprocess.TimeoutExpired:
            _kill(proc)
            write_json(out_path, _failure(spec, "timeout", f"no result after {spec.timeout_s:g} s (--timeout)", log))
            return read_result(out_path)
        except KeyboardInterrupt:
            _kill(proc)
            raise
    if out_path.exists() and out_path.stat().st_mtime >= started - 1:
        return read_result(out_path)
    message = f"worker exited with code {rc} before writing a result"
    if rc < 0:
        message += f" (killed by signal {-rc}{'; out of host memory?' if -rc == signal.SIGKILL else ''})"
    write_json(out_path, _failure(spec, "error", message, log))
    return read_result(out_path)


def spec_changes(stored: object, spec: RunSpec) -> list[str]:
    """How the spec a result was measured with differs from `spec` ('batch_size 4 -> 8'); [] when equal.
    The whole spec is compared: a field membench adds later makes an older result run again, never reused."""
    new = json.loads(json.dumps(spec.to_dict()))  # as stored: tuples become lists
    old = stored if isinstance(stored, dict) else {}
    return [f"{k} {old.get(k, '(none)')!r} -> {new.get(k, '(none)')!r}"
            for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]


def run_all(specs: list[RunSpec], out_dir: Path, resume: bool = False,
            on_start: Callable[[RunSpec], None] | None = None,
            on_done: Callable[[RunSpec, dict, bool], None] | None = None,
            on_note: Callable[[RunSpec, str], None] | None = None) -> list[dict]:
    """Run every spec in turn, holding out_dir's lock; with resume, keep the results already finished there
    with the same spec (on_note says why another is run again)."""
    with locked(out_dir):
        return _run_all(specs, out_dir, resume, on_start, on_done, on_note)


def check_result_paths(specs: list[RunSpec], out_dir: Path) -> None:
    """Before anything runs: a folder where a result goes would fail its run only after it ran."""
    for spec in specs:
        path = result_path(out_dir, spec.name)
        if path.exists() and not path.is_file():
            raise UserError(f"{path} is not a result file (a folder or a device is in its place): move it away "
                            "or choose another --out")


def _run_all(specs, out_dir, resume, on_start, on_done, on_note) -> list[dict]:
    check_result_paths(specs, out_dir)
    results = []
    for spec in specs:
        path = result_path(out_dir, spec.name)
        if resume and is_finished(path):
            kept = read_result(path)
            changes = spec_changes(kept.get("spec"), spec)
            if not changes:
                results.append(kept)
                if on_done:
                    on_done(spec, kept, True)
                continue
            if on_note:
                on_note(spec, f"not resumed: {path} was measured with another spec ({'; '.join(changes)}); "
                              "running it again (the old result moves to previous/)")
        try:
            if on_start:
                on_start(spec)
            results.append(launch(spec, out_dir))
        except KeyboardInterrupt as stop:
            raise Interrupted(results, terminated=isinstance(stop, Terminated)) from None
        if on_done:
            on_done(spec, results[-1], False)
    return results
