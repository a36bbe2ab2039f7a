"""The CUDA recording pass, checked on CPU: device memory only, history with Python stacks only, the
trace summary in blocks."""

from __future__ import annotations

import contextlib
import pickle

import torch
from torch import nn

from membench.trackers import cuda
from membench.trackers.memory import CudaMeter


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
    assert calls[0] == {"max_entries": 1000, "stacks": "python", "context": "alloc"} and calls[1] == {"enabled": None}
    assert info["trace_peak_allocated_bytes"] == 4096 + 512 + 1536
    assert pickle.loads((tmp_path / "r.snapshot.pickle").read_bytes()) == SNAPSHOT


def test_history_takes_no_stack_at_a_free(tmp_path, monkeypatch):
    """ckpt's recording pass on hf:gpt2 (torch 2.11, an H200) failed in backward with "SystemError: <built-in method
    dropout ...> returned NULL without setting an exception": checkpoint's early stop raises from a pack hook after
    CUDA's dropout allocated its output, and the allocator, asked for a stack at every free (context "all", torch's
    default), took one at that output's free inside C++'s unwinding and lost the exception. Stacks at allocations
    only ("alloc") ran; the same block on a GPU is tests/trackers/test_cuda.py's."""
    contexts = []
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history",
                        lambda *a, **k: contexts.append(k.get("context", "all")) if k.get("enabled", 1) else None)
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda: SNAPSHOT)
    for name, value in (("synchronize", None), ("memory_allocated", 4096), ("current_device", 0)):
        monkeypatch.setattr(torch.cuda, name, lambda value=value: value)
    with cuda.recorded_history(tmp_path / "r.snapshot.pickle"):
        pass
    assert contexts == ["alloc"]
