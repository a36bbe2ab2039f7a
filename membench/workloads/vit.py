"""Vision Transformers from torchvision: the reference tutorial's vit_l_16, and small configs for CPU."""

from __future__ import annotations

import functools

from torchvision.models import vision_transformer as tv_vit

from membench.workloads.base import Workload, classification_loss, image_batch

# name: (image_size, patch_size, layers, heads, hidden_dim, mlp_dim, classes)
CONFIGS = {
    "vit-tiny": (32, 8, 2, 2, 64, 128, 10),
    "vit-small": (64, 8, 6, 6, 192, 768, 100),
    "vit_b_16": (224, 16, 12, 12, 768, 3072, 1000),
    "vit_l_16": (224, 16, 24, 16, 1024, 4096, 1000),
}


def _build(image_size, patch_size, layers, heads, hidden, mlp, classes) -> tv_vit.VisionTransformer:
    return tv_vit.VisionTransformer(image_size=image_size, patch_size=patch_size, num_layers=layers,
                                    num_heads=heads, hidden_dim=hidden, mlp_dim=mlp, num_classes=classes)


def vit(name: str) -> Workload:
    cfg = CONFIGS[name]
    image_size, classes = cfg[0], cfg[-1]
    return Workload(
        build_model=functools.partial(_build, *cfg),
        make_batch=image_batch(image_size, classes),
        loss_fn=classification_loss,
        blocks=lambda model: list(model.encoder.layers),
    )
