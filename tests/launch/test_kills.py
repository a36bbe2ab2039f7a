"""One writer per results folder; kill -9 and SIGTERM of a sweep leave nothing running."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import one_error_line, run_tiny

# --- one writer per results folder; kills and SIGTERM leave nothing running ----------------------------------

def _start_hanging_sweep(out: Path, *extra, workload: str = "tests.workloads:hang", processes: int = 1,
                         ) -> subprocess.Popen:
    """`membench run` of a workload whose step sleeps, returned once its worker processes are running."""
    proc = subprocess.Popen([sys.executable, "-m", "membench", "run", "--workload", workload, "--techniques",
                             "baseline", "--no-check", "--no-timeline", "--out", str(out), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while len(_workers(out)) < processes and time.time() < deadline:
        time.sleep(0.2)
    assert len(_workers(out)) >= processes, "the workers never started"
    return proc


def _workers(out: Path) -> list[int]:
    """Pids of worker processes writing into `out`, torchrun included (their command line names the result)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"membench.child.worker" in cmd and any(str(out).encode() in part for part in cmd):
            pids.append(int(proc.name))
    return pids


def _gone(out: Path, within: float = 10.0) -> bool:
    deadline = time.time() + within
    while _workers(out) and time.time() < deadline:
        time.sleep(0.2)
    return not _workers(out)


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="finds workers through /proc")
@pytest.mark.slow
def test_a_second_writer_is_refused_and_a_killed_ones_lock_is_released(tmp_path, capsys):
    from membench.launch.sweep import locked

    first = _start_hanging_sweep(tmp_path)
    try:
        capsys.readouterr()
        assert run_tiny("--out", str(tmp_path)) == 2
        assert f"in use by another membench run (pid {first.pid})" in one_error_line(capsys)
    finally:
        first.kill()  # kill -9: nothing of membench's runs, the kernel drops the lock
        first.communicate()
        _kill_workers(tmp_path)
    with locked(tmp_path):
        pass


def _kill_workers(out: Path) -> None:
    """Clean up after a test whose workers outlived their sweep (what the test is about)."""
    for pid in _workers(out):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="finds workers through /proc")
def test_kill_9_of_the_sweep_kills_its_worker(tmp_path):
    sweep = _start_hanging_sweep(tmp_path)
    sweep.kill()
    sweep.communicate()
    try:
        assert _gone(tmp_path, within=5)
    finally:
        _kill_workers(tmp_path)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="finds workers through /proc")
def test_kill_9_of_the_sweep_kills_torchrun_and_its_ranks(tmp_path):
    # The baseline finishes; the fsdp run, through torchrun with two gloo ranks, hangs: torchrun and 2 ranks.
    sweep = _start_hanging_sweep(tmp_path, "--techniques", "fsdp", "--device", "cpu", "--nproc-per-node", "2",
                                 workload="tests.workloads:hang_under_torchrun", processes=3)
    time.sleep(2)  # the ranks are inside their step
    sweep.kill()
    sweep.communicate()
    try:
        assert _gone(tmp_path, within=10)
    finally:
        _kill_workers(tmp_path)


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="finds workers through /proc")
@pytest.mark.slow
def test_sigterm_stops_the_sweep_like_ctrl_c(tmp_path):
    sweep = _start_hanging_sweep(tmp_path)
    sweep.terminate()
    _, err = sweep.communicate(timeout=60)
    try:
        assert sweep.returncode == 143
        assert "terminated: 0 finished run(s) kept" in err and "Traceback" not in err
        assert _gone(tmp_path, within=5)
    finally:
        _kill_workers(tmp_path)


def test_the_portable_watch_kills_the_workers_group_once_the_sweep_is_gone():
    """The fallback where prctl does not exist: a process watching a pid dies (with its group) once it is gone."""
    sweep = subprocess.Popen(["sleep", "60"])
    watcher = subprocess.Popen([sys.executable, "-c", "import sys, time; from membench.launch import lifeline; "
                                "lifeline.watch(int(sys.argv[1]), 0.1); time.sleep(60)", str(sweep.pid)],
                               start_new_session=True)
    time.sleep(1)
    assert watcher.poll() is None
    sweep.kill()
    sweep.wait()
    assert watcher.wait(timeout=10) == -signal.SIGKILL
