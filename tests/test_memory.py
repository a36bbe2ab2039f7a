"""Exact memory facts, measured with the CPU storage tracker: to the byte, and the same every time."""

import pytest
import torch

from membench.trackers import categories as cat
from tests.helpers import spec, track_steps as measure


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
    assert first["peak_allocated_bytes"] == second["peak_allocated_bytes"]
    assert first["breakdown_at_peak"] == second["breakdown_at_peak"]


def test_peak_breakdown_sums_to_peak():
    memory = measure(spec("gpt-tiny", batch_size=2))[0]
    assert sum(memory["breakdown_at_peak"].values()) == memory["peak_allocated_bytes"]


@pytest.mark.parametrize("technique", ["accum", "ckpt"])
def test_accum_and_ckpt_lower_an_activation_heavy_peak(technique):
    base = measure(spec("gpt-mini", batch_size=4))[0]
    other = measure(spec("gpt-mini", batch_size=4, techniques=[technique]))[0]
    assert base["peak_phase"] in ("forward", "backward")  # activation-heavy: the peak is not the optimizer's
    assert other["peak_allocated_bytes"] < base["peak_allocated_bytes"]
    assert other["breakdown_at_peak"][cat.ACTIVATIONS] < base["breakdown_at_peak"][cat.ACTIVATIONS]


def test_opt_in_bwd_lowers_a_parameter_heavy_peak_and_keeps_no_grads():
    base = measure(spec("vit-tiny", batch_size=1))[0]
    memory, meter, state, _ = measure(spec("vit-tiny", batch_size=1, techniques=["opt-in-bwd"]))
    # The tutorial's picture: the baseline peaks in the optimizer step with every gradient alive...
    assert base["peak_phase"] == "optimizer"
    assert base["breakdown_at_peak"][cat.GRADS] >= storage_bytes(state.model.parameters())
    # ...the fused step moves the peak into backward and never holds more than a few gradients at once.
    assert memory["peak_phase"] == "backward"
    assert memory["peak_allocated_bytes"] < base["peak_allocated_bytes"]
    assert memory["breakdown_at_peak"][cat.GRADS] < base["breakdown_at_peak"][cat.GRADS] / 4
    assert all(p.grad is None for p in state.model.parameters())
    assert meter.tracker.by_category[cat.GRADS] == 0


def test_budget_raises_out_of_memory_on_cpu():
    from tests.helpers import replace

    s = spec("vit-tiny", batch_size=1)
    peak = measure(s)[0]["peak_allocated_bytes"]
    with pytest.raises(torch.OutOfMemoryError):
        measure(replace(s, memory_budget=peak - 1))
    measure(replace(s, memory_budget=peak))  # exactly the peak fits
