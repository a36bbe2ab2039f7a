"""Fake tensors and a fake process group: run a real training step with no memory and no GPU behind it.

FakeTensorMode gives every tensor its shape, dtype and storage size but no data, so the storage tracker can count
the bytes a step would allocate. Only here do we touch torch's private fake-tensor and fake-process-group APIs.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from membench.trackers import private


class _AnswerScalars(private.TorchDispatchMode):
    """A fake tensor has no value, so `.item()` has no answer; give 1 (a loss to print, an Adam step count that
    keeps `1 - beta ** step` away from zero). Nothing that decides memory depends on it in a training step, except
    a gradient scaler's inf/nan flag (amp-fp16): 1 would mean "inf found", and the scaler would skip every
    optimizer step, so a prediction would hold no optimizer state. A flag GradScaler's check wrote answers 0: the
    prediction is of a step whose gradients are finite (the steady state of training; a skipped step only
    allocates less)."""

    def __init__(self):
        super().__init__()
        self._inf_flags = WeakIdKeyDictionary()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in private.SCALAR_OPS:
            return 0 if args[0] in self._inf_flags else 1
        if private.writes_values_only(func):
            # An in-place pointwise op (the optimizer's, one tensor or a list at a time) changes values only, which
            # fake tensors do not have, and allocates nothing: FakeTensorMode's meta kernel would only return its
            # first argument (a tenth of a prediction went there).
            return None if func._schema.name.startswith("aten::_foreach_") else args[0]
        out = func(*args, **(kwargs or {}))
        if func is private.AMP_CHECK_AND_UNSCALE:
            self._inf_flags[args[1]] = True
        return out


@contextlib.contextmanager
def fake_tensors():
    """Every tensor made inside is fake, on its real device (we use cpu: fake cuda fails in backward without a
    GPU and picks other kernels), and real tensors that meet fake ones become fake too."""
    with private.fake_tensor_mode(allow_non_fake_inputs=True), _AnswerScalars():
        yield


def build_on_meta(build) -> nn.Module:
    """Build with no memory at all (torchvision's ViT init is data-dependent, so it cannot run under fake mode)."""
    with torch.device("meta"):
        return build()


def materialize(meta_model: nn.Module) -> nn.Module:
    """Inside fake_tensors(): fake cpu storages of the right sizes for every parameter and buffer.

    `to_empty` gives each module its own new tensor, so a parameter shared by two modules (tied input and output
    embeddings, as in GPT-2 and BERT) would become two and be counted twice, with two gradients and two optimizer
    states; the sharing is restored here, as transformers does with tie_weights() after its own meta loading.
    """
    shared = [(module, kind, name, id(tensor)) for module in meta_model.modules()
              for kind in ("_parameters", "_buffers") for name, tensor in getattr(module, kind).items()
              if tensor is not None]
    model = meta_model.to_empty(device="cpu")
    first: dict[int, torch.Tensor] = {}
    for module, kind, name, key in shared:
        table = getattr(module, kind)
        table[name] = first.setdefault(key, table[name])
    return model


def real_tensors():
    """Leave fake mode for a moment (a device mesh needs real rank arithmetic); fake tensors stay fake."""
    return private.unset_fake_temporarily()


@contextlib.contextmanager
def fake_process_group(world_size: int, rank: int = 0):
    """One process plays `rank` of `world_size`: collectives return at once and move no data, but every buffer
    they need is allocated as it would be, so per-rank memory (FSDP shards, all-gather buffers) is predicted."""
    import torch.distributed as dist

    if dist.is_initialized():
        raise RuntimeError("a process group is already initialized; predict in a fresh process")
    dist.init_process_group("fake", store=private.fake_store(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()
