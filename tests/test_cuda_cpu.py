"""The CUDA path's decisions, checked on CPU: what would go wrong on the first GPU run, reached without a GPU by
standing in for the few torch calls that need one (issue 22). What only a GPU can show is in test_cuda.py."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import pickle
import subprocess
import sys
import warnings
import weakref

import pytest
import torch
import torch.distributed as dist
from torch import nn

from membench import api, environment, equivalence, private
from membench.child import worker
from membench.cli import main
from membench.common.errors import UserError
from membench.launch import distributed, fork
from membench.launch.lifecycle import environment_for
from membench.results import Environment, Equivalence, RunRecord, read_result, write_record
from membench.spec import RunSpec
from membench.step import batches, build_state, train_step
from membench.techniques import resolve
from membench.trackers import cuda, timing
from membench.trackers.memory import CpuMeter, CudaMeter
from membench.workloads import load_workload
from tests.helpers import spec


# --- 1. a notebook's runs fork: asking whether CUDA exists must not poison fork ----------------------------------
@pytest.fixture
def poisoning_is_available(monkeypatch):
    """torch.cuda.is_available() as on a GPU machine: cudaGetDeviceCount poisons fork, so a child forked after it
    is 'in bad fork' (torch/csrc/cuda/Module.cpp, poison_fork). device_count() asks NVML and poisons nothing."""
    parent, poisoned = os.getpid(), []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: poisoned.append(True) or True)
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: bool(poisoned) and os.getpid() != parent)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    return poisoned


_POISONED_FORK = """
import os, torch
from membench.launch import fork
parent, poisoned = os.getpid(), []
torch.cuda.is_available = lambda: poisoned.append(True) or True  # as poisoning_is_available does
torch.cuda._is_in_bad_fork = lambda: bool(poisoned) and os.getpid() != parent
torch.cuda.device_count = lambda: 1
print(fork.why_not_fork("cuda"))
torch.cuda.is_available()  # what a notebook typically did before calling membench
print(fork.why_not_fork("cuda"))
print(fork.why_not_fork("cpu"))  # a CPU run does not touch CUDA in the child
"""


def test_a_cuda_run_is_not_forked_after_is_available_poisoned_fork():
    # A fresh interpreter: once a backward on fake CUDA tensors has run in this process (other tests do), autograd's
    # device threads forbid backward in any forked child, and the probe rightly answers that before CUDA's state.
    proc = subprocess.run([sys.executable, "-c", _POISONED_FORK], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    before, after, cpu = proc.stdout.splitlines()
    assert before == "None" and cpu == "None"
    assert "torch.cuda.is_available()" in after


def test_resolving_the_device_does_not_poison_fork(poisoning_is_available):
    assert api.resolve_device("auto") == "cuda" and api.resolve_device("cuda") == "cuda"
    assert not poisoning_is_available  # is_available() was never called
    assert fork.why_not_fork("cuda") is None


def test_the_default_out_dir_does_not_start_cuda_in_this_process(monkeypatch):
    def started(*args):
        raise AssertionError("CUDA started in the caller's process")

    monkeypatch.setattr(torch.cuda, "get_device_name", started)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    # The child process asks instead; on this CPU machine it has no GPU to name: one clear line.
    with pytest.raises(UserError, match="could not read the CUDA device's name in a child process"):
        api.default_out_dir(RunSpec("tests.workloads:mlp", 4, device="cuda"))
    assert api.default_out_dir(RunSpec("tests.workloads:mlp", 4)).parts[0] == "results"


def test_a_worker_that_cannot_describe_its_device_still_writes_a_record(tmp_path, monkeypatch):
    def describe(device):
        raise RuntimeError("Cannot re-initialize CUDA in forked subprocess.")

    monkeypatch.setattr(environment, "describe", describe)
    record = worker.run(spec("tests.workloads:mlp"), tmp_path / "baseline.json")
    assert record.status == "error" and "Cannot re-initialize CUDA" in record.error
    assert read_result(tmp_path / "baseline.json").status == "error"


# --- 2. FSDP shards on the run's device; one rank per GPU ---------------------------------------------------------
@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_fsdp_on_cpu_shards_on_a_cpu_mesh_on_a_gpu_machine(one_rank_group, monkeypatch):
    # fully_shard's default mesh takes the machine's accelerator (torch._C._get_accelerator): on a GPU machine,
    # cuda, whatever --device says. A CUDA mesh cannot be made here: the default would fail.
    monkeypatch.setattr(torch._C, "_get_accelerator", lambda: torch.device("cuda"))
    run = RunSpec("gpt-tiny", 2, ("fsdp",))
    workload = load_workload("gpt-tiny")
    state = build_state(run, workload, resolve(run).techniques)
    assert {p.device_mesh.device_type for p in state.model.parameters()} == {"cpu"}
    assert train_step(state, next(batches(workload, run))) > 0


def test_more_ranks_than_gpus_is_refused_before_anything_runs(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(UserError, match=r"--nproc-per-node 2 .* has 1 CUDA GPU; valid: 1 to 1"):
        api.plan("gpt-tiny", "fsdp", 2, device="cuda", nproc_per_node=2)
    assert main(["run", "--device", "cuda", "--workload", "gpt-tiny", "--techniques", "fsdp",
                 "--nproc-per-node", "2"]) == 2
    # A prediction for CUDA computes on this machine: its GPUs do not matter.
    assert api.plan("gpt-tiny", "fsdp", 2, device="cpu", target_device="cuda", nproc_per_node=2)


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


# --- 4. the CUDA timeline counts device memory only ----------------------------------------------------------------
def test_the_cuda_recording_pass_does_not_count_host_tensors(tmp_path, monkeypatch):
    @contextlib.contextmanager
    def no_history(path, max_entries=cuda.MAX_ENTRIES, labels=None):
        info = {}
        yield info
        if labels is not None:  # the labelled history, read back: nothing was recorded
            info["timeline"] = cuda.replay_history([], labels, 0, lambda size: size)

    monkeypatch.setattr(cuda, "recorded_history", no_history)
    meter = CudaMeter()
    model = nn.Linear(64, 64)  # on the host, as opt-offload's and fsdp-offload's copies are
    meter.attach_model(model)
    with meter.recording(tmp_path / "run") as recording:
        batch = torch.ones(32, 64)
        model(batch).sum().backward()
    assert recording.tracker.peak.bytes == 0 and recording.tracker.current == 0


# --- 5. one rank's failure: every rank's record, no hang ---------------------------------------------------------
def _record(status: str, error: str | None = None, peak: int | None = None) -> RunRecord:
    from membench.results import Memory

    memory = Memory(device="cpu", method="storage-tracker", peak_allocated_bytes=peak,
                    peak_phase="forward", peak_step=1) if peak else None
    return RunRecord(name="fsdp", status=status, spec=spec("gpt-tiny", ("fsdp",)), env=Environment(device="cpu"),
                     error=error, memory=memory)


def test_the_runs_record_is_made_from_its_ranks_records(tmp_path):
    out = tmp_path / "fsdp.json"
    write_record(out, _record("error", "DistBackendError during measure: Connection closed by peer"))
    write_record(distributed.rank_record_path(out, 1), _record("oom", "out of memory during measure: planted",
                                                               peak=1000))
    merged = distributed.merge_ranks(out, since=0)
    assert merged.status == "oom"
    assert merged.error == ("rank 1: out of memory during measure: planted; "
                            "rank 0: DistBackendError during measure: Connection closed by peer")
    assert merged.memory.peak_allocated_bytes == 1000
    # Rank 0 stopped by torchrun (no record of its own): the failed rank's record is the run's.
    out.unlink()
    merged = distributed.merge_ranks(out, since=0)
    assert merged.status == "oom" and "rank 0 left no record" in merged.error
    # Every rank ok: rank 0's record stands as it is.
    write_record(out, _record("ok"))
    write_record(distributed.rank_record_path(out, 1), _record("ok"))
    assert distributed.merge_ranks(out, since=0) is None
    assert not list(tmp_path.glob("*.rank*"))  # rank records stay out of the results folder's top level


def test_agree_in_one_process_raises_the_error_itself():
    distributed.agree(None, "the reference pass")
    with pytest.raises(torch.OutOfMemoryError):
        distributed.agree(torch.OutOfMemoryError("planted"), "the reference pass")


def test_an_oom_on_one_rank_ends_the_run_as_oom_with_every_ranks_record(tmp_path):
    """torchrun, 2 ranks, gloo: rank 1 runs out of memory inside a step while rank 0 waits in that step's
    collectives. Before: rank 1 exited cleanly without a record and rank 0 waited (up to the group's timeout)."""
    from membench.launch.process import launch
    from membench.spec import LaunchSpec

    job = dataclasses.replace(spec("tests.workloads:oom_on_rank1", ("fsdp",), batch_size=8, nproc_per_node=2),
                              launch=LaunchSpec(timeout_s=300))  # a hang would end as status "timeout"
    record = launch(job, tmp_path)  # the fsdp run alone, through torchrun, as the sweep launches it
    assert record.status == "oom", (record.status, record.error, record.log_tail)
    assert record.error.startswith("rank 1: out of memory during measure: planted")
    assert record.memory is not None and record.memory.peak_allocated_bytes > 0
    assert read_result(tmp_path / "fsdp.json").status == "oom"
    assert read_result(tmp_path / "runs" / "fsdp.rank1.json").status == "oom"


# --- 6. history with Python stacks only; 7. the trace summary in blocks ------------------------------------------
SNAPSHOT = {"segments": [], "device_traces": [[
    {"action": "alloc", "addr": 1, "size": 1000, "frames": []},
    {"action": "alloc", "addr": 2, "size": 100, "frames": []},
    {"action": "free_requested", "addr": 1, "size": 1000},
    {"action": "free_completed", "addr": 1, "size": 1000},
    {"action": "alloc", "addr": 3, "size": 1536, "frames": []}]]}


def test_the_trace_summary_counts_blocks_as_memory_allocated_does():
    # Requests round up to 512-byte blocks: 1000 -> 1024, 100 -> 512; 1536 is already whole blocks.
    summary = cuda.trace_summary(SNAPSHOT, 0, 4096, 1000)
    assert summary["trace_peak_allocated_bytes"] == 4096 + 512 + 1536
    assert [(s.bytes, s.blocks) for s in cuda.top_sites(SNAPSHOT)] == [(512 + 1536, 2)]


def test_history_is_recorded_with_python_stacks_only(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", lambda *a, **k: calls.append(k))
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda: SNAPSHOT)
    for name, value in (("synchronize", None), ("memory_allocated", 4096), ("current_device", 0)):
        monkeypatch.setattr(torch.cuda, name, lambda value=value: value)
    with cuda.recorded_history(tmp_path / "r.snapshot.pickle", max_entries=1000) as info:
        pass
    assert calls[0] == {"max_entries": 1000, "stacks": "python"} and calls[1] == {"enabled": None}
    assert info["trace_peak_allocated_bytes"] == 4096 + 512 + 1536
    assert pickle.loads((tmp_path / "r.snapshot.pickle").read_bytes()) == SNAPSHOT


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

