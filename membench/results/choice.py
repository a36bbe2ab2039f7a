"""What a technique stack changes besides memory, in one word, read from its numerics (techniques/base.py's
`numerics`, recorded on each run): the one rule `predict`, `fit` and `report` apply when they name a technique.

A stack whose numerics are one of SAME_MODEL trains the same model as the baseline (bit for bit, up to rounding, or
up to the rounding of sums split another way); any other value (precision, or one a newer technique declares)
changes something, and is named with what it changes wherever it is recommended.
"""

from __future__ import annotations

from membench.common.vocab import COSTS
from membench.results.schema import RunRecord

SAME_MODEL = frozenset({"exact", "rounding", "batch-split"})
# What a numerics value changes, in words; a value not listed is named as it is ("changes: <value>").
WORDS = {"precision": "the numerics"}


def changes(numerics: str | None) -> str | None:
    """What the stack changes ("the numerics"), or None where it trains the same model (or is not recorded)."""
    if numerics is None or numerics in SAME_MODEL:
        return None
    return WORDS.get(numerics, numerics)


def changes_phrase(numerics: str | None) -> str:
    """'changes the numerics' (or '' where nothing changes), the words beside a recommended technique."""
    what = changes(numerics)
    if what is None:
        return ""
    return f"changes {what}" if numerics in WORDS else f"changes: {what}"


def cost_phrase(cost: str | None) -> str:
    """'no step-time cost', 'medium step-time cost'; 'step-time cost not recorded' for an older record."""
    if cost is None:
        return "step-time cost not recorded"
    return "no step-time cost" if cost == "none" else f"{cost} step-time cost"


def order(cost: str | None, numerics: str | None, techniques: int, room: int) -> tuple:
    """The one rule that names a technique among those that fit (`predict`'s answer, `fit`'s, and `membench report`
    on CUDA predictions): the cheapest in step time (its declared cost class: a prediction has no timing; not
    recorded, last), then one that changes nothing, then the fewest techniques, then the most room (`room`: larger
    is better; its bytes are the caller's, the same for every candidate). The smallest key wins."""
    rank = COSTS.index(cost) if cost in COSTS else len(COSTS)
    return rank, changes(numerics) is not None, techniques, -room


def card_fit(record: RunRecord) -> tuple[bool, int] | None:
    """Whether a CUDA prediction fits the GPU it was predicted for, and the reserved bytes that say so; None for
    anything else (a measurement, a CPU prediction, one under --memory-budget, one that did not finish).

    The prediction replays its step under the card where the unbounded simulation reserves more than the card holds
    less the CUDA context and NCCL's buffers (predict/device.py `on_card`): absent, it fits as simulated; present,
    it fits unless the replay ran out of memory. This is the fits line's whole-device test (predict/verdict.py
    `device_peak` against the card's memory), read from the record alone."""
    memory = record.memory
    if (not record.predicted or record.predicted_for != "cuda" or record.status != "ok" or memory is None
            or memory.peak_reserved_bytes is None or record.spec.run.memory_budget is not None):
        return None
    card = memory.on_card
    if card is None:
        return True, memory.peak_reserved_bytes
    return (False, memory.peak_reserved_bytes) if card.oom else (True, card.peak_reserved_bytes)
