"""The user's training loop, for run and predict alike: amp-fp16 that really steps, optimizer state created in the
measured step, zeroed gradients kept between steps, gradient clipping, a first step (--warmup 0), inference.

Every expected number is derived by hand from the model's parameter count, and the predictions (fake tensors) are
checked against real CPU runs of the same step."""

from __future__ import annotations

import pytest

from membench import cli
from membench.api import plan
from membench.common.errors import UserError
from membench.common.vocab import CATEGORIES
from membench.predict.run import predict_memory
from membench.results import read_result
from membench.spec import Job, RunSpec
from membench.trackers.memory import CpuMeter
from tests.helpers import measure, session_for, spec

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
    # Each of the 4 parameters has two state tensors of its own size, each in 512-byte blocks. Its 4-byte step is a
    # host tensor on a GPU too (torch/optim/adam.py: on the device only if capturable or fused), so not counted.
    sizes = [192 * 64, 64, 64 * 10, 10]
    blocks = sum(2 * -(-4 * n // 512) * 512 for n in sizes)
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


def _measured_step_events(**options) -> list[tuple[str, int, tuple[int, ...]]]:
    """The measured step's timeline on the exact CPU tracker: (phase, step, bytes per category) at every
    allocation and free, after one warm-up step."""
    meter = CpuMeter(timeline=True)
    session = session_for(spec(MLP, batch_size=4, **options).run, meter=meter)
    session.build()
    session.warm_up(1)
    meter.tracker.clear_events()
    session.measure(1)
    return meter.tracker.events


def _gradients(events, phase: str) -> set[int]:
    return {by_category[CATEGORIES.index("gradients")] for p, _, by_category in events if p == phase}


def test_zeroed_gradients_kept_between_steps_hold_every_gradient_byte_from_the_forward_on():
    """--zero-grad zeros (set_to_none=False): the gradients stay allocated, as zeros, through the next step's forward
    and backward (backward adds into them); none frees them after the step, and backward allocates them anew."""
    kept, freed = _measured_step_events(zero_grad="zeros"), _measured_step_events()
    for phase in ("forward", "backward", "optimizer"):
        assert _gradients(kept, phase) == {MLP_PARAM_BYTES}, phase
    assert _gradients(freed, "forward") == {0}
    assert max(_gradients(freed, "backward")) == MLP_PARAM_BYTES
    zeros = measure(MLP, batch_size=4, zero_grad="zeros").memory
    none = measure(MLP, batch_size=4).memory
    assert zeros.current_bytes - none.current_bytes == MLP_PARAM_BYTES
    assert zeros.current_breakdown["gradients"] == MLP_PARAM_BYTES and none.current_breakdown["gradients"] == 0
    predicted = predict_memory(spec(MLP, batch_size=4, zero_grad="zeros"), round_to=1)
    for key in ("peak_allocated_bytes", "peak_phase", "breakdown_at_peak", "current_bytes", "current_breakdown"):
        assert getattr(predicted, key) == getattr(zeros, key), key


def test_clipping_costs_the_norms_of_the_gradients_at_the_step():
    """clip_grad_norm_ over the MLP's 4 gradients keeps 4 scalar norms (4 B each), their stack (16 B) and the total
    norm (4 B) at once: 36 B over what the optimizer phase starts with. Plain SGD steps in place and allocates
    nothing, so without clipping the phase only frees."""
    for clip, extra in ((1.0, 36), (None, None)):
        events = _measured_step_events(optimizer="sgd", clip_grad_norm=clip)
        totals = [sum(by_category) for _, _, by_category in events]
        first = next(i for i, (phase, _, _) in enumerate(events) if phase == "optimizer")
        rise = max(totals[first:]) - totals[first - 1]
        assert rise == extra if extra else rise < 0


def test_amp_fp16_with_clipping_unscales_first_and_is_predicted_to_the_byte():
    job = spec(MLP, ("amp-fp16",), batch_size=4, clip_grad_norm=1.0)
    predicted, measured = predict_memory(job, round_to=1), measure(MLP, ("amp-fp16",), batch_size=4,
                                                                   clip_grad_norm=1.0).memory
    assert measured.current_breakdown["optimizer_state"] == ADAM_STATE_BYTES
    for key in ("peak_allocated_bytes", "peak_phase", "breakdown_at_peak", "current_bytes", "current_breakdown"):
        assert getattr(predicted, key) == getattr(measured, key), key


@pytest.mark.parametrize("stack", [(), ("amp-bf16",)], ids=["fp32", "amp-bf16"])
def test_inference_has_no_gradients_and_no_optimizer_state(stack):
    """--inference: eval mode, torch.inference_mode, no backward, no optimizer. Autocast still applies (bf16
    activations, predicted as measured). gpt-tiny's peak is in its forward."""
    job = spec("gpt-tiny", stack, batch_size=4, inference=True)
    predicted, measured = predict_memory(job, round_to=1), measure("gpt-tiny", stack, batch_size=4,
                                                                   inference=True).memory
    for memory in (predicted, measured):
        assert memory.peak_phase == "forward"
        for breakdown in (memory.breakdown_at_peak, memory.current_breakdown):
            assert breakdown["gradients"] == breakdown["optimizer_state"] == breakdown["temporaries"] == 0
        assert memory.current_bytes == memory.current_breakdown["parameters"] + memory.current_breakdown["inputs"]
    for key in ("peak_allocated_bytes", "peak_phase", "breakdown_at_peak", "current_bytes", "current_breakdown"):
        assert getattr(predicted, key) == getattr(measured, key), key


def test_inference_under_amp_bf16_saves_activations():
    fp32, bf16 = (predict_memory(spec("gpt-tiny", s, batch_size=4, inference=True), round_to=1)
                  for s in ((), ("amp-bf16",)))
    assert bf16.breakdown_at_peak["activations"] < fp32.breakdown_at_peak["activations"]


@pytest.mark.parametrize("stack, options, says", [
    (("accum",), dict(inference=True), "--inference runs the forward only"),
    (("opt-in-bwd",), dict(zero_grad="zeros"), "cannot combine opt-in-bwd with --zero-grad zeros"),
    (("opt-in-bwd",), dict(clip_grad_norm=1.0), "cannot combine opt-in-bwd with --clip-grad-norm"),
])
def test_loop_options_a_technique_contradicts_are_refused(stack, options, says):
    with pytest.raises(UserError, match=says):
        plan("gpt-tiny", "+".join(stack), 2, "cpu", **options)


@pytest.mark.parametrize("options, says", [
    (dict(zero_grad="never"), "unknown --zero-grad 'never'; valid: none, zeros"),
    (dict(clip_grad_norm=0.0), "--clip-grad-norm must be a finite positive number"),
    (dict(inference="yes"), "--inference must be true or false"),
])
def test_bad_loop_options_are_one_clear_line(options, says):
    with pytest.raises(UserError, match=says):
        RunSpec(workload="gpt-tiny", batch_size=2, **options).validated()


def test_inference_runs_the_baseline_by_default_and_old_specs_read_the_defaults():
    jobs = plan("gpt-tiny", None, 2, "cpu", inference=True)
    assert [j.name for j in jobs] == ["baseline"] and jobs[0].run.inference
    old = spec("gpt-tiny").to_dict()
    for name in ("zero_grad", "clip_grad_norm", "inference"):
        del old["run"][name]
    assert Job.from_dict(old).run == spec("gpt-tiny").run


def test_cli_predict_records_the_loop_options_in_the_spec(tmp_path, capsys):
    code = cli.main(["predict", "--workload", MLP, "--batch-size", "4", "--device", "cpu", "--techniques",
                     "amp-fp16", "--zero-grad", "zeros", "--clip-grad-norm", "1", "--warmup", "0",
                     "--out", str(tmp_path)])
    assert code == 0, capsys.readouterr()
    records = {p.stem: read_result(p) for p in tmp_path.glob("*.json")}
    assert set(records) == {"baseline", "amp-fp16"}
    for record in records.values():
        run = record.spec.run
        assert (run.zero_grad, run.clip_grad_norm, record.spec.measure.warmup) == ("zeros", 1.0, 0)
        assert record.memory.current_breakdown["gradients"] == MLP_PARAM_BYTES
        assert record.memory.current_breakdown["optimizer_state"] == ADAM_STATE_BYTES


TINY_BERT = "hf:bert,hidden_size=64,num_hidden_layers=2,num_attention_heads=2,intermediate_size=128,head=seq-cls"


def test_hugging_face_config_overrides_such_as_the_attention_kernel_are_kept():
    """`_attn_implementation=eager` (what the Trainer of transformers v4.18 ran) reaches the model, also when the
    predictor builds it on meta: eager attention keeps the seq x seq probabilities that sdpa does not."""
    pytest.importorskip("transformers")
    from membench.workloads import load_workload

    eager = f"{TINY_BERT},_attn_implementation=eager"
    assert load_workload(eager, 64).build_model().config._attn_implementation == "eager"
    # Forward only, so the peak is where attention is (a training step's peak is Adam's, on the vocabulary).
    predicted = {w: predict_memory(spec(w, batch_size=2, seq_len=64, inference=True), round_to=1)
                 for w in (eager, TINY_BERT)}
    assert predicted[eager].peak_allocated_bytes > predicted[TINY_BERT].peak_allocated_bytes
    measured = measure(eager, batch_size=2, seq_len=64, inference=True).memory
    assert predicted[eager].peak_allocated_bytes == measured.peak_allocated_bytes
