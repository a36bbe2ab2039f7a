"""Workers die with their sweep: a kill -9 of `membench run` must not leave a worker (or torchrun and its ranks)
training on, holding the GPU and writing into a folder the next sweep uses.

Workers run in their own session (so a terminal's Ctrl-C reaches only the sweep, which then kills them in order),
so nothing kills them by default when the sweep itself is killed. Two mechanisms, each enough on its own:

- Linux: prctl(PR_SET_PDEATHSIG, SIGKILL), set in the child before it runs anything (`preexec`), and again at the
  top of every worker (torchrun's ranks: their parent is torchrun, which gets the first one). The kernel kills
  the child as soon as its parent is gone, whatever killed the parent; torchrun's death then kills its ranks
  (which torchrun starts in sessions of their own, out of reach of a kill of torchrun's process group).
- Anywhere: the worker watches the sweep's pid (MEMBENCH_PARENT_PID) from a daemon thread and, once the sweep is
  gone, kills its own process group: a plain worker, or a torchrun rank (torchrun then stops: its workers
  failed).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time
from typing import NoReturn

PARENT_ENV = "MEMBENCH_PARENT_PID"
_PR_SET_PDEATHSIG = 1
_POLL_S = 0.5


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised wherever the sweep is (sweep.sigterm_as_interrupt), so that it stops as on Ctrl-C:
    the worker killed, the finished runs kept."""


def _libc_prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _libc_prctl()  # looked up here, in the parent: the child after fork must not load libraries


def die_with_parent(expected_parent: int | None = None) -> None:
    """Ask the kernel for SIGKILL when our parent exits (Linux; elsewhere nothing). The parent may already be
    gone by then (the request would never fire): if so, die now."""
    if _PRCTL is None:
        return
    _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if expected_parent is not None and os.getppid() != expected_parent:
        os.kill(os.getpid(), signal.SIGKILL)


INTERRUPTS = (signal.SIGINT, signal.SIGTERM)
_HELD: dict[int, object] = {}  # the handlers interrupts_held replaced, while it holds them


@contextlib.contextmanager
def interrupts_held():
    """Ctrl-C and SIGTERM held back while a worker is forked, and acted on once it exists: one raised inside fork()
    interrupts CPython's at-fork handlers (logging's lock release: "Exception ignored in _releaseLock"), which leaves
    the lock taken and the sweep hung for good. Blocking the signals would not do: another thread of this process
    can take them and leave the exception pending for the main thread's next bytecode, inside those handlers. So
    for the moment of the fork their handler only notes them; then the handlers are put back, and one noted is
    handled as it would have been. Only the main thread sets handlers: elsewhere nothing is held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    _HELD.update({s: signal.signal(s, lambda signum, frame: noted.append(signum)) for s in INTERRUPTS})
    try:
        yield
    finally:
        before = dict(_HELD)
        release_interrupts()
        for signum in noted[:1]:
            handler = before[signum]
            if callable(handler):
                handler(signum, None)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(signum)


def release_interrupts() -> None:
    """The handlers interrupts_held replaced, put back (also in a child forked while they were held)."""
    for signum, handler in list(_HELD.items()):
        signal.signal(signum, handler)
    _HELD.clear()


def preexec_for(parent: int):
    """A Popen preexec_fn: the child dies with `parent` (the sweep)."""
    return lambda: die_with_parent(parent)


def child_env(env: dict[str, str]) -> dict[str, str]:
    """The worker's environment, naming the sweep to watch."""
    return {**env, PARENT_ENV: str(os.getpid())}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def watch(pid: int, interval: float = _POLL_S) -> threading.Thread:
    """Kill this process's group once `pid` is gone (the portable fallback; see the module docstring). A pid whose
    process has exited but not been reaped (a zombie) still counts as alive: where prctl exists it fires first."""

    def loop():
        while _alive(pid):
            time.sleep(interval)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    thread = threading.Thread(target=loop, name="membench-lifeline", daemon=True)
    thread.start()
    return thread


def tie_worker_to_sweep() -> None:
    """At the top of a worker: die with its parent (torchrun's ranks: with torchrun), and with the sweep that
    launched it. Only a worker the launcher started watches: it runs in a process group of its own, which is
    what the watch kills."""
    die_with_parent()
    sweep = os.environ.get(PARENT_ENV, "")
    if not sweep.isdigit():
        return
    try:
        if os.getpgid(int(sweep)) == os.getpgrp():  # not in a group of its own: killing it would hit others
            return
    except ProcessLookupError:  # the sweep is gone already
        os.killpg(os.getpgrp(), signal.SIGKILL)
    watch(int(sweep))


def exit_promptly(code: int) -> NoReturn:
    """Exit as sys.exit(code) would, less the interpreter's teardown, for a child whose answer is written: unloading
    torch, torch._dynamo and the rest takes most of a second (0.6-0.9 s measured on a 2-core x86_64 with torch
    2.14.1) that the command waits for and nothing needs. Exit handlers still run (the user's, logging's: CPython's
    own function for them) and the standard streams are flushed; where a thread that is not a daemon still runs (a
    normal exit waits for it), or on an interpreter without that function, the usual exit."""
    import atexit

    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)
    others = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if run_exit_handlers is None or others:
        sys.exit(code)
    run_exit_handlers()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
