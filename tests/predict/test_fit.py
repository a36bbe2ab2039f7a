"""fit: the largest batch under a budget of predicted peak memory; batch + step does not fit."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from membench import cli
from membench.allocator.events import TraceEvent
from membench.predict.fit import batch_step, confirm_on_gpu, fit_batch, largest_batch
from membench.predict.run import Traced, predict_memory, predict_traced
from membench.spec import Job
from tests.helpers import cli as run_cli
from tests.helpers import spec as job_spec


def peak(spec: Job) -> int:
    return predict_memory(spec).peak_allocated_bytes


@pytest.mark.parametrize("stack", [(), ("ckpt",), ("accum",)], ids=lambda s: "+".join(s) or "baseline")
def test_fit_returns_a_batch_that_fits_and_the_next_does_not(stack):
    spec = job_spec("vit-tiny", stack, batch_size=1, device="cuda", accum_steps=2)
    step = batch_step(spec)
    assert step == (2 if "accum" in stack else 1)
    budget = peak(spec.with_run(batch_size=5 * step)) + 1  # a budget between two batch sizes
    fit = largest_batch(spec, budget, peak)
    assert fit.batch % step == 0 and fit.over_batch == fit.batch + step
    # checked again from fresh predictions, not from the search's own numbers
    assert peak(spec.with_run(batch_size=fit.batch)) == fit.peak <= budget
    assert peak(spec.with_run(batch_size=fit.batch + step)) == fit.over_peak > budget
    assert fit.batch >= 5 * step


def test_nothing_fits_a_budget_below_the_smallest_batch():
    spec = job_spec("vit-tiny", batch_size=1, device="cuda")
    fit = largest_batch(spec, peak(spec) - 1, peak)
    assert fit.batch == 0 and fit.over_batch == 1 and "over budget" in fit.note


def test_max_batch_stops_the_search():
    spec = job_spec("vit-tiny", batch_size=1, device="cuda")
    fit = largest_batch(spec, 2**40, peak, max_batch=4)
    assert fit.batch == 4 and fit.over_batch is None and "--max-batch" in fit.note


# --- fit from traces: two predictions, sizes derived as affine in the batch, confirmed by two more ------------------

def synthetic(special: set[int]):
    """A stand-in for predict_traced whose allocations are known by hand: 1000 B before the measured step, then
    100 B per sample allocated and freed; a batch in `special` makes one more allocation (another kernel path)."""
    def traced(job: Job) -> Traced:
        b = job.run.batch_size
        events = [TraceEvent.alloc(0, 1000), TraceEvent.alloc(1, 100 * b), TraceEvent.free(1)]
        if b in special:
            events[1:1] = [TraceEvent.alloc(2, 8), TraceEvent.free(2)]
        return Traced(SimpleNamespace(peak_allocated_bytes=1000 + 100 * b), events, 1, 1)
    return traced


def test_fit_from_traces_derives_the_answer_and_confirms_it():
    job = job_spec("vit-tiny", batch_size=1, device="cuda")
    fit = fit_batch(job, 1000 + 100 * 37, "allocated", synthetic(set()))
    assert (fit.batch, fit.peak, fit.over_batch, fit.over_peak) == (37, 4700, 38, 4800)
    assert fit.probes == 4 and fit.method.startswith("from traces at 2 and 3")


def test_fit_from_traces_steps_past_a_special_batch_and_falls_back_where_two_pairs_differ():
    job = job_spec("vit-tiny", batch_size=1, device="cuda")
    fit = fit_batch(job, 1000 + 100 * 37, "allocated", synthetic({2}))
    assert (fit.batch, fit.over_batch, fit.probes) == (37, 38, 5) and fit.method.startswith("from traces at 3 and 4")
    fit = fit_batch(job, 1000 + 100 * 37, "allocated", synthetic({2, 4}))
    assert (fit.batch, fit.over_batch) == (37, 38) and fit.method == "full search"
    assert "allocations differ between batch sizes" in fit.note


@pytest.mark.slow  # 3 to 6 s each on the 2-core machine: a full search of real predictions beside it
@pytest.mark.parametrize("stack", [(), ("ckpt",), ("accum",)], ids=lambda s: "+".join(s) or "baseline")
def test_fit_from_traces_gives_the_full_searchs_answer(stack):
    job = job_spec("vit-tiny", stack, batch_size=1, device="cuda", accum_steps=2)
    step = batch_step(job)
    budget = peak(job.with_run(batch_size=9 * step)) + 1
    fit = fit_batch(job, budget, "allocated", predict_traced)
    full = largest_batch(job, budget, peak)
    assert fit.method.startswith("from traces") and fit.probes == 4
    assert (fit.batch, fit.peak, fit.over_batch, fit.over_peak) == (full.batch, full.peak, full.over_batch,
                                                                     full.over_peak)
    assert fit.batch == 9 * step


def test_a_trace_does_not_depend_on_when_the_cycle_collector_runs():
    """Checkpointing leaves storages in reference cycles: a trace must not change with the collector's timing (or
    with frees that land in the tracker's list after the prediction ended)."""
    job = job_spec("vit-tiny", ("ckpt",), batch_size=2, device="cuda")
    first = predict_traced(job)
    threshold = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    try:
        again = predict_traced(job)
    finally:
        gc.set_threshold(*threshold)
    gc.collect()
    assert first.events == again.events and first.memory.peak_allocated_bytes == again.memory.peak_allocated_bytes


