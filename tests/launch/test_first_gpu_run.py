"""What would break the first GPU run (issue 30), reproduced on CPU with stand-ins for the few CUDA calls involved:
an in-process run after CUDA started, the caller's random state and memory fraction, a torchrun rank's own GPU,
a rank that left during the equivalence check, the peak FLOP/s of an H100's form factors, amp-fp16 with opt-offload
and clipping."""

import dataclasses
import os
import types
import warnings

import pytest
import torch

from membench import environment
from membench.common.errors import UserError
from membench.launch import distributed, fork
from membench.launch.lifecycle import environment_for
from membench.results import Environment, Equivalence, RunRecord, write_record
from membench.step import batches, build_state, train_step
from membench.techniques import resolve
from membench.techniques.amp import AmpFp16
from membench.techniques.opt_offload import OptimizerOffload
from membench.trackers import timing
from membench.trackers.memory import CudaMeter
from membench.workloads import load_workload
from tests.helpers import spec


def _in_process(job, tmp_path, work):
    stack = resolve(job.run)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fork.InProcessWarning)
        fork.InProcess("a test", work).start(job, stack, tmp_path / "r.json", tmp_path / "r.log",
                                             environment_for(stack))


def test_an_in_process_run_is_not_refused_because_cuda_started(tmp_path, monkeypatch):
    """A notebook that touched the GPU can still run a sweep in its own process: only settings that act at CUDA's
    start (the allocator's) need it not started, and PYTHONUNBUFFERED (a new process's) is not one."""
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(fork, "_callers_random_state", lambda: torch.random.fork_rng(devices=[]))
    ran = []
    _in_process(spec("gpt-tiny"), tmp_path, lambda job, out: ran.append(job.name))
    assert ran == ["baseline"] and "PYTHONUNBUFFERED" not in os.environ
    with pytest.raises(UserError, match="PYTORCH_CUDA_ALLOC_CONF"):  # expandable segments: an allocator setting
        _in_process(spec("gpt-tiny", ("expandable-segments",), device="cuda"), tmp_path,
                    lambda job, out: ran.append(job.name))
    assert ran == ["baseline"]


def test_an_in_process_run_leaves_the_callers_random_stream_as_it_was(tmp_path):
    def draws_after_seeding() -> torch.Tensor:
        torch.manual_seed(7)
        torch.rand(2)
        return torch.rand(3)

    expected = draws_after_seeding()
    torch.manual_seed(7)
    torch.rand(2)
    _in_process(spec("gpt-tiny"), tmp_path, lambda job, out: (torch.manual_seed(0), torch.rand(5)))
    assert torch.equal(torch.rand(3), expected)


def test_a_budget_restores_the_callers_own_memory_fraction_on_its_gpu(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: types.SimpleNamespace(total_memory=8 * 2**30) if device == 1 else None)
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda device=None: 0.7)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                        lambda fraction, device=None: calls.append((fraction, device)))
    meter = CudaMeter(budget=2**30)
    meter.close()
    assert calls == [(1 / 8, 1), (0.7, 1)]


def test_a_torchrun_rank_describes_its_own_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name",
                        lambda device=None: f"GPU {torch.cuda.current_device() if device is None else device}")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(environment, "_driver_version", lambda: None)
    assert environment.describe("cuda").device_name == "GPU 1"


def _record(verdict: str, detail: str = "") -> RunRecord:
    return RunRecord(name="fsdp", status="ok", spec=spec("gpt-tiny", ("fsdp",)), env=Environment(device="cpu"),
                     equivalence=Equivalence(verdict=verdict, detail=detail))


def test_a_rank_that_left_in_the_equivalence_check_makes_the_runs_verdict(tmp_path):
    out = tmp_path / "fsdp.json"
    write_record(out, _record("equivalent"))
    write_record(distributed.rank_record_path(out, 1), _record("failed", "the equivalence check ran out of memory"))
    merged = distributed.merge_ranks(out, since=0)
    assert merged.status == "ok" and merged.error is None  # the measurements stand
    assert merged.equivalence.verdict == "failed" and merged.equivalence.detail.startswith("rank 1: the equiv")
    out.unlink()  # rank 0 stopped by torchrun while it waited in the check's collective
    merged = distributed.merge_ranks(out, since=0)
    assert merged.status == "ok" and merged.error is None
    assert merged.equivalence.verdict == "failed" and "rank 0 left no record" in merged.equivalence.detail


@pytest.mark.parametrize("name,bf16", [("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12),
                                       ("NVIDIA H100 NVL", 835e12), ("NVIDIA H200", 989e12),
                                       ("NVIDIA H200 NVL", 835e12), ("NVIDIA A100-SXM4-80GB", 312e12),
                                       ("NVIDIA L4", 121e12), ("NVIDIA L40S", 362.05e12),
                                       ("NVIDIA GeForce RTX 3090", None), ("NVIDIA GH200 480GB", None)])
def test_peak_flops_tell_an_h100s_form_factors_apart(name, bf16):
    assert timing.peak_flops(name, "bf16") == bf16


def test_amp_fp16_with_opt_offload_clips_the_gradients_the_host_step_uses():
    """The scaler must unscale the gradients its step checks (the host copies), and clipping must clip those: on
    CPU (the host is the device) the stack trains as amp-fp16 alone does, up to rounding."""
    run = spec("gpt-tiny", batch_size=2, clip_grad_norm=0.01).run
    workload = load_workload("gpt-tiny")

    def trained(*techniques) -> list[torch.Tensor]:
        state = build_state(run, workload, sorted((t(run) for t in techniques), key=lambda t: t.order))
        data = batches(workload, run)
        losses = [train_step(state, next(data)) for _ in range(2)]
        assert all(torch.isfinite(torch.tensor(losses)))
        return [p.detach().clone() for p in state.model.parameters()]

    offloaded, alone = trained(AmpFp16, OptimizerOffload), trained(AmpFp16)
    for a, b in zip(offloaded, alone):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_clipping_reads_the_gradients_the_optimizers_step_on():
    """A plain run clips exactly its model's gradients: the optimizers' parameters are the model's, in order."""
    run = dataclasses.replace(spec("gpt-tiny", batch_size=2).run, clip_grad_norm=1.0)
    state = build_state(run, load_workload("gpt-tiny"), ())
    assert [id(p) for o in state.optimizers for g in o.param_groups for p in g["params"]] == \
        [id(p) for p in state.model.parameters() if p.requires_grad]
