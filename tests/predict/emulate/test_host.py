"""A CUDA prediction counts only GPU memory: the step counts Adam, AdamW and Adafactor keep on the CPU (unless fused
or capturable) and the CPU scalars their foreach steps make are host tensors (predict/emulate/host.py).

Expected sizes are worked out from the model's parameter shapes: every tensor a 512-byte block multiple, Adam's and
AdamW's state two fp32 copies of each parameter, Adafactor's a row and a column vector per matrix (its last dim and
its second-to-last set to 1) and a full copy per vector, and a fused or capturable optimizer's step one fp32 scalar
per parameter on the GPU (a block each).
"""

from __future__ import annotations

import math

import pytest
import torch

from membench.predict.emulate import fake
from membench.predict.emulate.kernels import CudaKernels
from membench.predict.gpus import gpu
from membench.predict.run import predict_memory
from membench.trackers.storage import StorageTracker
from membench.workloads import load_workload
from tests.helpers import spec

BLOCK = 512


def capturable_adam(params, lr: float) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=lr, capturable=True)


def capturable_adamw(params, lr: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=lr, capturable=True)


def foreach_adafactor(params, lr: float) -> torch.optim.Optimizer:
    return torch.optim.Adafactor(params, lr=lr, foreach=True)


def _blocks(nbytes: int) -> int:
    return -(-nbytes // BLOCK) * BLOCK


def _shapes(workload: str) -> list[torch.Size]:
    with torch.device("meta"):
        model = load_workload(workload).build_model()
    return [p.shape for p in model.parameters() if p.requires_grad]


def _adafactor_state(shapes) -> int:
    total = 0
    for shape in shapes:
        if len(shape) > 1:
            total += _blocks(4 * math.prod(shape[:-1])) + _blocks(4 * math.prod((*shape[:-2], shape[-1])))
        else:
            total += _blocks(4 * math.prod(shape))
    return total


HERE = "tests.predict.emulate.test_host"
# (optimizer, techniques, state copies of the parameters, step on the GPU)
ADAMS = [
    ("adam", (), 2, False),  # foreach: CUDA's default
    ("adam", ("foreach-off",), 2, False),
    ("adam", ("fused-adam",), 2, True),
    ("adamw", (), 2, False),
    ("adamw", ("foreach-off",), 2, False),
    ("adamw", ("fused-adam",), 2, True),
    (f"{HERE}:capturable_adam", (), 2, True),
    (f"{HERE}:capturable_adamw", ("foreach-off",), 2, True),
]


def _state(workload: str, optimizer: str, techniques=()) -> tuple[int, int]:
    memory = predict_memory(spec(workload, techniques, batch_size=1, device="cuda", optimizer=optimizer))
    return memory.current_breakdown["parameters"], memory.current_breakdown["optimizer_state"]


@pytest.mark.parametrize("optimizer, techniques, copies, step_on_gpu", ADAMS,
                         ids=[f"{o.rpartition(':')[2]}-{'+'.join(t) or 'default'}" for o, t, _, _ in ADAMS])
def test_adam_state_is_the_parameters_times_its_copies(optimizer, techniques, copies, step_on_gpu):
    shapes = _shapes("gpt-tiny")
    params, state = _state("gpt-tiny", optimizer, techniques)
    assert params == sum(_blocks(4 * math.prod(s)) for s in shapes)
    assert state == copies * params + (BLOCK * len(shapes) if step_on_gpu else 0)


@pytest.mark.parametrize("optimizer", ["adafactor", f"{HERE}:foreach_adafactor"])
def test_adafactor_state_is_its_factors(optimizer):
    _, state = _state("gpt-tiny", optimizer)
    assert state == _adafactor_state(_shapes("gpt-tiny"))


@pytest.mark.slow
@pytest.mark.parametrize("optimizer, techniques, copies, step_on_gpu",
                         [("adamw", (), 2, False), ("adam", ("fused-adam",), 2, True)], ids=["adamw", "fused-adam"])
def test_vit_l_16_adam_state(optimizer, techniques, copies, step_on_gpu):
    shapes = _shapes("vit_l_16")
    assert len(shapes) == 296  # 151,552 B of CPU step counts, counted as GPU blocks before
    params, state = _state("vit_l_16", optimizer, techniques)
    assert params == sum(_blocks(4 * math.prod(s)) for s in shapes)
    assert state == copies * params + (BLOCK * len(shapes) if step_on_gpu else 0)


@pytest.mark.slow
def test_vit_l_16_adafactor_state():
    assert _state("vit_l_16", "adafactor")[1] == _adafactor_state(_shapes("vit_l_16"))


def test_scalars_made_from_data_are_host_tensors():
    """torch.tensor(1.0) and what CPU scalars alone make are host tensors; a tensor from a list (a batch that code
    then moves to the GPU) and anything a GPU tensor takes part in are counted."""
    tracker = StorageTracker(round_to=BLOCK, trace=True)
    tracker.kernels = CudaKernels(gpu("H100"))
    with fake.fake_tensors():
        on_gpu = torch.empty(4)
        with tracker:
            step = torch.tensor(0.0)
            step += 1
            twice = step * 2
            batch = torch.tensor([1.0, 2.0])
            mixed = on_gpu.sum() * step
            del step, twice
    # the batch, the sum, mixed, and the sum freed
    assert [e[0] for e in tracker.trace] == ["alloc", "alloc", "alloc", "free"]
    assert [e[2] for e in tracker.trace[:3]] == [8, 4, 4] and tracker.trace[3][1] == tracker.trace[1][1]
    assert tracker.current == 2 * BLOCK and batch.shape == (2,) and mixed.dim() == 0
