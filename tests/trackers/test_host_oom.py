"""An allocation the host refuses is out of memory, not a crash: the exact tracker counts a tensor once it exists,
so a single tensor bigger than the machine (a 30 GB tensor in the loss, or a model of 30 GB parameters, under a
1 GiB budget) reaches torch's CPU allocator first, which raises a RuntimeError ("DefaultCPUAllocator: can't
allocate memory"). The run's status is `oom`, with the bytes that were asked."""

from __future__ import annotations

import torch
from torch import nn

from membench.child.worker import run
from membench.trackers.host import host_refusal
from membench.workloads import Workload
from membench.workloads.base import classification_loss, image_batch
from tests.helpers import spec

NO_HOST_HOLDS = 2**60  # bytes: 1 EiB, refused by malloc on any machine


def _small():
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 16), nn.ReLU(), nn.Linear(16, 10))


def loss_asks_for_too_much() -> Workload:
    def loss(model, batch):
        torch.empty(NO_HOST_HOLDS, dtype=torch.uint8)
        return classification_loss(model, batch)

    return Workload(build_model=_small, make_batch=image_batch(8, 10), loss_fn=loss)


def parameters_too_big() -> Workload:
    """One weight of 2**28 x 2**30 fp32 values: 2**60 bytes."""
    return Workload(build_model=lambda: nn.Linear(2**30, 2**28, bias=False), make_batch=image_batch(8, 10),
                    loss_fn=classification_loss)


def test_the_host_refusal_becomes_an_out_of_memory_error_with_the_bytes_asked():
    try:
        torch.empty(NO_HOST_HOLDS, dtype=torch.uint8)
    except RuntimeError as exc:
        oom = host_refusal(exc)
    assert isinstance(oom, torch.OutOfMemoryError)
    assert str(oom) == ("membench: the host refused an allocation of 1152921504606846976 bytes "
                        "(1,073,741,824.0 GiB): DefaultCPUAllocator: can't allocate memory")
    assert host_refusal(RuntimeError("shape mismatch")) is None and host_refusal(ValueError("x")) is None


def test_a_tensor_the_host_refuses_in_the_loss_is_oom_under_a_budget(tmp_path):
    job = spec("tests.trackers.test_host_oom:loss_asks_for_too_much", batch_size=2, memory_budget=2**30, device="cpu")
    record = run(job, tmp_path / "baseline.json")
    assert record.status == "oom", record.error
    assert "the host refused an allocation of 1152921504606846976 bytes" in record.error
    assert record.memory is not None and record.memory.peak_allocated_bytes > 0  # what was measured until then


def test_parameters_the_host_refuses_are_oom_while_building(tmp_path):
    record = run(spec("tests.trackers.test_host_oom:parameters_too_big", batch_size=2, memory_budget=2**30,
                      device="cpu"),
                 tmp_path / "baseline.json")
    assert record.status == "oom" and "out of memory during build" in record.error, record.error
    assert f"the host refused an allocation of {2**60} bytes" in record.error
