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

LLAMA = ("hf:llama,hidden_size=64,intermediate_size=128,num_attention_heads=4,num_key_value_heads=2,vocab_size=128,"
         "num_hidden_layers=2,head=causal-lm")
CASES = [("gpt-tiny", "accum", {}), ("gpt-tiny", "ckpt", {}), ("gpt-tiny", "amp-bf16", {}),
         ("gpt-tiny", "opt-in-bwd", {"optimizer": "adafactor"}), ("vit-tiny", "sac", {}),
         ("tests.workloads:resnet18", "amp-bf16", {}), ("gpt-tiny", "baseline", {"inference": True}),
         ("gpt-tiny", "fsdp", {"nproc_per_node": 2}),
         # a boolean attention mask: where() with a real host scalar (predict/emulate/sdpa.py), efficient and cuDNN
         (LLAMA, "baseline", {"seq_len": 32}), (LLAMA, "amp-bf16", {"seq_len": 32})]


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


def test_a_fake_tensor_made_from_a_known_modes_attributes_is_the_one_fake_tensor_makes():
    """new_fake_tensor makes the first tensor of a mode with FakeTensor and later ones from its attributes: each must
    be what FakeTensor makes (attributes and their order, dispatch keys, device, layout, the storage it views)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    from membench.predict.emulate import fake

    with fake.fake_tensors():
        mode = private.active_fake_mode()
        cpu = torch.device("cpu")
        base = private.new_fake_tensor(mode, (4, 6), (6, 1), torch.bfloat16, cpu)  # the first: FakeTensor's own
        for storage, offset in ((None, 0), (base.untyped_storage(), 2)):
            made = private.new_fake_tensor(mode, (3, 2), (1, 3), torch.bfloat16, cpu, storage, offset)
            with private.no_dispatch_modes():
                empty = torch.empty_strided((3, 2), (1, 3), dtype=torch.bfloat16, device="meta")
                if storage is not None:
                    empty.set_(storage, offset, (3, 2), (1, 3))
            expected = FakeTensor(mode, empty, cpu)
            assert type(made) is FakeTensor and made.fake_mode is mode
            assert list(made.__dict__.items()) == list(expected.__dict__.items())
            assert torch._C._dispatch_keys(made) == torch._C._dispatch_keys(expected)
            assert (made.device, made.shape, made.stride(), made.storage_offset(), made.dtype, made.requires_grad) == (
                expected.device, expected.shape, expected.stride(), expected.storage_offset(), expected.dtype,
                expected.requires_grad)
            assert (made.untyped_storage() is base.untyped_storage()) == (storage is not None)
    with fake.fake_tensors():  # another mode: its own attributes, not the last one's
        other = private.active_fake_mode()
        assert private.new_fake_tensor(other, (2,), (1,), torch.float32, cpu).fake_mode is other
        assert private.new_fake_tensor(other, (2,), (1,), torch.float32, cpu).fake_mode is other


def test_an_unsafe_view_made_again_shares_its_inputs_storage_with_no_view_base():
    """A matmul of a 3-d input ends in _unsafe_view: kept, and made again on the input's storage, not as a view (no
    _base), as FakeTensorMode makes it below autograd."""
    import torch

    from membench.predict.emulate import fake

    seen = []

    class Outputs(private.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten._unsafe_view.default:
                seen.append((out._base is None, out.untyped_storage() is args[0].untyped_storage(), out.shape,
                             out.stride(), out.storage_offset()))
            return out

    with fake.fake_tensors():
        a, w = torch.empty(2, 3, 4, requires_grad=True), torch.empty(5, 4, requires_grad=True)
        with Outputs():
            for _ in range(2):  # FakeTensorMode's, then the kept one's
                torch.matmul(a, w.t()).sum().backward()
    assert len(seen) == 2 and seen[0] == seen[1] == (True, True, torch.Size([2, 3, 5]), (15, 5, 1), 0)


def test_a_foreach_op_over_dtensors_called_in_parts_makes_the_trace_one_call_makes(monkeypatch):
    """FSDP2's Adam takes the square root of its second moments (DTensors) in one _foreach_sqrt; a prediction calls it
    on parts of the list (fake.SPLIT_FOREACH_AT tensors each): the memory and every allocation must be one call's."""
    from membench.predict.emulate import fake

    job = next(j for j in plan(workload="gpt-tiny", techniques="fsdp", batch_size=4, target_device="cuda",
                               in_process=True, nproc_per_node=2) if j.name == "fsdp")
    calls, split = [], fake._split_foreach

    def counted(func, tensors):
        calls.append(len(tensors))
        return split(func, tensors)

    monkeypatch.setattr(fake, "_split_foreach", counted)
    monkeypatch.setattr(fake, "SPLIT_FOREACH_AT", 3)
    parts = predict_traced(job)
    assert calls and all(n > 3 for n in calls)  # split, in parts of 3
    monkeypatch.setattr(fake, "SPLIT_FOREACH_AT", 10**9)
    whole = predict_traced(job)
    assert dataclasses.asdict(parts.memory) == dataclasses.asdict(whole.memory)
    assert parts.events == whole.events


