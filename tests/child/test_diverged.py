"""A NaN loss is a diverged run, written as strict JSON."""

from __future__ import annotations

import json

import pytest

from membench.results import read_result
from tests.helpers import run_tiny

# --- a NaN loss is a diverged run, written as strict JSON ------------------------------------------------------

@pytest.mark.slow
def test_a_nan_loss_is_diverged_and_the_json_is_strict(tmp_path, capsys):
    args = ("--workload", "tests.workloads:diverging", "--steps", "2", "--out", str(tmp_path))
    assert run_tiny(*args) == 0  # like an OOM: the technique's result, not a failed sweep
    text = (tmp_path / "baseline.json").read_text()
    record = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in a result file"))
    assert record["status"] == "diverged" and record["diverged_at_timed_step"] == 0
    assert "the loss became nan at timed step 1 of 2" in record["error"]
    assert record["timing"]["losses"] == [None, None]
    assert run_tiny(*args, "--resume") == 0  # finished: resume keeps it
    assert read_result(tmp_path / "baseline.json").started == record["started"]
    assert "(resumed) baseline: diverged" in capsys.readouterr().err
