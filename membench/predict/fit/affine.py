"""The allocations of a prediction at any batch, derived from two predictions: the affine trace model."""

from __future__ import annotations

from typing import NamedTuple

from membench.allocator import simulate
from membench.allocator.events import TraceEvent
from membench.predict.device import SEGMENT_PLACEMENT
from membench.predict.emulate.registry import KernelCall
from membench.predict.run import Traced


class NotAffine(Exception):
    """Why two traces do not give one affine trace (in words: fit's note when it falls back to the full search)."""


class Affine(NamedTuple):
    """A size at any batch: base + per_sample x batch (bytes)."""

    base: int
    per_sample: int

    def at(self, batch: int) -> int:
        return self.base + self.per_sample * batch


class AffineCall(NamedTuple):
    """A kernel call that may take scratch: its place among the trace's events (scratch left out), the call as the
    first trace kept it, and its layout with each integer affine in the batch step (see _affine)."""

    at: int
    call: KernelCall
    layout: tuple


class AffineTrace:
    """The allocations of a prediction at any batch, derived from two: event i is the same allocation or free at
    every batch, and an allocation's size is a + c x batch (bytes, integers). Kernel scratch (a CUDA kernel's own
    buffers, predict/emulate/reductions.py) is not affine in the batch: a reduction splits across blocks only past
    some size, with buffers sized by the GPU. Its calls are kept apart, each with its tensors' layouts (affine in
    the batch), and their scratch is worked out again at each batch by the same code a prediction runs."""

    def __init__(self, kinds: list[TraceEvent], sizes: list[Affine | None], measured_from: int, round_to: int,
                 settings, calls: list[AffineCall] = (), scratch=None):
        # kinds: each event as the first batch made it; sizes: each allocation's size (None for a free)
        self.kinds, self.sizes, self.measured_from = kinds, sizes, measured_from  # measured_from: among kinds
        self.round_to, self.settings = round_to, settings
        self.calls, self.scratch = list(calls), scratch
        self.first, self.step = 0, 1

    @classmethod
    def derive(cls, a: Traced, batch_a: int, b: Traced, batch_b: int, settings, scratch=None) -> AffineTrace:
        """The affine trace through a and b; NotAffine (saying why) where there is none. scratch: the prediction's
        predict/emulate/registry.KernelScratch (its GPU), for traces that kept kernel calls."""
        (events_a, calls_a, from_a), (events_b, calls_b, from_b) = _apart(a), _apart(b)
        if len(events_a) != len(events_b) or from_a != from_b:
            raise NotAffine(f"batch {batch_a} makes {len(events_a)} allocations and frees, batch {batch_b} makes "
                            f"{len(events_b)}")
        sizes = [_affine_size(i, x, y, batch_a, batch_b) for i, (x, y) in enumerate(zip(events_a, events_b))]
        if len(calls_a) != len(calls_b):
            raise NotAffine(f"batch {batch_a} makes {len(calls_a)} kernel calls, batch {batch_b} makes {len(calls_b)}")
        calls = []
        for (at_a, call_a), (at_b, call_b) in zip(calls_a, calls_b):
            layout = _affine(call_a.layout, call_b.layout)
            if at_a != at_b or call_a.func is not call_b.func or layout is None or scratch is None:
                raise NotAffine(f"a kernel call at event {at_a} is not the same op on affine layouts at both batches")
            calls.append(AffineCall(at_a, call_a, layout))
        model = cls(events_a, sizes, from_a, a.round_to, settings, calls, scratch)
        model.first, model.step = batch_a, batch_b - batch_a  # the calls' layouts: per step from the first batch
        for traced, batch in ((a, batch_a), (b, batch_b)):
            if model.peak_allocated(batch) != traced.memory.peak_allocated_bytes:
                raise NotAffine("the trace does not account for the predicted peak")  # a tracker change to follow
        return model

    def events(self, batch: int) -> tuple[list[TraceEvent], int]:
        """The allocations and frees at `batch`, and where the measured step begins among them."""
        out: list[TraceEvent] = []
        calls = iter(self.calls)
        call = next(calls, None)
        measured_from = invocation = None
        for i, (kind, size) in enumerate(zip([*self.kinds, None], [*self.sizes, None])):
            while call is not None and call.at == i:
                if call.call.part == 0:  # a later part (after the op's outputs) is of the same kernel invocation
                    invocation = id(call)
                out += self._scratch(call, batch, invocation)
                call = next(calls, None)
            if i == self.measured_from:
                measured_from = len(out)
            if kind is not None:
                out.append(kind if size is None else TraceEvent(kind.kind, kind.key, size.at(batch), kind.stream))
        return out, measured_from

    def _scratch(self, call: AffineCall, batch: int, invocation: int) -> list[TraceEvent]:
        """A kernel call's scratch at `batch`, keyed apart from the trace's storages (and from other invocations')."""
        steps, rest = divmod(batch - self.first, self.step)
        if rest:
            raise ValueError(f"batch {batch} is not a whole number of steps of {self.step} from {self.first}")
        return [TraceEvent(e.kind, ("scratch", invocation, e.key), e.size, e.stream)
                for e in self.scratch.events_of(call.call, _at(call.layout, steps))]

    def matches(self, traced: Traced, batch: int) -> str | None:
        """None when a real prediction at `batch` made exactly the derived allocations; else the first difference."""
        derived, measured_from = self.events(batch)
        events, real = _keys_in_order(derived), _keys_in_order(traced.events)
        if len(events) != len(real) or traced.measured_from != measured_from:
            return f"batch {batch} makes {len(real)} allocations and frees, not {len(events)}"
        for i, (x, y) in enumerate(zip(events, real)):
            if x != y:
                return f"event {i} at batch {batch} is {_shown(y)}, derived {_shown(x)}"
        return None

    def peak_allocated(self, batch: int) -> int:
        """The measured step's peak of the sum of live allocations rounded to blocks, as the tracker counts it."""
        r = self.round_to
        events, measured_from = self.events(batch)
        live: dict = {}
        current = peak = 0
        for i, event in enumerate(events):
            if i == measured_from:
                peak = current
            if event.kind == "free":
                current -= live.pop(event.key)
            else:
                rounded = -(-event.size // r) * r
                live[event.key] = rounded
                current += rounded
                if i >= measured_from and current > peak:
                    peak = current
        return peak

    def peak_reserved(self, batch: int) -> int:
        return simulate(self.events(batch)[0], self.settings, placement=SEGMENT_PLACEMENT).peak_reserved_bytes


def _affine_size(i: int, x: TraceEvent, y: TraceEvent, batch_a: int, batch_b: int) -> Affine | None:
    """Event i's size as affine in the batch, from the event at two batches (None for a free); NotAffine where
    the two are not the same event or the size grows by no whole number of bytes per sample."""
    if (x.kind, x.key, x.stream) != (y.kind, y.key, y.stream):
        raise NotAffine(f"event {i} differs between batch {batch_a} and batch {batch_b}: {(x.kind, x.key)} vs "
                        f"{(y.kind, y.key)}")
    if x.kind != "alloc":
        return None
    slope, rest = divmod(y.size - x.size, batch_b - batch_a)
    if rest or slope < 0:
        raise NotAffine(f"allocation {i} grows from {x.size} B to {y.size} B: not a whole number of bytes per sample")
    return Affine(x.size - slope * batch_a, slope)


def _apart(traced: Traced) -> tuple[list[TraceEvent], list[tuple[int, KernelCall]], int]:
    """A trace's events without kernel scratch, keys numbered in order of first use (scratch takes keys from the
    same counter), its kernel calls (each with its place among those events), and the measured step's place."""
    scratch_at = {i for call in traced.kernel_calls for i in range(call.at, call.at + call.count)}
    kept = [i for i in range(len(traced.events)) if i not in scratch_at]
    place = {index: n for n, index in enumerate(kept)}
    place[len(traced.events)] = len(kept)

    def placed(index: int) -> int:  # the first kept event at or after index
        while index not in place:
            index += 1
        return place[index]

    events = _keys_in_order([traced.events[i] for i in kept])
    calls = [(placed(call.at), call) for call in traced.kernel_calls]
    return events, calls, placed(traced.measured_from)


def _keys_in_order(events: list[TraceEvent]) -> list[TraceEvent]:
    numbers: dict = {}
    return [TraceEvent(e.kind, numbers.setdefault(e.key, len(numbers)), e.size, e.stream) for e in events]


def _shown(event: TraceEvent) -> str:
    """An event as fit's notes name it: (kind, key, bytes) for an allocation, (kind, key) for a free."""
    return str((event.kind, event.key, event.size) if event.kind == "alloc" else (event.kind, event.key))


def _affine(x, y):
    """x and y (a layout at two batches, one batch step apart) as one layout whose integers are (x, y - x): x plus
    that per batch step (accumulation's micro-batch grows by one sample per step of accum-steps samples). Tagged
    tuples: ("affine", x, per step), ("parts", the parts of a tuple), ("same", a value equal at both)."""
    if type(x) is int and type(y) is int:
        return ("affine", x, y - x)
    if isinstance(x, tuple) and isinstance(y, tuple):
        if len(x) != len(y):
            return None
        parts = tuple(_affine(p, q) for p, q in zip(x, y))
        return None if any(p is None for p in parts) else ("parts", parts)
    return ("same", x) if x == y and type(x) is type(y) else None


def _at(layout, steps: int):
    """The layout `steps` batch steps past the first of the two it was derived from."""
    kind = layout[0]
    if kind == "affine":
        return layout[1] + layout[2] * steps
    if kind == "parts":
        return tuple(_at(p, steps) for p in layout[1])
    return layout[1]
