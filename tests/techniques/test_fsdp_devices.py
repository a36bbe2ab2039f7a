"""FSDP shards on the run's device, one rank per GPU (checked on CPU, standing in for the torch calls
that need a GPU)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from membench import api
from membench.cli import main
from membench.common.errors import UserError
from membench.spec import RunSpec
from membench.step import batches, build_state, train_step
from membench.techniques import resolve
from membench.workloads import load_workload


# --- 2. FSDP shards on the run's device; one rank per GPU ---------------------------------------------------------
@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_fsdp_on_cpu_shards_on_a_cpu_mesh_on_a_gpu_machine(one_rank_group, monkeypatch):
    # fully_shard's default mesh takes the machine's accelerator (torch._C._get_accelerator): on a GPU machine,
    # cuda, whatever --device says. A CUDA mesh cannot be made here: the default would fail.
    monkeypatch.setattr(torch._C, "_get_accelerator", lambda: torch.device("cuda"))
    run = RunSpec("gpt-tiny", 2, ("fsdp",))
    workload = load_workload("gpt-tiny")
    state = build_state(run, workload, resolve(run).techniques)
    assert {p.device_mesh.device_type for p in state.model.parameters()} == {"cpu"}
    assert train_step(state, next(batches(workload, run))) > 0


def test_more_ranks_than_gpus_is_refused_before_anything_runs(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(UserError, match=r"--nproc-per-node 2 .* has 1 CUDA GPU; valid: 1 to 1"):
        api.plan("gpt-tiny", "fsdp", 2, device="cuda", nproc_per_node=2)
    assert main(["run", "--device", "cuda", "--workload", "gpt-tiny", "--techniques", "fsdp",
                 "--nproc-per-node", "2"]) == 2
    # A prediction for CUDA computes on this machine: its GPUs do not matter.
    assert api.plan("gpt-tiny", "fsdp", 2, device="cpu", target_device="cuda", nproc_per_node=2)
