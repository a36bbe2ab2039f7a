"""A small conv net with BatchNorm: the case where accumulation is *not* the same as one big batch."""

from __future__ import annotations

from torch import nn

from membench.workloads.base import Workload, classification_loss, image_batch


def _build() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1, stride=2), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    )


def cnn_bn() -> Workload:
    return Workload(build_model=_build, make_batch=image_batch(16, 10), loss_fn=classification_loss)
