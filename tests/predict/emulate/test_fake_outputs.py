"""A prediction makes again the outputs of ops it has seen with the same inputs' layouts (predict/emulate/fake.py,
_Outputs) instead of asking FakeTensorMode each time: every allocation, free and byte must be what FakeTensorMode
alone gives."""

from __future__ import annotations

import dataclasses

import pytest

from membench import private
from membench.api import plan
from membench.predict.run import predict_traced
from tests.predict.test_steady import _canonical

CASES = [("gpt-tiny", "accum", {}), ("gpt-tiny", "ckpt", {}), ("gpt-tiny", "amp-bf16", {}),
         ("gpt-tiny", "opt-in-bwd", {"optimizer": "adafactor"}), ("vit-tiny", "sac", {}),
         ("tests.workloads:resnet18", "amp-bf16", {}), ("gpt-tiny", "baseline", {"inference": True}),
         ("gpt-tiny", "fsdp", {"nproc_per_node": 2})]


@pytest.mark.parametrize("workload, technique, options", CASES, ids=[f"{w}-{t}-{o}" for w, t, o in CASES])
def test_outputs_made_again_are_fake_tensor_modes(workload, technique, options, monkeypatch):
    job = next(j for j in plan(workload=workload, techniques=technique, batch_size=4, target_device="cuda",
                               in_process=True, **options) if j.name == technique)
    fast = predict_traced(job)
    monkeypatch.setattr(private, "cacheable_op", lambda op: False)  # every op through FakeTensorMode
    slow = predict_traced(job)
    assert dataclasses.asdict(fast.memory) == dataclasses.asdict(slow.memory)
    assert _canonical(fast.events) == _canonical(slow.events)


def test_only_ops_whose_outputs_follow_from_their_inputs_layouts_are_kept():
    aten = private.torch.ops.aten
    assert private.cacheable_op(aten.mm.default) and private.cacheable_op(aten.view.default)
    assert not private.cacheable_op(aten.add_.Tensor)  # writes into an argument
    assert not private.cacheable_op(aten.nonzero.default)  # its size depends on the values
    assert not private.cacheable_op(aten.randn.default)  # random
