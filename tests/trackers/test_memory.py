"""Exact memory facts, measured with the CPU storage tracker: to the byte, and the same every time."""

import pytest
import torch

from membench.common import vocab as cat
from tests.helpers import spec
from tests.helpers import track_steps as measure


def storage_bytes(tensors) -> int:
    return sum(t.untyped_storage().nbytes() for t in tensors)


@pytest.mark.parametrize("workload", ["vit-tiny", "gpt-tiny"])
def test_steady_state_is_params_plus_adam_state_plus_inputs(workload):
    memory, meter, state, batch = measure(spec(workload, batch_size=2))
    params = list(state.model.parameters())
    param_bytes = storage_bytes(params)
    adam_state = [t for s in state.optimizers[0].state.values() for t in s.values()]
    # Adam keeps exp_avg and exp_avg_sq (each the size of its parameter) and a 4-byte fp32 step per parameter.
    assert storage_bytes(adam_state) == 2 * param_bytes + 4 * len(params)
    input_bytes = storage_bytes(batch)
    assert meter.current() == param_bytes + storage_bytes(adam_state) + input_bytes
    by = meter.tracker.by_category
    assert by[cat.PARAMS] == param_bytes
    assert by[cat.OPTIMIZER] == 2 * param_bytes + 4 * len(params)
    assert by[cat.INPUTS] == input_bytes
    assert by[cat.GRADS] == by[cat.ACTIVATIONS] == by[cat.TEMPORARIES] == by[cat.OTHER] == 0
    assert all(p.grad is None for p in params)


def test_tracker_is_deterministic():
    first = measure(spec("vit-tiny", batch_size=2))[0]
    second = measure(spec("vit-tiny", batch_size=2))[0]
    assert first.peak_allocated_bytes == second.peak_allocated_bytes
    assert first.breakdown_at_peak == second.breakdown_at_peak


@pytest.fixture(scope="module")
def gpt_tiny_baseline():
    # gpt-tiny at batch 4 holds about 4.6x its parameters in activations at the peak: activation-heavy, and a
    # fraction of a second to measure (gpt-mini took tens of seconds for the same fact).
    return measure(spec("gpt-tiny", batch_size=4))[0]


@pytest.mark.parametrize("technique", ["accum", "ckpt"])
def test_accum_and_ckpt_lower_an_activation_heavy_peak(technique, gpt_tiny_baseline):
    base = gpt_tiny_baseline
    other = measure(spec("gpt-tiny", batch_size=4, techniques=[technique]))[0]
    assert base.breakdown_at_peak[cat.ACTIVATIONS] > base.breakdown_at_peak[cat.PARAMS]
    assert base.peak_phase in ("forward", "backward")  # activation-heavy: the peak is not the optimizer's
    assert other.peak_allocated_bytes < base.peak_allocated_bytes
    assert other.breakdown_at_peak[cat.ACTIVATIONS] < base.breakdown_at_peak[cat.ACTIVATIONS]


def test_opt_in_bwd_lowers_a_parameter_heavy_peak_and_keeps_no_grads():
    base = measure(spec("vit-tiny", batch_size=1))[0]
    memory, meter, state, _ = measure(spec("vit-tiny", batch_size=1, techniques=["opt-in-bwd"]))
    # The tutorial's picture: the baseline peaks in the optimizer step with every gradient alive...
    assert base.peak_phase == "optimizer"
    assert base.breakdown_at_peak[cat.GRADS] >= storage_bytes(state.model.parameters())
    # ...the fused step moves the peak into backward and never holds more than a few gradients at once.
    assert memory.peak_phase == "backward"
    assert memory.peak_allocated_bytes < base.peak_allocated_bytes
    assert memory.breakdown_at_peak[cat.GRADS] < base.breakdown_at_peak[cat.GRADS] / 4
    assert all(p.grad is None for p in state.model.parameters())
    assert meter.tracker.by_category[cat.GRADS] == 0


