"""The real CUDA path. Skipped (with the reason) where torch sees no GPU."""

import pytest

from membench.cli import main
from membench.results import read_result

pytestmark = pytest.mark.gpu


def test_cuda_sweep_records_allocator_and_driver_memory(tmp_path):
    assert main(["run", "--device", "cuda", "--workload", "vit-tiny", "--batch-size", "8", "--steps", "3",
                 "--techniques", "accum,ckpt,opt-in-bwd", "--out", str(tmp_path)]) == 0
    for name in ("baseline", "accum", "ckpt", "opt-in-bwd"):
        r = read_result(tmp_path / f"{name}.json")
        mem = r.memory
        assert r.status == "ok" and mem.device == "cuda"
        assert 0 < mem.peak_allocated_bytes <= mem.peak_reserved_bytes < mem.driver_used_bytes
        assert mem.alloc_retries >= 0 and r.env.cuda


def test_vit_l_16_opt_in_bwd_lowers_the_tutorial_peak(tmp_path):
    """The reference tutorial: vit_l_16 + Adam at batch 1 peaks at ~6 GB in the optimizer step, ~4 GB with the
    step fused into backward."""
    assert main(["run", "--device", "cuda", "--workload", "vit_l_16", "--batch-size", "1", "--steps", "3",
                 "--techniques", "opt-in-bwd", "--out", str(tmp_path)]) == 0
    base, fused = read_result(tmp_path / "baseline.json"), read_result(tmp_path / "opt-in-bwd.json")
    assert base.memory.peak_phase == "optimizer"
    assert fused.memory.peak_allocated_bytes < 0.8 * base.memory.peak_allocated_bytes


def _batch(n, generator):
    import torch

    return torch.randn(n, 64, generator=generator), torch.randint(10, (n,), generator=generator)


# --- Issue 22: what only a GPU shows. Each would have caught one item of the CUDA review on its first GPU run. ---
def test_a_notebook_run_after_is_available_still_writes_records(tmp_path):
    """Item 1: a notebook asks torch.cuda.is_available() first (poisoning fork); its model-function runs must then
    run without forking (or fork before CUDA starts) and still write every record."""
    import warnings

    import torch
    from torch import nn

    from membench import api

    assert torch.cuda.is_available()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an InProcessWarning is the documented way out
        # accum, not ckpt: a bare nn.Linear declares no blocks to checkpoint, and ckpt of it is refused before
        # anything runs, so the path this test is for would never run.
        frame = api.run_sweep(lambda: nn.Linear(64, 10), "accum", batch_size=4, device="cuda", out=tmp_path,
                              make_batch=_batch, steps=2, accum_steps=2, progress=False)
    assert list(frame["run"]) == ["baseline", "accum"] and set(frame["status"]) == {"ok"}, \
        frame[["run", "status", "error"]].to_string()


def test_more_ranks_than_gpus_is_one_line_before_anything_runs(tmp_path, capsys):
    """Item 2: ranks are checked against the GPUs present, not discovered by a dead torchrun."""
    import torch

    n = torch.cuda.device_count()
    assert main(["run", "--device", "cuda", "--workload", "gpt-tiny", "--techniques", "fsdp",
                 "--nproc-per-node", str(n + 1), "--out", str(tmp_path)]) == 2
    assert f"{n} CUDA GPU" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.json"))


def test_fsdp_on_cpu_on_a_gpu_machine_trains_on_cpu(tmp_path):
    """Item 2: --device cpu --techniques fsdp on a GPU machine shards on a CPU mesh (torch's default mesh would
    take the accelerator)."""
    assert main(["run", "--device", "cpu", "--workload", "gpt-tiny", "--batch-size", "4", "--steps", "2",
                 "--techniques", "fsdp", "--nproc-per-node", "2", "--out", str(tmp_path)]) == 0
    record = read_result(tmp_path / "fsdp.json")
    assert record.status == "ok" and record.memory.device == "cpu"


def test_the_check_of_a_large_model_does_not_turn_a_finished_run_into_oom(tmp_path):
    """Item 3: the measured state is freed before the equivalence check trains its two models; a failure of the
    check is the check's verdict, never the run's status."""
    assert main(["run", "--device", "cuda", "--workload", "vit_l_16", "--batch-size", "1", "--steps", "2",
                 "--techniques", "opt-in-bwd", "--out", str(tmp_path)]) == 0
    record = read_result(tmp_path / "opt-in-bwd.json")
    assert record.status == "ok"
    assert record.equivalence is not None and record.equivalence.verdict != "failed", record.equivalence


def test_the_timeline_of_an_offload_run_counts_device_memory_only(tmp_path):
    """Item 4: opt-offload keeps optimizer state in pinned host memory; the CUDA timeline must not count it, so
    the timeline's peak cannot exceed what the allocator itself reported."""
    assert main(["run", "--device", "cuda", "--workload", "vit-tiny", "--batch-size", "8", "--steps", "2",
                 "--techniques", "opt-offload", "--timeline", "--out", str(tmp_path)]) == 0
    record = read_result(tmp_path / "opt-offload.json")
    assert record.status == "ok" and record.timeline is not None
    assert record.timeline.peak_bytes <= record.memory.peak_allocated_bytes


def test_an_in_process_cuda_run_leaves_no_memory_fraction_behind(tmp_path):
    """Item 9: --memory-budget sets the per-process memory fraction; a run in this process must undo it."""
    import warnings

    import torch
    from torch import nn

    from membench import api

    total = torch.cuda.get_device_properties(0).total_memory
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        api.run_sweep(lambda: nn.Linear(64, 10), None, batch_size=4, device="cuda", out=tmp_path, steps=2,
                      make_batch=_batch,
                      memory_budget=2**30, progress=False)
    # A fraction still set would refuse this allocation of more than 1 GiB.
    big = torch.empty(min(2 * 2**30, total // 2), dtype=torch.uint8, device="cuda")
    del big


def test_a_checkpointed_dropout_is_recomputed_inside_the_recorded_history(tmp_path):
    """ckpt's recording pass on hf:gpt2 (torch 2.11, H200): checkpoint's early stop raised from a pack hook after
    CUDA's dropout allocated its output, and a stack taken at that output's free lost the exception ("SystemError:
    <built-in method dropout ...> returned NULL without setting an exception"). The history takes none at frees."""
    import torch
    from torch.utils.checkpoint import checkpoint

    from membench.trackers import cuda

    layer = torch.nn.Linear(64, 64).cuda()
    x = torch.randn(8, 64, device="cuda", requires_grad=True)
    with cuda.recorded_history(tmp_path / "r.snapshot.pickle"):
        y = checkpoint(lambda t: torch.nn.functional.dropout(layer(t), 0.1, True), x, use_reentrant=False)
        y.sum().backward()
    assert x.grad is not None and (tmp_path / "r.snapshot.pickle").exists()
