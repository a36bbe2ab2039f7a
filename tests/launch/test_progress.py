"""Progress inside a run: the worker's stages reach the sweep as they happen, and survive the worker's end."""

from __future__ import annotations

import io

import pytest

from membench.launch import progress
from membench.launch.process import launch
from membench.launch.progress import StageReader
from membench.launch.sweep import run_all
from membench.report.live import Estimate, StageLines, SweepProgress
from membench.results import RunRecord
from membench.results.progress import Stage
from tests.helpers import spec


def test_the_reader_passes_on_complete_lines_only(tmp_path, monkeypatch):
    path = tmp_path / "run.progress"
    reader = StageReader(path, "baseline", started=0.0)
    monkeypatch.setenv(progress.PROGRESS_ENV, str(path))
    progress.report("build")
    progress.report("time", 2, 5)
    with open(path, "a") as f:
        f.write('{"stage": "che')  # a line the worker is still writing
    assert [s.describe() for s in reader.read()] == ["building the model", "timing step 2 of 5"]
    assert reader.read() == []
    with open(path, "a") as f:
        f.write('ck", "t": 1.5, "step": null, "steps": 2}\nnot json\n')
    assert reader.read() == [Stage("baseline", "check", 1.5, None, 2)]


def test_only_rank_0_reports_and_no_file_means_no_report(tmp_path, monkeypatch):
    path = tmp_path / "run.progress"
    monkeypatch.setenv(progress.PROGRESS_ENV, str(path))
    monkeypatch.setenv("RANK", "1")
    progress.report("build")
    assert not path.exists()
    monkeypatch.delenv(progress.PROGRESS_ENV)
    monkeypatch.setenv("RANK", "0")
    progress.report("build")  # nowhere to write: nothing happens, nothing fails
    assert not path.exists()


def test_a_real_run_reports_every_stage_in_order(tmp_path):
    job = spec("tests.workloads:mlp", (), batch_size=4, steps=3, warmup=1, check=True, timeline=True)
    stages: list[Stage] = []
    record = launch(job, tmp_path, stages.append)
    assert record.status == "ok", record.error
    assert [s.describe() for s in stages] == [
        "building the model", "warm-up (1 step)", "measuring memory (1 step)", "timeline pass",
        "timing step 1 of 3", "timing step 2 of 3", "timing step 3 of 3", "counting FLOPs",
        "equivalence check (2 steps)", "predicting it beside the measurement"]
    assert all(s.run == "baseline" for s in stages)
    assert [s.elapsed_s for s in stages] == sorted(s.elapsed_s for s in stages)
    assert (tmp_path / "runs" / "baseline.progress").is_file()


def test_stages_before_the_worker_is_killed_still_reach_the_sweep(tmp_path):
    job = spec("tests.workloads:killed_in_step", (), batch_size=4)
    seen: list[tuple[str, str]] = []
    [record] = run_all([job], tmp_path, on_stage=lambda j, s: seen.append((j.name, s.stage)))
    assert record.status == "error" and "killed by signal 9" in record.error
    assert seen == [("baseline", "build"), ("baseline", "warmup")]


def test_the_estimate_goes_by_the_finished_runs():
    estimate = Estimate(total=3)
    assert estimate.left_s(started=1, current_elapsed_s=5.0) is None  # nothing finished: no guess
    estimate.finished(20.0)
    # run 2 of 3 has run 5 s of an expected 20 s; run 3 is still to come.
    assert estimate.left_s(started=2, current_elapsed_s=5.0) == 15.0 + 20.0
    assert estimate.left_s(started=2, current_elapsed_s=30.0) == 20.0  # longer than expected: not negative


def test_the_terminal_line_shows_stage_elapsed_and_what_is_left():
    job = spec("tests.workloads:mlp", ())
    shown = SweepProgress([job, job], "out")
    shown.start(job)
    shown.estimate.finished(60.0)
    shown.stage(job, Stage("baseline", "time", 12.0, 2, 5))
    task = shown.progress.tasks[0]
    assert task.description == "baseline: timing step 2 of 5 (12 s in)"
    assert task.fields["left"] == "about 1 min 48 s left"  # 48 s of this run and one 60 s run


def test_the_api_default_prints_one_quiet_line_per_stage():
    out = io.StringIO()
    lines = StageLines(out)
    for stage in (Stage("ckpt", "build", 0.4), Stage("ckpt", "time", 9.0, 1, 5), Stage("ckpt", "time", 9.5, 2, 5)):
        lines(stage)
    lines.done(None, RunRecord(name="ckpt", status="ok", spec=spec()), skipped=False)
    text = out.getvalue().splitlines()
    assert text[:2] == ["membench: ckpt: building the model (0.4 s in)", "membench: ckpt: timing (5 steps) (9.0 s in)"]
    assert text[2].startswith("membench: ckpt: ok, ") and len(text) == 3


@pytest.mark.slow
def test_run_sweep_passes_stages_to_a_callback_or_prints_them(tmp_path, capsys):
    import membench

    stages: list[Stage] = []
    options = dict(batch_size=4, device="cpu", steps=1, warmup=0, check=False, timeline=False)
    membench.run_sweep("tests.workloads:mlp", "baseline", out=tmp_path / "a", progress=stages.append, **options)
    assert [s.stage for s in stages] == ["build", "warmup", "measure", "time", "flops", "predict"]
    assert "membench: baseline:" not in capsys.readouterr().err  # a callback replaces the default lines
    membench.run_sweep("tests.workloads:mlp", "baseline", out=tmp_path / "b", **options)
    err = capsys.readouterr().err
    assert "membench: baseline: building the model (" in err and "membench: baseline: ok, peak " in err
