"""`membench predict --jobs N`: the configurations predicted in processes forked from the loaded workload, with the
output and the records of the serial loop (`--jobs 1`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "membench", *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ))


def _records(folder) -> dict[str, dict]:
    """Each record as written, less what differs between any two runs (when, how long, where)."""
    records = {}
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text())
        for key in ("started", "wall_s", "env"):
            record.pop(key, None)
        records[path.name] = record
    return records


def test_predict_with_two_jobs_prints_and_writes_what_one_does(tmp_path):
    runs = [_cli("predict", "--workload", "gpt-tiny", "--batch-size", "2", "--techniques", "ckpt,opt-in-bwd",
                 "--jobs", jobs, "--out", str(tmp_path / jobs)) for jobs in ("1", "2")]
    for proc in runs:
        assert proc.returncode == 0, proc.stderr[-2000:]
    serial, parallel = runs
    assert parallel.stdout.replace(str(tmp_path / "2"), "OUT") == serial.stdout.replace(str(tmp_path / "1"), "OUT")
    seconds = re.compile(r"\(\d+\.\d s\)")  # each prediction's own time, on stderr
    assert seconds.sub("", parallel.stderr) == seconds.sub("", serial.stderr)
    assert [line.split(":")[0] for line in serial.stderr.splitlines()] == [
        "predicting baseline ...", "predicted baseline", "predicting ckpt ...", "predicted ckpt",
        "predicting opt-in-bwd ...", "predicted opt-in-bwd"]
    assert _records(tmp_path / "2") == _records(tmp_path / "1") and len(_records(tmp_path / "1")) == 3


def test_a_configuration_whose_process_dies_is_one_line_naming_it():
    proc = _cli("predict", "--workload", "tests.workloads:killed_in_step", "--device", "cpu", "--techniques",
                "accum", "--jobs", "2", timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("membench: error: predicting baseline ") and "killed by signal 9" in last, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
