"""The CUDA recording pass without a dispatch mode: labels stamped on the allocator's history and read back into
the timeline (trackers/cuda.py). On CPU: a hand-made history in the format of torch's snapshots
(/work/shared/gpu-truth's traces carry the same fields: action, addr, size, frames, user_metadata), and the labels
a model's module hooks stamp, caught where they would reach torch."""

import torch
from torch import nn

from membench import private
from membench.trackers import cuda
from membench.trackers.modules import ModuleScopes
from membench.trackers.storage import NO_MODULE

FRAME = [{"filename": "/home/me/model.py", "line": 5, "name": "forward"},
         {"filename": "/site-packages/torch/nn/modules/linear.py", "line": 125, "name": "forward"}]


def _entry(labels, action, addr, size, phase=None, step=None, module="lin", category=None, frames=()):
    meta = "" if phase is None else cuda.SEP.join((labels.token, phase, str(step), module, category))
    return {"action": action, "addr": addr, "size": size, "frames": list(frames), "user_metadata": meta}


def test_the_history_read_back_is_the_timeline_the_tracker_would_give():
    """Hand-derived: parameters named before recording (1 KiB), 4 KiB of other memory allocated before it, then
    one step's inputs, an activation, a temporary of backward's first node (no label yet on autograd's thread), a
    gradient named by its annotation, a free, the next step, a free of an unnamed block from before recording, and a
    stale label of autograd's thread (last step's) standing for this step's backward."""
    labels = cuda.AllocatorLabels()
    labels.before[1000] = (1024, "parameters", "lin")
    trace = [
        _entry(labels, "alloc", 2000, 1000, "inputs", 3, NO_MODULE, "inputs"),
        _entry(labels, "alloc", 3000, 512, "forward", 3, "lin", "activations", FRAME),
        _entry(labels, "alloc", 4000, 2048),  # autograd's thread before any module hook: backward, no module
        _entry(labels, "alloc", 5000, 1024, "backward", 3, "lin", "temporaries"),
        {"action": "annotate", "addr": 5000, "size": 0,
         "user_metadata": cuda.SEP.join((labels.token, "gradients", "lin"))},
        _entry(labels, "free_requested", 4000, 2048, "backward", 3, "lin", "temporaries"),
        _entry(labels, "free_completed", 4000, 2048, "backward", 3, "lin", "temporaries"),
        _entry(labels, "alloc", 6000, 512, "forward", 4, "lin", "activations"),
        _entry(labels, "free_completed", 7777, 4096, "forward", 4, "lin", "activations"),
        _entry(labels, "alloc", 8000, 600, "backward", 3, "lin", "temporaries"),  # stale: step 3 after step 4
    ]
    t = cuda.replay_history(trace, labels, start_bytes=1024 + 4096, block=lambda size: -(-size // 512) * 512)
    assert t.peak.bytes == 1024 + 4096 + 1024 + 512 + 2048 + 1024 and (t.peak.phase, t.peak.step) == ("backward", 3)
    assert t.peak.breakdown == {"parameters": 1024, "gradients": 1024, "optimizer_state": 0, "activations": 512,
                                "recomputed_activations": 0, "temporaries": 2048, "inputs": 1024, "other": 4096}
    assert t.top_modules()[:2] == [(cuda.BEFORE_MODULE, "other", 4096), (NO_MODULE, "temporaries", 2048)]
    assert [(p, s) for p, s, _ in t.events] == [("inputs", 3), ("forward", 3), ("backward", 3), ("backward", 3),
                                                ("backward", 3), ("backward", 3), ("forward", 4), ("forward", 4),
                                                ("backward", 4)]
    assert t.event_modules[-1] == NO_MODULE and t.current == 1024 + 1024 + 512 + 1024 + 512 + 1024
    assert t.by_category["other"] == 0 and t.by_category["gradients"] == 1024
    first = t.first_step
    assert [(e.kind, e.size, e.category, e.module) for e in first] == [
        ("alloc", 1000, "inputs", NO_MODULE), ("alloc", 512, "activations", "lin"),
        ("alloc", 2048, "temporaries", NO_MODULE), ("alloc", 1024, "temporaries", "lin"),
        ("free", 2048, "temporaries", NO_MODULE)]
    assert first[1].site == "/home/me/model.py:5 (forward)"


def test_a_models_hooks_stamp_phase_step_and_module_and_name_nothing_on_the_host(monkeypatch):
    stamped = []
    monkeypatch.setattr(private, "set_memory_metadata", stamped.append)
    labels = cuda.AllocatorLabels()

    class Owner:
        tracker = labels

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    scopes = ModuleScopes(model, Owner())
    labels.track(model[0].weight, "parameters", "0")  # a host tensor: not device memory, not named
    assert labels.before == {}
    labels.start()
    labels.step = 7
    with labels.in_phase("forward"):
        loss = model(torch.ones(2, 4)).sum()
    with labels.in_phase("backward"):
        loss.backward()
    labels.stop()
    scopes.remove()
    said = [tuple(text.split(cuda.SEP)[1:]) for text in stamped if text]
    assert ("forward", "7", "0", "activations") in said and ("forward", "7", "2", "activations") in said
    assert ("backward", "7", "2", "temporaries") in said and ("backward", "7", "0", "temporaries") in said
    assert said[0] == ("setup", "-1", NO_MODULE, "other") and stamped[-1] == ""
    assert all(text.split(cuda.SEP)[0] == labels.token for text in stamped if text)
