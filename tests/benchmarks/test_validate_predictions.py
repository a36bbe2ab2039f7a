"""benchmarks/validate_predictions.py without the real GPU traces beside the repository: it says so in one line and
exits 3, never 0 (a script that checked nothing must not pass for one that checked; validate_allocator.py's case is in
tests/allocator/test_simulator.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_without_the_traces_it_checks_nothing_and_says_so_with_exit_3(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "validate_predictions.py"), "--truth",
                           str(tmp_path / "absent"), "--skip-hf"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 3
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1 and "absent" in lines[0] and "nothing checked, exit 3" in lines[0], lines
