"""The user's code never runs in `membench run`'s own process: a factory that hangs, aborts or raises while
loading is one line and exit 2 before any run (the probe runs it in a child, under --timeout); and the CPU memory
budget holds for the whole run, not only the measured step."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from membench.results import read_result

FAST = ["--batch-size", "2", "--techniques", "baseline", "--steps", "1", "--warmup", "1", "--no-check",
        "--no-timeline", "--device", "cpu"]


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "membench", "run", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("factory, message", [
    pytest.param("factory_hangs", "did not load within 30 s", marks=pytest.mark.slow),  # waits out the 30 s
    ("factory_aborts", "crashed while loading (signal 6)"),
    ("factory_raises", "raised ValueError: could not open shard [/data/train-000.tar]"),
    ("not_a_workload", "must return membench.workloads.Workload"),
])
def test_a_bad_factory_is_one_line_before_anything_runs(tmp_path, factory, message):
    start = time.monotonic()
    proc = run("--workload", f"tests.workloads:{factory}", *FAST, "--timeout", "30", "--out", str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert time.monotonic() - start < 120
    assert not (tmp_path / "out" / "baseline.json").exists()


def test_planning_does_not_import_the_users_module(monkeypatch, tmp_path):
    from membench.api import plan

    (tmp_path / "userpkg_probe_only.py").write_text("from tests.workloads import mlp\n\n\ndef f():\n    return mlp()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{':'.join(sys.path)}")
    jobs = plan("userpkg_probe_only:f", "baseline", batch_size=2, device="cpu")
    assert [j.name for j in jobs] == ["baseline"]
    assert "userpkg_probe_only" not in sys.modules


@pytest.mark.slow
def test_a_leak_during_the_timed_steps_passes_no_budget(tmp_path):
    """The leak stays under the budget in the measured step and passes it in the timed steps: the whole run is
    under the budget, so it ends as an OOM, not as ok."""
    out = tmp_path / "out"
    proc = run("--workload", "tests.workloads:leaking", "--batch-size", "2048", "--techniques", "baseline",
               "--steps", "20", "--warmup", "1", "--no-check", "--no-timeline", "--device", "cpu",
               "--memory-budget", "96MiB", "--out", str(out), timeout=300)
    record = read_result(out / "baseline.json")
    assert record.status == "oom", (record.status, record.error, proc.stderr[-2000:])
    assert "during time" in record.error and "budget" in record.error
    assert record.memory is not None and record.memory.peak_allocated_bytes <= 96 * 2**20


@pytest.mark.slow
def test_a_timeout_leaves_no_temporary_folder_behind(tmp_path, monkeypatch):
    """predict's child (and fit's forked workers, membench-pool-*) make temporary folders; a timeout kills the
    child's session with SIGKILL, which runs no cleanup: their folders live inside the parent's own temporary
    folder (TMPDIR), removed when the command ends."""
    from tests.helpers import cli

    (tmp_path / "hang.py").write_text(
        "import pathlib, tempfile, time\n\n\n"
        "def workload():\n"
        "    made = tempfile.mkdtemp(prefix='membench-pool-')\n"
        "    pathlib.Path('made.txt').write_text(made)\n"
        "    time.sleep(600)\n")
    monkeypatch.chdir(tmp_path)
    done = cli("predict", "--workload", "hang:workload", "--device", "cpu", "--timeout", "60")
    assert done.returncode == 2 and "did not finish within 60 s" in done.stderr, done.stderr
    made = Path((tmp_path / "made.txt").read_text())
    assert made.name.startswith("membench-pool-") and not made.exists()
