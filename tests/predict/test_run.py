"""Predictions: equal to the exact CPU measurement to the byte where fake cpu and real cpu allocate the same,
rounded to CUDA blocks for a CUDA target, labelled as predictions, and per-rank FSDP memory with a fake group."""

from __future__ import annotations

import pytest
import torch

from membench import cli
from membench.child import worker
from membench.predict.run import predict, predict_memory
from membench.results import read_result
from membench.techniques import REGISTRY
from membench.techniques.base import Technique
from membench.workloads import load_workload
from tests.helpers import measure, spec

STACKS = [(), ("accum",), ("ckpt",), ("opt-in-bwd",), ("ckpt", "opt-in-bwd")]
CASES = [(w, s) for w in ("vit-tiny", "gpt-tiny", "cnn-bn") for s in STACKS if not (w == "cnn-bn" and "ckpt" in s)]


@pytest.mark.parametrize("workload, stack", CASES, ids=[f"{w}-{'+'.join(s) or 'baseline'}" for w, s in CASES])
def test_prediction_equals_cpu_measurement_to_the_byte(workload, stack):
    """The worker's own measurement (real tensors) against the predictor (fake tensors): one procedure, two kinds of
    tensor, the same bytes."""
    job = spec(workload, stack, batch_size=4, accum_steps=2)
    measured, predicted = measure(workload, stack, batch_size=4, accum_steps=2).memory, predict_memory(job, round_to=1)
    for key in ("peak_allocated_bytes", "peak_phase", "breakdown_at_peak", "current_bytes", "current_breakdown"):
        assert getattr(predicted, key) == getattr(measured, key), key


def test_prediction_equals_what_the_worker_records(tmp_path):
    job = spec("gpt-tiny", ("ckpt",), batch_size=2)
    record = worker.run(job, tmp_path / "ckpt.json")
    assert predict_memory(job).peak_allocated_bytes == record.memory.peak_allocated_bytes


def test_cuda_target_rounds_to_allocator_blocks():
    job = spec("gpt-tiny", batch_size=4, device="cuda")
    cuda = predict_memory(job)
    assert cuda.device == "cuda" and cuda.peak_allocated_bytes % 512 == 0
    assert all(v % 512 == 0 for v in cuda.breakdown_at_peak.values())
    exact = predict_memory(job.with_run(device="cpu"), round_to=1)
    assert cuda.peak_allocated_bytes >= exact.peak_allocated_bytes


def test_a_cuda_prediction_counts_the_batch_from_the_step_on_as_the_gpu_holds_it():
    """gpt-tiny's make_batch draws [B, L + 1] tokens and slices them into inputs and targets: a CUDA run does that on
    the host and copies the two to the GPU in the step, so a CUDA prediction never counts the [2, 65] int64 draw
    (1,040 B); a CPU run makes it on the device it trains on, and its prediction counts it."""
    from membench.predict.run import predict_traced

    job = spec("gpt-tiny", batch_size=2, device="cuda")
    draw, inputs = 2 * 65 * 8, 2 * 64 * 8
    cuda = [e.size for e in predict_traced(job).events if e.kind == "alloc"]
    cpu = [e.size for e in predict_traced(job.with_run(device="cpu")).events if e.kind == "alloc"]
    assert draw not in cuda and cuda.count(inputs) >= 4  # inputs and targets, in the warm-up and measured steps
    assert cpu.count(draw) >= 2


def test_cuda_target_uses_cudas_foreach_adam_default():
    """On CUDA, Adam defaults to foreach, whose intermediates add to a peak in the optimizer step; on CPU it does
    not. So a CUDA-target prediction of an optimizer-bound run is above the same run rounded on the CPU default,
    and forcing foreach off (the foreach-off technique) brings it back to exactly that, plus the two cuBLAS
    workspaces a CUDA step holds (the main thread's handle and the autograd thread's: 32 MiB each on an H100), less
    Adam's step counts, which a CUDA run keeps on the host (a 512-byte block per parameter on the CPU)."""
    job = spec("vit-tiny", batch_size=1, device="cuda")
    cuda = predict_memory(job)
    cpu_default = predict_memory(job.with_run(device="cpu"), round_to=512)
    assert cpu_default.peak_phase == "optimizer"
    assert cuda.peak_allocated_bytes > cpu_default.peak_allocated_bytes
    foreach_off = predict_memory(job.with_run(techniques=("foreach-off",)))
    steps = 512 * len(list(load_workload("vit-tiny").build_model().parameters()))
    assert foreach_off.peak_allocated_bytes == cpu_default.peak_allocated_bytes + 2 * 32 * 2**20 - steps


