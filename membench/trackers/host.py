"""A host-memory guard for the parts of a CPU run that the exact tracker does not watch (the timed steps and the
FLOP count run with nothing of membench in them): with --memory-budget on CPU, the process's resident memory may
not grow past what it held when the tracker let go, plus the budget.

Resident memory (RSS) is coarser than the tracker's bytes: it also holds freed memory the C allocator keeps, so
the guard allows a tenth of the budget on top. It polls /proc/self/statm from a thread (Linux; elsewhere it does
nothing) and stops the main thread with torch.OutOfMemoryError, the error a GPU of that size would raise.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import re
import threading
import time
from pathlib import Path

import torch

POLL_S = 0.005
SLACK = 0.10  # of the budget: the host allocator's cached and fragmented memory


# The C allocator's refusal (malloc failed: the machine or its overcommit limit cannot give that much). The
# exact tracker counts a tensor once it exists, so one allocation bigger than the host (a 30 GB tensor under a
# 1 GiB budget) reaches the host allocator first: torch raises a RuntimeError, not an OutOfMemoryError.
_HOST_REFUSAL = re.compile(r"DefaultCPUAllocator: (can't allocate memory|not enough memory): "
                           r"you tried to allocate (\d+) bytes")


def host_refusal(exc: BaseException) -> torch.OutOfMemoryError | None:
    """The host allocator's refusal as the out-of-memory error it is, with the bytes asked; None for any other
    exception."""
    if isinstance(exc, torch.OutOfMemoryError) or not isinstance(exc, RuntimeError):
        return None
    found = _HOST_REFUSAL.search(str(exc))
    if found is None:
        return None
    asked = int(found.group(2))
    return torch.OutOfMemoryError(f"membench: the host refused an allocation of {asked} bytes "
                                  f"({asked / 2**30:,.1f} GiB): DefaultCPUAllocator: {found.group(1)}")


def rss_bytes() -> int | None:
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


@contextlib.contextmanager
def rss_budget(budget: int, tensor_bytes_now: int, what: str):
    """Inside the block, RSS may reach (RSS now - tensor_bytes_now) + budget x 1.1; past it, OutOfMemoryError."""
    start = rss_bytes()
    if start is None:
        yield
        return
    limit = start - tensor_bytes_now + int(budget * (1 + SLACK))
    tripped: list[int] = []
    done = threading.Event()

    def watch() -> None:
        while not done.wait(POLL_S):
            rss = rss_bytes()
            if rss is not None and rss > limit:
                tripped.append(rss)
                _thread.interrupt_main()
                return

    thread = threading.Thread(target=watch, name="membench-rss-budget", daemon=True)
    thread.start()

    def over() -> torch.OutOfMemoryError:
        return torch.OutOfMemoryError(
            f"membench: host memory (RSS) {tripped[0]} bytes passed the budget's limit of {limit} bytes during "
            f"{what} (--memory-budget {budget} bytes, with {int(SLACK * 100)}% for the host allocator)")

    converted = False
    try:
        yield
    except KeyboardInterrupt:
        if not tripped:
            raise
        converted = True
        raise over() from None
    finally:
        done.set()
        thread.join()
        if tripped and not converted:  # the block ended before the interrupt arrived: take it here
            try:
                for _ in range(200):
                    time.sleep(0.001)
            except KeyboardInterrupt:
                pass
            raise over()