def test_budget_raises_out_of_memory_on_cpu():
    """A budget below what training must hold between steps (parameters + Adam's two moments and step counters,
    derived from the model, not measured) cannot fit; one far above everything does."""
    from membench.workloads import load_workload
    from tests.helpers import replace

    params = list(load_workload("vit-tiny").build_model().parameters())
    must_hold = 3 * storage_bytes(params) + 4 * len(params)
    s = spec("vit-tiny", batch_size=1)
    with pytest.raises(torch.OutOfMemoryError):
        measure(replace(s, memory_budget=must_hold - 1))
    assert measure(replace(s, memory_budget=2**30))[0].peak_allocated_bytes > must_hold


def test_timed_steps_run_with_nothing_of_membench_attached(monkeypatch):
    """After the measured step the session detaches: the timed steps register no storage with the tracker, and
    no membench hook stays on the parameters or the optimizer."""
    import weakref

    from tests.helpers import session_for

    session = session_for(spec("gpt-tiny", batch_size=2).run)
    session.build()
    session.warm_up(1)
    session.measure(1)
    session.detach()
    finalizers = []
    real = weakref.finalize
    monkeypatch.setattr(weakref, "finalize", lambda *a, **k: finalizers.append(a) or real(*a, **k))
    for i in session.timed_indices(3):
        session.bare_step(i)
    assert finalizers == []
    params = list(session.state.model.parameters())
    assert all(not p._post_accumulate_grad_hooks for p in params)  # torch keeps them in this dict (2.14)
    assert all(not opt._optimizer_step_post_hooks for opt in session.state.optimizers)


def _recomputed_high_water(techniques) -> tuple[int, int]:
    """(most recomputed-activation bytes alive at once, the step's peak) for gpt-tiny's step under the tracker."""
    from membench.step import batches, build_state, train_step
    from membench.techniques import resolve
    from membench.trackers.storage import StorageTracker
    from membench.workloads import load_workload

    run = spec("gpt-tiny", techniques, batch_size=2).run
    workload = load_workload(run.workload)
    state = build_state(run, workload, resolve(run).techniques)
    tracker = StorageTracker(timeline=True)
    with tracker:
        train_step(state, next(batches(workload, run)), tracker.in_phase)
    column = cat.CATEGORIES.index(cat.RECOMPUTED)
    return max(e[2][column] for e in tracker.events), tracker.peak.bytes


@pytest.mark.parametrize("technique", ["ckpt", "sac"])
def test_recomputation_in_backward_is_counted_as_recomputed_activations(technique):
    recomputed, _ = _recomputed_high_water((technique,))
    assert recomputed > 0
    assert _recomputed_high_water(())[0] == 0  # nothing is recomputed without checkpointing


@pytest.mark.parametrize("env, label", [
    ({}, "default"),
    ({"PYTORCH_CUDA_ALLOC_CONF": "large_segment_size_mb:64"}, "large_segment_size_mb:64"),
    ({"PYTORCH_ALLOC_CONF": "backend:cudaMallocAsync"}, "backend:cudaMallocAsync"),
    ({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:lots"}, "max_split_size_mb:lots"),  # kept as written
])
def test_a_cuda_record_keeps_the_allocator_settings_it_ran_with(env, label):
    """validate_gpu_runs and a later prediction read them (the H200's records had none: the script's table stood in)."""
    from membench.trackers.memory import allocator_label

    assert allocator_label(env) == label


def test_batches_hold_no_batch_while_the_next_is_made():
    # A CUDA run copies each batch to the GPU inside its step, after the last step's copy is gone; a prediction's
    # batches are the device's, so the generator must not keep the last one alive while it makes the next (an
    # H200's vit_l_16 trace: the old batch freed, then the new one allocated).
    import dataclasses
    import gc
    import weakref

    from membench.step import batches
    from membench.workloads import load_workload

    workload = load_workload("vit-tiny", None)
    seen: list = []
    made_while_alive: list[bool] = []

    def make_batch(*args):
        made_while_alive.append(bool(seen) and seen[-1]() is not None)
        return workload.make_batch(*args)

    data = batches(dataclasses.replace(workload, make_batch=make_batch), spec("vit-tiny", batch_size=2).run)
    seen.append(weakref.ref(next(data)[0]))
    gc.collect()
    next(data)
    assert made_while_alive == [False, False]
