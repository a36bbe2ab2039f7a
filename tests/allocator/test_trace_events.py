"""The allocation trace's one event type (membench.allocator.events.TraceEvent): built, converted, replayed by name."""

from __future__ import annotations

import pytest

from membench.allocator import DEFAULT_STREAM, TraceEvent, simulate

MiB = 2**20


def test_an_event_names_its_fields_and_defaults_to_the_default_stream():
    event = TraceEvent.alloc("a", 1000)
    assert (event.kind, event.key, event.size, event.stream) == ("alloc", "a", 1000, DEFAULT_STREAM)
    assert TraceEvent.free("a") == TraceEvent("free", "a", 0, DEFAULT_STREAM)


@pytest.mark.parametrize("old, new", [
    (("alloc", 1, 10), TraceEvent.alloc(1, 10)),
    (("alloc", 1, 10, 7), TraceEvent.alloc(1, 10, stream=7)),
    (("free", 1), TraceEvent.free(1)),
    (("empty_cache",), TraceEvent("empty_cache")),
    (("reset_peak",), TraceEvent("reset_peak")),
])
def test_the_tuples_simulate_always_took_convert(old, new):
    assert TraceEvent.of(old) == new


@pytest.mark.parametrize("bad", [("free",), ("alloc", 1), ("malloc", 1, 10), ("empty_cache", 1), ()])
def test_a_malformed_tuple_is_one_line_naming_what_is_valid(bad):
    with pytest.raises(ValueError, match=r"^expected \('alloc', key, size\), \('free', key\)"):
        TraceEvent.of(bad)


def test_a_typed_event_of_an_unknown_kind_is_refused_by_the_simulator():
    with pytest.raises(ValueError, match="event 0: kind must be one of alloc, free, empty_cache, reset_peak"):
        simulate([TraceEvent("malloc", 1, 10)])


def test_the_stream_reaches_the_simulator():
    """A freed block is reused only by its own stream: 1 MiB freed on stream 0 serves a second request on stream 0
    from the same 2 MiB small-pool segment, and one on stream 1 from a segment of its own (hand-derived from
    CUDACachingAllocator's per-stream free lists)."""
    same = simulate([TraceEvent.alloc("a", MiB), TraceEvent.free("a"), TraceEvent.alloc("b", MiB)])
    other = simulate([TraceEvent.alloc("a", MiB), TraceEvent.free("a"), TraceEvent.alloc("b", MiB, stream=1)])
    assert same.segments == [2 * MiB]
    assert other.segments == [2 * MiB, 2 * MiB]
