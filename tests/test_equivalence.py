"""The equivalence verdict: exact techniques are bitwise, accumulation equivalent, BatchNorm + accum not,
precision techniques report the loss difference, and a planted wrong technique is caught."""

from __future__ import annotations

import pytest

from membench.techniques import REGISTRY, Technique
from tests.helpers import on_cpu_too, registered, verdict

# What each CPU technique must do to the trained model, from what it is (not from its `numerics` label):
# recomputation (ckpt, sac), a per-parameter step (opt-in-bwd), the for-loop optimizer (foreach-off: the CPU default
# already), building elsewhere with the baseline's values (init-on-device) change no arithmetic: bit for bit.
BITWISE = ["ckpt", "sac", "opt-in-bwd", "foreach-off", "init-on-device"]
EXPECTED = {**dict.fromkeys(BITWISE, "bitwise"), "accum": "equivalent", "fused-adam": "equivalent",
            "amp-bf16": "precision", "amp-fp16": "precision", "bf16": "precision",
            # an adapter is not the baseline's model: its verdict says what it trains (tests/techniques/test_lora.py)
            "lora": "precision", "qlora": "precision",
            "compile": "equivalent",  # gpt-tiny on CPU: tests/techniques/test_compile.py (slow)
            "chunked-ce": "equivalent"}  # the loss summed chunk by chunk: another order of the same sums


def test_every_cpu_technique_has_an_expected_verdict():
    cpu = {n for n, c in REGISTRY.items() if "cpu" in c.devices and not c.distributed and n != "baseline"}
    assert cpu == set(EXPECTED)


@pytest.mark.parametrize("name", BITWISE)
def test_exact_techniques_are_bitwise(name):
    v = verdict("gpt-tiny", (name,))
    assert v.verdict == "bitwise", v
    assert v.max_abs_param_diff == 0.0 and v.max_abs_loss_diff == 0.0


def test_cuda_only_exact_techniques_are_bitwise_on_cpu(monkeypatch):
    with on_cpu_too(monkeypatch, "act-offload", "opt-offload", "expandable-segments"):
        for name in ("act-offload", "opt-offload", "expandable-segments"):
            assert verdict("gpt-tiny", (name,)).verdict == "bitwise", name


def test_fused_adam_is_equivalent_within_rounding():
    v = verdict("gpt-tiny", ("fused-adam",))
    assert v.verdict == "equivalent" and v.compared == "parameters, optimizer state after 1 adam steps"
    assert 0 < v.max_abs_param_diff < 1e-6  # measured here: 1.2e-7, one ulp of a parameter near 1


def test_accum_is_equivalent_comparing_sgd_updates():
    v = verdict("vit-tiny", ("accum",), optimizer="adam")
    assert v.verdict == "equivalent" and v.mode == "batch-split"
    assert "sgd" in v.compared  # Adam's first step would amplify rounding noise in near-zero gradients
    assert v.relative_diff < 1e-4


def test_batchnorm_with_accum_is_not_equivalent_and_says_why():
    v = verdict("cnn-bn", ("accum",), batch_size=8)
    assert v.verdict == "not-equivalent"
    assert "BatchNorm" in v.detail and "own statistics" in v.detail


def test_batchnorm_without_accum_stays_bitwise():
    assert verdict("cnn-bn", ("foreach-off",), batch_size=8).verdict == "bitwise"


@pytest.mark.parametrize("name", ["amp-bf16", "amp-fp16", "bf16"])
def test_precision_techniques_report_the_loss_difference(name):
    v = verdict("gpt-tiny", (name,), check_steps=3)
    assert v.verdict == "precision" and v.mode == "precision"
    assert len(v.losses) == len(v.reference_losses) == 3
    assert v.max_abs_loss_diff == max(abs(a - b) for a, b in zip(v.losses, v.reference_losses)) > 0
    assert f"{v.max_abs_loss_diff:.3g}" in v.detail


class SkipsAParameter(Technique):
    """Planted bug: freezes the first parameter, so it never trains."""

    name = "planted-skip"
    summary = "test only"

    def configure(self, state) -> None:
        next(state.model.parameters()).requires_grad_(False)


