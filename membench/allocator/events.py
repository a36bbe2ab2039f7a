"""One event of an allocation trace: what the storage tracker records, the simulator replays, and prediction's warm-up
writing and fit read, all by name.

A NamedTuple rather than a dataclass: a prediction makes one per allocation and per free (tens of thousands), and a
tuple's construction and comparison are the cheapest Python has.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Literal, NamedTuple

Kind = Literal["alloc", "free", "empty_cache", "reset_peak"]
KINDS: tuple[Kind, ...] = ("alloc", "free", "empty_cache", "reset_peak")
DEFAULT_STREAM = 0  # CUDA's default stream, as the caching allocator and its snapshots number it


class TraceEvent(NamedTuple):
    """kind "alloc": a storage of `size` bytes (the raw request: the simulator rounds it as the allocator does) is
    allocated on `stream`, under `key` (any hashable naming it until its free); "free": the storage under `key` is
    freed (its memory reusable at once on the stream it was allocated on); "empty_cache": torch.cuda.empty_cache();
    "reset_peak": torch.cuda.reset_peak_memory_stats(), peaks count from here."""

    kind: Kind
    key: Hashable = None
    size: int = 0  # bytes requested; 0 for all but "alloc"
    stream: int = DEFAULT_STREAM

    @classmethod
    def alloc(cls, key: Hashable, size: int, stream: int = DEFAULT_STREAM) -> TraceEvent:
        return cls("alloc", key, size, stream)

    @classmethod
    def free(cls, key: Hashable) -> TraceEvent:
        return cls("free", key)

    @classmethod
    def of(cls, event: tuple) -> TraceEvent:
        """A TraceEvent from one, or from the tuples simulate() has always taken: ("alloc", key, size[, stream]),
        ("free", key), ("empty_cache",), ("reset_peak",). ValueError (naming what is valid) for anything else."""
        if isinstance(event, TraceEvent):
            return event
        kind = event[0] if isinstance(event, tuple) and event else None
        if kind == "alloc" and len(event) in (3, 4):
            return cls(*event)
        if (kind == "free" and len(event) == 2) or (kind in ("empty_cache", "reset_peak") and len(event) == 1):
            return cls(*event)
        raise ValueError(f"expected ('alloc', key, size), ('free', key), ('empty_cache',) or ('reset_peak',), got "
                         f"{event!r}")
