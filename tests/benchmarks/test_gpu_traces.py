"""benchmarks/gpu_traces.py on this CPU machine (it stops where it needs a GPU, in one line), and the traces it made
on an H200, committed under results/gpu-traces/: the allocator simulator, given the addresses the driver chose,
replays each whole process exactly."""

from __future__ import annotations

import lzma
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

from membench.allocator.replay import actual_of, compare, replay
from membench.allocator.snapshot import initial_state, load_snapshot

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_traces.py"
ARCHIVE = ROOT / "results" / "gpu-traces" / "NVIDIA-H200_torch2.11.0.tar.xz"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine traces instead")
def test_without_a_gpu_it_says_so_in_one_line_and_writes_nothing(tmp_path):
    done = _run("--out", str(tmp_path / "traces"))
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 3 and len(lines) == 1 and lines[0].startswith("gpu_traces: no CUDA GPU here")
    assert not (tmp_path / "traces").exists()


@pytest.mark.parametrize("args, says", [(["--jobs", "0"], "--jobs must be at least 1"),
                                        (["--only", "no-such-case"], "matches no case")])
def test_bad_arguments_exit_2(tmp_path, args, says):
    done = _run("--out", str(tmp_path), *args)
    assert done.returncode == 2 and says in done.stderr


def test_the_committed_traces_replay_exactly_at_the_drivers_addresses(tmp_path):
    with tarfile.open(ARCHIVE) as tar:
        tar.extractall(tmp_path, filter="data")
    packed = sorted(tmp_path.rglob("*.snapshot.pickle.xz"))
    assert len(packed) == 9 + 16 + 6  # three runs on one machine: 9 cases; those and 7 more; 6 more
    for path in packed:
        unpacked = path.with_suffix("")
        unpacked.write_bytes(lzma.decompress(path.read_bytes()))
        trace = initial_state(load_snapshot(unpacked))
        # Recorded from the process's first allocation: nothing was held before the first event.
        assert not trace.segments and trace.events[0]["action"] == "segment_alloc", path.name
        actual, simulated = actual_of(trace), replay(trace)
        assert compare(actual, simulated).exact and simulated.same_address == actual.allocs, path.name
