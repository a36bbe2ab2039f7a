"""Running a user's code out of this process before any run: planning a sweep of a user's workload (`probe`), and
predict or fit from loading the user's code to the answer (`call_isolated`). The child side is child/probe.py."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from membench.common.errors import UserError
from membench.launch.lifeline import child_env, preexec_for
from membench.launch.process import kill_session
from membench.launch.sweep import sigterm_as_interrupt
from membench.spec import Job

CHILD = "membench.child.probe"

PROBE_MIN_S = 30.0


def probe(plan_args: dict, timeout_s: float) -> list[Job]:
    """Plan a sweep of a user's workload in a child process, under the run's timeout: the user's factory is
    imported and called there, never in the sweep's own process. A factory that hangs, aborts or raises is one
    line (UserError) before anything runs. Notes the child prints ("membench: ...") are passed on."""
    workload = plan_args["workload"]
    # Starting Python and importing torch takes seconds before the factory runs: a short --timeout (meant for a
    # training run) must not fail the loading, so the probe waits at least PROBE_MIN_S.
    timeout_s = max(timeout_s, PROBE_MIN_S)
    with tempfile.TemporaryDirectory(prefix="membench-probe-") as tmp:
        path = Path(tmp) / "plan.json"
        path.write_text(json.dumps(plan_args))
        try:
            proc = subprocess.run([sys.executable, "-m", CHILD, str(path)],
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
    """Run `python -m membench.child.probe --call KIND` on `request` in a child process, under
    `timeout_s`: how predict and fit run a user's code (and everything after it) out of this
    process, as `run` does with its workers.

    The answer comes back in a file, never on the child's stdout (user code prints: 10 MB of it, or an atexit
    handler's). The child's output (progress lines, the user's prints) is passed on to stderr, line by line. The
    child runs in a session of its own, which is killed when it ends however it ends, so processes the user's
    code forked end with it; it dies with this process (lifeline); the temporary folder goes on SIGTERM too.
    A child that hangs, exits or dies without answering is one line (UserError); an answer {"error": ...} too.
    """
    timeout_s = max(timeout_s, PROBE_MIN_S)
    with sigterm_as_interrupt(), tempfile.TemporaryDirectory(prefix=f"membench-{kind}-") as tmp:
        request_path, answer_path = Path(tmp) / "request.json", Path(tmp) / "answer.json"
        request_path.write_text(json.dumps(request))
        proc = subprocess.Popen([sys.executable, "-m", CHILD, "--call", kind, str(request_path),
                                 str(answer_path)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                # the child's (and its workers') temporary folders inside this one, which goes when
                                # the child is killed (a timeout: SIGKILL runs no cleanup of its own)
                                stderr=subprocess.STDOUT, env=child_env({**os.environ, "TMPDIR": tmp}),
                                start_new_session=True,
                                preexec_fn=preexec_for(os.getpid()))

        def relay() -> None:  # ends when the last holder of the pipe (the child, or one it forked) is gone
            for line in iter(proc.stdout.readline, b""):
                sys.stderr.write(line.decode(errors="replace"))
                sys.stderr.flush()

        reader = threading.Thread(target=relay, daemon=True)
        reader.start()
        try:
            rc = _wait(proc, timeout_s)
        finally:  # a timeout, Ctrl-C, SIGTERM or a clean end: the child's whole session goes
            kill_session(proc)
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


def _wait(proc: subprocess.Popen, timeout_s: float) -> int | None:
    """The child's exit code as soon as it exits, None after timeout_s. Popen.wait with a timeout polls (up to 50 ms
    late, which the command waits out); Linux's pidfd says at once. Elsewhere, Popen.wait."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
    try:
        ready, _, _ = select.select([fd], [], [], timeout_s)
    finally:
        os.close(fd)
    return proc.wait() if ready else None
