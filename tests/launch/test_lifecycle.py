"""launch.lifecycle.run_job, the one lifecycle every launcher goes through, with a stand-in worker: no process
is started, so each outcome (a result, a hang, a death, Ctrl-C) is made to happen exactly."""

from __future__ import annotations

import dataclasses

import pytest

from membench.launch.lifecycle import run_job
from membench.launch.progress import PROGRESS_ENV
from membench.results import RunRecord, read_result, write_record
from membench.spec import LaunchSpec
from tests.helpers import spec


class StandIn:
    """A started worker: finishes (or not) when waited for, writing `record` first if given."""

    def __init__(self, finishes=True, code=0, record=None, out=None, interrupt=False):
        self.finishes, self.code, self.record, self.out, self.interrupt = finishes, code, record, out, interrupt
        self.killed = False

    def wait(self, seconds: float) -> bool:
        if self.interrupt:
            raise KeyboardInterrupt
        if self.record is not None:
            write_record(self.out, self.record)
        return self.finishes

    def kill(self) -> None:
        self.killed = True

    def exit_code(self):
        return self.code


class Launcher:
    what = "stand-in worker"

    def __init__(self, worker: StandIn):
        self.worker, self.env = worker, None

    def start(self, job, stack, out_path, log, env):
        log.write_text("the worker's last words\n")
        self.worker.out, self.env = out_path, env
        return self.worker


def test_a_result_the_worker_wrote_is_the_runs_and_the_earlier_one_is_archived(tmp_path):
    job = spec("gpt-tiny")
    write_record(tmp_path / "baseline.json", RunRecord(name="baseline", status="error", spec=job, error="earlier"))
    launcher = Launcher(StandIn(record=RunRecord(name="baseline", status="ok", spec=job)))
    record = run_job(job, tmp_path, launcher)
    assert record.status == "ok" and read_result(tmp_path / "baseline.json").status == "ok"
    [archived] = (tmp_path / "previous").iterdir()
    assert read_result(archived / "baseline.json").error == "earlier"
    assert launcher.env[PROGRESS_ENV] == str((tmp_path / "runs" / "baseline.progress").resolve())
    assert (tmp_path / "runs" / "baseline.spec.json").is_file()


def test_a_hang_is_killed_at_the_timeout_and_recorded_with_the_end_of_its_log(tmp_path):
    job = dataclasses.replace(spec("gpt-tiny"), launch=LaunchSpec(timeout_s=0.01))
    worker = StandIn(finishes=False)
    record = run_job(job, tmp_path, Launcher(worker))
    assert worker.killed
    assert record.status == "timeout" and record.error == "no result after 0.01 s (--timeout)"
    assert record.log_tail == "the worker's last words\n"
    assert read_result(tmp_path / "baseline.json").status == "timeout"


def test_a_worker_that_died_without_a_result_is_an_error_naming_the_signal(tmp_path):
    worker = StandIn(code=-9)
    record = run_job(spec("gpt-tiny"), tmp_path, Launcher(worker))
    assert not worker.killed
    assert record.status == "error" and record.error == (
        "stand-in worker exited with code -9 before writing a result (killed by signal 9; out of host memory?); "
        "its log ends: the worker's last words")


def test_ctrl_c_kills_the_worker_and_stops_the_sweep(tmp_path):
    worker = StandIn(interrupt=True)
    with pytest.raises(KeyboardInterrupt):
        run_job(spec("gpt-tiny"), tmp_path, Launcher(worker))
    assert worker.killed and not (tmp_path / "baseline.json").exists()
