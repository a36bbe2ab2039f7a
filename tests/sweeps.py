"""Tiny real sweeps for the report tests, run in this process (no subprocess: fast) and cached per session."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

from membench.child.worker import run
from membench.results import RunRecord, load_dir
from tests.helpers import spec

# vit-tiny at batch 1 is parameter-heavy: parameters + gradients + Adam state outweigh the activations, so the
# baseline peaks in the optimizer step, as vit_l_16 does in the reference tutorial.
TINY = dict(workload="vit-tiny", batch_size=1, steps=1, warmup=1)


def run_one(out_dir: Path, techniques: tuple[str, ...] = (), **options) -> RunRecord:
    job = spec(techniques=techniques, **{**TINY, "check": False, **options})
    return run(job, out_dir / f"{job.name}.json")


@functools.cache
def _cached_sweep() -> Path:
    out = Path(tempfile.mkdtemp(prefix="membench-sweep-"))
    atexit.register(shutil.rmtree, out, True)  # cached for the session; gone when the test process ends
    run_one(out)
    run_one(out, ("opt-in-bwd",), check=True)
    return out


def tiny_sweep(tmp_path: Path) -> Path:
    """A copy of baseline + opt-in-bwd results (with timelines) that the test may change freely."""
    dest = tmp_path / "sweep"
    shutil.copytree(_cached_sweep(), dest)
    return dest


def load(path: Path) -> list[RunRecord]:
    return load_dir(path)
