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

from membench import private
from membench.common.fsio import atomic_write_bytes
from membench.results import SiteBytes

MAX_ENTRIES = 100_000  # alloc/free events kept (a ring buffer); ~ tens of MB of pickle with stack traces


def save_snapshot(path: Path) -> int:
    """Pickle the allocator's state (and history, if recorded) the way memory_viz reads it; returns its size."""
    return atomic_write_bytes(path, pickle.dumps(private.memory_snapshot(), protocol=4))


def _block_sizes(snapshot: dict):
    """Trace sizes are what was asked for (requested bytes: torch's record_trace passes the request, and
    block->requested_size at free_completed, c10/cuda/CUDACachingAllocator.cpp), memory_allocated() counts whole
    blocks: round a request to the block the allocator gives it, under the settings the snapshot was recorded with,
    as the allocator simulator does, so a sum of trace sizes is in blocks too."""
    from membench.allocator.settings import settings_from_snapshot
    from membench.allocator.simulator import round_size

    settings = settings_from_snapshot(snapshot.get("allocator_settings"))
    return lambda size: round_size(size, settings)


def trace_summary(snapshot: dict, device: int, start_bytes: int, max_entries: int) -> dict:
    """Allocated bytes (whole blocks) over the recorded trace: its peak, to cross-check the tracker's 512-byte-rounded
    peak.

    start_bytes is torch.cuda.memory_allocated() when recording began (blocks); each traced request counts as its
    rounded block (_block_sizes). A trace that hit max_entries lost its first events (a ring buffer), so its peak
    cannot be trusted and is left out.
    """
    traces = snapshot.get("device_traces") or []
    trace = traces[device] if device < len(traces) else []
    summary = {"trace_entries": len(trace), "trace_truncated": len(trace) >= max_entries}
    if summary["trace_truncated"]:
        return summary
    block = _block_sizes(snapshot)
    current = peak = start_bytes
    for entry in trace:
        if entry["action"] == "alloc":
            current += block(entry["size"])
            peak = max(peak, current)
        elif entry["action"] == "free_completed":
            current -= block(entry["size"])
    summary["trace_peak_allocated_bytes"] = peak
    return summary


def allocation_site(frames: list[dict]) -> str:
    """The Python line that asked for a block: the innermost frame outside torch itself (the user's code or the
    workload's), else the innermost Python frame. Frames are innermost first, as memory_viz shows them."""
    python = [f for f in frames or () if str(f.get("filename", "")).endswith(".py")]
    outside = [f for f in python if "/torch/" not in str(f["filename"]).replace("\\", "/")]
    frame = (outside or python or [None])[0]
    if frame is None:
        return "(no Python frame)"
    return f"{frame['filename']}:{frame.get('line', '?')} ({frame.get('name', '?')})"


def top_sites(snapshot: dict, device: int = 0, n: int = 10) -> list[SiteBytes]:
    """The blocks live at the peak of the recorded trace, summed by allocation site, largest first.

    Only what the trace saw allocated counts (blocks allocated before recording began have no frames here). The
    live set is copied at the first free after a new peak, not at every allocation that raises it."""
    traces = snapshot.get("device_traces") or []
    trace = traces[device] if device < len(traces) else []
    block = _block_sizes(snapshot)  # the blocks' bytes, as trace_summary counts them
    live: dict[int, tuple[int, str]] = {}
    current = peak = 0
    at_peak: dict[int, tuple[int, str]] = {}
    pending = False
    for entry in trace:
        action = entry.get("action")
        if action == "alloc":
            size = block(entry["size"])
            live[entry["addr"]] = (size, allocation_site(entry.get("frames", [])))
            current += size
            if current > peak:
                peak, pending = current, True
        elif action == "free_completed" and entry["addr"] in live:
            if pending:
                at_peak, pending = dict(live), False
            current -= live.pop(entry["addr"])[0]
    if pending:
        at_peak = dict(live)
    by_site: dict[str, list[int]] = {}
    for size, site in at_peak.values():
        total = by_site.setdefault(site, [0, 0])
        total[0] += size
        total[1] += 1
    ranked = sorted(by_site.items(), key=lambda kv: (-kv[1][0], kv[0]))[:n]
    return [SiteBytes(site=site, bytes=b, blocks=k) for site, (b, k) in ranked]


@contextlib.contextmanager
def recorded_history(path: Path, max_entries: int = MAX_ENTRIES):
    """Record the allocator's history inside the block, then save the snapshot at `path`.

    Yields a dict that is filled, after the block, with the snapshot's file name, size and trace summary.
    """
    info: dict = {}
    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    # Python frames only: allocation_site reads nothing else, and C++ frames ("all", the default) are
    # symbolised when the snapshot is taken, which can take minutes on a large model.
    private.record_memory_history(max_entries=max_entries, stacks="python")
    try:
        yield info
        torch.cuda.synchronize()
        snapshot = private.memory_snapshot()
        size = atomic_write_bytes(path, pickle.dumps(snapshot, protocol=4))
        info.update({"snapshot": path.name, "snapshot_bytes": size, "snapshot_max_entries": max_entries,
                     **trace_summary(snapshot, torch.cuda.current_device(), start, max_entries),
                     "top_sites": top_sites(snapshot, torch.cuda.current_device())})
    finally:
        private.record_memory_history(enabled=None)


# Where the OOM observer saves its snapshot: None when no run is measuring. The observer cannot be detached
# (torch._C._cuda_attach_out_of_memory_observer only adds), so one is attached per process, and each run points
# it at its own file for its duration: a later run in the same process never writes into an earlier run's folder.
_oom_path: list[Path | None] = [None]
_observer_attached = [False]


def snapshot_on_oom(path: Path) -> None:
    """Until stop_snapshot_on_oom, at an out-of-memory error, save what the allocator holds (segments and blocks;
    no history unless it was being recorded) at `path`, so an OOM run can still be opened in memory_viz."""
    _oom_path[0] = path
    if not _observer_attached[0]:
        private.attach_out_of_memory_observer(_observer)
        _observer_attached[0] = True


def stop_snapshot_on_oom() -> None:
    _oom_path[0] = None


def _observer(device, alloc, device_allocated, device_free) -> None:
    path = _oom_path[0]
    if path is None:
        return
    try:
        save_snapshot(path)
    except Exception:  # noqa: BLE001 - never turn an OOM into a different error; but say why it is missing
        print(f"membench: could not save the snapshot at OOM to {path}:", file=sys.stderr)
        traceback.print_exc()
