"""fit --by device: the budget is the whole card, so the CUDA context and NCCL's buffers come off it first."""

from __future__ import annotations

import pytest

from membench import cli
from membench.predict.device import outside_allocator
from membench.spec import RunSpec

CONTEXT = 804_061_184  # measured on an H200 (torch 2.11), as predict/device.py takes it
# One communicator: 16 channels x 1 peer x (Simple 4 MiB + LL 8*512*8*16 B + LL128 120*640*8*8 B), NCCL src/init.cc
NCCL_ONE = 16 * (4 * 2**20 + 8 * 512 * 8 * 16 + 120 * 640 * 8 * 8)


def test_what_a_rank_holds_outside_the_allocator_by_hand():
    assert outside_allocator(RunSpec("tests.workloads:mlp", 8, ())) == CONTEXT
    assert outside_allocator(RunSpec("tests.workloads:mlp", 8, ("fsdp",), nproc_per_node=8)) == CONTEXT + NCCL_ONE
    # HSDP 2 x 4: the world's communicator and one per mesh dimension
    hsdp = RunSpec("tests.workloads:mlp", 8, ("fsdp",), nproc_per_node=8, mesh="dp_replicate=2,dp_shard=4")
    assert outside_allocator(hsdp) == CONTEXT + 3 * NCCL_ONE


def _table(capsys, *args) -> tuple[dict[str, list[str]], str]:
    code = cli.main(["fit", "--workload", "vit-tiny", "--techniques", "ckpt", "--max-batch", "16", *args])
    out = capsys.readouterr().out
    assert code == 0, out
    rows = [line.split("  ") for line in out.splitlines()[2:4]]
    return {row[0]: [c.strip() for c in row[1:] if c.strip()] for row in rows}, out


def _mib(text: str) -> float:
    assert text.endswith(" MiB"), text
    return float(text.split()[-2])


@pytest.mark.slow  # two fits, about 25 s each on a 2-core CPU
def test_fit_by_device_answers_as_reserved_under_the_budget_less_the_context(capsys):
    # 67 MiB of reserved memory falls between batch 1 (66 MiB: vit-tiny's cuBLAS workspaces and more) and 16
    by_reserved, _ = _table(capsys, "--budget", "67MiB")
    by_device, out = _table(capsys, "--by", "device", "--budget", str(67 * 2**20 + CONTEXT))
    assert by_device.keys() == by_reserved.keys() == {"baseline", "ckpt"}
    for run, (batch, peak, over, *_) in by_reserved.items():
        assert 0 < int(batch) < 16
        device_batch, device_peak, device_over, *_ = by_device[run]
        # the same batch and first batch over; each peak the reserved one + the context (766.81 MiB)
        assert device_batch == batch and device_over.split(":")[0] == over.split(":")[0]
        assert _mib(device_peak) == round(_mib(peak) + CONTEXT / 2**20, 2)  # printed to 0.01 MiB
        assert _mib(device_over) == round(_mib(over) + CONTEXT / 2**20, 2)
    assert "PREDICTED (no timing)" in out and "peaks include the estimated CUDA context" in out


def test_fit_by_device_needs_cuda(capsys):
    assert cli.main(["fit", "--workload", "vit-tiny", "--device", "cpu", "--by", "device", "--budget", "1GiB"]) == 2
    assert "--by device needs --device cuda" in capsys.readouterr().err
