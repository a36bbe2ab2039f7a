"""The peak's fp32 logits named: storages of exactly tokens x vocabulary x 4 bytes live at the trace's peak."""

from membench.allocator.events import TraceEvent
from membench.predict.peak_source import logits_note

LOGITS = 128 * 8192 * 4  # 128 tokens, a vocabulary of 8192, fp32


def test_the_logits_sized_storages_live_at_the_peak_are_counted():
    # Three logits-sized storages at once (the peak: 3 x 4 MiB + 512 B), then one freed and a smaller one made.
    events = [TraceEvent.alloc("w", 512), TraceEvent.alloc("a", LOGITS), TraceEvent.alloc("b", LOGITS),
              TraceEvent.alloc("c", LOGITS), TraceEvent.free("a"), TraceEvent.alloc("d", 1024)]
    note = logits_note(events, 0, 512, 3 * LOGITS + 512, 128, 8192)
    assert note.startswith("3 fp32 logits-sized tensors (4.00 MiB each: 128 tokens x 8192 vocabulary x 4 B) make "
                           "100% of the peak")


def test_no_note_without_a_logits_sized_storage_at_the_peak():
    events = [TraceEvent.alloc("a", LOGITS), TraceEvent.free("a"), TraceEvent.alloc("b", 2 * LOGITS)]
    assert logits_note(events, 0, 512, 2 * LOGITS, 128, 8192) is None
