"""benchmarks/trace_differences.py: a committed H200 trace set beside its prediction, event for event."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import trace_differences  # noqa: E402

ARCHIVE = ROOT / "results" / "gpu-traces" / "NVIDIA-H200_torch2.11.0.tar.xz"


@pytest.mark.skipif(not torch.__version__.startswith("2.14"), reason="the difference below is 2.14's rule")
def test_gpt_tiny_under_2_14_differs_from_its_2_11_trace_by_the_cublaslt_workspace_alone(tmp_path):
    with tarfile.open(ARCHIVE) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith("NVIDIA-H200_torch2.11.0/run-1/gpt-tiny_baseline")]
        tar.extractall(tmp_path, members=members, filter="data")
    row = trace_differences.compare_one(next(tmp_path.rglob("gpt-tiny_baseline.json")))
    # 2.11 gave cuBLASLt a 1 MiB workspace of its own at the first linear layer's addmm; 2.14's cuBLASLt shares
    # cuBLAS's (gpus.cublaslt_workspace_bytes): one allocation the 2.14 prediction does not make, all else equal.
    assert not row.error and row.torch == "2.11.0+cu130" and row.events > 600
    assert row.differences == 1 and "('A', 1048576)" in row.first and "linear.py" in row.first


def test_bad_arguments_are_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "not-an-archive.tar.xz"
    bad.write_text("no")
    for args, says in ((["--jobs", "0"], "--jobs 0"), ([str(bad)], "cannot read")):
        done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "trace_differences.py"), *args],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and says in done.stderr


def test_a_corrupt_case_is_its_own_row(tmp_path):
    (tmp_path / "run-1").mkdir()
    record = tmp_path / "run-1" / "broken.json"
    record.write_text("{not json")
    (tmp_path / "run-1" / "broken.snapshot.pickle.xz").write_bytes(b"not xz")
    row = trace_differences.compare_one(record)
    assert row.case == "run-1/broken" and row.error.startswith("JSONDecodeError") and not row.events
    record.write_text('{"environment": {"torch": "2.11.0"}, "job": {}}')
    assert trace_differences.compare_one(record).error.startswith("LZMAError")
