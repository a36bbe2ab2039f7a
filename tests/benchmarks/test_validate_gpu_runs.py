"""benchmarks/validate_gpu_runs.py on the committed H200 runs: it re-predicts a run from its own record and prints
the measured and predicted peaks side by side; without an archive it says so and exits 1."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "validate_gpu_runs.py"
ARCHIVE = ROOT / "results" / "gpu-runs" / "NVIDIA-H200_torch2.11.0.tar.xz"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


def test_a_recorded_run_is_predicted_beside_its_measurement():
    done = _run(str(ARCHIVE), "--only", "predicted-vs-measured-gpt-tiny/baseline", "--jobs", "1")
    assert done.returncode == 0, done.stderr
    (row,) = [line for line in done.stdout.splitlines() if line.startswith("gpt-tiny/")]
    cells = row.split()
    assert cells[1] == "2.11.0+cu130" and cells[2] == "75,880,960"  # what the H200 measured
    assert "1 of 1 runs predicted" in done.stdout


def test_a_run_not_predicted_says_why_and_nothing_matching_is_an_error(tmp_path):
    done = _run(str(ARCHIVE), "--only", "cudaMallocAsync/", "--jobs", "1")
    assert done.returncode == 0 and "not predicted: ran with PYTORCH_CUDA_ALLOC_CONF=backend:c..." in done.stdout
    done = _run(str(ARCHIVE), "--only", "no such run")
    assert done.returncode == 1 and "no run that measured in one process matching 'no such run'" in done.stdout
    assert _run("--jobs", "0").returncode == 2
    (tmp_path / "junk.tar.xz").write_text("not an archive")
    for bad in (tmp_path / "junk.tar.xz", tmp_path / "absent.tar.xz"):
        done = _run(str(bad))
        assert done.returncode == 2 and "cannot read" in done.stderr and "Traceback" not in done.stderr


def test_an_archive_with_a_malformed_result_is_one_line_and_exit_2(tmp_path, capsys):
    """A member that is not a result (malformed JSON) is one line naming the archive, not a traceback."""
    import io
    import tarfile

    import pytest

    from benchmarks import validate_gpu_runs

    archive = tmp_path / "bad.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        data = b"{ not json"
        info = tarfile.TarInfo("case/baseline.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(SystemExit) as stop:
        validate_gpu_runs.main([str(archive)])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "cannot read" in err and "Traceback" not in err