class PerturbsTheLoss(Technique):
    """Planted bug: adds a term to the loss that the baseline does not have."""

    name = "planted-loss"
    summary = "test only"

    def configure(self, state) -> None:
        state.scale_loss = lambda loss: loss + 1e-3 * sum(p.square().sum() for p in state.model.parameters())


@pytest.mark.parametrize("planted", [SkipsAParameter, PerturbsTheLoss])
def test_a_planted_non_equivalent_technique_is_caught(planted):
    with registered(planted):
        v = verdict("gpt-tiny", (planted.name,))
    assert v.verdict == "not-equivalent", v
    assert planted.name not in REGISTRY


def test_a_planted_bug_is_caught_even_as_rounding():
    class Planted(SkipsAParameter):
        name = "planted-rounding"
        numerics = "rounding"

    with registered(Planted):
        assert verdict("gpt-tiny", ("planted-rounding",)).verdict == "not-equivalent"


def test_init_on_device_starts_from_the_baselines_values():
    v = verdict("gpt-tiny", ("init-on-device",))
    assert v.verdict == "bitwise" and "initial values" in v.compared


def test_the_whole_state_is_compared_and_named():
    v = verdict("gpt-tiny", ("ckpt",))
    assert v.verdict == "bitwise"
    assert [d.part for d in v.parts] == ["parameters", "optimizer state"]  # gpt-tiny has no buffers
    assert "optimizer state" in v.compared and all(d.max_abs_diff == 0 for d in v.parts)


def test_resnet18_under_ckpt_is_not_bitwise_batchnorm_runs_twice():
    """Recomputation runs BatchNorm's forward again: its running statistics are updated twice."""
    v = verdict("tests.workloads:resnet18", ("ckpt",), batch_size=4, check_steps=1)
    assert v.verdict == "not-equivalent", v
    parts = {d.part: d for d in v.parts}
    assert parts["buffer counters"].max_abs_diff == 1 and "num_batches_tracked" in parts["buffer counters"].worst
    assert not parts["buffers"].within_tolerance and "running_" in parts["buffers"].worst  # updated twice
    assert "BatchNorm" in v.detail and "twice" in v.detail and "num_batches_tracked" in v.detail
    params = next(d for d in v.parts if d.part == "parameters")
    assert params.max_abs_diff == 0  # the parameters alone would have said "bitwise"


def test_a_technique_that_changes_only_the_optimizer_state_is_caught():
    class DoublesAdamState(Technique):
        """Planted bug: the parameters step right, but the optimizer state is off for the next step."""

        name = "planted-state"
        summary = "test only"

        def configure(self, state) -> None:
            def step(opt):
                opt.step()
                for st in opt.state.values():
                    st["exp_avg_sq"].mul_(2)
            state.step_optimizer = step

    with registered(DoublesAdamState):
        v = verdict("gpt-tiny", ("planted-state",), check_steps=1)
    assert v.verdict == "not-equivalent" and "optimizer state" in v.detail
    assert next(d for d in v.parts if d.part == "parameters").max_abs_diff == 0


def test_dropout_under_accum_is_equivalent_apart_from_the_masks():
    v = verdict("tests.workloads:dropout_mlp", ("accum",), batch_size=8)
    assert v.random_ops == ["bernoulli_"]  # dropout's mask on CPU (native_dropout elsewhere)
    assert v.verdict == "equivalent" and v.apart_from == "dropout masks", v
    assert v.detail.startswith("equivalent apart from dropout masks") and "dropout disabled" in v.detail


def test_hf_gpt2_under_accum_is_equivalent_apart_from_dropout():
    pytest.importorskip("transformers")
    v = verdict("tests.workloads:hf_gpt2", ("accum",), batch_size=4)
    assert v.verdict == "equivalent" and v.apart_from == "dropout masks", v
    assert v.random_ops == ["bernoulli_"]


def test_batchnorm_with_accum_stays_not_equivalent_with_its_reason():
    v = verdict("cnn-bn", ("accum",), batch_size=8)
    assert v.verdict == "not-equivalent" and "own statistics" in v.detail and v.apart_from is None
