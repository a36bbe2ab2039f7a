"""Sessions run with the interpreter nox runs under (venv_backend="none"): nothing is reinstalled (torch is large),
so CI installs once (`pip install -c constraints.txt -e .[test]`) and then `nox -s tests gate bench`. `accuracy` is
the exception: it needs the torch release the GPU data was recorded with, in an environment of its own."""

from __future__ import annotations

import sys

import nox

nox.options.sessions = ["lint", "tests"]
PYTHON = sys.executable


@nox.session(venv_backend="none")
def lint(session: nox.Session) -> None:
    """ruff (settings in ruff.toml): style, import order, bug-prone patterns, broad excepts."""
    session.run(PYTHON, "-m", "ruff", "check", ".", *session.posargs)


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """The test suite (CPU; GPU tests skip themselves without CUDA)."""
    session.run(PYTHON, "-m", "pytest", "-q", *session.posargs)


@nox.session(venv_backend="none")
def gate(session: nox.Session) -> None:
    """The memory regression gate: a small CPU sweep checked against results/ci-baseline (exit 1 on growth)."""
    session.run("bash", ".ci/memory-gate", *session.posargs, env={"PYTHON": PYTHON})


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """Time one training step per technique and save the run under .benchmarks/ (keyed by machine)."""
    # -n 0: in one process, as pytest-benchmark times only without xdist (pyproject's addopts start two)
    session.run(PYTHON, "-m", "pytest", "benchmarks", "-q", "-n", "0", "--benchmark-autosave", *session.posargs)


@nox.session(venv_backend="none")
def bench_compare(session: nox.Session) -> None:
    """Compare against the last saved run (or the one given: `nox -s bench_compare -- 0001`); fail when a step's
    minimum time is 15% slower. Only meaningful on the machine the saved run came from."""
    against = session.posargs[0] if session.posargs else ""
    session.run(PYTHON, "-m", "pytest", "benchmarks", "-q", "-n", "0", f"--benchmark-compare={against}".rstrip("="),
                "--benchmark-compare-fail=min:15%", *session.posargs[1:])


@nox.session(venv_backend="venv", reuse_venv=True)
def accuracy(session: nox.Session) -> None:
    """The accuracy gate (benchmarks/accuracy_gate.py) in its own environment with the torch the committed GPU data
    was recorded with (benchmarks/accuracy-constraints.txt: 2.11.0): fails when a row is further off than
    results/accuracy/ says. `nox -s accuracy -- --update` writes the table; `-- --plant-mib 1` must fail."""
    session.install("-q", "-r", "benchmarks/accuracy-constraints.txt")
    session.install("-q", "--no-deps", "-e", ".")
    session.run("python", "benchmarks/accuracy_gate.py", *session.posargs)
