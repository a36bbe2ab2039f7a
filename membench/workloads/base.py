"""The workload contract: what a model factory hands membench.

A factory is a function with no required arguments that returns a `Workload`; a factory for text may also take a
`seq_len` keyword (what `--seq-len` sets; it is not passed when the user does not set it). membench builds the
model itself (so a technique can build it on another device or dtype), makes batches from a seeded generator, and calls
`loss_fn(model, batch)` for a scalar loss that is a *mean* over the samples of the batch (accumulation relies on
that: a micro-batch's loss is scaled by 1/N).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the workload names are read without torch (the CLI's --help): torch is imported where it runs
    import torch
    from torch import nn

    Batch = tuple[torch.Tensor, ...]
else:
    Batch = tuple  # tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class Workload:
    """A model to train and the data to train it on.

    build_model: returns a freshly initialised model (on the current default device, in fp32).
    make_batch: (batch_size, generator) -> a tuple of CPU tensors whose first dimension is the batch.
    loss_fn: (model, batch) -> scalar loss, the mean over the batch.
    blocks: (model) -> the repeated blocks (transformer layers) that checkpointing wraps; None: no blocks.
    items_per_sample: how many throughput units one sample is (tokens per sequence for text; 1 for images).
    unit: the throughput unit ("samples" or "tokens").
    optimizer: the optimizer this model trains with when `--optimizer` is not given (a name such as "adamw", or
        "package.module:factory"); None: Adam.
    causal_lm: for a causal LM, its hidden states, output projection and aligned targets (chunked-ce).
    """

    build_model: Callable[[], nn.Module]
    make_batch: Callable[[int, torch.Generator], Batch]
    loss_fn: Callable[[nn.Module, Batch], torch.Tensor]
    blocks: Callable[[nn.Module], Sequence[nn.Module]] | None = None
    items_per_sample: int = 1
    unit: str = "samples"
    optimizer: str | None = None
    # A causal LM's split for a loss that projects the logits itself (chunked-ce): (model, batch) -> (the last
    # hidden states [B, T, D], the output projection, the targets [B, T] aligned to them, -100 where none); None:
    # not a causal LM.
    causal_lm: Callable[[nn.Module, Batch], tuple] | None = None


def classification_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    from torch import nn

    images, labels = batch
    return nn.functional.cross_entropy(model(images), labels)


def image_batch(image_size: int, num_classes: int, channels: int = 3) -> Callable[[int, torch.Generator], Batch]:
    def make(batch_size: int, generator: torch.Generator) -> Batch:
        import torch

        images = torch.randn(batch_size, channels, image_size, image_size, generator=generator)
        labels = torch.randint(0, num_classes, (batch_size,), generator=generator)
        return images, labels

    return make