def test_prediction_record_is_labelled_and_says_what_it_cannot_see():
    record = predict(spec("vit-tiny", batch_size=2, device="cuda"))
    assert record.status == "ok" and record.predicted is True and record.predicted_for == "cuda"
    # What a CPU prediction cannot see, named by hand: the CUDA context, workspaces outside the caching allocator,
    # and that reserved memory is a simulation.
    for blind_spot in ("CUDA context", "workspaces outside the caching allocator", "reserved memory is simulated"):
        assert any(blind_spot in line for line in record.cannot_see), blind_spot
    assert record.timing is None and record.memory.reserved_method.startswith("simulated")


@pytest.mark.slow
def test_cuda_only_techniques_are_validated_against_the_target_not_this_cpu(tmp_path, capsys):
    """predict targets CUDA: a CUDA-only technique is accepted (not refused because this machine is a CPU), and
    one whose device memory a CPU prediction cannot separate from host memory says so in its own row."""
    out = tmp_path / "pred"
    code = cli.main(["predict", "--workload", "gpt-tiny", "--batch-size", "2", "--techniques",
                     "expandable-segments,fsdp-offload", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 1  # one run could not be predicted
    from membench.results import read_result

    assert read_result(out / "expandable-segments.json").status == "ok"
    offload = read_result(out / "fsdp-offload.json")
    assert offload.status == "error" and "host and device" in offload.error and offload.traceback is None
    assert "Traceback" not in captured.err
    assert cli.main(["predict", "--workload", "gpt-tiny", "--device", "cpu", "--techniques", "fsdp-offload",
                     "--out", str(tmp_path / "refused")]) == 2


def test_cli_predict_writes_predictions_apart_and_labels_the_table(tmp_path, capsys):
    out = tmp_path / "pred"
    code = cli.main(["predict", "--workload", "vit-tiny", "--batch-size", "4", "--techniques", "ckpt",
                     "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0
    assert "predicted alloc MiB" in text and "PREDICTED (no timing) for H100" in text and "not seen:" in text
    assert sorted(p.name for p in out.glob("*.json")) == ["baseline.json", "ckpt.json"]


def test_the_gpu_predicted_for_sizes_the_workspaces_and_is_recorded_and_printed(tmp_path, capsys):
    """Two cuBLAS workspaces in a training step: 32 MiB each on an H100, 8,519,680 B each on an A100, so the
    same step's peak differs by exactly twice the difference."""
    peaks = {}
    for name in ("H100", "a100"):
        out = tmp_path / name
        assert cli.main(["predict", "--workload", "vit-tiny", "--batch-size", "2", "--techniques", "baseline",
                         "--gpu", name, "--out", str(out)]) == 0
        record = read_result(out / "baseline.json")
        peaks[record.spec.run.gpu] = record.memory.peak_allocated_bytes
    text = capsys.readouterr().out
    assert "for H100 (sm90" in text and "for A100 (sm80" in text
    assert peaks["H100"] - peaks["A100"] == 2 * (32 * 2**20 - 8_519_680)
    with pytest.raises(SystemExit) as exit_:  # argparse's usage error: exit 2
        cli.main(["predict", "--gpu", "B9000"])
    assert exit_.value.code == 2 and "unknown GPU 'B9000'; valid: H100" in capsys.readouterr().err


def test_unknown_technique_is_a_usage_error(tmp_path, capsys):
    assert cli.main(["predict", "--workload", "vit-tiny", "--techniques", "nope", "--out", str(tmp_path)]) == 2
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
        job = spec("gpt-tiny", (shard_technique,), batch_size=2, nproc_per_node=ranks, device="cuda")
        assert predict(job).world_size == ranks
        peaks[ranks] = predict_memory(job)
    assert not torch.distributed.is_initialized()  # the fake group is torn down after each prediction
    # Adam's state is sharded: each rank holds 1/N of it (up to the padding of uneven shards)
    state = {n: m.breakdown_at_peak["optimizer_state"] for n, m in peaks.items()}
    assert state[1] / 2.2 < state[2] < state[1] / 1.8 and state[1] / 4.5 < state[4] < state[1] / 3.5
    assert peaks[1].peak_allocated_bytes > peaks[2].peak_allocated_bytes > peaks[4].peak_allocated_bytes


def test_fsdp_prediction_at_world_size_1_equals_a_real_gloo_run(shard_technique):
    import torch.distributed as dist
    import torch.distributed.fsdp  # noqa: F401 - before the tracker starts, so it sees FSDP's storage frees

    predicted = predict_memory(spec("gpt-tiny", (shard_technique,), batch_size=2), round_to=1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        measured = measure("gpt-tiny", (shard_technique,), batch_size=2).memory
    finally:
        dist.destroy_process_group()
    assert predicted.peak_allocated_bytes == measured.peak_allocated_bytes


def test_a_table_mixing_kinds_labels_each_prediction(tmp_path):
    from membench.report.table import render
    from membench.results.sweep import Sweep

    job = spec("vit-tiny", batch_size=2)
    measured = worker.run(job, tmp_path / "baseline.json")
    predicted = predict(job.with_run(techniques=("ckpt",)))
    text = render(Sweep.group([measured, predicted]))
    # Apart: a prediction is never compared with a measurement, and its table says "predicted".
    measured_table, predicted_table = text.split("\n\n")[:2]
    assert "vit-tiny, batch 2, cpu:" in measured_table and "peak alloc MiB" in measured_table
    assert "vit-tiny, batch 2, cpu (predicted):" in predicted_table and "predicted alloc MiB" in predicted_table
    assert "ckpt" in predicted_table and "ckpt" not in measured_table


def test_cuda_prediction_carries_simulated_reserved_memory():
    job = spec("gpt-tiny", batch_size=4, device="cuda")
    memory = predict_memory(job)
    assert memory.peak_reserved_bytes >= memory.peak_allocated_bytes
    # Default settings: every segment is 2 MiB (small pool), 20 MiB, or a large request rounded up to 2 MiB.
    assert memory.peak_reserved_bytes % (2 * 2**20) == 0
    assert memory.allocator_settings == "default" and memory.segments_allocated > 0
    expandable = predict_memory(job.with_run(techniques=("expandable-segments",)))
    assert expandable.allocator_settings == "expandable_segments:True"
    assert expandable.peak_allocated_bytes == memory.peak_allocated_bytes  # the technique changes no tensor
    assert predict_memory(job.with_run(device="cpu")).peak_reserved_bytes is None  # a CPU has no caching allocator


def test_the_allocation_trace_replays_to_the_trackers_live_bytes():
    """The trace the simulator reads and the tracker's own count are two records of one history: replayed with the
    tracker's rounding, the trace ends at exactly the tracker's live bytes."""
    from membench.trackers.memory import CpuMeter
    from tests.helpers import session_for

    meter = CpuMeter(round_to=512, trace=True)
    session = session_for(spec("vit-tiny", ("opt-in-bwd",), batch_size=2).run, meter=meter)
    session.build()
    session.warm_up(1)
    session.measure(1)
    live: dict = {}
    for event in meter.tracker.trace:
        if event.kind == "alloc":
            live[event.key] = -(-event.size // 512) * 512
        else:
            del live[event.key]
    assert sum(live.values()) == meter.tracker.current > 0


def test_fit_searches_by_reserved_for_cuda_and_refuses_it_for_cpu(capsys):
    assert cli.main(["fit", "--workload", "vit-tiny", "--techniques", "baseline", "--budget", "8MiB",
                     "--max-batch", "16"]) == 0
    assert "predicted peak reserved" in capsys.readouterr().out
    assert cli.main(["fit", "--workload", "vit-tiny", "--device", "cpu", "--by", "reserved", "--budget", "8MiB"]) == 2
    assert "--by reserved needs --device cuda" in capsys.readouterr().err


def test_a_run_that_cannot_be_predicted_says_why_on_its_line(tmp_path, capfd):
    """The reason is in the record and on the run's `predicted NAME: error` line, not only in the JSON."""
    code = cli.main(["predict", "--workload", "gpt-tiny", "--batch-size", "2", "--techniques", "fsdp-offload",
                     "--jobs", "1", "--out", str(tmp_path / "pred")])
    err = capfd.readouterr().err
    assert code == 1
    line = next(line for line in err.splitlines() if line.startswith("predicted fsdp-offload: error"))
    assert line.endswith(": cannot predict: fsdp-offload moves tensors between host and device memory, which a "
                         "prediction on CPU cannot tell apart: measure it on a GPU")


@pytest.mark.parametrize("version, refused", [("2.9.1+cu128", True), ("2.11.0+cu130", False)])
def test_fsdp_is_predicted_only_under_the_torch_releases_it_was_checked_on(version, refused, monkeypatch):
    """Under torch 2.9.1 FSDP2 fails on fake tensors (a real run works): a prediction of it says so instead."""
    monkeypatch.setattr("membench.techniques._installed_torch", lambda: version)
    record = predict(spec("gpt-tiny", ("fsdp",), batch_size=2, device="cuda"))
    if refused:
        assert record.status == "error" and record.traceback is None
        assert record.error == ("cannot predict: predicting fsdp needs torch >= 2.11 (checked on 2.11 and 2.14; "
                                "under torch 2.9.1 FSDP2 fails on fake tensors); this is torch 2.9.1+cu128: measure "
                                "it with membench run, which trains it there")
    else:
        assert record.status == "ok", record.error
