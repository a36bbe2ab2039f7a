"""Every technique of the catalogue runs on CPU (where it means something there), and moves memory the way it
should, asserted with the exact CPU tracker where that is deterministic."""

from __future__ import annotations

import pytest
import torch

from membench.cli import main
from membench.common.errors import UserError
from membench.launch.lifecycle import environment_for
from membench.techniques import REGISTRY, Technique, check_stack, resolve
from membench.trackers.memory import CpuMeter
from tests.helpers import adam_step_bytes, measure, on_cpu_too, registered, session_for, spec

# compile runs in tests/techniques/test_compile.py: compiling takes minutes on this machine, past the default set's
CPU_TECHNIQUES = [n for n, cls in REGISTRY.items() if "cpu" in cls.devices and not cls.distributed
                  and n != "baseline" and not cls.compiles]
CUDA_ONLY = [n for n, cls in REGISTRY.items() if cls.devices == ("cuda",)]


def breakdown(result: dict) -> dict:
    return result.memory.breakdown_at_peak


@pytest.fixture(scope="module")
def baseline() -> dict:
    return measure("gpt-tiny")


def test_catalogue_is_complete():
    expected = {"baseline", "accum", "ckpt", "opt-in-bwd", "amp-bf16", "amp-fp16", "bf16", "foreach-off",
                "fused-adam", "init-on-device", "opt-offload", "act-offload", "sac", "fsdp", "fsdp-offload", "tp",
                "expandable-segments", "lora", "qlora", "compile", "chunked-ce"}
    assert set(REGISTRY) == expected
    for name, cls in REGISTRY.items():
        assert cls.name == name and cls.summary and cls.__doc__, name
        assert cls.numerics in ("exact", "rounding", "batch-split", "precision"), name


def test_techniques_command_lists_everything(capsys):
    assert main(["techniques"]) == 0
    out = capsys.readouterr().out
    for name, cls in REGISTRY.items():
        line = next(line for line in out.splitlines() if line.startswith(name + " "))
        assert cls.summary in line and ", ".join(cls.devices) in line


@pytest.mark.parametrize("name", CPU_TECHNIQUES)
def test_every_cpu_technique_runs(name):
    result = measure("gpt-tiny", (name,))
    assert result.memory.peak_allocated_bytes > 0 and result.timing.median_s > 0


@pytest.mark.parametrize("name", CUDA_ONLY)
def test_cuda_only_techniques_are_refused_on_cpu(name):
    with pytest.raises(UserError, match=rf"^technique {name} cannot run on cpu; it runs on: cuda$"):
        check_stack((name,), "cpu")


