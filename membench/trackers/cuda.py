"""CUDA memory snapshots: the caching allocator's own history, for pytorch.org/memory_viz.

The only module that calls torch's private snapshot APIs (torch.cuda.memory._record_memory_history, _snapshot,
torch._C._cuda_attach_out_of_memory_observer). Recording history slows every allocation down (it keeps a stack
trace per event), so it is only ever on during the separate, untimed recording pass. The number of recorded
entries is capped so a snapshot stays small enough for the viewer to open.
"""

from __future__ import annotations

import contextlib
import pickle
import sys
import traceback
from pathlib import Path

import torch

from membench.fsio import atomic_write_bytes
from membench.trackers import private

MAX_ENTRIES = 100_000  # alloc/free events kept (a ring buffer); ~ tens of MB of pickle with stack traces


def save_snapshot(path: Path) -> int:
    """Pickle the allocator's state (and history, if recorded) the way memory_viz reads it; returns its size."""
    return atomic_write_bytes(path, pickle.dumps(private.memory_snapshot(), protocol=4))


def trace_summary(snapshot: dict, device: int, start_bytes: int, max_entries: int) -> dict:
    """Allocated bytes over the recorded trace: its peak, to cross-check the tracker's 512-byte-rounded peak.

    start_bytes is torch.cuda.memory_allocated() when recording began; a trace that hit max_entries lost its
    first events (a ring buffer), so its peak cannot be trusted and is left out.
    """
    traces = snapshot.get("device_traces") or []
    trace = traces[device] if device < len(traces) else []
    summary = {"trace_entries": len(trace), "trace_truncated": len(trace) >= max_entries}
    if summary["trace_truncated"]:
        return summary
    current = peak = start_bytes
    for entry in trace:
        if entry["action"] == "alloc":
            current += entry["size"]
            peak = max(peak, current)
        elif entry["action"] == "free_completed":
            current -= entry["size"]
    summary["trace_peak_allocated_bytes"] = peak
    return summary


@contextlib.contextmanager
def recorded_history(path: Path, max_entries: int = MAX_ENTRIES):
    """Record the allocator's history inside the block, then save the snapshot at `path`.

    Yields a dict that is filled, after the block, with the snapshot's file name, size and trace summary.
    """
    info: dict = {}
    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    private.record_memory_history(max_entries=max_entries)
    try:
        yield info
        torch.cuda.synchronize()
        snapshot = private.memory_snapshot()
        size = atomic_write_bytes(path, pickle.dumps(snapshot, protocol=4))
        info.update({"snapshot": path.name, "snapshot_bytes": size, "snapshot_max_entries": max_entries,
                     **trace_summary(snapshot, torch.cuda.current_device(), start, max_entries)})
    finally:
        private.record_memory_history(enabled=None)


def snapshot_on_oom(path: Path) -> None:
    """At an out-of-memory error, save what the allocator holds (segments and blocks; no history unless it was
    being recorded), so an OOM run can still be opened in memory_viz."""

    def observer(device, alloc, device_allocated, device_free):
        try:
            save_snapshot(path)
        except Exception:  # noqa: BLE001 - never turn an OOM into a different error; but say why it is missing
            print(f"membench: could not save the snapshot at OOM to {path}:", file=sys.stderr)
            traceback.print_exc()

    private.attach_out_of_memory_observer(observer)
