"""User workloads for tests, loaded as `tests.workloads:NAME` exactly as a user's own model would be."""

import dataclasses
import os
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
def resnet18() -> Workload:
    """torchvision's resnet18 (BatchNorm) on small images; `ckpt` checkpoints its residual blocks."""
    from torchvision.models import resnet18 as build

    return Workload(
        build_model=lambda: build(num_classes=10),
        make_batch=image_batch(32, 10),
        loss_fn=classification_loss,
        blocks=lambda model: [*model.layer1, *model.layer2, *model.layer3, *model.layer4],
    )


def dropout_mlp() -> Workload:
    """A small model with dropout 0.1, as GPT-2 has: every forward draws a fresh random mask."""
    return Workload(
        build_model=lambda: nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 64), nn.ReLU(), nn.Dropout(0.1),
                                          nn.Linear(64, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 10)),
        make_batch=image_batch(8, 10),
        loss_fn=classification_loss,
        blocks=lambda model: [model[1], model[4]],
    )


def hf_gpt2() -> Workload:
    """A Hugging Face GPT-2 built from a config (no download), dropout 0.1 as GPT-2 ships; needs transformers."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=64)

    def make_batch(batch_size: int, generator: torch.Generator):
        return (torch.randint(0, 256, (batch_size, 32), generator=generator),)

    def loss(model, batch):
        return model(input_ids=batch[0], labels=batch[0]).loss

    return Workload(build_model=lambda: GPT2LMHeadModel(config), make_batch=make_batch, loss_fn=loss,
                    blocks=lambda model: list(model.transformer.h), items_per_sample=32, unit="tokens")
def mlp_adafactor() -> Workload:
    """A workload that names the optimizer it trains with (--optimizer overrides it)."""
    return dataclasses.replace(mlp(), optimizer="adafactor")


def rmsprop(params, lr: float) -> torch.optim.Optimizer:
    """A user's optimizer factory (--optimizer tests.workloads:rmsprop): one state (square_avg) and a step."""
    return torch.optim.RMSprop(params, lr=lr, foreach=False)


def factory_chdirs() -> Workload:
    """A factory that changes the working directory (as some training scripts do): a relative --out must not
    move with it."""
    import os
    import tempfile

    def build():
        os.chdir(tempfile.mkdtemp(prefix="membench-chdir-"))
        return mlp().build_model()

    return Workload(build_model=build, make_batch=image_batch(8, 10), loss_fn=classification_loss)


def factory_exits_0() -> Workload:
    """Ends its process with success before returning: a caller that reads the exit code alone would pass."""
    import os

    os._exit(0)


def factory_system_exit() -> Workload:
    raise SystemExit(3)


def factory_prints() -> Workload:
    """Prints 10 MB to stdout, and more at exit, as chatty libraries do."""
    import atexit
    import sys

    atexit.register(lambda: print("goodbye from atexit"))
    sys.stdout.write("x" * 10_000_000 + "\n")
    return mlp()


def factory_says_collector() -> Workload:
    """Says whether Python's cycle collector is on while the user's code runs (predict's child turns it off only
    while it imports torch)."""
    import gc

    print(f"collector on: {gc.isenabled()}")
    return mlp()


def factory_forks() -> Workload:
    """Leaves a forked child behind that sleeps (holding whatever pipes it inherited), and writes its pid where the
    test reads it (MEMBENCH_TEST_PIDFILE)."""
    import os

    pid = os.fork()
    if pid == 0:
        time.sleep(600)
        os._exit(0)
    with open(os.environ["MEMBENCH_TEST_PIDFILE"], "w") as f:
        f.write(str(pid))
    return mlp()


def killed_in_step() -> Workload:
    """The worker is killed (SIGKILL, as the kernel's OOM killer does) in its first training step."""
    import os
    import signal

    def loss(model, batch):
        os.kill(os.getpid(), signal.SIGKILL)

    return Workload(build_model=mlp().build_model, make_batch=image_batch(8, 10), loss_fn=loss)


def oom_on_rank1() -> Workload:
    """Under torchrun, rank 1 runs out of memory in its second step (the first after one warm-up step) while
    rank 0 does not: rank 0 is then inside that step's collectives, waiting for rank 1."""
    calls = []

    def loss(model, batch):
        calls.append(1)
        if os.environ.get("RANK") == "1" and len(calls) == 2:
            raise torch.OutOfMemoryError("planted: rank 1 out of memory in its second step")
        return classification_loss(model, batch)

    return Workload(build_model=mlp().build_model, make_batch=image_batch(8, 10), loss_fn=loss)
