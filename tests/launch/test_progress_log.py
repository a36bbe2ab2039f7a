"""A run's stages are also lines of its log: a long run's log says where it is, with the time of day."""

from __future__ import annotations

import re
import time

from membench.launch import progress
from membench.launch.process import launch
from tests.helpers import spec


def test_each_reported_stage_is_a_line_on_stderr_with_the_time(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(progress.PROGRESS_ENV, str(tmp_path / "run.progress"))
    progress.report("time", 2, 5)
    progress.report("time", 7, None)  # past --steps, under --min-time
    rss = r" \(peak RSS \d+\.\d\d [MG]iB\)"  # this process's, from getrusage
    assert re.fullmatch(rf"membench \d\d:\d\d:\d\d: timing step 2 of 5{rss}\n"
                        rf"membench \d\d:\d\d:\d\d: timing step 7 \(--min-time\){rss}\n", capsys.readouterr().err)


def test_the_log_line_is_the_local_time_of_day_and_the_stage():
    at = time.mktime((2026, 11, 25, 10, 46, 12, 0, 0, -1))
    assert progress.log_line("compare", 3, 6, now=at) == "membench 10:46:12: timing against the baseline step 3 of 6"
    assert progress.log_line("build", now=at) == "membench 10:46:12: building the model"
    assert progress.log_line("build", now=at, rss=3 * 2**29) == ("membench 10:46:12: building the model "
                                                                 "(peak RSS 1.50 GiB)")


def test_no_progress_file_means_no_line(monkeypatch, capsys):
    monkeypatch.delenv(progress.PROGRESS_ENV, raising=False)
    progress.report("build")  # a run in the caller's process: its stderr is the caller's, left alone
    assert capsys.readouterr().err == ""


def test_a_real_runs_log_holds_its_stages(tmp_path):
    job = spec("tests.workloads:mlp", (), batch_size=4, steps=2, warmup=1, check=False, timeline=False)
    record = launch(job, tmp_path, None)
    assert record.status == "ok", record.error
    log = (tmp_path / "runs" / "baseline.log").read_text()
    stages = [re.sub(r" \(peak RSS .*\)$", "", line.split(": ", 1)[1]) for line in log.splitlines()
              if re.match(r"membench \d\d:\d\d:\d\d: ", line)]
    assert stages[:2] == ["building the model", "warm-up (1 step)"]
    assert "timing step 2 of 2" in stages


def test_the_reader_passes_on_the_peak_host_memory(tmp_path, monkeypatch):
    path = tmp_path / "run.progress"
    reader = progress.StageReader(path, "baseline", started=0.0)
    monkeypatch.setenv(progress.PROGRESS_ENV, str(path))
    progress.report("build")
    [stage] = reader.read()
    assert stage.host_peak_bytes == progress.peak_rss_bytes() > 0  # the peak so far: it does not go down
