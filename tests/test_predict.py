"""Predictions: equal to the exact CPU measurement to the byte where fake cpu and real cpu allocate the same,
rounded to CUDA blocks for a CUDA target, labelled as predictions, and per-rank FSDP memory with a fake group."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from membench import cli, worker
from membench.predict import CANNOT_SEE, predict, predict_memory
from membench.spec import RunSpec
from membench.step import batches, build_state, train_step
from membench.techniques import REGISTRY, instantiate
from membench.techniques.base import Technique
from membench.trackers.memory import CpuMeter
from membench.workloads import load_workload

STACKS = [(), ("accum",), ("ckpt",), ("opt-in-bwd",), ("ckpt", "opt-in-bwd")]
CASES = [(w, s) for w in ("vit-tiny", "gpt-tiny", "cnn-bn") for s in STACKS if not (w == "cnn-bn" and "ckpt" in s)]


def measure(spec: RunSpec) -> dict:
    """What `membench run` measures on cpu (the worker's steps: warm-up, reset, one tracked step), real tensors."""
    workload = load_workload(spec.workload)
    meter = CpuMeter()
    data = batches(workload, spec)
    with meter.active():
        state = build_state(spec, workload, instantiate(spec), on_model=meter.attach_model)
        meter.attach_optimizers(state.optimizers)
        for i in range(spec.warmup + 1):
            if i == spec.warmup:
                meter.reset_peak()
            meter.start_step(i)
            train_step(state, next(data), meter.phase)
        return meter.result()


@pytest.mark.parametrize("workload, stack", CASES, ids=[f"{w}-{'+'.join(s) or 'baseline'}" for w, s in CASES])
def test_prediction_equals_cpu_measurement_to_the_byte(workload, stack):
    spec = RunSpec(workload, 4, techniques=stack, warmup=1, accum_steps=2)
    measured, predicted = measure(spec), predict_memory(spec, round_to=1)
    for key in ("peak_allocated_bytes", "peak_phase", "breakdown_at_peak", "current_bytes", "current_breakdown"):
        assert predicted[key] == measured[key], key


def test_prediction_equals_what_the_worker_records(tmp_path):
    spec = RunSpec("gpt-tiny", 2, techniques=("ckpt",), steps=1, warmup=1, check=False)
    record = worker.run(spec, tmp_path / "ckpt.json")
    assert predict_memory(spec)["peak_allocated_bytes"] == record["memory"]["peak_allocated_bytes"]


def test_cuda_target_rounds_to_allocator_blocks_and_uses_cudas_foreach_default():
    spec = RunSpec("gpt-tiny", 4, device="cuda", warmup=1)
    cuda = predict_memory(spec)
    assert cuda["device"] == "cuda" and cuda["peak_allocated_bytes"] % 512 == 0
    assert all(v % 512 == 0 for v in cuda["breakdown_at_peak"].values())
    exact = predict_memory(dataclasses.replace(spec, device="cpu"), round_to=1)
    assert cuda["peak_allocated_bytes"] >= exact["peak_allocated_bytes"]
    # foreach Adam (CUDA's default) holds intermediates in the optimizer step that the CPU default does not
    cpu_rounded = predict_memory(dataclasses.replace(spec, device="cpu"), round_to=512)
    sgd = dataclasses.replace(spec, optimizer="sgd")
    assert cuda["peak_allocated_bytes"] >= cpu_rounded["peak_allocated_bytes"]
    assert predict_memory(sgd)["peak_allocated_bytes"] < cuda["peak_allocated_bytes"]


def test_prediction_record_is_labelled_and_says_what_it_cannot_see():
    record = predict(RunSpec("vit-tiny", 2, device="cuda", warmup=1))
    assert record["status"] == "ok" and record["predicted"] is True and record["predicted_for"] == "cuda"
    assert record["cannot_see"] == list(CANNOT_SEE) and any("fragmentation" in c for c in CANNOT_SEE)
    assert record["timing"] is None and record["memory"]["peak_reserved_bytes"] is None


def test_cli_predict_writes_predictions_apart_and_labels_the_table(tmp_path, capsys):
    out = tmp_path / "pred"
    code = cli.main(["predict", "--workload", "vit-tiny", "--batch-size", "4", "--techniques", "ckpt",
                     "--warmup", "1", "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0
    assert "predicted alloc GiB" in text and "PREDICTED cuda memory" in text and "cannot see" in text
    assert sorted(p.name for p in out.glob("*.json")) == ["baseline.json", "ckpt.json"]


def test_unknown_technique_is_a_usage_error(capsys):
    assert cli.main(["predict", "--workload", "vit-tiny", "--techniques", "nope"]) == 2
    assert "unknown technique 'nope'" in capsys.readouterr().err


class ShardBlocks(Technique):
    """A plain FSDP2 `fully_shard` of each block and the root, for testing the fake process group plumbing."""

    name = "shard-test"
    summary = "fully_shard each block (test only)"
    distributed = True

    def configure(self, state) -> None:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for block in state.workload.blocks(state.model):
            fully_shard(block, mesh=mesh)
        fully_shard(state.model, mesh=mesh)


@pytest.fixture
def shard_technique(monkeypatch):
    monkeypatch.setitem(REGISTRY, ShardBlocks.name, ShardBlocks)
    return ShardBlocks.name


def test_fsdp_prediction_for_any_world_size_in_one_process(shard_technique):
    peaks = {}
    for ranks in (1, 2, 4):
        spec = RunSpec("gpt-tiny", 2, techniques=(shard_technique,), nproc_per_node=ranks, warmup=1, device="cuda")
        memory = predict_memory(spec)
        assert memory["world_size"] == ranks
        peaks[ranks] = memory
    assert not torch.distributed.is_initialized()  # the fake group is torn down after each prediction
    # Adam's state is sharded: each rank holds 1/N of it (up to the padding of uneven shards)
    state = {n: m["breakdown_at_peak"]["optimizer_state"] for n, m in peaks.items()}
    assert state[1] / 2.2 < state[2] < state[1] / 1.8 and state[1] / 4.5 < state[4] < state[1] / 3.5
    assert peaks[1]["peak_allocated_bytes"] > peaks[2]["peak_allocated_bytes"] > peaks[4]["peak_allocated_bytes"]


def test_fsdp_prediction_at_world_size_1_equals_a_real_gloo_run(shard_technique):
    import torch.distributed as dist
    import torch.distributed.fsdp  # noqa: F401 - before the tracker starts, so it sees FSDP's storage frees

    spec = RunSpec("gpt-tiny", 2, techniques=(shard_technique,), warmup=1)
    predicted = predict_memory(spec, round_to=1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        measured = measure(spec)
    finally:
        dist.destroy_process_group()
    assert predicted["peak_allocated_bytes"] == measured["peak_allocated_bytes"]


def test_a_table_mixing_kinds_labels_each_prediction(tmp_path):
    from membench.report.table import render

    spec = RunSpec("vit-tiny", 2, steps=1, warmup=1, check=False)
    measured = worker.run(spec, tmp_path / "baseline.json")
    predicted = predict(dataclasses.replace(spec, techniques=("ckpt",)))
    text = render([measured, predicted])
    assert "ckpt (predicted)" in text and "baseline (predicted)" not in text and "peak alloc GiB" in text