def test_cli_fit_prints_a_table(capsys):
    # --gpu named: without it the target is this machine's GPU where there is one, and the line would name it
    code = cli.main(["fit", "--workload", "vit-tiny", "--techniques", "ckpt", "--budget", "4MiB", "--max-batch", "64",
                     "--gpu", "H100"])
    out = capsys.readouterr().out
    assert code == 0
    assert "max batch (predicted)" in out and "ckpt" in out and "PREDICTED (no timing) for H100" in out
    assert "within 4.00 MiB of predicted peak reserved" in out
    assert ("not confirmed (no CUDA GPU here)" in out) == (not torch.cuda.is_available())


def test_a_technique_no_prediction_stands_for_is_refused_before_any_search(capfd):
    """It read `workload 'vit-tiny' raised CannotPredict: ...` after the baseline's whole search."""
    assert cli.main(["fit", "--workload", "vit-tiny", "--techniques", "opt-offload", "--budget", "4MiB",
                     "--jobs", "1"]) == 2
    err = capfd.readouterr().err
    assert "fit baseline" not in err
    assert err.strip().splitlines()[-1] == (
        "membench: error: cannot fit opt-offload: opt-offload moves tensors between host and device memory, which a "
        "prediction on CPU cannot tell apart: measure it on a GPU")


def test_cli_fit_bad_budget_is_a_usage_error(capsys):
    assert cli.main(["fit", "--workload", "vit-tiny", "--budget", "lots"]) == 2
    assert "cannot read 'lots' as a size" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: confirmation runs are real runs")
def test_confirmation_on_gpu_finds_a_batch_that_runs(tmp_path):
    spec = job_spec("vit-small", batch_size=1, device="cuda")
    budget = 2 * 2**30
    # A memory fraction caps what the allocator reserves, so the search goes by predicted reserved, as `fit` does
    # (searched by allocated, it confirmed no batch on an H200 under torch 2.11).
    fit = confirm_on_gpu(spec, largest_batch(spec, budget, lambda j: predict_memory(j).peak_reserved_bytes,
                                             max_batch=512), budget, tmp_path)
    assert fit.confirmed is not None and fit.confirmed > 0


# --- predict and fit run the user's code in a child process, under --timeout ------------------------------------

