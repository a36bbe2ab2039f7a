"""launch.pool: calls in forked workers, their answers and output in the serial loop's order, a dead worker named."""

from __future__ import annotations

import os
import signal
import time

import pytest

from membench.launch.pool import WorkerDied, run_in_order


def _read_all(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


@pytest.fixture
def out(tmp_path):
    fd = os.open(tmp_path / "shown", os.O_RDWR | os.O_CREAT)
    yield fd
    os.close(fd)


def test_answers_and_output_come_in_item_order(out):
    """Later items finish first (item 0 sleeps longest), and write to fd 1 and fd 2 (pytest holds sys.stdout, so
    the worker writes to the descriptors, as a fitting process's prints do): the output is still item 0's, then
    1's, ..., as the serial loop shows it; the answers are in item order."""
    def call(k: int) -> int:
        time.sleep(0.3 * (3 - k) if k < 3 else 0)
        os.write(1, f"item {k} says\n".encode())
        os.write(2, f"item {k} on fd 2\n".encode())
        return k * k

    assert run_in_order(call, 5, 3, out_fd=out) == [0, 1, 4, 9, 16]
    assert _read_all(out).decode() == "".join(f"item {k} says\nitem {k} on fd 2\n" for k in range(5))


def test_the_pool_stops_at_an_answer_that_stops_it(out):
    def call(k: int) -> str:
        os.write(1, f"item {k}\n".encode())
        return "error" if k == 1 else "ok"

    assert run_in_order(call, 6, 2, stops=lambda a: a == "error", out_fd=out) == ["ok", "error"]
    assert _read_all(out).decode() == "item 0\nitem 1\n"  # nothing of the items after the one that stopped it


def test_a_worker_that_dies_names_the_item_and_how(out):
    """Worker 1 of 2 takes items 1 and 3; killed on item 3, after items 0 to 2 answered and were shown."""
    def call(k: int) -> int:
        os.write(1, f"item {k}\n".encode())
        if k == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        return k

    with pytest.raises(WorkerDied) as died:
        run_in_order(call, 4, 2, out_fd=out)
    assert (died.value.index, died.value.how) == (3, "was killed by signal 9")
    assert _read_all(out).decode() == "item 0\nitem 1\nitem 2\nitem 3\n"


def test_a_worker_that_exits_names_its_code_and_no_worker_outlives_the_pool(out, tmp_path):
    pids = tmp_path / "pids"

    def call(k: int) -> int:
        with open(pids, "a") as f:
            f.write(f"{os.getpid()}\n")
        if k == 0:
            os._exit(3)
        time.sleep(600)  # the others still run when item 0's worker is found dead: the pool kills them
        return k

    with pytest.raises(WorkerDied, match="item 0: its process exited with code 3 before answering"):
        run_in_order(call, 3, 3, out_fd=out)
    for pid in map(int, pids.read_text().split()):
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reaped already: killed and joined by the pool
