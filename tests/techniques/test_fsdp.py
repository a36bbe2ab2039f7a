"""FSDP2 at world size 2 on CPU, through the real launcher and torchrun (gloo)."""

from __future__ import annotations

import pytest

from membench.cli import main
from membench.common.errors import UserError
from membench.launch.process import command_for
from membench.results import read_result
from membench.spec import Job, LaunchSpec, RunSpec
from membench.techniques import resolve
from tests.helpers import adam_step_bytes, measure


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp")
    code = main(["run", "--device", "cpu", "--workload", "gpt-tiny", "--batch-size", "2", "--techniques", "fsdp",
                 "--nproc-per-node", "2", "--steps", "1", "--warmup", "1", "--out", str(out)])
    return code, out


def test_fsdp_runs_at_world_size_2_through_torchrun(fsdp_run):
    code, out = fsdp_run
    assert code == 0, (out / "runs" / "fsdp.log").read_text()[-3000:]
    result = read_result(out / "fsdp.json")
    assert result.status == "ok" and result.world_size == 2
    assert [r.rank for r in result.ranks] == [0, 1]


def test_fsdp_records_per_rank_peaks_with_half_the_state(fsdp_run):
    _, out = fsdp_run
    fsdp, base = (read_result(out / f"{n}.json") for n in ("fsdp", "baseline"))
    base_bd = base.memory.breakdown_at_peak
    for rank in fsdp.ranks:
        assert rank.peak_allocated_bytes > 0 and rank.median_s > 0
        # gpt-tiny's every parameter has an even first dimension: each rank holds exactly half.
        assert rank.breakdown_at_peak["parameters"] * 2 == base_bd["parameters"]
        steps = adam_step_bytes()
        assert (rank.breakdown_at_peak["optimizer_state"] - steps) * 2 == base_bd["optimizer_state"] - steps
    # Aggregate throughput: both ranks' samples per step.
    assert fsdp.timing.samples_per_s == pytest.approx(2 * 2 / fsdp.timing.median_s)
    assert base.world_size is None  # the baseline stays a single-process run


def test_fsdp_trains_the_same_model(fsdp_run):
    _, out = fsdp_run
    eq = read_result(out / "fsdp.json").equivalence
    assert eq.verdict == "equivalent", eq
    assert "2 ranks against one process at batch 4" in eq.compared


def test_torchrun_command_takes_multi_node_arguments(tmp_path):
    job = Job(RunSpec("gpt-tiny", 2, ("fsdp",), nproc_per_node=4),
              launch=LaunchSpec(torchrun_args="--nnodes=2 --rdzv-endpoint=h:29500"))
    cmd = command_for(job, resolve(job.run), tmp_path / "s.json", tmp_path / "r.json")
    assert cmd[1:6] == ["-m", "torch.distributed.run", "--nproc-per-node=4", "--nnodes=2", "--rdzv-endpoint=h:29500"]
    single = RunSpec("gpt-tiny", 2, ("fsdp",))
    assert "--standalone" in command_for(Job(single), resolve(single), tmp_path / "s", tmp_path / "r")


def test_fsdp_outside_torchrun_is_a_clear_error():
    with pytest.raises(UserError, match="runs under torchrun"):
        measure("gpt-tiny", ("fsdp",))
