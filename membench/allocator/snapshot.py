"""Reading a CUDA memory snapshot safely, and rebuilding the allocator's state at its first recorded event.

A snapshot (torch.cuda.memory._snapshot(), or the pickle _dump_snapshot writes for pytorch.org/memory_viz) holds
`segments`, the allocator's state when it was taken, and `device_traces`, one list of events per device, oldest
first. The trace is a ring buffer: older events are dropped, so the state at the first event is found by undoing
the events one by one, newest first, from the final state.
"""

from __future__ import annotations

import bisect
import dataclasses
import io
import pickle
from pathlib import Path

from membench.allocator.settings import AllocatorSettings, settings_from_snapshot
from membench.allocator.simulator import SMALL_BUFFER, SMALL_SIZE, round_size
from membench.common.errors import UserError

_WHAT = "a CUDA memory snapshot (the pickle of torch.cuda.memory._snapshot() or _dump_snapshot)"
#: events that change what the allocator holds; the others (free_requested, snapshot, oom, user_defined) do not
ALLOC, FREE, SEGMENT_ALLOC, SEGMENT_FREE = "alloc", "free_completed", "segment_alloc", "segment_free"


class _Refused(pickle.UnpicklingError):
    pass


class _DataOnlyUnpickler(pickle.Unpickler):
    """Admits no class or function at all: a snapshot is dicts, lists, strings and numbers.

    Everything in a pickle that could run code (a reduce, an object build, an extension code) first has to look
    its callable up through find_class, which refuses; persistent ids are refused too.
    """

    def find_class(self, module, name):
        raise _Refused(f"it asks to load {module}.{name}")

    def persistent_load(self, pid):
        raise _Refused("it holds a persistent id")


