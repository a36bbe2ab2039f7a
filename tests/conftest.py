import os
from pathlib import Path

import pytest

# Two test processes share the two cores (pyproject's addopts): each, and every process it starts, gets one
# thread, or torch's thread pools oversubscribe the cores and in-process steps slow ten-fold.
XDIST_WORKER = bool(os.environ.get("PYTEST_XDIST_WORKER"))
if XDIST_WORKER:
    os.environ["OMP_NUM_THREADS"] = "1"  # before torch is imported: its pool's size is read then

import torch  # noqa: E402

if XDIST_WORKER:
    torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _importable_tests(monkeypatch):
    """Worker subprocesses import user workloads such as tests.workloads:mlp from the repository root."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


@pytest.fixture(autouse=True)
def _out_of_the_working_tree(monkeypatch, tmp_path_factory):
    """Each test runs in a folder of its own: a command without --out writes its default results/ folder there,
    never into the clone (where two tests at once would also lock each other out of the same folder)."""
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


@pytest.fixture()
def sweep(tmp_path) -> Path:
    """A finished tiny sweep's results folder (tests/sweeps.py); a test module may define its own."""
    from tests.sweeps import tiny_sweep

    return tiny_sweep(tmp_path)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; torch sees none here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
