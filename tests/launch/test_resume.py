"""--resume reuses only runs measured with the same spec."""

from __future__ import annotations

import pytest

from membench.results import read_result
from tests.helpers import run_tiny

# --- resume reuses only runs of the same spec -----------------------------------------------------------------

@pytest.mark.slow
def test_resume_reuses_only_runs_measured_with_the_same_spec(tmp_path, capsys):
    assert run_tiny("--out", str(tmp_path), "--optimizer", "adam") == 0
    first = read_result(tmp_path / "baseline.json")
    capsys.readouterr()
    assert run_tiny("--out", str(tmp_path), "--optimizer", "sgd", "--batch-size", "8", "--resume") == 0
    again = read_result(tmp_path / "baseline.json")
    assert again.started != first.started
    assert again.spec.run.optimizer == "sgd" and again.spec.run.batch_size == 8
    err = capsys.readouterr().err
    assert "baseline: not resumed" in err and "optimizer 'adam' -> 'sgd'" in err and "batch_size 4 -> 8" in err
    # The same spec again: kept, and said so.
    assert run_tiny("--out", str(tmp_path), "--optimizer", "sgd", "--batch-size", "8", "--resume") == 0
    assert read_result(tmp_path / "baseline.json").started == again.started
    assert "(resumed) baseline: ok" in capsys.readouterr().err
