"""One account of memory: the caching-allocator simulator's live requests held against the storage tracker's count.

A prediction's peak allocated comes from the storage tracker (live storages, each rounded up to 512 B), its reserved
memory from the simulator fed the tracker's trace. Both must count the same storages over the same window: at each
event the simulator's live requests, each rounded up to 512 B as the tracker rounds it (c10's kMinBlockSize; the
blocks themselves can be larger by an unsplit remainder), equal the trace's running count, which is the tracker's
live bytes (every change of the tracker's count is a trace event: trackers/storage.py); and from the measured step's
reset on, the simulator's peak and final live requests equal the tracker's peak and final bytes. A mismatch is a
membench bug, raised as AccountMismatch, never a number.

The window: a run's meter resets the allocator's peaks before the measured step (CudaMeter.reset_peak,
torch.cuda.reset_peak_memory_stats), and the tracker its peak at the same moment (Session.measure), so the trace
the simulator reads carries a reset_peak event there (`with_reset`): without it, the simulator's peak allocated is
the peak from the model's construction on. For FSDP that is the whole unsharded model, which membench builds on
the device before fully_shard shards it (step.build_state), and which outgrows one step's peak as models deepen.
"""

from __future__ import annotations

from dataclasses import dataclass

from membench.allocator.events import TraceEvent
from membench.allocator.simulator import MIN_BLOCK

RESET = TraceEvent("reset_peak")


class AccountMismatch(RuntimeError):
    """The simulator and the storage tracker disagree on live memory: a membench bug."""


@dataclass(frozen=True)
class Tracked:
    """What the tracker counted, in 512-byte blocks: its peak since the reset, and its live bytes at the end."""

    peak_bytes: int
    final_bytes: int


def with_reset(events: list[TraceEvent], measured_from: int) -> list[TraceEvent]:
    """The trace with the measured step's reset_peak where the meter resets its peaks (events[measured_from])."""
    return [*events[:measured_from], RESET, *events[measured_from:]]


def rounded(size: int) -> int:
    """A request as the tracker counts it: up to a multiple of 512 B (0 stays 0: no storage, no block)."""
    return -(-size // MIN_BLOCK) * MIN_BLOCK


def check(peak_requested: int, final_requested: int, tracked: Tracked) -> None:
    """AccountMismatch where the simulator's peak (since the reset) or final live requests are not the tracker's."""
    for what, simulated, counted in (("peak", peak_requested, tracked.peak_bytes),
                                     ("final", final_requested, tracked.final_bytes)):
        if simulated != counted:
            raise AccountMismatch(f"the allocator simulator's {what} live requests are {simulated:,} B, the storage "
                                  f"tracker's {counted:,} B: they count different storages or windows")
