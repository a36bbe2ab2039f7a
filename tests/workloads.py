"""User workloads for tests, loaded as `tests.workloads:NAME` exactly as a user's own model would be."""

import dataclasses
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


def not_a_workload():
    return torch.nn.Linear(2, 2)


def mlp_adafactor() -> Workload:
    """A workload that names the optimizer it trains with (--optimizer overrides it)."""
    return dataclasses.replace(mlp(), optimizer="adafactor")


def rmsprop(params, lr: float) -> torch.optim.Optimizer:
    """A user's optimizer factory (--optimizer tests.workloads:rmsprop): one state (square_avg) and a step."""
    return torch.optim.RMSprop(params, lr=lr, foreach=False)
