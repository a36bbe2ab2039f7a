"""An independent oracle: torch's own MemTracker (torch.distributed._tools.mem_tracker) on the same step must see
the same peak as membench, to the byte.

MemTracker is a separate implementation (its own dispatch mode, its own storage bookkeeping), so agreement here is
evidence about membench's tracker, not a restatement of it. It cannot follow a module called twice in one step, so
accumulation (several forwards per step) is not among the cases.
"""

from __future__ import annotations

import pytest
import torch

from membench.step import batches, build_state, train_step
from membench.techniques import resolve
from membench.workloads import load_workload
from tests.helpers import measure, spec

CASES = [("vit-tiny", ()), ("gpt-tiny", ()), ("cnn-bn", ()), ("vit-small", ()), ("gpt-tiny", ("ckpt",)),
         ("gpt-tiny", ("opt-in-bwd",)), ("vit-tiny", ("ckpt", "opt-in-bwd")), ("gpt-tiny", ("sac",)),
         ("gpt-tiny", ("amp-bf16",)), ("cnn-bn", ("foreach-off",))]


def memtracker_peak(workload: str, techniques: tuple[str, ...], batch_size: int) -> int:
    """The step after one warm-up step (Adam's state exists), under MemTracker alone: nothing of membench's
    tracking is on (the same training step code, the same seed and batches)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    run = spec(workload, techniques, batch_size=batch_size).run
    loaded = load_workload(workload)
    state = build_state(run, loaded, resolve(run).techniques)
    data = batches(loaded, run)
    train_step(state, next(data))
    batch = next(data)
    tracker = MemTracker()
    tracker.track_external(state.model, *state.optimizers, *batch)
    with tracker:
        train_step(state, batch)
    return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


# The 12-layer model is slow; the same path on vit-tiny, gpt-tiny and cnn-bn stays in the default run.
@pytest.mark.parametrize("workload, techniques", [
    pytest.param(w, t, id=f"{w}-{'+'.join(t) or 'baseline'}", marks=[pytest.mark.slow] if w == "vit-small" else [])
    for w, t in CASES])
def test_peak_agrees_with_torch_memtracker_to_the_byte(workload, techniques):
    ours = measure(workload, techniques, batch_size=4).memory.peak_allocated_bytes
    assert ours == memtracker_peak(workload, techniques, 4)
