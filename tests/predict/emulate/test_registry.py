"""The emulation registry (predict/emulate/registry.py): an emulation defined and registered here, in this file alone,
acts in a CUDA prediction, and the op table CudaKernels builds from the registry holds each emulation's ops."""

from __future__ import annotations

import contextlib

import pytest
import torch

from membench.allocator.events import TraceEvent
from membench.predict import gpus
from membench.predict.emulate.kernels import CudaKernels
from membench.predict.emulate.registry import REGISTRY, Emulation, emulation, load_all, unregister
from membench.predict.run import predict_traced
from tests.helpers import spec

aten = torch.ops.aten
TOY_BYTES = 12_345  # a size no other allocation of gpt-tiny at batch 4 has


@contextlib.contextmanager
def registered(cls):
    emulation(cls)
    try:
        yield cls
    finally:
        unregister(cls)


class ToyLossScratch(Emulation):
    """Takes TOY_BYTES of scratch after each nll_loss_forward, freed at once; counts the rewrites it was asked."""

    ops = frozenset({aten.nll_loss_forward.default})
    rewritten: list = []

    def rewrite(self, func, args, kwargs):
        ToyLossScratch.rewritten.append(func)
        return func

    def scratch(self, func, args, kwargs, out) -> list[TraceEvent]:
        return [TraceEvent.alloc("toy", TOY_BYTES), TraceEvent.free("toy")]


def _toy_allocations(job) -> int:
    return sum(1 for e in predict_traced(job).events if e.kind == "alloc" and e.size == TOY_BYTES)


def test_an_emulation_registered_by_a_test_shows_in_a_predictions_trace():
    """gpt-tiny's loss is one cross_entropy per step, whose forward runs nll_loss_forward once; a prediction with one
    warm-up step holds two steps' allocations (the warm-up's written from the measured step's, or run), so the toy
    takes its TOY_BYTES twice; its rewrite is asked about that op and no other. Without the toy, no allocation of
    that size."""
    job = spec("gpt-tiny", batch_size=4, device="cuda", gpu="H100")
    assert _toy_allocations(job) == 0
    ToyLossScratch.rewritten = []
    with registered(ToyLossScratch):
        assert _toy_allocations(job) == 2
        assert ToyLossScratch.rewritten and set(ToyLossScratch.rewritten) == {aten.nll_loss_forward.default}
    assert ToyLossScratch not in REGISTRY
    assert _toy_allocations(job) == 0


def test_the_op_table_holds_each_registered_emulations_ops_in_order():
    kernels = CudaKernels(gpus.gpu("H100"))
    classes = load_all()
    assert [type(e) for e in kernels.emulations] == classes
    for e in kernels.emulations:
        if e.ops is None:
            continue
        for op in e.ops:
            if e.acts_after():
                assert e.after in kernels._after[op]
            if e.acts_before():
                assert e.rewrite in kernels._before[op]
    # the all-ops emulations run around any other op, in order: backward's in-place paths, bitsandbytes' 4-bit matmul
    # (its ops exist only once bitsandbytes is imported: matched by name), then host tensors last
    assert [type(h.__self__).__name__ for h in kernels._after_all] == ["BackwardPaths", "Bnb4bitKernels",
                                                                        "HostTensors"]


def test_only_emulation_subclasses_register():
    with pytest.raises(TypeError, match="Emulation subclasses"):
        emulation(object)
