"""The pytest plugin as a user's suite meets it (pytester): the memory_peak fixture measures a block's exact
peak, --membench-save records baselines keyed by test id, and --membench-compare-fail fails a test whose peak
grew past the rule, with one line naming the test, the baseline and the current bytes."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytest_plugins = ["pytester"]
# Each inner run is a subprocess: in-process runs would import torch's own test libraries twice.

# Installed with the entry point, pytest loads the plugin by itself; in a checkout installed before it existed,
# name it explicitly (naming it twice would register it twice).
INSTALLED = any(e.value == "membench.gate.pytest_plugin" for e in importlib.metadata.entry_points(group="pytest11"))
PLUGIN = [] if INSTALLED else ["-p", "membench.gate.pytest_plugin"]

USER_TESTS = """
import torch
from torch import nn

SIZE = {size}

def test_step(memory_peak):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, SIZE), nn.ReLU(), nn.Linear(SIZE, 8))
    x = torch.randn(32, 64)
    with memory_peak("forward-backward", model=model) as m:
        model(x).square().sum().backward()
    assert m.peak_bytes > 0

def test_function(memory_peak):
    m = memory_peak(torch.zeros, 1000)
    assert m.peak_bytes == 4000 and m.result.shape == (1000,)
"""


def run(pytester: pytest.Pytester, size: int, *args: str):
    pytester.makepyfile(test_user=USER_TESTS.format(size=size))
    return pytester.runpytest_subprocess(*PLUGIN, "-p", "no:cacheprovider", *args)


def test_entry_point_is_declared():
    text = (ROOT / "pyproject.toml").read_text()  # (tomllib is 3.11+; membench supports 3.10)
    section = text.split("[project.entry-points.pytest11]", 1)[1].split("\n[", 1)[0]
    assert 'membench = "membench.gate.pytest_plugin"' in section


@pytest.mark.slow
def test_save_then_compare_passes_then_a_growth_fails(pytester):
    result = run(pytester, 256, "--membench-save=base")
    result.assert_outcomes(passed=2)
    saved = json.loads(Path(pytester.path, "base", "memory_peaks.json").read_text())
    step = saved["tests"]["test_user.py::test_step"]["forward-backward"]
    assert saved["tests"]["test_user.py::test_function"]["zeros"]["peak_bytes"] == 4000
    assert step["peak_bytes"] > 32 * 256 * 4  # at least the hidden activations
    assert {m["module"] for m in step["top_modules"]} & {"0", "1", "2"}  # named after the model's layers
    result.stdout.fnmatch_lines(["*membench memory peaks*", "test_user.py::test_step [[]forward-backward[]]: *",
                                 "saved 2 test(s)' memory peaks to *memory_peaks.json"])

    # Same code: within peak:0%, and the terminal says against what.
    result = run(pytester, 256, "--membench-compare=base", "--membench-compare-fail=peak:0%")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_step [[]forward-backward[]]: * baseline * +0.00%"])

    # A wider hidden layer: the peak grows, the test fails with one line; the other test still passes.
    result = run(pytester, 512, "--membench-compare=base", "--membench-compare-fail=peak:5%")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([f"*membench: test_user.py::test_step [[]forward-backward[]] peak * B (*) vs "
                                 f"baseline {step['peak_bytes']} B (*) in *memory_peaks.json: +*%, breaks rule "
                                 "peak:5%"])
    # An absolute rule with room for it passes.
    run(pytester, 512, "--membench-compare=base", "--membench-compare-fail=peak:1MiB").assert_outcomes(passed=2)


@pytest.mark.slow
def test_weights_made_before_the_block_are_not_counted(pytester):
    pytester.makepyfile(test_views="""
        import torch
        def test_views(memory_peak):
            w = torch.randn(1000, 1000)
            with memory_peak("views") as m:
                w.t().add_(0)          # a view and an in-place op: no new memory
                y = w.sum(0)           # 1000 floats
            assert m.peak_bytes == 4000, m.peak_bytes
    """)
    pytester.runpytest_subprocess(*PLUGIN, "-p", "no:cacheprovider").assert_outcomes(passed=1)


@pytest.mark.slow
def test_usage_errors_are_one_line(pytester):
    pytester.makepyfile(test_x="def test_x(memory_peak):\n    pass\n")
    result = pytester.runpytest_subprocess(*PLUGIN, "--membench-compare-fail=peak:5%")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--membench-compare-fail needs --membench-compare=DIR*"])
    result = pytester.runpytest_subprocess(*PLUGIN, "--membench-compare=nowhere",
                                           "--membench-compare-fail=step_time:5%")
    result.stderr.fnmatch_lines(["*a test measures its peak; write peak:N%*"])
    result = pytester.runpytest_subprocess(*PLUGIN, "--membench-compare=nowhere")
    result.stderr.fnmatch_lines(["*no baselines at nowhere/memory_peaks.json*"])


@pytest.mark.slow
def test_bad_baseline_files_and_folders_are_one_line_never_an_internal_error(pytester):
    """A corrupt baseline file, a save folder that is a file or under /proc: a usage error before the tests run;
    a full disk when the session saves: one line and a failed session, the old file intact."""
    pytester.makepyfile(test_x="def test_x(memory_peak):\n    memory_peak(list, range(10))\n")
    Path(pytester.path, "bad").mkdir()
    corrupt = '{"version": 1, "tests": {"t": {"b": {"peak_bytes": NaN}}}}'
    Path(pytester.path, "bad", "memory_peaks.json").write_text(corrupt)
    Path(pytester.path, "afile").write_text("x")
    for args, line in [(["--membench-compare=bad"], "*baseline file bad/memory_peaks.json: field tests.t.b.peak_bytes "
                                                    "must be int, got \"NaN\""),
                       (["--membench-save=bad"], "*field tests.t.b.peak_bytes must be int*"),
                       (["--membench-save=afile"], "*--membench-save afile is a file: name a folder*"),
                       (["--membench-save=/proc/membench"], "*is in a kernel file system*")]:
        result = pytester.runpytest_subprocess(*PLUGIN, "-p", "no:cacheprovider", *args)
        assert result.ret == pytest.ExitCode.USAGE_ERROR, (args, result.stderr.str())
        result.stderr.fnmatch_lines([line])
        said = result.stderr.str() + result.stdout.str()
        assert "INTERNALERROR" not in said and "Traceback" not in said

    pytester.makeconftest("""
        import errno, os
        def full(fd):
            raise OSError(errno.ENOSPC, "No space left on device")
        os.fsync = full   # only membench's atomic writer syncs
    """)
    Path(pytester.path, "base").mkdir()
    Path(pytester.path, "base", "memory_peaks.json").write_text('{"version": 1, "tests": {}}')
    result = pytester.runpytest_subprocess(*PLUGIN, "-p", "no:cacheprovider", "--membench-save=base")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stdout.fnmatch_lines(["membench: error: --membench-save: cannot write base/memory_peaks.json: No space left "
                                 "on device"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    assert Path(pytester.path, "base", "memory_peaks.json").read_text() == '{"version": 1, "tests": {}}'
