"""benchmarks/gpu_acceptance.py on this CPU machine: it stops where it needs a GPU, in one line, with its exit code;
what it decides from the records of its runs, and the one file it writes, on records made by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from membench import environment
from membench.results import Environment, Memory, PredictionCheck, RunRecord
from tests.helpers import spec

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_acceptance as ga  # noqa: E402


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine runs the checks instead")
def test_without_a_gpu_it_says_so_in_one_line_and_writes_nothing(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_acceptance.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == ga.NO_GPU_EXIT == 3
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_acceptance: no CUDA GPU here") and "exit 3" in lines[0]
    assert not list(tmp_path.iterdir())


def _record(name: str, status: str = "ok", within: bool | None = True) -> RunRecord:
    record = RunRecord(name=name, status=status, spec=spec("tests.workloads:mlp", device="cuda"))
    record.memory = Memory(device="cuda", method="m", peak_phase="backward", peak_step=1,
                           peak_allocated_bytes=1000, peak_reserved_bytes=2048)
    if within is not None:
        record.prediction = PredictionCheck(status="ok", target="H100", tolerance=0.01, within=within,
                                            allocated_error=0.0 if within else 0.5, reserved_error=0.0)
    return record


def test_predicted_vs_measured_passes_only_when_every_run_is_ok_and_within_the_tolerance():
    assert ga._predicted_within({"baseline": _record("baseline"), "ckpt": _record("ckpt")}, 0)[0]
    ok, detail = ga._predicted_within({"baseline": _record("baseline"), "ckpt": _record("ckpt", within=False)}, 0)
    assert not ok and "+50.000%" in detail
    assert not ga._predicted_within({"baseline": _record("baseline", within=None)}, 0)[0]  # no prediction made
    assert not ga._predicted_within({"baseline": _record("baseline", "error")}, 1)[0]
    assert not ga._all_ok({}, 0)[0]  # no record at all is no pass
    assert ga._oom({"baseline": _record("baseline", "oom")}, 0)[0]
    assert not ga._oom({"baseline": _record("baseline")}, 0)[0]


def test_one_results_file_names_the_gpu_and_torch_and_what_failed(tmp_path, monkeypatch):
    monkeypatch.setattr(environment, "describe", lambda device: Environment(device="cuda",
                                                                          device_name="NVIDIA H100 80GB HBM3"))
    checks = [ga.Check("cuBLAS workspace", "pass", "32 MiB"), ga.Check("reduction scratch", "fail", "differs"),
              ga.Check("SDPA backend and backward scratch", "recorded", "FLASH_ATTENTION")]
    assert ga._write(tmp_path, checks, 12.0) == 1
    (written,) = tmp_path.iterdir()
    assert written.name == f"NVIDIA-H100-80GB-HBM3_torch{torch.__version__.split('+')[0]}.json"
    data = json.loads(written.read_text())
    assert data["failed"] == ["reduction scratch"] and len(data["checks"]) == 3
    assert data["environment"]["device_name"] == "NVIDIA H100 80GB HBM3"
    assert ga._write(tmp_path, checks[:1], 1.0) == 0


def test_a_check_that_raises_is_its_own_row():
    def broken():
        raise RuntimeError("no such kernel")

    row = ga._timed(broken, "reduction scratch")
    assert (row.name, row.status) == ("reduction scratch", "error") and "no such kernel" in row.detail
