"""Nothing is written outside --out, through a link, or over a measurement."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from membench.cli import main
from membench.results import read_result
from tests.helpers import TINY_RUN, one_error_line, run_tiny

# --- nothing written outside --out, through a link, or over a measurement (issue 21) ----------------------------

def _second_sweep(sweep: Path, workload: str) -> None:
    """Another sweep's result in the same folder, its workload named by the file."""
    record = json.loads((sweep / "opt-in-bwd.json").read_text())
    record["name"], record["spec"]["run"]["workload"] = "other", workload
    (sweep / "other.json").write_text(json.dumps(record))


def _tree(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


@pytest.mark.parametrize("workload", ["../../../../escaped", "ABSOLUTE", "..", "a/../../b\x1b]0;x\x07"])
def test_report_subfolders_named_from_results_stay_inside_the_folder(sweep, tmp_path, workload):
    outside = tmp_path / "outside"
    outside.mkdir()
    _second_sweep(sweep, str(outside / "escaped") if workload == "ABSOLUTE" else workload)
    before = _tree(tmp_path)
    assert main(["report", str(sweep)]) == 0
    new = _tree(tmp_path) - before
    assert new and all(p.startswith("sweep/report/") or p == "sweep/report" for p in new), new
    assert len([p for p in (sweep / "report").iterdir() if p.is_dir()]) == 2


def test_two_sweeps_do_not_write_through_a_symlinked_report_folder(sweep, tmp_path, capsys):
    _second_sweep(sweep, "mlp")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (sweep / "report").symlink_to(elsewhere)
    assert main(["report", str(sweep)]) == 2
    assert "is a symlink" in one_error_line(capsys)
    assert list(elsewhere.iterdir()) == []


PREDICT = ("predict", "--workload", "tests.workloads:mlp", "--batch-size", "4", "--techniques", "baseline",
           "--device", "cpu")


@pytest.mark.slow
def test_a_prediction_never_replaces_a_measurement(tmp_path, capsys):
    assert run_tiny("--out", str(tmp_path)) == 0
    measured = (tmp_path / "baseline.json").read_bytes()
    capsys.readouterr()
    assert main([*PREDICT, "--out", str(tmp_path)]) == 2
    assert "holds a measured result" in one_error_line(capsys)
    assert (tmp_path / "baseline.json").read_bytes() == measured


@pytest.mark.slow
def test_a_new_prediction_archives_the_earlier_one(tmp_path):
    assert main([*PREDICT, "--out", str(tmp_path)]) == 0
    first = read_result(tmp_path / "baseline.json")
    assert main([*PREDICT, "--out", str(tmp_path)]) == 0
    [folder] = (tmp_path / "previous").iterdir()
    assert read_result(folder / "baseline.json").started == first.started
    assert read_result(tmp_path / "baseline.json").predicted


def test_predict_is_refused_while_a_run_holds_the_folder(tmp_path, capsys):
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time; "
                               "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX); "
                               "os.write(fd, b'4242'); print('held', flush=True); time.sleep(60)",
                               str(tmp_path / ".membench.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main([*PREDICT, "--out", str(tmp_path)]) == 2
        assert "in use by another membench run (pid 4242)" in one_error_line(capsys)
        assert not (tmp_path / "baseline.json").exists()
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("kind", ["symlink", "fifo", "folder", "device"])
def test_compare_markdown_writes_only_regular_files(sweep, tmp_path, capsys, kind):
    victim = tmp_path / "victim.md"
    victim.write_text("someone's notes")
    target = {"device": Path(os.devnull)}.get(kind, tmp_path / "table.md")
    if kind == "symlink":
        target.symlink_to(victim)
    elif kind == "fifo":
        os.mkfifo(target)
    elif kind == "folder":
        target.mkdir()
    assert main(["compare", str(sweep), str(sweep), "--markdown", str(target)]) == 2
    assert f"--markdown {target} is a" in one_error_line(capsys)
    assert victim.read_text() == "someone's notes"
    assert (target.is_symlink() if kind == "symlink" else target.is_fifo() if kind == "fifo" else
            target.is_dir() if kind == "folder" else target.is_char_device())


def test_a_symlinked_lock_file_is_refused_not_written_through(tmp_path, capsys):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    (out / ".membench.lock").symlink_to(victim)
    assert run_tiny("--out", str(out)) == 2
    assert "is a symlink" in one_error_line(capsys)
    assert victim.read_text() == "precious"


@pytest.mark.slow
def test_a_symlinked_log_is_replaced_not_truncated(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    out = tmp_path / "out"
    (out / "runs").mkdir(parents=True)
    (out / "runs" / "baseline.log").symlink_to(victim)
    assert run_tiny("--out", str(out)) == 0
    assert victim.read_text() == "precious"
    assert not (out / "runs" / "baseline.log").is_symlink()


@pytest.mark.parametrize("folder", ["previous", pytest.param("runs", marks=pytest.mark.slow)])
def test_a_symlinked_folder_inside_out_is_refused_and_the_result_kept(tmp_path, capsys, folder):
    out = tmp_path / "out"
    assert run_tiny("--out", str(out)) == 0
    kept = (out / "baseline.json").read_bytes()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.rmtree(out / folder, ignore_errors=True)
    (out / folder).symlink_to(elsewhere)
    capsys.readouterr()
    assert run_tiny("--out", str(out)) == 2
    assert "is a symlink" in one_error_line(capsys)
    assert list(elsewhere.iterdir()) == []
    assert (out / "baseline.json").read_bytes() == kept


@pytest.mark.slow
def test_a_factory_that_changes_directory_does_not_move_a_relative_out(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["run", *TINY_RUN, "--workload", "tests.workloads:factory_chdirs", "--out", "rel"]) == 0
    assert read_result(tmp_path / "rel" / "baseline.json").status == "ok"
