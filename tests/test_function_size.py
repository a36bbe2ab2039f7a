"""Functions a reader can hold in mind: none over 80 lines, none with cyclomatic complexity over 25, in the parts
below the commands (prediction, the allocator, measurement, launching, the children, techniques, workloads, a
training step). Length is read from the syntax trees; complexity is ruff's C901 (mccabe), with the threshold here."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "membench"
CHECKED = ["predict", "allocator", "trackers", "launch", "child", "techniques", "workloads", "step.py",
           "measure.py", "equivalence.py", "optimizers.py", "private.py", "environment.py"]
MAX_LINES = 80
MAX_COMPLEXITY = 25


def _files() -> list[Path]:
    found: list[Path] = []
    for name in CHECKED:
        path = PACKAGE / name
        found += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return found


def _too_long(source: str) -> list[tuple[str, int, int]]:
    """(name, first line, lines) of every function in `source` over MAX_LINES lines, nested ones included."""
    return [(node.name, node.lineno, node.end_lineno - node.lineno + 1) for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_LINES]


def test_no_function_is_over_80_lines():
    long = [f"{path.relative_to(PACKAGE.parent)}:{line} {name} ({lines} lines)"
            for path in _files() for name, line, lines in _too_long(path.read_text())]
    assert not long, "\n".join(long)


def test_no_function_is_over_complexity_25():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--select", "C901", "--config",
                           f"lint.mccabe.max-complexity={MAX_COMPLEXITY}", "--output-format", "concise",
                           *map(str, _files())], capture_output=True, text=True, cwd=PACKAGE.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_checks_see_a_long_and_a_branchy_function(tmp_path):
    """The two checks can fail: an 81-line function and one with 26 branches are found."""
    body = "".join(f"    x{i} = {i}\n" for i in range(80))
    branches = "".join(f"    if x == {i}:\n        return {i}\n" for i in range(25))
    source = f"def long():\n{body}\n\ndef branchy(x):\n{branches}    return -1\n"
    assert _too_long(source) == [("long", 1, 81)]  # branchy: 52 lines
    (tmp_path / "sample.py").write_text(source)
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--isolated", "--select", "C901",
                           "--config", f"lint.mccabe.max-complexity={MAX_COMPLEXITY}", "--output-format", "concise",
                           "sample.py"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 1 and "`branchy` is too complex (26 > 25)" in proc.stdout, proc.stdout + proc.stderr