@pytest.mark.parametrize("workload", ["gpt-tiny", "vit-tiny"])
def test_a_foreach_op_over_fake_tensors_called_one_tensor_at_a_time_makes_the_trace_one_call_makes(workload,
                                                                                                   monkeypatch):
    """Adam's _foreach_sqrt over fake tensors is called one tensor at a time, each made again by _Outputs: the memory
    and every allocation must be one call's, through FakeTensorMode."""
    from membench.predict.emulate import fake

    job = next(j for j in plan(workload=workload, techniques="baseline", batch_size=4, target_device="cuda",
                               in_process=True) if j.name == "baseline")
    calls, call = [], fake._Outputs.call

    def counted(self, func, args, kwargs):
        calls.append(func in fake.SPLIT_FOREACH and len(args[0]) == 1)
        return call(self, func, args, kwargs)

    monkeypatch.setattr(fake._Outputs, "call", counted)
    parts = predict_traced(job, derive_warmup=False)  # the warm-up step's optimizer runs too
    assert any(calls)
    monkeypatch.setattr(fake, "SPLIT_FOREACH", frozenset())
    whole = predict_traced(job, derive_warmup=False)
    assert dataclasses.asdict(parts.memory) == dataclasses.asdict(whole.memory)
    assert parts.events == whole.events


DTENSOR_CASES = [("gpt-tiny", {"nproc_per_node": 2}), ("gpt-tiny", {"nproc_per_node": 3, "param_dtype": "bf16"}),
                 (LLAMA, {"nproc_per_node": 4, "seq_len": 32, "reduce_dtype": "fp32", "param_dtype": "bf16"}),
                 # for the CPU: Adam tensor by tensor (DTensor ops with a float argument), clipping the norm
                 ("gpt-tiny", {"nproc_per_node": 2, "target_device": "cpu", "clip_grad_norm": 1.0})]


@pytest.mark.parametrize("workload, options", DTENSOR_CASES, ids=[str(o) for _, o in DTENSOR_CASES])
def test_dtensor_ops_run_with_this_mode_on_the_stack_make_the_trace_fake_tensor_mode_makes(workload, options,
                                                                                          monkeypatch):
    """A DTensor op (FSDP2's parameters, gradients, optimizer state) is passed on to DTensor's dispatch with the
    fake-scalars mode on the stack again, so that the ops on local shards come through it (fake._through_dtensor):
    the memory and every allocation must be those of the ops going from DTensor's dispatch to FakeTensorMode."""
    from membench.predict.emulate import fake

    options = {"target_device": "cuda", **options}
    job = next(j for j in plan(workload=workload, techniques="fsdp", batch_size=4, in_process=True, **options)
               if j.name == "fsdp")
    passed = []
    through = fake._AnswerScalars._through_dtensor

    def counted(self, func, args, kwargs):
        passed.append(func)
        return through(self, func, args, kwargs)

    monkeypatch.setattr(fake._AnswerScalars, "_through_dtensor", counted)
    fast = predict_traced(job)
    assert passed  # Adam's state, at least
    monkeypatch.setattr(fake._AnswerScalars, "_of_dtensors", lambda self, args: False)
    slow = predict_traced(job)
    assert dataclasses.asdict(fast.memory) == dataclasses.asdict(slow.memory)
    assert fast.events == slow.events


