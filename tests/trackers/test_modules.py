"""Where the peak comes from: every tracked byte belongs to a module (the one that owns it, or the one that was
running, in forward or in its backward), the sums at the peak are exact, and the totals do not change."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from membench.results import RunRecord
from membench.trackers import cuda
from membench.trackers.modules import ModuleScopes
from membench.trackers.storage import NO_MODULE, StorageTracker
from tests.helpers import measure


def by_module(top) -> dict[tuple[str, str], int]:
    return {(m.module, m.category): m.bytes for m in top}


def test_top_modules_name_modules_and_sum_to_the_peak():
    memory = measure("gpt-tiny", batch_size=4).memory
    top = memory.top_modules
    assert top and top == sorted(top, key=lambda m: -m.bytes)
    names = {m.module for m in top}
    assert any(n.startswith("blocks.") for n in names), names
    assert all(m.category in memory.breakdown_at_peak for m in top)
    for category, size in memory.breakdown_at_peak.items():  # no module holds more of a category than the peak
        assert sum(m.bytes for m in top if m.category == category) <= size


class Net(nn.Module):
    """Two layers of very different sizes, so the attribution is obvious: `big` makes 4x the activations."""

    def __init__(self):
        super().__init__()
        self.big = nn.Linear(16, 1024)
        self.small = nn.Linear(1024, 4)

    def forward(self, x):
        return self.small(torch.relu(self.big(x)))


class Holder:
    tracker = None


def test_forward_allocations_belong_to_the_innermost_module_and_backward_to_its_backward():
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(64, 16)
    owner = Holder()
    scopes = ModuleScopes(model, owner)
    tracker = owner.tracker = StorageTracker(timeline=True)
    with tracker:
        tracker.track_all(model.parameters(), "parameters", "weights")  # else a view of a weight counts it anew
        with tracker.in_phase("forward"):
            out = model(x)
            # After forward: the ReLU's output (in Net's own forward, saved for backward) is Net's; the last
            # layer's output is small's. big's output died with the ReLU (which saves its own output).
            assert tracker.by_module[("Net", "activations")] == 64 * 1024 * 4
            assert tracker.by_module[("small", "activations")] == 64 * 4 * 4
            loss = out.square().sum()
        with tracker.in_phase("backward"):
            loss.backward()
    scopes.remove()
    held = tracker.peak_modules()
    assert sum(held.values()) == tracker.peak.bytes  # every byte at the peak is attributed
    # Backward allocations are named after the module whose backward ran, not "(no module)".
    in_backward = {m for m, (phase, _, _) in zip(tracker.event_modules, tracker.events) if phase == "backward"}
    assert {"big", "small"} <= in_backward, in_backward
    assert tracker.module == NO_MODULE  # a phase ends outside any module


def test_parameters_gradients_and_optimizer_state_belong_to_their_owner():
    memory = measure("vit-tiny", batch_size=1).memory  # parameter-bound: peaks in the optimizer step
    assert memory.peak_phase == "optimizer"
    owned = [m for m in memory.top_modules if m.category in ("parameters", "gradients", "optimizer_state")]
    assert owned and all(m.module != NO_MODULE for m in owned), memory.top_modules
    assert {"parameters", "optimizer_state"} <= {m.category for m in owned}


@pytest.mark.slow
def test_checkpointed_recompute_is_attributed_to_the_block_children():
    memory = measure("gpt-tiny", ("ckpt",), batch_size=4).memory
    assert memory.peak_allocated_bytes == measure("gpt-tiny", ("ckpt",), batch_size=4).memory.peak_allocated_bytes
    assert not any(m.module == NO_MODULE and m.category == "temporaries" and m.bytes > memory.peak_allocated_bytes / 2
                   for m in memory.top_modules)


def test_top_modules_round_trip_in_the_result_file():
    record = measure("gpt-tiny", batch_size=2)
    again = RunRecord.from_json(record.to_json())
    assert again.memory.top_modules == record.memory.top_modules
    assert all(isinstance(m.bytes, int) for m in again.memory.top_modules)


def test_cuda_top_sites_at_the_trace_peak_from_a_hand_built_snapshot():
    def frames(fn, line):
        return [{"filename": "/site-packages/torch/nn/modules/linear.py", "line": 125, "name": "forward"},
                {"filename": "/home/me/train.py", "line": line, "name": fn},
                {"filename": "??", "line": 0, "name": "c10::alloc"}]

    trace = [
        {"action": "alloc", "addr": 1, "size": 1000, "frames": frames("embed", 10)},
        {"action": "alloc", "addr": 2, "size": 3000, "frames": frames("attention", 20)},
        {"action": "alloc", "addr": 3, "size": 2000, "frames": frames("attention", 20)},
        {"action": "free_requested", "addr": 2, "size": 3000},
        {"action": "free_completed", "addr": 2, "size": 3000},  # the peak (6144 in blocks) was just before this
        {"action": "alloc", "addr": 4, "size": 500, "frames": frames("mlp", 30)},
    ]
    sites = cuda.top_sites({"segments": [], "device_traces": [trace]})
    # In blocks, as memory_allocated counts them: 3000 -> 3072 and 2000 -> 2048 bytes, 1000 -> 1024.
    assert [(s.site, s.bytes, s.blocks) for s in sites] == [
        ("/home/me/train.py:20 (attention)", 5120, 2), ("/home/me/train.py:10 (embed)", 1024, 1)]
    assert cuda.allocation_site([]) == "(no Python frame)"
    assert cuda.allocation_site(frames("x", 1)[:1]).startswith("/site-packages/torch/nn/modules/linear.py:125")


def test_parameters_are_registered_in_the_order_to_device_copies_them():
    # nn.Module._apply (what .to(device) runs) visits each child first, depth first, then the module's own
    # parameters, then its buffers; a tensor two modules share, once. A CUDA run that builds on the host and moves
    # the model allocates its parameters in that order (an H200's vit_l_16 trace: conv_proj's weight and bias, the
    # first block's LayerNorm, out_proj, then the attention's own in_proj_weight...), which a prediction follows.
    from membench.trackers.modules import parameter_owners

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.in_proj = nn.Parameter(torch.zeros(3))
            self.out = nn.Linear(2, 2)
            self.register_buffer("mask", torch.zeros(1))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.token = nn.Parameter(torch.zeros(4))
            self.attn = Attention()
            self.head = nn.Linear(2, 5)
            self.head.weight = self.attn.out.weight  # tied: once, where _apply meets it first

    model = Model()
    order = list(parameter_owners(model).items())
    expected = [(model.attn.out.weight, "attn.out"), (model.attn.out.bias, "attn.out"), (model.attn.in_proj, "attn"),
                (model.attn.mask, "attn"), (model.head.bias, "head"), (model.token, "Model")]
    assert [(id(t), owner) for t, owner in order] == [(id(t), owner) for t, owner in expected]
