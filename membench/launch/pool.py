"""One worker pool: calls run in processes forked from this one (what it has loaded, they have), their answers and
their output handed back in the order a serial loop would give them.

Worker w of n takes items w, w + n, ... in turn: a worker's first call pays for what it warms (torch's dispatch
caches, for fit), which its later calls reuse. Each item's output (whatever the worker writes to its fd 1 and 2
while the item runs: the user's prints too) goes to a file of its own, so that a worker never blocks on it; this
process shows the first unfinished item's output as it comes, and each later item's once every item before it has
answered, as the serial loop would. Answers come back pickled through a pipe per worker. Workers stay in this
process's group and session (a --timeout or the end of the command kills them with everything else), die with it
(lifeline.die_with_parent), and are killed when the pool returns or raises.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import tempfile
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import TypeVar

from membench.launch.lifeline import die_with_parent

A = TypeVar("A")
POLL_S = 0.2  # how often the current item's output is shown while it runs, and a worker's death looked for


def default_workers() -> int:
    """The cores this process may run on (its affinity, where the OS tells it): one worker on each."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class WorkerDied(Exception):
    """The process running item `index` ended before answering for it; `how` says how, in words ("was killed by
    signal 9", "exited with code 1")."""

    def __init__(self, index: int, how: str):
        super().__init__(f"item {index}: its process {how} before answering")
        self.index, self.how = index, how


def run_in_order(call: Callable[[int], A], count: int, workers: int,
                 stops: Callable[[A], bool] = lambda answer: False, out_fd: int = 1) -> list[A]:
    """[call(0), ..., call(count - 1)], each run in one of `workers` forked processes (see the module docstring),
    each item's output written to out_fd in item order. call must return a picklable answer (an exception it raises
    ends its worker: WorkerDied). A worker stops at an answer for which stops(answer) is true, and so does the pool:
    the answers up to that one are returned, as a serial loop that stops there would give them."""
    sys.stdout.flush()
    sys.stderr.flush()  # what is buffered here would otherwise be written again by every worker
    context = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory(prefix="membench-pool-") as folder:
        outputs = [Path(folder) / f"{k}.out" for k in range(count)]
        pool: list[tuple[multiprocessing.Process, Connection]] = []
        try:
            for w in range(workers):
                answers, send = context.Pipe(duplex=False)
                mine = list(range(w, count, workers))
                process = context.Process(target=_work, args=(call, mine, outputs, send, stops, os.getpid()),
                                          name=f"membench-pool-{w}")
                process.start()
                send.close()  # the worker's end: its EOF says the worker is gone
                pool.append((process, answers))
            found = []
            for k in range(count):
                process, answers = pool[k % workers]
                found.append(_answer(k, process, answers, outputs[k], out_fd))
                if stops(found[-1]):
                    break
            return found
        finally:
            for process, answers in pool:  # an error or an interrupt: no worker outlives the pool
                if process.exitcode is None:
                    process.kill()
                process.join()
                answers.close()


def _work(call: Callable[[int], A], mine: list[int], outputs: list[Path], send: Connection,
          stops: Callable[[A], bool], parent: int) -> None:
    """In a worker: each of its items with fd 1 and 2 on that item's output file, the answer sent after."""
    die_with_parent(parent)  # the kernel's PDEATHSIG is not inherited across fork
    for k in mine:
        with open(outputs[k], "wb") as out:
            os.dup2(out.fileno(), 1)
            os.dup2(out.fileno(), 2)
            answer = call(k)
            sys.stdout.flush()
            sys.stderr.flush()
        send.send(answer)
        if stops(answer):
            break
    send.close()


def _answer(k: int, process: multiprocessing.Process, answers: Connection, output: Path, out_fd: int):
    """Item k's answer from its worker, its output shown as it comes; WorkerDied where the worker ends first."""
    shown = _show(output, 0, out_fd)  # what it wrote while the items before it ran, at once
    while True:
        ready = wait([answers], timeout=POLL_S)
        shown = _show(output, shown, out_fd)
        if ready:
            try:
                answer = answers.recv()
            except EOFError:  # the worker closed its end: it ended without answering for k
                break
            _show(output, shown, out_fd)  # the rest, written before the answer was sent
            return answer
        # A process the worker forked may hold the pipe open after the worker ended: look at the worker itself.
        if process.exitcode is not None and not answers.poll():
            break
    process.join()
    _show(output, shown, out_fd)
    code = process.exitcode
    raise WorkerDied(k, f"was killed by signal {-code}" if code < 0 else f"exited with code {code}")


def _show(output: Path, shown: int, out_fd: int) -> int:
    """Writes what `output` holds past byte `shown` to out_fd; returns how far it has been shown."""
    try:
        with open(output, "rb") as f:
            f.seek(shown)
            data = f.read()
    except FileNotFoundError:  # the worker has not reached this item yet
        return shown
    view = memoryview(data)
    while view:
        view = view[os.write(out_fd, view):]
    return shown + len(data)