def test_cuda_only_refusal_is_one_line_from_the_cli(capsys):
    assert main(["run", "--device", "cpu", "--workload", "gpt-tiny", "--techniques", "act-offload"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "membench: error: technique act-offload cannot run on cpu; it runs on: cuda"


def test_bf16_halves_parameters_and_optimizer_state_exactly(baseline):
    base, half = breakdown(baseline), breakdown(measure("gpt-tiny", ("bf16",)))
    assert half["parameters"] * 2 == base["parameters"]
    # Adam's two moments follow the parameters' dtype; its per-parameter `step` counters stay fp32 scalars.
    steps = adam_step_bytes()
    assert (half["optimizer_state"] - steps) * 2 == base["optimizer_state"] - steps


def test_amp_shrinks_activations_only(baseline):
    base = breakdown(baseline)
    for name in ("amp-bf16", "amp-fp16"):
        amp = breakdown(measure("gpt-tiny", (name,)))
        assert amp["parameters"] == base["parameters"] and amp["optimizer_state"] == base["optimizer_state"]
        assert amp["activations"] < base["activations"], name


def test_amp_fp16_scales_the_loss():
    state_spec = spec(techniques=("amp-fp16",))
    from membench.step import build_state
    from membench.workloads import load_workload

    state = build_state(state_spec.run, load_workload("gpt-tiny"), resolve(state_spec.run).techniques)
    assert float(state.scale_loss(torch.ones(()))) == 2.0 ** 16  # GradScaler's initial scale


def test_sac_sits_between_baseline_and_ckpt(baseline):
    sac, ckpt = measure("gpt-tiny", ("sac",)), measure("gpt-tiny", ("ckpt",))
    assert breakdown(ckpt)["activations"] < breakdown(sac)["activations"] < breakdown(baseline)["activations"]
    peak = lambda r: r.memory.peak_allocated_bytes  # noqa: E731
    assert peak(ckpt) < peak(sac) < peak(baseline)


def test_init_on_device_lowers_the_construction_peak():
    host_then_cast = measure("gpt-tiny", ("bf16",)).memory
    direct = measure("gpt-tiny", ("init-on-device", "bf16")).memory
    # Built at bf16 directly: the construction peak is the bf16 parameters and nothing else.
    assert direct.build_peak_bytes == host_then_cast.breakdown_at_peak["parameters"]
    # Built in fp32 then cast: all fp32 parameters are alive while the first bf16 copies appear.
    assert host_then_cast.build_peak_bytes > 2 * direct.build_peak_bytes
    assert direct.build_host_peak_bytes == direct.build_peak_bytes  # on CPU the device is the host


class ForeachOn(Technique):
    """Test-only: forces the multi-tensor optimizer step that CUDA uses by default (CPU defaults to for-loop)."""

    name = "foreach-on"
    summary = "optimizer with foreach=True"

    def configure(self, state) -> None:
        state.optimizer_options["foreach"] = True


def test_foreach_off_removes_the_step_intermediates(baseline):
    # CPU already defaults to foreach=False: foreach-off changes nothing here, to the byte.
    off = measure("gpt-tiny", ("foreach-off",))
    assert off.memory.peak_allocated_bytes == baseline.memory.peak_allocated_bytes
    with registered(ForeachOn):
        on = _optimizer_phase_peak("foreach-on")
    assert _optimizer_phase_peak("foreach-off") < on


class _OptimizerPhaseMeter(CpuMeter):
    """Resets the peak as the optimizer step begins: its peak is then the step's own."""

    def phase(self, name):
        if name == "optimizer":
            self.reset_peak()
        return super().phase(name)


def _optimizer_phase_peak(technique: str) -> int:
    """Peak live bytes during the optimizer step alone (the step's intermediates come and go there)."""
    session = session_for(spec(techniques=(technique,)).run, meter=_OptimizerPhaseMeter())
    session.build()
    session.warm_up(1)  # the first step creates Adam's state; measure the second
    return session.measure(1)[0].peak_allocated_bytes


def test_expandable_segments_sets_the_allocator_for_its_process_only(monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
    s = spec(techniques=("expandable-segments",), device="cuda").run
    assert environment_for(resolve(s))["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128,expandable_segments:True"
    assert environment_for(resolve(spec().run))["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128"


def test_offload_techniques_run_their_logic_on_cpu(monkeypatch, baseline):
    """Their memory effect needs a GPU; the mechanics (host copies, save_on_cpu) are checked here."""
    with on_cpu_too(monkeypatch, "opt-offload", "act-offload"):
        opt = measure("gpt-tiny", ("opt-offload",))
        act = measure("gpt-tiny", ("act-offload",))
    # On CPU the host copy of the parameters is extra memory: exactly one more set of parameters.
    assert opt.memory.breakdown_at_peak["other"] - breakdown(baseline)["other"] == breakdown(baseline)[
        "parameters"]
    # save_on_cpu packs a saved tensor with .cpu(), which returns a CPU tensor itself: on CPU nothing is copied,
    # so every byte is the baseline's.
    assert act.memory.peak_allocated_bytes == baseline.memory.peak_allocated_bytes
    assert act.memory.breakdown_at_peak == baseline.memory.breakdown_at_peak


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["opt-offload", "act-offload"])
def test_offload_lowers_device_peak_on_gpu(name):
    base = measure("gpt-mini", device="cuda").memory.peak_allocated_bytes
    assert measure("gpt-mini", (name,), device="cuda").memory.peak_allocated_bytes < base


@pytest.mark.parametrize("name, release", [(n, cls.min_torch) for n, cls in REGISTRY.items() if cls.min_torch])
def test_a_technique_an_older_torch_lacks_is_refused_in_one_line(name, release, monkeypatch):
    """sac needs torch 2.5's selective checkpointing, fsdp the FSDP2 of 2.9 and tp the DTensor of 2.11: on torch
    2.4 (which pyproject allows) they are refused before anything runs, from torch's metadata (no import of torch)."""
    major, minor = (int(p) for p in release.split("."))
    monkeypatch.setattr("membench.techniques._installed_torch", lambda: f"{major}.{minor - 1}.1+cu121")
    with pytest.raises(UserError, match=rf"^technique {name} needs torch >= {release} \(.+\); this is torch "
                                        rf"{major}\.{minor - 1}\.1\+cu121$"):
        check_stack((name,), "cuda")
    monkeypatch.setattr("membench.techniques._installed_torch", lambda: release)
    check_stack((name,), "cuda")
    monkeypatch.setattr("membench.techniques._installed_torch", lambda: None)  # unknown: torch says it itself
    check_stack((name,), "cuda")


def test_the_techniques_an_older_torch_lacks():
    assert {n: cls.min_torch for n, cls in REGISTRY.items() if cls.min_torch} == {
        "sac": "2.5", "fsdp": "2.9", "fsdp-offload": "2.9", "tp": "2.11"}
    assert {n: cls.min_torch_predicted for n, cls in REGISTRY.items() if cls.min_torch_predicted} == {
        "fsdp": "2.11", "fsdp-offload": "2.11"}
