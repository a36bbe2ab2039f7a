"""User workloads for tests, loaded as `tests.workloads:NAME` exactly as a user's own model would be."""

import time

import torch
from torch import nn

from membench.workloads import Workload
from membench.workloads.base import classification_loss, image_batch


def mlp() -> Workload:
    """The documented contract: a factory returning a Workload."""
    return Workload(
        build_model=lambda: nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 64), nn.ReLU(), nn.Linear(64, 10)),
        make_batch=image_batch(8, 10),
        loss_fn=classification_loss,
    )


def broken() -> Workload:
    def build():
        raise RuntimeError("planted crash while building the model")

    return Workload(build_model=build, make_batch=image_batch(8, 10), loss_fn=classification_loss)


def hang() -> Workload:
    def loss(model, batch):
        time.sleep(600)
        return classification_loss(model, batch)

    return Workload(build_model=mlp().build_model, make_batch=image_batch(8, 10), loss_fn=loss)


def diverging() -> Workload:
    """A loss that is NaN from the first step: a run that trains nothing."""
    return Workload(build_model=mlp().build_model, make_batch=image_batch(8, 10),
                    loss_fn=lambda model, batch: classification_loss(model, batch) * float("nan"))


def not_a_workload():
    return torch.nn.Linear(2, 2)


def hang_under_torchrun() -> Workload:
    """Hangs only in a torchrun rank (torchrun sets RANK): the baseline finishes, a distributed run hangs."""
    import os

    def loss(model, batch):
        if "RANK" in os.environ:
            time.sleep(600)
        return classification_loss(model, batch)

    return Workload(build_model=mlp().build_model, make_batch=image_batch(8, 10), loss_fn=loss)


def factory_hangs() -> Workload:
    time.sleep(600)
    return mlp()


def factory_aborts() -> Workload:
    import os

    os.abort()


def factory_raises() -> Workload:
    raise ValueError("could not open shard [/data/train-000.tar]")


def leaking() -> Workload:
    """Keeps every step's activations alive in a global list: memory grows by a batch's activations each step."""
    kept = []

    def loss(model, batch):
        out = model[1](model[0](batch[0]))  # the first Linear's output, 8 MiB at batch 2048: kept forever
        kept.append(out)
        return classification_loss(model, batch) + 0 * out.sum()

    def build():
        return nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 1024), nn.ReLU(), nn.Linear(1024, 10))

    return Workload(build_model=build, make_batch=image_batch(8, 10), loss_fn=loss)
