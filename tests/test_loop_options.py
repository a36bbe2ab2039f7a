"""The user's training loop, for run and predict alike: amp-fp16 that really steps, optimizer state created in the
measured step, zeroed gradients kept between steps, gradient clipping, a first step (--warmup 0), inference.

Every expected number is derived by hand from the model's parameter count, and the predictions (fake tensors) are
checked against real CPU runs of the same step."""

from __future__ import annotations

from membench.predict import predict_memory
from tests.helpers import measure, spec

MLP = "tests.workloads:mlp"  # Linear(192, 64), ReLU, Linear(64, 10): 4 parameters
MLP_PARAMS = 192 * 64 + 64 + 64 * 10 + 10  # 13002 fp32 values
MLP_PARAM_BYTES = 4 * MLP_PARAMS
ADAM_STEP_BYTES = 4 * 4  # one fp32 step counter per parameter tensor
ADAM_STATE_BYTES = 2 * MLP_PARAM_BYTES + ADAM_STEP_BYTES  # exp_avg and exp_avg_sq in fp32, the step counters


def test_amp_fp16_prediction_steps_the_optimizer_as_a_real_run_does():
    """On fake tensors GradScaler's inf flag has no value: read as 1 it skipped every step and left no optimizer
    state. The prediction takes the finite-gradients path, and holds exactly Adam's state, as the real run."""
    job = spec(MLP, ("amp-fp16",), batch_size=4)
    predicted = predict_memory(job, round_to=1)
    measured = measure(MLP, ("amp-fp16",), batch_size=4).memory
    assert predicted.current_breakdown["optimizer_state"] == ADAM_STATE_BYTES
    assert measured.current_breakdown["optimizer_state"] == ADAM_STATE_BYTES
    for key in ("peak_allocated_bytes", "peak_phase", "breakdown_at_peak", "current_bytes", "current_breakdown"):
        assert getattr(predicted, key) == getattr(measured, key), key


def test_amp_fp16_cuda_prediction_holds_adam_state_in_allocator_blocks():
    predicted = predict_memory(spec(MLP, ("amp-fp16",), batch_size=4, device="cuda"))
    # Each of the 4 parameters has two state tensors of its own size and a 4-byte step, each in 512-byte blocks.
    sizes = [192 * 64, 64, 64 * 10, 10]
    blocks = sum(2 * -(-4 * n // 512) * 512 + 512 for n in sizes)
    assert predicted.current_breakdown["optimizer_state"] == blocks


def test_first_step_state_is_optimizer_state_at_the_peak_measured_and_predicted():
    """--warmup 0 measures the first step, where Adam creates its state: at the peak (the optimizer step) the
    state is optimizer state, not a temporary of the step, and the peak is the steady state's (Adam's state is
    made before its update either way)."""
    first = spec(MLP, batch_size=4, warmup=0)
    predicted, measured = predict_memory(first, round_to=1), measure(MLP, batch_size=4, warmup=0).memory
    steady = predict_memory(spec(MLP, batch_size=4, warmup=1), round_to=1)
    for memory in (predicted, measured):
        assert memory.peak_phase == "optimizer"
        assert memory.breakdown_at_peak["optimizer_state"] == ADAM_STATE_BYTES
        assert memory.breakdown_at_peak == steady.breakdown_at_peak
        assert memory.peak_allocated_bytes == steady.peak_allocated_bytes
