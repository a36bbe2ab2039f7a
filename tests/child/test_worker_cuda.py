"""The worker's CUDA decisions, checked on CPU by standing in for the torch calls that need a GPU: the
equivalence check starts from freed memory, nothing process-wide outlives an in-process run, nothing but the step
is timed, the check on CUDA is deterministic, both allocator variables reach torch."""

from __future__ import annotations

import gc
import warnings
import weakref

import torch
from torch import nn

from membench import equivalence, private
from membench.child import worker
from membench.launch.lifecycle import environment_for
from membench.results import Equivalence
from membench.spec import RunSpec
from membench.techniques import resolve
from membench.trackers import cuda, timing
from membench.trackers.memory import CpuMeter, CudaMeter
from tests.helpers import spec


# --- 3. the equivalence check starts from freed memory; its failure is its own ------------------------------------
def test_the_meter_lets_go_of_the_model_and_optimizers_at_detach():
    meter = CpuMeter()
    model = nn.Linear(4, 4)
    opt = torch.optim.Adam(model.parameters())
    meter.attach_model(model)
    meter.attach_optimizers([opt])
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    refs = [weakref.ref(model), weakref.ref(opt), weakref.ref(model.weight)]
    meter.detach()
    del model, opt
    gc.collect()
    assert [r() for r in refs] == [None, None, None]


def test_the_check_runs_after_the_measured_model_and_optimizer_are_freed(tmp_path, monkeypatch):
    from membench.measure import Session

    held = {}
    build = Session.build

    def keep_refs(self):
        out = build(self)
        held["refs"] = [weakref.ref(self.state.model)] + [weakref.ref(o) for o in self.state.optimizers]
        return out

    def check(run, stack, workload, steps):
        held["alive"] = [r() is not None for r in held["refs"]]
        return Equivalence(verdict="bitwise")

    monkeypatch.setattr(Session, "build", keep_refs)
    monkeypatch.setattr(equivalence, "check", check)
    record = worker.run(spec("tests.workloads:mlp", ("accum",), check=True), tmp_path / "accum.json")
    assert record.status == "ok" and record.equivalence.verdict == "bitwise"
    assert held["alive"] == [False] * len(held["refs"])


def test_an_oom_in_the_check_is_the_checks_verdict_not_the_runs_status(tmp_path, monkeypatch):
    def check(*args):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(equivalence, "check", check)
    record = worker.run(spec("tests.workloads:mlp", ("accum",), check=True), tmp_path / "accum.json")
    assert record.status == "ok" and record.memory.peak_allocated_bytes > 0 and record.timing.median_s > 0
    assert record.equivalence.verdict == "failed"
    assert "ran out of memory" in record.equivalence.detail and "Tried to allocate" in record.equivalence.detail


# --- 9. nothing process-wide outlives a run in the caller's process ----------------------------------------------
def test_the_oom_observer_is_attached_once_and_writes_only_for_the_current_run(tmp_path, monkeypatch):
    attached, saved = [], []
    monkeypatch.setattr(private, "attach_out_of_memory_observer", attached.append)
    monkeypatch.setattr(cuda, "save_snapshot", saved.append)
    monkeypatch.setattr(cuda, "_observer_attached", [False])
    cuda.snapshot_on_oom(tmp_path / "first.oom.pickle")
    cuda.stop_snapshot_on_oom()
    cuda.snapshot_on_oom(tmp_path / "second.oom.pickle")
    assert len(attached) == 1
    attached[0](0, 1, 2, 3)
    cuda.stop_snapshot_on_oom()
    attached[0](0, 1, 2, 3)  # an OOM after the run ended writes nothing anywhere
    assert saved == [tmp_path / "second.oom.pickle"]


def test_the_memory_fraction_is_undone_when_the_run_ends(monkeypatch):
    fractions = []

    class Properties:
        total_memory = 80 * 2**30

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Properties())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda device=None: 1.0)  # the caller's
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                        lambda fraction, device=None: fractions.append(fraction))
    meter = CudaMeter(budget=20 * 2**30)
    meter.close()
    assert fractions == [0.25, 1.0]
    CudaMeter().close()
    assert fractions == [0.25, 1.0]  # no budget: nothing set, nothing to undo


def test_the_worker_closes_its_meter_whatever_happens(tmp_path, monkeypatch):
    closed = []
    monkeypatch.setattr(CpuMeter, "close", lambda self: closed.append(True))
    worker.run(spec("tests.workloads:mlp"), tmp_path / "a.json")
    assert worker.run(spec("tests.workloads:broken"), tmp_path / "b.json").status == "error"
    assert closed == [True, True]


# --- 10. deterministic check on CUDA; nothing but the step timed; both allocator variables ------------------------
def test_the_check_on_cuda_runs_deterministic_and_names_the_kernels_that_were_not():
    before = torch.are_deterministic_algorithms_enabled()
    with equivalence.deterministic("cuda") as flagged:
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        # torch's own alert text (aten/src/ATen/Context.cpp, alertNotDeterministic), as warn_only issues it:
        warnings.warn("scatter_add_cuda_kernel does not have a deterministic implementation, but you set "
                      "'torch.use_deterministic_algorithms(True, warn_only=True)'.", stacklevel=1)
    assert flagged == ["scatter_add_cuda_kernel"]
    assert torch.are_deterministic_algorithms_enabled() == before and not torch.backends.cudnn.deterministic
    with equivalence.deterministic("cpu") as flagged:
        assert torch.are_deterministic_algorithms_enabled() == before
    assert flagged == []


def test_batches_are_made_before_the_clock_starts(monkeypatch):
    events = []
    clock = iter(range(1000))
    monkeypatch.setattr(timing.time, "perf_counter", lambda: events.append("clock") or next(clock))
    times, losses = timing.time_steps(lambda batch: events.append(f"step {batch}") or 0.0, range(2),
                                      prepare=lambda i: events.append(f"batch {i}") or i)
    assert events == ["batch 0", "clock", "step 0", "clock", "batch 1", "clock", "step 1", "clock"]
    assert len(times) == 2


def test_the_worker_times_steps_on_batches_made_outside_them(tmp_path, monkeypatch):
    seen = []
    time_steps = timing.time_steps
    monkeypatch.setattr(timing, "time_steps", lambda *a, **k: seen.append(k.get("prepare")) or time_steps(*a, **k))
    assert worker.run(spec("tests.workloads:mlp", steps=2), tmp_path / "a.json").status == "ok"
    assert seen and seen[0] is not None


def test_expandable_segments_reach_torch_under_both_allocator_variables(monkeypatch):
    stack = resolve(RunSpec("gpt-tiny", 2, ("expandable-segments",), device="cuda"))
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:64")
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    env = environment_for(stack)
    # torch >= 2.9 reads PYTORCH_ALLOC_CONF first in c10/core: the setting must be there too, not only under the
    # older name, and the user's own setting stays under both.
    both = "max_split_size_mb:64,expandable_segments:True"
    assert env["PYTORCH_ALLOC_CONF"] == env["PYTORCH_CUDA_ALLOC_CONF"] == both
    monkeypatch.delenv("PYTORCH_ALLOC_CONF")
    env = environment_for(stack)
    assert env["PYTORCH_ALLOC_CONF"] == env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
