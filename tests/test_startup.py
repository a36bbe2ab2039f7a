"""Start-up: the commands that run no training step answer without importing torch (3 s of a 3.5 s `--version`
before), and the report without matplotlib unless it draws a chart. Each case runs in a fresh interpreter, since
this test process has imported torch long ago."""

from __future__ import annotations

import importlib.metadata
import json
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.allocator.test_simulator import hand_made_snapshot

ROOT = Path(__file__).resolve().parent.parent

# Runs `membench.cli.main(argv)` and prints which heavy modules it left imported, as one JSON line on stderr.
PROBE = """
import json, sys
from membench.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as stop:
    code = stop.code
print("MODULES " + json.dumps({m: m in sys.modules for m in ("torch", "matplotlib", "torchvision")}),
      file=sys.stderr)
sys.exit(code or 0)
"""


def loaded(args: list[str], cwd: Path) -> dict[str, bool]:
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    line = next((x for x in done.stderr.splitlines() if x.startswith("MODULES ")), None)
    assert line is not None, done.stderr[-2000:]
    assert done.returncode in (0, 1), (args, done.returncode, done.stderr[-2000:])
    return json.loads(line.removeprefix("MODULES "))


def test_importing_the_cli_and_the_registries_leaves_torch_out():
    code = ("import sys, membench, membench.cli, membench.techniques, membench.workloads, membench.predict.gpus, "
            "membench.spec; print(sorted(m for m in ('torch', 'matplotlib', 'numpy') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.fixture
def results(tmp_path) -> Path:
    folder = tmp_path / "results"  # one sweep: the report is written straight into --out
    shutil.copytree(ROOT / "results" / "ci-baseline" / "vit-tiny-bs4", folder)
    return folder


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["techniques"], ["list"], ["run", "--help"],
                                  ["predict", "--help"], ["fit", "--help"], ["replay", "--help"],
                                  ["report", "--help"], ["compare", "--help"], ["check", "--help"]])
def test_help_version_and_listing_start_without_torch(args, tmp_path):
    assert loaded(args, tmp_path)["torch"] is False


def test_report_compare_check_and_replay_run_without_torch(results, tmp_path):
    snapshot = tmp_path / "snap.pickle"
    snapshot.write_bytes(pickle.dumps(hand_made_snapshot()))
    for args in (["report", str(results), "--no-files"],
                 ["report", str(results), "--out", str(tmp_path / "report")],
                 ["compare", str(results), str(results)],
                 ["check", "--baseline", str(results), str(results), "--rule", "peak_allocated:5%"],
                 ["replay", str(snapshot)]):
        assert loaded(args, tmp_path)["torch"] is False, args
    assert (tmp_path / "report" / "report.html").is_file()


def test_the_report_imports_matplotlib_only_to_draw_a_chart(results, tmp_path):
    assert loaded(["report", str(results), "--no-files"], tmp_path)["matplotlib"] is False
    # With files: the peak chart is drawn, so matplotlib is there for it.
    assert loaded(["report", str(results), "--out", str(tmp_path / "drawn")], tmp_path)["matplotlib"] is True
    # Runs with nothing to draw (every run failed): the HTML report is written without matplotlib.
    failed = tmp_path / "failed"
    failed.mkdir()
    for path in sorted(results.rglob("*.json"))[:2]:
        record = json.loads(path.read_text())
        record.update(status="error", error="failed on purpose", memory=None, timing=None, equivalence=None)
        (failed / path.name).write_text(json.dumps(record))
    assert loaded(["report", str(failed), "--out", str(tmp_path / "bare")], tmp_path)["matplotlib"] is False
    assert (tmp_path / "bare" / "report.html").is_file()


def test_the_pytest_plugin_imports_torch_only_for_its_fixture(tmp_path):
    """pytest loads the plugin in every session of an environment with membench installed (its entry point): a test
    session that never asks for memory_peak pays no torch import; one that does, imports it then."""
    (tmp_path / "test_plain.py").write_text("import sys\n\ndef test_plain():\n    assert 'torch' not in sys.modules\n")
    (tmp_path / "test_fixture.py").write_text(
        "import sys\n\ndef test_fixture(memory_peak):\n    assert 'torch' in sys.modules\n")
    installed = any(e.value == "membench.gate.pytest_plugin" for e in importlib.metadata.entry_points(group="pytest11"))
    plugin = [*([] if installed else ["-p", "membench.gate.pytest_plugin"]), "-p", "no:cacheprovider", "-n", "0", "-q"]
    for name in ("test_plain.py", "test_fixture.py"):
        done = subprocess.run([sys.executable, "-m", "pytest", *plugin, name], capture_output=True, text=True,
                              cwd=tmp_path, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