FSDP_CASES = [{"nproc_per_node": 2}, {"nproc_per_node": 4, "param_dtype": "bf16", "reduce_dtype": "fp32"},
              {"mesh": "dp_replicate=2,dp_shard=2", "nproc_per_node": 4, "reshard_after_forward": False},
              {"nproc_per_node": 3}]


@pytest.mark.parametrize("options", FSDP_CASES, ids=[str(o) for o in FSDP_CASES])
def test_fsdp2s_copy_in_and_copy_out_answered_without_fake_tensor_mode_make_its_trace(options, monkeypatch):
    """FSDP2's all-gather copy-in and copy-out are answered by fake.py where their arguments are as FSDP2 makes them:
    every allocation, free and byte must be FakeTensorMode's (mixed precision, HSDP, uneven shards at 3 ranks)."""
    from membench.predict.emulate import fake

    job = next(j for j in plan(workload="gpt-tiny", techniques="fsdp", batch_size=4, target_device="cuda",
                               in_process=True, **options) if j.name == "fsdp")
    answered, copies = [], fake._fsdp_copies

    def counted():
        def noting(answer):
            def noted(*args):
                out = answer(*args)
                answered.append(out is not fake._UNLIKE_FSDP)  # not the outputs: they would outlive the step
                return out
            return noted
        return {op: noting(answer) for op, answer in copies().items()}

    monkeypatch.setattr(fake, "_fsdp_copies", counted)
    fast = predict_traced(job)
    assert len(answered) > 4 and all(answered)  # every call answered here
    monkeypatch.setattr(fake, "_fsdp_copies", dict)
    slow = predict_traced(job)
    assert dataclasses.asdict(fast.memory) == dataclasses.asdict(slow.memory)
    assert fast.events == slow.events


def test_fsdp2s_copy_in_answered_is_the_view_fake_tensor_mode_makes(monkeypatch):
    """A rank's share of the all-gather buffer: the same view (shape, strides, offset into the buffer's storage) as
    FakeTensorMode's Meta kernel makes, and the buffer itself."""
    import torch
    import torch.distributed.fsdp  # noqa: F401 - registers FSDP2's ops

    from membench.predict.emulate import fake

    def copy_in():
        inputs = [torch.empty(6, dtype=torch.bfloat16), torch.empty(2, dtype=torch.bfloat16)]
        buffer = torch.empty(8 * 4, dtype=torch.bfloat16)[8:]  # not at its storage's start
        share, same = torch.ops.fsdp.all_gather_copy_in(inputs, buffer, [6, 2], 8, 2)
        assert same is buffer and share.untyped_storage() is buffer.untyped_storage()
        return share.shape, share.stride(), share.storage_offset(), share.dtype, share.requires_grad, type(share)

    answered, original = [], fake._all_gather_copy_in

    def noted(*args):
        answered.append(True)
        return original(*args)

    monkeypatch.setattr(fake, "_all_gather_copy_in", noted)
    with fake.fake_tensors():
        ours = copy_in()
    assert answered  # by fake.py
    monkeypatch.setattr(fake, "_fsdp_copies", dict)  # FakeTensorMode's
    with fake.fake_tensors():
        theirs = copy_in()
    assert ours == theirs and ours[2] == 8 + 16
