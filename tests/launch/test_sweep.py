"""The sweep as a user runs it: one process per run, failures contained, nothing measured ever lost."""

import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

import membench
from membench.cli import main
from membench.results import SCHEMA_VERSION, read_result


def run_cli(*args) -> int:
    # --device cpu: these tests check CPU numbers (exact bytes, a host budget); on a GPU machine "auto" is cuda.
    return main(["run", "--device", "cpu", "--steps", "2", "--warmup", "1", *args])


@pytest.mark.slow
def test_sweep_writes_one_result_per_run_with_spec_and_environment(tmp_path, capsys):
    rc = run_cli("--workload", "vit-tiny", "--batch-size", "8", "--techniques", "accum,ckpt,opt-in-bwd",
                 "--out", str(tmp_path))
    assert rc == 0
    table = capsys.readouterr().out
    for name in ("baseline", "accum", "ckpt", "opt-in-bwd"):
        r = read_result(tmp_path / f"{name}.json")
        assert r.schema_version == SCHEMA_VERSION and r.status == "ok", r.error
        assert r.spec.run.workload == "vit-tiny" and r.spec.run.batch_size == 8
        assert r.env.torch and r.env.device == "cpu" and r.env.device_name
        assert r.memory.peak_allocated_bytes > 0
        assert r.timing.median_s > 0 and r.timing.flops_per_step > 0
        assert len(r.timing.step_times_s) == 2
        assert name in table
    # Where the baseline's peak comes from: its top 5 modules, below the table.
    assert "where baseline's peak" in table and "top 5 modules" in table
    verdicts = {n: read_result(tmp_path / f"{n}.json").equivalence.verdict
                for n in ("baseline", "accum", "ckpt", "opt-in-bwd")}
    assert verdicts == {"baseline": "reference", "accum": "equivalent", "ckpt": "bitwise", "opt-in-bwd": "bitwise"}


@pytest.mark.slow
def test_oom_in_one_run_keeps_the_others(tmp_path):
    # Under 1.8 MB the baseline (2.06 MB peak at batch 8) runs out of memory, accumulation (1.67 MB) fits.
    rc = run_cli("--workload", "vit-tiny", "--batch-size", "8", "--techniques", "accum", "--no-check",
                 "--memory-budget", "1.8MB", "--out", str(tmp_path))
    assert rc == 0
    base, accum = read_result(tmp_path / "baseline.json"), read_result(tmp_path / "accum.json")
    assert base.status == "oom" and "out of memory" in base.error
    assert base.memory.peak_allocated_bytes > 1_800_000
    assert accum.status == "ok" and accum.memory.peak_allocated_bytes <= 1_800_000


@pytest.mark.slow
def test_crash_and_hang_become_statuses(tmp_path):
    rc = run_cli("--workload", "tests.workloads:broken", "--techniques", "baseline", "--out", str(tmp_path / "a"))
    assert rc == 1
    r = read_result(tmp_path / "a" / "baseline.json")
    assert r.status == "error" and "planted crash" in r.error
    rc = run_cli("--workload", "tests.workloads:hang", "--techniques", "baseline", "--timeout", "3",
                 "--out", str(tmp_path / "b"))
    assert rc == 1
    assert read_result(tmp_path / "b" / "baseline.json").status == "timeout"


@pytest.mark.slow
def test_resume_skips_finished_runs_and_reruns_keep_history(tmp_path):
    args = ("--workload", "tests.workloads:mlp", "--techniques", "accum", "--no-check", "--out", str(tmp_path))
    assert run_cli(*args) == 0
    stamp = (tmp_path / "baseline.json").stat().st_mtime_ns
    assert run_cli(*args, "--resume") == 0
    assert (tmp_path / "baseline.json").stat().st_mtime_ns == stamp
    assert run_cli(*args) == 0  # a fresh run moves the earlier results aside rather than overwriting them
    assert len(list((tmp_path / "previous").glob("baseline.*/baseline.json"))) == 1


def _interruptible() -> None:
    """The sweep as a terminal starts it: Ctrl-C not ignored. A shell's background job (`.ci/run &`, a CI runner's)
    starts with SIGINT ignored, which its children inherit, and Python then installs no handler for it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
def test_ctrl_c_keeps_finished_runs(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "membench", "run", "--workload", "tests.workloads:hang",
                             "--techniques", "baseline", "--device", "cpu", "--out", str(tmp_path)],
                            env=os.environ.copy(), preexec_fn=_interruptible,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # The baseline hangs; once its worker has started (its first stage is in its log: the log file itself is made
    # before the worker is), interrupt the sweep as a person at the terminal would.
    log, deadline = tmp_path / "runs" / "baseline.log", time.time() + 120
    while not (log.exists() and "membench " in log.read_text(errors="replace")) and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "interrupted" in err and "Traceback" not in err


@pytest.mark.slow
def test_ctrl_c_while_the_worker_is_forked_still_stops_the_sweep(tmp_path):
    """SIGINT the moment the run's log file appears, when the sweep is inside fork(): it used to interrupt CPython's
    at-fork handlers (logging's lock release), leaving the lock taken and the sweep hung for good (seen in CI). The
    sweep holds interrupts back while it forks (lifeline.interrupts_held) and stops once the worker exists."""
    for trial in range(3):
        out = tmp_path / str(trial)
        proc = subprocess.Popen([sys.executable, "-m", "membench", "run", "--workload", "tests.workloads:hang",
                                 "--techniques", "baseline", "--device", "cpu", "--out", str(out)],
                                env=os.environ.copy(), preexec_fn=_interruptible, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 60
        while not (out / "runs" / "baseline.log").exists() and time.time() < deadline:
            time.sleep(0.002)
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
        assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err, err


def test_ctrl_c_after_a_finished_run_leaves_its_result(tmp_path):
    from membench.launch.sweep import Interrupted, run_all
    from tests.helpers import spec

    specs = [spec("tests.workloads:mlp", (), batch_size=4, warmup=0),
             spec("tests.workloads:mlp", ("ckpt",), batch_size=4, warmup=0)]

    def interrupt(job):
        if job.run.techniques:
            raise KeyboardInterrupt

    with pytest.raises(Interrupted) as stop:
        run_all(specs, tmp_path, on_start=interrupt)
    assert [r.name for r in stop.value.results] == ["baseline"]
    assert read_result(tmp_path / "baseline.json").status == "ok"


@pytest.mark.slow
def test_python_api_returns_a_dataframe(tmp_path):
    df = membench.run_sweep("tests.workloads:mlp", "accum,opt-in-bwd", batch_size=8, device="cpu", out=tmp_path,
                            steps=2, warmup=1)
    assert isinstance(df, pd.DataFrame)
    assert list(df["run"]) == ["baseline", "accum", "opt-in-bwd"]
    assert (df.status == "ok").all()
    assert df.loc[df["run"] == "baseline", "peak_vs_baseline_pct"].iloc[0] == 0
    assert read_result(tmp_path / "accum.json").spec.run.accum_steps == 4