def _cli(*args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "membench", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("command, factory, message", [
    ("predict", "factory_raises", "raised ValueError: could not open shard [/data/train-000.tar]"),
    ("fit", "factory_system_exit", "raised SystemExit(3) while membench ran it"),
    ("predict", "factory_exits_0", "exited with code 0 before answering"),
    ("fit", "factory_aborts", "was killed by signal 6 before answering"),
    # Waits out --timeout's 30 s floor; the other bad factories of predict and fit stay in the default run.
    pytest.param("predict", "factory_hangs", "did not finish within 30 s (--timeout)", marks=pytest.mark.slow),
])
def test_a_bad_factory_is_one_line_and_exit_2(tmp_path, command, factory, message):
    budget = ["--budget", "1GiB"] if command == "fit" else ["--out", str(tmp_path / "pred")]
    proc = _cli(command, "--workload", f"tests.workloads:{factory}", "--device", "cpu", "--techniques", "baseline",
                "--timeout", "1", *budget)
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("membench: error: ") and message in last, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_a_factory_that_prints_does_not_break_the_answer(tmp_path):
    """10 MB on stdout and a print at exit: shown (on stderr), never read as membench's answer."""
    proc = _cli("predict", "--workload", "tests.workloads:factory_prints", "--device", "cpu", "--techniques",
                "baseline", "--batch-size", "2", "--out", str(tmp_path / "pred"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "x" * 1000 in proc.stderr and "goodbye from atexit" in proc.stderr
    assert proc.stdout.splitlines()[3].split()[0] == "baseline" and "x" * 1000 not in proc.stdout


def test_the_users_code_runs_with_the_cycle_collector_on(tmp_path):
    proc = _cli("predict", "--workload", "tests.workloads:factory_says_collector", "--device", "cpu", "--techniques",
                "baseline", "--batch-size", "2", "--out", str(tmp_path / "pred"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "collector on: True" in proc.stderr and "collector on: False" not in proc.stderr


def test_processes_the_users_code_forks_end_with_the_command(tmp_path):
    pidfile = tmp_path / "pid"
    proc = _cli("fit", "--workload", "tests.workloads:factory_forks", "--device", "cpu", "--techniques", "baseline",
                "--budget", "64KiB", "--max-batch", "4", env={"MEMBENCH_TEST_PIDFILE": str(pidfile)}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not _running(int(pidfile.read_text()))


def _running(pid: int) -> bool:
    """Whether pid still runs: a killed orphan whose new parent (the machine's PID 1) never reaps it stays a
    zombie, which os.kill(pid, 0) still finds."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("args, message", [
    (["predict", "--world-size", "100000", "--techniques", "fsdp"], "--world-size must be an integer from 1 to 1024"),
    # Refused by the option's own check (spec.CHECKS), the same line `membench run` and the API give.
    (["predict", "--batch-size", str(2**70)], f"--batch-size must be an integer from 1 to 2147483647, got {2**70}"),
    (["fit", "--budget", "1GiB", "--max-batch", str(2**31)],
     f"--max-batch must be an integer from 1 to 2147483647, got {2**31}"),
])
def test_bounds_a_prediction_cannot_meet_are_one_line(args, message):
    proc = run_cli(args[0], "--workload", "vit-tiny", *args[1:])
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and message in err[0]


# --- --jobs: techniques fitted in processes of their own ---------------------------------------------------------

@pytest.mark.slow
def test_fit_with_two_jobs_gives_the_answers_of_one():
    """Each technique's search, forked from the loaded workload, answers exactly as the serial loop does: the same
    table (batch, peak, first batch over and its peak) and the same progress lines, in the same order. Through the
    command: a fresh process, as users run it (this one has run backwards already, and then fit stays serial)."""
    runs = [_cli("fit", "--workload", "tests.workloads:mlp", "--device", "cpu", "--techniques", "accum,opt-in-bwd",
                 "--budget", "1MiB", "--jobs", jobs, timeout=240) for jobs in ("1", "2")]
    for proc in runs:
        assert proc.returncode == 0, proc.stderr[-2000:]
    serial, parallel = runs
    rows = [line.split() for line in serial.stdout.splitlines()[2:5]]
    assert [row[0] for row in rows] == ["baseline", "accum", "opt-in-bwd"]
    assert all(row[1] != "0" and row[4] != "-" for row in rows)  # each search found a batch and the first over
    assert parallel.stdout == serial.stdout
    assert parallel.stderr == serial.stderr and "cannot fork" not in parallel.stderr


def test_a_technique_whose_process_dies_is_one_line_naming_it():
    proc = _cli("fit", "--workload", "tests.workloads:killed_in_step", "--device", "cpu", "--techniques", "accum",
                "--budget", "1GiB", "--jobs", "2", timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("membench: error: fitting baseline ") and "killed by signal 9" in last, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_jobs_out_of_range_is_one_line_naming_the_range():
    proc = _cli("fit", "--workload", "vit-tiny", "--budget", "1GiB", "--jobs", "0", timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "--jobs" in proc.stderr and "from 1 to 1024" in proc.stderr


def test_kernel_scratch_only_larger_batches_take_is_worked_out_again_at_each_batch():
    """gpt-tiny's sums split across blocks on an H100 only at larger batches (their kernel scratch: none at 2 and 3,
    64 allocations and frees at 64), and its token embedding's backward sorts its indices only past 3,072 (none at
    2 and 3; at 64, 4,096 indices: 6 events before its gradient's allocation and 22 after, in the warm-up step and
    the measured one): the trace derived from batches 2 and 3 works each call's scratch out again, both sides of
    the gradient, and makes a real prediction's allocations at 64 event for event, and its peak."""
    from membench.api import plan
    from membench.predict import gpus
    from membench.predict.emulate.reductions import KernelScratch
    from membench.predict.fit import AffineTrace
    from membench.predict.run import allocator_settings
    from membench.techniques import resolve

    def traced(batch: int):
        job = next(j for j in plan(workload="gpt-tiny", techniques="baseline", batch_size=batch,
                                   target_device="cuda", in_process=True) if j.name == "baseline")
        return job, predict_traced(job)

    (job, two), (_, three), (_, big) = traced(2), traced(3), traced(64)
    assert sum(c.count for c in two.kernel_calls + three.kernel_calls) == 0
    assert sum(c.count for c in big.kernel_calls) == 64 + 2 * (6 + 22)
    model = AffineTrace.derive(two, 2, three, 3, allocator_settings(resolve(job.run)), KernelScratch(gpus.gpu("H100")))
    assert model.matches(big, 64) is None
    assert model.peak_allocated(64) == big.memory.peak_allocated_bytes