def load_snapshot(path: Path | str) -> dict:
    """The snapshot's dict, or UserError: a missing file, a pickle that is not a snapshot, one that holds code."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path} does not exist or is not a file; give {_WHAT}")
    try:
        data = _DataOnlyUnpickler(io.BytesIO(path.read_bytes())).load()
    except _Refused as exc:
        raise UserError(f"{path} is not a plain memory snapshot: {exc}, which a snapshot never does "
                        "(refused without running it)") from None
    except Exception as exc:  # noqa: BLE001 - untrusted bytes: truncated, not a pickle, ... are all one answer
        # repr: the unpickler quotes the file's own bytes (newlines, terminal controls) in its messages
        raise UserError(f"{path} is not {_WHAT}: cannot read it as a pickle ({type(exc).__name__}: "
                        f"{str(exc)[:200]!r})") from None
    if not isinstance(data, dict) or not isinstance(data.get("segments"), list) \
            or not isinstance(data.get("device_traces"), list):
        got = f"a dict with keys {sorted(map(str, data))[:6]}" if isinstance(data, dict) else type(data).__name__
        raise UserError(f"{path} is not {_WHAT}: expected a dict with 'segments' and 'device_traces', got {got}")
    return data


@dataclasses.dataclass
class InitialSegment:
    address: int
    size: int
    is_small: bool
    stream: int
    allocated: list[tuple[int, int, int]]  # blocks in use: (address, block size, requested size)


@dataclasses.dataclass
class Trace:
    """One device's recorded events and the allocator's state just before the first of them."""

    device: int
    events: list[dict]
    segments: list[InitialSegment]
    settings: AllocatorSettings  # as recorded in the snapshot (default when it does not say)
    guessed_sizes: int  # blocks in use at the start whose size had to be inferred (see initial_state)


def pick_device(snapshot: dict, device: int | None = None) -> int:
    traces = snapshot["device_traces"]
    if device is None:  # the device with the longest trace
        device = max(range(len(traces)), key=lambda d: len(traces[d] or []), default=0)
    if not 0 <= device < len(traces) or not traces[device]:
        with_events = [d for d, t in enumerate(traces) if t]
        raise UserError(f"the snapshot has no recorded events for device {device}"
                        + (f"; devices with events: {with_events}" if with_events else
                           "; record them with torch.cuda.memory._record_memory_history() before running"))
    return device


def _check_event(event) -> dict:
    if not isinstance(event, dict) or not isinstance(event.get("action"), str):
        raise UserError(f"a trace event is not a dict with an 'action': {repr(event)[:80]}")
    if event["action"] in (ALLOC, FREE, SEGMENT_ALLOC, SEGMENT_FREE, "free", "free_requested"):
        if not isinstance(event.get("addr"), int) or not isinstance(event.get("size"), int):
            raise UserError(f"a {event['action']!r} event has no integer 'addr' and 'size': {repr(event)[:80]}")
        if event["size"] < 0 or event["addr"] < 0:
            raise UserError(f"a {event['action']!r} event has a negative 'addr' or 'size': {repr(event)[:80]}")
    if not _is_int(event.get("stream", 0)):
        raise UserError(f"a {event['action']!r} event's 'stream' is not an integer: {repr(event)[:80]}")
    return event


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_segment(seg: dict) -> None:
    """Blocks tile their segment: positive sizes, in address order, none past the end or over another."""
    start, size = seg["address"], seg["total_size"]
    if not isinstance(start, int) or not isinstance(size, int) or start < 0 or size <= 0:
        raise UserError(f"a segment has no non-negative integer 'address' and positive 'total_size': "
                        f"{str({k: seg.get(k) for k in ('address', 'total_size')})[:120]}")
    if not _is_int(seg.get("stream", 0)) or not isinstance(seg["blocks"], list):
        raise UserError(f"the segment at {start:#x} has no integer 'stream' or no list of 'blocks'")
    end = start
    for b in sorted(seg["blocks"], key=lambda b: b["address"] if isinstance(b["address"], int) else -1):
        addr, bsize = b["address"], b["size"]
        if not isinstance(addr, int) or not isinstance(bsize, int) or bsize <= 0:
            raise UserError(f"a block of the segment at {start:#x} has no integer 'address' and positive 'size': "
                            f"{str({k: b.get(k) for k in ('address', 'size')})[:120]}")
        if addr < end:
            raise UserError(f"the block at {addr:#x} overlaps the one before it in the segment at {start:#x}: "
                            "the snapshot is inconsistent")
        end = addr + bsize
        if end > start + size:
            raise UserError(f"the block at {addr:#x} ({bsize} bytes) ends past its segment at {start:#x} "
                            f"({size} bytes): the snapshot is inconsistent")


def initial_state(snapshot: dict, device: int | None = None) -> Trace:
    """Undo the trace's events on the final `segments`, newest first, to get the state at the first event.

    A block in use before the trace started and freed during it is known only by its address and requested size.
    Its block size is the rounded request, plus the free bytes after it up to the next block in use (or the end
    of its segment) when those are 1 MiB or less in the large pool: the allocator never leaves a free block that
    small there (it splits off only remainders above 1 MiB), so they were part of the block.
    """
    try:
        return _rebuild(snapshot, device)
    except (KeyError, TypeError, AttributeError) as exc:  # a dict without the fields a snapshot has
        raise UserError(f"the snapshot's segments or events are malformed ({type(exc).__name__}: {exc}); expected "
                        "the layout of torch.cuda.memory._snapshot()") from None


def _rebuild(snapshot: dict, device: int | None) -> Trace:
    device = pick_device(snapshot, device)
    settings = settings_from_snapshot(snapshot.get("allocator_settings"))
    events = [_check_event(e) for e in snapshot["device_traces"][device]]
    actions = {e["action"] for e in events}
    if actions & {"segment_map", "segment_unmap"} or any(
            s.get("is_expandable") for s in snapshot["segments"] if s.get("device", 0) == device):
        raise UserError("this snapshot was recorded with expandable_segments:True; replaying such traces is not "
                        "supported yet (record without it, and ask for it as a what-if with --alloc-conf)")
    segs: dict[int, tuple[int, bool, int]] = {}  # address -> (size, is_small, stream)
    live: dict[int, tuple[int, int | None]] = {}  # address of a block in use -> (requested size, block size)
    for seg in snapshot["segments"]:
        if seg.get("device", 0) != device:
            continue
        if tuple(seg.get("segment_pool_id") or (0, 0)) != (0, 0):
            raise UserError("the snapshot has segments of a CUDA graph's private memory pool, which are not simulated")
        _check_segment(seg)
        segs[seg["address"]] = (seg["total_size"], seg.get("segment_type") == "small", seg.get("stream", 0))
        for b in seg["blocks"]:
            # active_allocated, or active_pending_free (its free has not completed); torch 2.0 said it in booleans
            in_use = b["state"] != "inactive" if "state" in b else bool(b["allocated"] or b["active"])
            if in_use:
                live[b["address"]] = (b.get("requested_size", b["size"]), b["size"])

    def inconsistent(event: dict, why: str) -> UserError:
        return UserError(f"the trace does not agree with the snapshot's final state at a {event['action']!r} "
                         f"event (address {event['addr']:#x}): {why}")

    for event in reversed(events):
        action, addr = event["action"], event.get("addr")
        if action == ALLOC:
            if live.pop(addr, None) is None:
                raise inconsistent(event, "no block in use there")
        elif action in (FREE, "free"):
            if addr in live:
                raise inconsistent(event, "a block is still in use there")
            live[addr] = (event["size"], None)
        elif action == SEGMENT_ALLOC:
            if segs.pop(addr, None) is None:
                raise inconsistent(event, "no such segment")
        elif action == SEGMENT_FREE:
            # only a 2 MiB segment can be a small-pool one: large-pool segments are 20 MiB or >= 10 MiB
            segs[addr] = (event["size"], event["size"] == SMALL_BUFFER, event.get("stream", 0))

    starts = sorted(segs)
    by_segment: dict[int, list[int]] = {a: [] for a in starts}
    for addr in live:
        i = bisect.bisect_right(starts, addr) - 1
        if i < 0 or addr >= starts[i] + segs[starts[i]][0]:
            raise UserError(f"a block in use at {addr:#x} lies in no segment: the snapshot is inconsistent")
        by_segment[starts[i]].append(addr)
    guessed = 0
    segments = []
    for start in starts:
        size, is_small, stream = segs[start]
        inside = sorted(by_segment[start])
        allocated = []
        for k, addr in enumerate(inside):
            requested, block_size = live[addr]
            if block_size is None:
                guessed += 1
                block_size = round_size(requested, settings)
                end = inside[k + 1] if k + 1 < len(inside) else start + size
                gap = end - addr - block_size
                if not is_small and 0 < gap <= SMALL_SIZE:
                    block_size += gap
            allocated.append((addr, block_size, requested))
        segments.append(InitialSegment(start, size, is_small, stream, allocated))
    return Trace(device, events, segments, settings, guessed)
