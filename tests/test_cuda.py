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
